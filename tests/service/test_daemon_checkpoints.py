"""targets[].checkpoints: a real daemon watches a target's checkpoint directory, and the
run record's checkpoints are the files the job wrote (file events), each matched to the
episode that wrote it when one was sampled; the config refuses what it cannot use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.profiler.records.store import Recorder
from serwatt.profiler.service.config import ConfigError, load_config
from tests.daemon_support import REPO, start_daemon

LATE_START = (
    "import runpy, sys, time; time.sleep(3.0); sys.argv[0] = 'train';"
    " runpy.run_module('serwatt.profiler.workloads.train', run_name='__main__')"
)


@pytest.mark.long  # a training job under the daemon to its end
def test_the_daemons_record_counts_every_file_the_job_wrote(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # the job's --dir is in its argv alone: the target's cmdline match
    d = start_daemon(tmp_path, {"trainer": {"cmdline": str(ckpt), "checkpoints": ckpt}})
    try:
        d.wait_metric("serwatt_target_up", 0, target="trainer")  # serving, before the job
        # the job waits 3 s before it trains, so the daemon (rescanning every 0.5 s) has
        # opened its run and the watch before the first save: a file written before the
        # daemon saw the run is not seen (docs/daemon.md)
        job = subprocess.run(
            [sys.executable, "-c", LATE_START, "--ckpt", "json",
             "--backend", "numpy", "--steps", "8", "--every", "2", "--size", "1",
             "--dir", str(ckpt), "--seed", "7"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert job.returncode == 0, job.stderr[-2000:]
        code, _took = d.stop()
        assert code == 0, d.log()
    finally:
        d.kill()
    summary = json.loads(next(ln for ln in job.stdout.splitlines() if ln.startswith('{"format"')))
    written = sorted(c["path"] for c in summary["checkpoints"])
    assert len(written) == 4
    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        runs = [r for r in rec.runs() if r.target == "trainer"]
        tracked = [ln for ln in d.log().splitlines() if "tracking" in ln or "forgetting" in ln]
        assert len(runs) == 1, "\n".join([*(r.run_id for r in runs), *tracked])
        (run,) = runs
        events = rec.checkpoint_events(run.run_id)
        rec_eps = [e for e in rec.episodes(run.run_id) or () if e["codepath"] == "json"]
    assert events is not None, d.log()  # recorded with the watch, not the heuristic
    assert events["identity"]["identified_by"] == "file events"
    assert events["identity"]["dir"] == str(ckpt)
    got = sorted(c["path"] for c in events["checkpoints"])
    assert got == sorted(str(Path(p).resolve()) for p in written), (got, written)
    # each is the file's own event; those the daemon's windows sampled name their writer:
    # the job's main thread, in a json encode episode the record holds
    matched = [c for c in events["checkpoints"] if c["episode_start"] is not None]
    assert matched, events["checkpoints"]
    starts = {e["start"] for e in rec_eps if e["direction"] == "encode"}
    for c in matched:
        assert c["thread_id"] == c["pid"] and c["episode_start"] in starts, (c, rec_eps)
        # a stall is stated, or why not (one sampled episode spanning several saves)
        assert c["stall_s"] is not None or c["timed_by"], c


@pytest.mark.parametrize(
    "target, words",
    [
        ("checkpoints: [a]", "targets[0].checkpoints: must be a string"),
        ("checkpoint_glob: '*.pt'", "targets[0].checkpoint_glob: without checkpoints"),
        ("checkpoints: /ckpt\n    checkpoint_glob: 'a/*.pt'", "is not a file-name pattern"),
    ],
)
def test_a_bad_checkpoints_entry_names_its_key(tmp_path: Path, target: str, words: str) -> None:
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        "targets:\n  - name: t\n    match: {cmdline: train}\n    " + target + "\n"
        f"record:\n  dir: {tmp_path / 'runs'}\n"
    )
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("*", r"\*")):
        load_config(cfg)


def test_checkpoints_and_its_glob_are_read(tmp_path: Path) -> None:
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        "targets:\n  - name: t\n    match: {cmdline: train}\n"
        "    checkpoints: rel/ckpt\n    checkpoint_glob: '*.pt'\n"
        f"record:\n  dir: {tmp_path / 'runs'}\n"
    )
    (t,) = load_config(cfg).targets
    assert t.checkpoints == tmp_path / "rel" / "ckpt"  # relative to the config's directory
    assert t.checkpoint_glob == "*.pt"
