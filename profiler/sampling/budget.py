"""The CPU budget: the sampling rate that keeps serwatt and its py-spy processes under
a number of cores (the daemon's `cpu_budget_cores`, `serwatt profile --cpu-budget`).

Why the rate and not fewer windows: a window the daemon skips is time nobody sees,
and serialization is bursty (a torch.save every few minutes), so skipping windows
misses whole events. A lower rate keeps every target watched all the time and only
widens the statistical error of each share. py-spy's cost is a start-up cost per window
plus a cost per sample (docs/benchmarks.md, "7.5 One `--idle` py-spy run per window"),
so it falls with the rate but not to zero, and the daemon has a fixed part of its own.

The governor is a multiplicative controller on the measured usage of each slot
(daemon CPU + its reaped py-spy children's CPU, over the slot's wall time): next
rate = rate x aim / usage, aiming at HEADROOM x budget so the noise of one slot
(+-10% on the VM) stays under the budget on average. Because part of the cost does
not scale with the rate, one step corrects only part of an overshoot; the next
slots finish it (geometric convergence, 2-3 slots from 50 Hz on the reference
VM). Pure: it is given usages and returns rates, so it is tested without a clock.

`serwatt profile` starts from `starting_rate` (the cost model below, for the tree it
sees at start) rather than the configured rate, so its first window is not over the
budget: a short profile may have only one.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

# Aim this far below the budget: one slot's usage varies by +-10% on a noisy node.
HEADROOM = 0.9
# Never sample slower than this: a window of 10 s still holds 10 samples per thread.
MIN_RATE_HZ = 1.0
# One step changes the rate by at most this factor either way, so one odd slot (a
# burst of scrapes, a target starting) cannot swing the rate to a limit.
MAX_STEP = 2.0
# What `serwatt profile --cpu-budget` allows by default: this share of the node's CPUs.
# On the 2-CPU reference VM it is 0.04 cores, which kept a 2-worker DataLoader job at
# >= 0.97 of its unprofiled steps (docs/benchmarks.md, "A CPU budget by default"); on a
# 64-CPU node it is 1.3 cores, where 50 Hz fits.
DEFAULT_BUDGET_SHARE = 0.02
# The cost model the first window's rate comes from, measured on the reference VM on a
# 3-process DataLoader tree (docs/benchmarks.md, "Where serwatt's CPU goes"): serwatt's
# own process at any rate, one py-spy start, one py-spy tick (all of a process's threads).
OWN_CORES = 0.012
RUN_START_CPU_S = 0.010
TICK_CPU_S = 0.00045
# The fix the profile's over-budget note names (the daemon's is in its config's terms).
PROFILE_FIX = "a larger --cpu-budget, --cpu-budget off, or --no-children"
DAEMON_FIX = (
    "fewer targets per node, a larger budget, or max_concurrent_samplers below the "
    "number of processes"
)


@dataclass
class RateGovernor:
    """budget_cores: None (no budget: always max_rate_hz) or cores (0.1 = 10% of one)."""

    budget_cores: float | None
    max_rate_hz: float
    rate_hz: float = 0.0  # the rate the next windows run at
    # why the budget cannot be met at MIN_RATE_HZ (None: it is met, or there is none)
    over_budget: str | None = None
    fix: str = DAEMON_FIX  # what the over_budget note tells the user to change
    observed: int = 0  # slots observed so far

    def __post_init__(self) -> None:
        if self.budget_cores is not None and not self.budget_cores > 0:
            raise ValueError(f"budget_cores must be > 0 or None, got {self.budget_cores!r}")
        if not self.max_rate_hz > 0:
            raise ValueError(f"max_rate_hz must be > 0, got {self.max_rate_hz!r}")
        self.rate_hz = _clamp(self.rate_hz or self.max_rate_hz, self.max_rate_hz)

    def reconfigure(self, budget_cores: float | None, max_rate_hz: float) -> None:
        """A reload: keep the learnt rate within the new limits."""
        self.budget_cores, self.max_rate_hz = budget_cores, max_rate_hz
        self.__post_init__()
        if budget_cores is None:
            self.rate_hz, self.over_budget = _clamp(max_rate_hz, max_rate_hz), None

    def observe(self, used_cores: float) -> float:
        """One slot with windows used `used_cores` (CPU s / wall s): the next rate."""
        if self.budget_cores is None:
            return self.rate_hz
        if not math.isfinite(used_cores) or used_cores < 0:
            raise ValueError(f"used_cores must be finite and >= 0, got {used_cores!r}")
        self.observed += 1
        aim = HEADROOM * self.budget_cores
        step = MAX_STEP if used_cores <= 0 else min(MAX_STEP, max(1 / MAX_STEP, aim / used_cores))
        self.rate_hz = _clamp(self.rate_hz * step, self.max_rate_hz)
        if self.rate_hz <= _floor(self.max_rate_hz) and used_cores > self.budget_cores:
            self.over_budget = (
                f"used {used_cores:.3f} cores at {self.rate_hz:g} Hz, over the budget of "
                f"{self.budget_cores:g}: {self.fix}"
            )
        else:
            self.over_budget = None
        return self.rate_hz

    def scaled(self, rate_hz: float) -> float:
        """Another py-spy run's rate, configured for max_rate_hz, lowered in proportion
        with the governed rate (so the budget governs every run), at least 1 Hz."""
        return max(MIN_RATE_HZ, float(math.floor(rate_hz * self.rate_hz / self.max_rate_hz)))


def _floor(max_rate_hz: float) -> float:
    return min(MIN_RATE_HZ, max_rate_hz)


def _clamp(rate: float, max_rate_hz: float) -> float:
    # py-spy takes a whole number of samples per second (--rate N): round down so the
    # recorded rate is the one py-spy ran at, and the budget is not exceeded.
    whole = float(math.floor(rate)) if rate >= 1 else rate
    return min(max_rate_hz, max(_floor(max_rate_hz), whole))


def default_budget_cores(cpus: int | None = None) -> float:
    """`serwatt profile`'s budget when none is given: DEFAULT_BUDGET_SHARE of the CPUs
    this process may run on (a container's cpuset, not the host's count)."""
    n = cpus if cpus is not None else len(os.sched_getaffinity(0))
    return DEFAULT_BUDGET_SHARE * max(1, n)


def starting_rate(
    budget_cores: float,
    max_rate_hz: float,
    *,
    runs_per_window: int,
    window_s: float,
    ticks_per_hz: float,
) -> float:
    """The whole rate whose modelled cost (OWN_CORES, RUN_START_CPU_S per run started,
    TICK_CPU_S per py-spy tick; `ticks_per_hz` ticks a second per 1 Hz of rate) is the
    governor's aim, between MIN_RATE_HZ and max_rate_hz. The measured usage corrects it
    from the first window on."""
    if not (budget_cores > 0 and max_rate_hz > 0 and window_s > 0 and ticks_per_hz > 0):
        raise ValueError("starting_rate needs a positive budget, rate, window and tick count")
    left = HEADROOM * budget_cores - OWN_CORES - runs_per_window * RUN_START_CPU_S / window_s
    return _clamp(left / (TICK_CPU_S * ticks_per_hz), max_rate_hz)
