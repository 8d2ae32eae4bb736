"""GPU-wait is timed by the timeline that produced the samples (issue 43, item 4).

The daemon's windows carry the on-CPU run's rate (`rate_hz`, 50 Hz) and a timeline from
the --idle run at IDLE_RUN_RATE_HZ (10 Hz). Each timeline sample stands for one tick of
that timeline; timing it by 1/rate_hz covered a fifth of the span, so on a GPU idle
throughout, 10 s of pickle gave 2.0 s of GPU-wait and 8.0 s unattributed."""

from __future__ import annotations

import pytest

from serwatt.collectors.nvml import GpuWindow, UtilInterval
from serwatt.profiler.attribution.tracker import WindowEnergy
from serwatt.profiler.attribution.window import attribute_span
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.sampling.window import CodepathWindow, TimedLabel, WindowReport
from serwatt.profiler.service.plan import IDLE_RUN_RATE_HZ, daemon_plan

PID = 5151
START, SPAN_S = 1000.0, 10.0


def _pickle_window() -> WindowReport:
    """One thread in pickle at every tick of a daemon window: the on-CPU run at the
    daemon's rate, the --idle timeline at its own."""
    plan = daemon_plan(50.0, None)
    period = 1.0 / plan.idle_run_rate_hz
    ticks = round(SPAN_S / period)
    labels = tuple(
        TimedLabel(t=START + k * period, tid=PID, thread_id=PID, codepath="pickle")
        for k in range(ticks)
    )
    cps = {cp: CodepathWindow() for cp in CODEPATHS}
    return WindowReport(
        pid=PID,
        started_at=START,
        ended_at=START + SPAN_S,
        rate_hz=plan.rate_hz,
        cpu_s=0.0,
        codepaths=cps,
        timeline=labels,
        cpu_timeline=(),
        timeline_period_s=period,
    )


def _idle_gpu_reading() -> WindowEnergy:
    gpu = GpuWindow(
        index=0,
        uuid=None,
        name=None,
        up=True,
        reason=None,
        start=START,
        end=START + SPAN_S,
        intervals=(UtilInterval(START, START + SPAN_S, 0.0),),
        covered_s=SPAN_S,
        idle_s=SPAN_S,
        pids=frozenset({PID}),
    )
    return WindowEnergy(
        start=START, end=START + SPAN_S, source="unavailable", reason="test", gpus=(gpu,)
    )


@pytest.mark.parametrize("driver", ["daemon slot", "profile window"])
def test_gpu_idle_throughout_a_pickle_span_is_all_gpu_wait(driver: str) -> None:
    report, reading = _pickle_window(), _idle_gpu_reading()
    assert report.rate_hz != IDLE_RUN_RATE_HZ  # the case: two runs at two rates
    if driver == "daemon slot":
        (window,) = attribute_span([report], reading, slot=True).windows
    else:
        (window,) = attribute_span([report], reading, slot=False).windows
    assert window.attribution is not None
    (gpu,) = window.attribution.gpu_wait
    period = report.timeline_period_s
    assert gpu.idle_s == pytest.approx(SPAN_S)
    assert abs(gpu.wait_s["pickle"] - SPAN_S) <= period, gpu.wait_s["pickle"]
    assert 0.0 <= gpu.unattributed_s <= period, gpu.unattributed_s
