"""The daemon weighs by the kernel's scheduler timeline when it has a stack-change run
(timing_rate_hz > 0) and the host allows it, and says so in /metrics
(serwatt_target_info{cpu_source}) and in the run record (windows.cpu_source); issue 44.
Without that run its windows say `estimate` (tests/service/test_daemon.py)."""

from __future__ import annotations

import pytest

from serwatt.collectors import sched_timeline
from serwatt.profiler.records.store import Recorder
from tests.daemon_support import start_daemon, start_workload, stop_process, total, wait_for

STATUS = sched_timeline.probe()


@pytest.mark.skipif(not STATUS.up, reason=f"no scheduler timeline: {STATUS}")
def test_a_daemon_with_a_stack_change_run_weighs_by_the_kernel(tmp_path) -> None:  # type: ignore[no-untyped-def]
    work = start_workload(tmp_path, "cpu_source_trainer")
    d = start_daemon(tmp_path, {"trainer": "cpu_source_trainer"}, timing_rate_hz=200)
    try:
        wait_for(
            lambda: (
                total(d.metrics(), "serwatt_target_info", pid=str(work.pid), cpu_source="kernel")
                == 1
            ),
            90,
            "serwatt_target_info{cpu_source=kernel}",
        )
        code, _ = d.stop()
        assert code == 0, d.log()
    finally:
        d.kill()
        stop_process(work)
    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        runs = [r for r in rec.runs() if r.target == "trainer"]
        sources = {w.cpu_source for r in runs for w in rec.run(r.run_id).windows}
    # a window whose py-spy clock did not line up falls back, and says so
    assert "kernel" in sources and sources <= {"kernel", "estimate"}, sources
