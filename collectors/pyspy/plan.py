"""What one sampling window runs: the py-spy runs, their rates, and the CPU polls.

A window is up to three py-spy runs over the same seconds (collectors/pyspy/runner.py):

- the *--idle run* sees every thread at every tick (the samples' times, wall seconds,
  GPU-wait); it samples at `idle_run_rate_hz`;
- the *on-CPU run* (`on_cpu_run`), without --idle, sees a thread only while it is on a CPU,
  which is what CPU weighting needs when a thread alternates work and waits faster than
  its CPU can be polled, or several threads share the GIL; it samples at `rate_hz`;
- the *stack-change run* (`timing_rate_hz`, None for none), in chrometrace format, times
  episode edges to the tick that first showed them.

`kernel_timeline`: trace the target's threads' on-CPU intervals with the kernel's
scheduler (collectors/sched_timeline.py) and weigh CPU by them where the window has a
stack-change run; where the kernel does not allow it, the window falls back to the
estimates and says so (`cpu_source`).

`poll_s` is how often the target's per-thread CPU is read during the window
(profiler/sampling/collect.py). The profile session and the daemon each build one plan
and hand it down, so the rates a window ran at are named in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_RATE_HZ = 50.0
DEFAULT_POLL_S = 0.1


@dataclass(frozen=True)
class SamplingPlan:
    rate_hz: float = DEFAULT_RATE_HZ
    on_cpu_run: bool = False
    # the --idle run's rate when there is an on-CPU run (None: rate_hz)
    idle_rate_hz: float | None = None
    timing_rate_hz: float | None = None
    poll_s: float = DEFAULT_POLL_S
    kernel_timeline: bool = False

    def __post_init__(self) -> None:
        for name in ("rate_hz", "idle_rate_hz", "timing_rate_hz", "poll_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"SamplingPlan.{name} must be > 0, got {value!r}")

    @property
    def idle_run_rate_hz(self) -> float:
        """The --idle run's rate: idle_rate_hz beside an on-CPU run, else rate_hz (the
        --idle run is then the only counted one)."""
        if self.on_cpu_run and self.idle_rate_hz is not None:
            return self.idle_rate_hz
        return self.rate_hz
