"""File names that are not UTF-8 (issue 45, item 12): a name is bytes, and a job may write
a checkpoint whose name no UTF-8 decoder reads. Python hands such a name on as text with
surrogate escapes, which SQLite refuses: `profile --record` crashed at the end and its
`--json` was never written. Every name serwatt records is now stored as the name's own
bytes (the read gives back the same text, and os.fsencode the same bytes) and printed
escaped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from serwatt.profiler.records.store import Recorder

REPO = Path(__file__).resolve().parents[2]
BAD = b"bad-\xff\xfe\n.many"  # not UTF-8, with a newline for the terminal
PLAIN = b"plain-\xff.many"

JOB = r"""
import os, sys, time
import torch
from serwatt.profiler import many
d = os.fsencode(sys.argv[1])
time.sleep(1.0)
many.save(os.path.join(sys.argv[1], "tmp.many"), {"w": torch.zeros(4)})
os.rename(os.path.join(d, b"tmp.many"), os.path.join(d, BAD_NAME))
fd = os.open(os.path.join(d, PLAIN_NAME), os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"x" * 100)
os.fsync(fd)
os.close(fd)
time.sleep(1.5)
""".replace("BAD_NAME", repr(BAD)).replace("PLAIN_NAME", repr(PLAIN))


def test_a_checkpoint_named_in_no_encoding_is_recorded_and_the_json_written(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    record, doc = tmp_path / "runs.sqlite", tmp_path / "profile.json"
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", "--nvml", "off", "--rate", "50",
         "--window", "1", "--checkpoints", str(ckpt), "--record", str(record),
         "--json", str(doc), "--", sys.executable, "-c", JOB, str(ckpt)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    names = {os.fsencode(ckpt / BAD.decode("utf-8", "surrogateescape")),
             os.fsencode(ckpt / PLAIN.decode("utf-8", "surrogateescape"))}  # fmt: skip
    # the --json document: every name, lossless
    written = {os.fsencode(c["path"]) for c in json.loads(doc.read_text())["checkpoints"]}
    assert names <= written, written
    # the record: the same names, lossless, and the .many one's receipt anchored under it
    with Recorder(record, readonly=True) as rec:
        (run,) = rec.runs()
        events = rec.checkpoint_events(run.run_id)
        assert events is not None
        assert names <= {os.fsencode(c["path"]) for c in events["checkpoints"]}
        (receipt,) = rec.receipts(run.run_id)
        assert os.fsencode(receipt["path"]) == os.fsencode(ckpt) + b"/" + BAD
    # printed escaped: no raw newline or undecodable byte reaches the terminal
    shown = subprocess.run(
        [sys.executable, "-m", "serwatt", "runs", "show", run.run_id, "--db", str(record)],
        cwd=REPO, capture_output=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0 and b"Traceback" not in shown.stderr, shown.stderr[-2000:]
    for out in (shown.stdout, shown.stderr, r.stdout.encode(), r.stderr.encode()):
        assert b"\xff" not in out and b"bad-\xff" not in out
        assert b"\xff\xfe\n" not in out
