"""`serwatt demo` end to end: the built-in workload, profiled by the real pipeline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_demo_profiles_every_kind_of_work(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "demo", "--workload", "mixed", "--duration", "8",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    cps = doc["codepaths"]
    for cp in ("pickle", "json", "protobuf", "torch", "other"):
        assert cps[cp]["samples"] > 0 and cps[cp]["cpu_s"] > 0, (cp, cps[cp])
    for cp in ("msgpack", "yaml", "safetensors", "many"):
        assert cps[cp]["samples"] == 0
    lines = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("codepath"))
    assert lines[head].split()[:3] == ["codepath", "samples", "CPU-s"]
    assert {ln.split()[0] for ln in lines[head + 1 : head + 11]} == set(cps)
    assert "sampler:" in r.stdout and "elapsed" in r.stderr


def test_a_failing_sampler_is_an_error_line_not_a_traceback(tmp_path: Path) -> None:
    """Fault injection: a py-spy that can never read the workload. The demo must say
    so, stop its workload and exit 1, without a traceback and without waiting out
    the workload's 60 s."""
    import time

    broken = tmp_path / "py-spy"
    broken.write_text("#!/bin/sh\necho 'Error: Failed to get stack traces'\nexit 1\n")
    broken.chmod(0o755)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "demo", "--workload", "mixed", "--duration", "60",
         "--pyspy", str(broken)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "serwatt demo: error: py-spy failed" in r.stderr
    assert "Failed to get stack traces" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 30
    leftover = subprocess.run(
        ["pgrep", "-f", "profiler.workloads.demo --duration 60"], capture_output=True, text=True
    )
    assert leftover.stdout == "", "the workload was left running"
