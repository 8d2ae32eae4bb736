"""A background checkpoint's CPU on every thread (issue 24 §3): many.Checkpointer's copy on
the training thread and its write on a thread of its own, 256 MB a save. Each checkpoint's
`cpu_s_all_threads` (the process's CPU from the save's start to the file event) must be
within 10% (the issue's goal) of the workload's own figure: time.process_time() at the
call and in on_written, which runs as the file is durable, before `keep` prunes the file
before it (pruning a 256 MB file is the kernel's CPU, after the file event: when it ran
first, the 2nd and 3rd checkpoints read 6-21% low). Measured on the quiet VM with this
command: within -1.2..+1.0% (docs/benchmarks.md, "A background checkpoint's CPU on every
thread")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.serial
def test_a_background_checkpoints_cpu_is_the_processs_over_its_span(tmp_path: Path) -> None:
    ckpt, doc = tmp_path / "ck", tmp_path / "p.json"
    ckpt.mkdir()
    r = subprocess.run(
        [
            # the checkpoints' CPU at the full rate (a budget lowers it on a 2-CPU node)
            sys.executable, "-m", "serwatt", "profile", "--cpu-budget", "off",
            "--checkpoints", str(ckpt),
            "--json", str(doc), "--",
            sys.executable, "-m", "serwatt.profiler.workloads.train", "--ckpt", "many-async",
            "--backend", "numpy", "--size", "256", "--steps", "12", "--every", "3",
            "--keep", "1", "--dir", str(ckpt),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    summary = next(json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))
    job = {c["path"]: c["cpu_s_all_threads"] for c in summary["checkpoints"]}
    profile = json.loads(doc.read_text())
    figures = {
        c["path"]: c["cpu_s_all_threads"]
        for c in profile["checkpoints"]
        if c["cpu_s_all_threads"] is not None
    }
    assert set(figures) <= set(job) and len(figures) >= 2, (figures, job)
    errors = {Path(p).name: got / job[p] - 1 for p, got in figures.items()}
    assert all(abs(e) <= 0.10 for e in errors.values()), errors
