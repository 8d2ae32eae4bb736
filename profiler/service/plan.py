"""What a daemon window is made of and when a target is tried again: the py-spy runs of
a window at the governor's rate (`daemon_plan`) and the daemon's retry rule
(`daemon_retry`)."""

from __future__ import annotations

from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.sampling.retry import RetryPolicy

# Per-thread CPU snapshots during a window (SamplingPlan.poll_s). Each snapshot
# reads /proc/<pid>/task/*/stat (+ schedstat) of every thread (~0.14 ms of CPU for a
# one-thread target, more per thread); at the sampler's 0.1 s default 8 targets cost
# 1-7% of a core on the reference VM depending on load (docs/daemon.md). 0.5 s
# still gives 20 points per thread over a 10 s window for the weighting.
CPU_POLL_S = 0.5
# Two py-spys per window, like `serwatt profile`. The on-CPU one (no --idle, at the
# window's rate) carries the CPU: with only the --idle run, a thread that works 2 ms
# and sleeps 18 ms has 90% of its samples on the sleep line, and weighting by a CPU
# series polled every CPU_POLL_S cannot tell them apart, so the --idle run alone puts
# 89% of the bench target's CPU in `other` (profile: 3%; docs/daemon.md "A window is two
# py-spy runs"). The --idle run (every thread at every tick) gives samples their times, wall
# seconds and GPU-wait; NVML's busy samples are 1/6-1 s apart, so IDLE_RUN_RATE_HZ is
# plenty for lining them up, and at 10 Hz it adds ~a fifth of a 50 Hz run's cost.
ON_CPU_RUN = True
IDLE_RUN_RATE_HZ = 10.0


def daemon_retry(window_s: float, refused_s: float) -> RetryPolicy:
    """The daemon's retry rule (profiler/sampling/retry.py): a target that refused is tried
    again after `refused_s`; serwatt's own faults back off by windows, up to `refused_s`."""
    return RetryPolicy(refused_retry_s=refused_s, fault_unit_s=window_s, fault_cap_s=refused_s)


def daemon_plan(rate_hz: float, timing_rate_hz: float | None) -> SamplingPlan:
    """A daemon window's runs: the on-CPU run at `rate_hz`, the --idle run at
    min(rate_hz, IDLE_RUN_RATE_HZ), the stack-change run at `timing_rate_hz` (None: none).
    With a stack-change run the window's CPU is weighed by the kernel's scheduler
    timeline where the host allows it (docs/sampling.md, cpu_source); without one, by
    the estimates (each window says which)."""
    return SamplingPlan(
        rate_hz=rate_hz,
        on_cpu_run=ON_CPU_RUN,
        idle_rate_hz=min(rate_hz, IDLE_RUN_RATE_HZ),
        timing_rate_hz=timing_rate_hz,
        poll_s=CPU_POLL_S,
        kernel_timeline=timing_rate_hz is not None,
    )
