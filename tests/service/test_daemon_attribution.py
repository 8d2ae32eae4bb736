"""The daemon's CPU attribution on a thread that alternates work and sleep faster than
its CPU is polled: a real daemon, a real workload, real py-spy.

The workload serializes for ~2 ms then sleeps 18 ms, so ~90% of its wall-time samples
sit on the sleep line while nearly all of its CPU is in pickle and json. With only
the --idle py-spy run the daemon put 89% of the CPU in `other`; the on-CPU run puts it
where it was spent. A Python before 3.11 (py-spy knows no kernel tid in nonblocking
mode, so it cannot tell running from waiting) gets its full-rate run used as the
--idle one and the window says so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.profiler.records.store import Recorder
from tests.daemon_support import start_daemon, stop_process, total
from tests.workloads.targets import ensure_target

ALTERNATING = Path(__file__).parents[1] / "workloads" / "alternating.py"


def _start(marker: str, python: str) -> subprocess.Popen:
    return subprocess.Popen([python, str(ALTERNATING), marker], stdout=subprocess.DEVNULL)


@pytest.mark.serial  # CPU shares under contention
def test_cpu_of_a_work_sleep_loop_goes_to_the_serializers_not_the_sleep_line(tmp_path):
    work = _start("alternating_trainer", sys.executable)
    old = _start("alternating_py310", str(ensure_target("py310")))
    d = start_daemon(
        tmp_path, {"trainer": "alternating_trainer", "old": "alternating_py310"}, window_s=2
    )
    try:
        m = d.wait_metric("serwatt_cpu_seconds_total", 0.6, target="trainer", timeout_s=90)
        d.wait_metric("serwatt_samples_total", 200, target="old", timeout_s=90)
        m = d.metrics()
        cpu = {
            cp: total(m, "serwatt_cpu_seconds_total", target="trainer", codepath=cp)
            for cp in ("pickle", "json", "other")
        }
        serialization = cpu["pickle"] + cpu["json"]
        share = serialization / (serialization + cpu["other"])
        # Truth is ~96.5% (the loop's CPU is the serializers'; the --idle-only daemon
        # measured 11%). This was held to the 81.5% of eight such targets on an
        # oversubscribed node, on the reasoning that one target waits less; two fresh-clone
        # suite runs read 0.812 and 0.813, and 12 runs here 0.841-0.957 (14 runs: mean
        # 0.892, sd 0.049). The bound is their one-sided 99.9% prediction bound (Student t,
        # 13 df): 0.70, still 6x what the --idle-only weighting gave.
        assert share >= 0.70, cpu
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)
        stop_process(old)

    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        by_target = {run.target: rec.run(run.run_id) for run in rec.runs()}
    trainer = [w for w in by_target["trainer"].windows if not w.exited]
    assert trainer and all(w.rate_hz == 50 for w in trainer)
    # (the window SIGTERM cut short is too short to count its rate)
    old_windows = [w for w in by_target["old"].windows if w.ended_at - w.started_at > 1]
    assert old_windows
    for w in old_windows:
        notes = " ".join(w.errors.get("notes", []))
        assert "py-spy knew no thread's run state" in notes, notes
        # Its samples are the full-rate run's: ~50 per thread per second, not 10.
        samples = sum(c.get("samples", 0) for c in w.codepaths.values())
        assert samples >= 30 * (w.ended_at - w.started_at), (samples, w.ended_at - w.started_at)
