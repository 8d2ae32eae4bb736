"""`serwatt profile --json FILE` when FILE cannot be written at the end.

docs/sampling.md: "If the JSON file cannot be written at the end, the document goes to
stderr so that no data is lost, and the exit code is 1." Two real ways it happens, each
under a real profile of a real job: the job removes the output directory before it exits
(a cleanup step), and the job fills the file system the directory is on (a tmpfs in a
private mount namespace, so nothing outside this test sees it). The document on stderr
must be the whole document: it parses, has every codepath, and holds the same samples as
the table on stdout and the run record written by --record.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from serwatt.profiler.records.store import Recorder
from tests.profile.test_profile_cli import check_document

REPO = Path(__file__).resolve().parents[2]
SERWATT = [sys.executable, "-m", "serwatt"]

JOB = textwrap.dedent(
    """
    import errno, glob, os, pickle, shutil, sys, time

    def sampled():  # a py-spy record of this process is running
        for path in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                argv = open(path, "rb").read().decode(errors="replace").split("\\0")
            except OSError:
                continue
            if "record" in argv and "--pid" in argv:
                if argv[argv.index("--pid") + 1] == str(os.getpid()):
                    return True
        return False

    data = {str(i): [i, "x" * 10] for i in range(5000)}
    # 3 s of pickling from the moment serwatt samples: on a loaded machine py-spy can start
    # later than a fixed pause would allow for
    give_up = time.time() + 60
    while not sampled() and time.time() < give_up:
        time.sleep(0.05)
    end = time.time() + 3
    while time.time() < end:
        blob = pickle.dumps(data)
    out_dir = sys.argv[2]
    if sys.argv[1] == "remove":
        shutil.rmtree(out_dir)
    else:  # fill the file system out_dir is on
        try:
            with open(os.path.join(out_dir, "filler"), "wb", buffering=0) as f:
                while True:
                    f.write(b"\\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    """
)


def _document_from_stderr(stderr: str, json_path: Path) -> dict:
    marker = f"serwatt profile: cannot write {json_path}: "
    assert marker in stderr, stderr
    rest = stderr[stderr.index(marker) :].split("\n", 1)[1]
    doc, _end = json.JSONDecoder().raw_decode(rest)
    return doc


def _table_samples(stdout: str) -> dict[str, int]:
    """The samples column of the table (the rows between its header and `total`)."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("codepath "))
    rows = {}
    for line in lines[start + 1 :]:
        name, samples = line.split()[:2]
        if name == "total":
            break
        rows[name] = int(samples)
    return rows


def _check_no_data_lost(r: subprocess.CompletedProcess[str], json_path: Path, record: Path):
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    doc = _document_from_stderr(r.stderr, json_path)
    check_document(doc)
    assert doc["codepaths"]["pickle"]["samples"] > 20, (
        doc["codepaths"]["pickle"],
        doc["samples"],
        doc["targets"],
        doc["sampler"],
    )
    # The same data as the table on stdout and the run record.
    table = _table_samples(r.stdout)
    assert {cp: c["samples"] for cp, c in doc["codepaths"].items()} == {
        cp: table[cp] for cp in doc["codepaths"]
    }
    with Recorder.for_dir(record.parent, readonly=True) as rec:
        runs = rec.runs()
    assert len(runs) == 1 and runs[0].samples == doc["samples"], (runs, doc["samples"])
    return doc


def test_output_directory_removed_by_the_job(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    json_path = out_dir / "p.json"
    record = tmp_path / "rec" / "runs.sqlite"
    record.parent.mkdir()
    r = subprocess.run(
        [*SERWATT, "profile", "--rate", "50", "--json", str(json_path), "--record", str(record)]
        + ["--", sys.executable, str(job), "remove", str(out_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    _check_no_data_lost(r, json_path, record)
    assert not out_dir.exists()
    assert "No such file or directory" in r.stderr


def test_output_file_system_full(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs util-linux unshare for a private tmpfs")
    probe = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"],
        capture_output=True, text=True,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.strip()}")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out_dir = tmp_path / "full"
    out_dir.mkdir()
    json_path = out_dir / "p.json"
    record = tmp_path / "rec" / "runs.sqlite"
    record.parent.mkdir()
    cmd = [*SERWATT, "profile", "--rate", "50", "--json", str(json_path), "--record", str(record)]
    cmd += ["--", sys.executable, str(job), "fill", str(out_dir)]
    # The tmpfs exists only in this shell's mount namespace; list it before it goes.
    script = (
        f"mount -t tmpfs -o size=256k tmpfs {out_dir} || exit 99\n"
        '"$@"; rc=$?\n'
        f"echo LEFT: $(ls -A {out_dir}) >&2\n"
        "exit $rc\n"
    )
    r = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", *cmd],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 99, r.stderr
    _check_no_data_lost(r, json_path, record)
    assert "No space left on device" in r.stderr
    # Neither the document nor a torn temp file is left on the full file system.
    assert "LEFT: filler\n" in r.stderr, r.stderr[-500:]
