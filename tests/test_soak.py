"""The soak of bench/soak.py, 3 minutes of it: a real daemon over 8 churning targets
(crashing, not Python, hostile sources), py-spy children SIGKILLed at random, SIGHUPs,
a real Prometheus scraping. Every check the bench prints is asserted here; the
30-minute run and its figures are in docs/benchmarks.md."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# measures CPU shares and time: runs alone, after the parallel pass
pytestmark = pytest.mark.serial

pytest.importorskip("scipy")

REPO = Path(__file__).resolve().parents[1]

# RSS slope after a 1-minute warm-up, over 2 minutes: too short to confirm the 30-minute
# bench's goal (150 MB after 30 days), so the test fails only on a clear leak: the
# slope's whole 95% interval above 0.7 MB/min (~60 MB to the unit's MemoryMax of 1 GiB
# in a day). With glibc's default arenas the daemon measured 8.2 MB/min (7.5-8.9) here;
# with the daemon's 2 arenas 0.32 (0.08-0.57), on a VM at load 20-30.
RSS_GOAL_MB_PER_MIN = 0.7


@pytest.mark.timeout(300)
def test_three_minute_soak_loses_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus missing: `make system-deps` installs Debian's prometheus")
    out = tmp_path / "soak.json"
    workdir = tmp_path / "soak"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "soak.py"),
            "--minutes",
            "3",
            "--sighup-s",
            "60",
            "--rss-goal-mb-per-min",
            str(RSS_GOAL_MB_PER_MIN),
            "--workdir",
            str(workdir),
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=290,
    )
    assert out.exists(), f"soak.py exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    checks = {c["name"]: c for c in json.loads(out.read_text())}
    log = (workdir / "daemon.log").read_text(errors="replace")
    assert set(checks) == {
        "rss",
        "rss_bound",
        "fds",
        "threads",
        "windows",
        "reloads",
        "prometheus",
        "record",
        "kills",
    }
    failed = {
        name: (c["verdict"], c["detail"], c["figures"])
        for name, c in checks.items()
        if c["verdict"] not in ("holds", "confirmed")
        and not (name == "rss" and c["verdict"] == "undecided")
    }
    tail = "\n".join(log.splitlines()[-40:])
    assert not failed, f"{failed}\n--- soak output ---\n{proc.stdout}\n--- daemon log ---\n{tail}"
    w = checks["windows"]["figures"]
    # the faults really happened: crashes, not-Python and killed py-spys were all seen
    assert w["errors_by_kind"].get("not_python", 0) >= 1, w
    assert w["errors_by_kind"].get("sampler_failed", 0) >= 1, w
    assert w["recorded_per_target"].get("t7", 0) >= 1, w  # the hostile target was sampled
    assert checks["reloads"]["figures"]["sighups"] >= 2
    endings = checks["kills"]["figures"]["endings"]
    assert {"SIGABRT", "SIGSEGV"} <= set(endings), endings
    assert proc.returncode in (0, 1), proc.stdout  # 1: an undecided rss slope
