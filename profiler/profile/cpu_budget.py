"""`serwatt profile --cpu-budget`: the session's own CPU, measured, and the rate that keeps
it under the budget (profiler/sampling/budget.py's governor, the daemon's).

serwatt's cost is its own process plus its py-spy runs (reaped children). It is read
from `os.times()` once per window length; the governor sets the rate of the windows
that start after it, every py-spy run lowered in proportion, and the CPU poll spaced to
POLL_PERIODS sample periods (a poll between two samples weighs nothing). The first
windows start at the cost model's rate for the tree seen at start, so a short profile
is not over the budget for its first window.

The launched command is a child too: once it has exited its CPU is in the children's
times, so the slot it ends in is not observed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.sampling.budget import RateGovernor, starting_rate

# The CPU poll is at least this many sample periods apart: at 50 Hz its 0.1 s default.
POLL_PERIODS = 5


def own_cpu_s() -> float:
    """This process's CPU plus its reaped children's (the py-spy runs), in seconds."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass(frozen=True)
class _Mark:
    cpu_s: float
    wall_s: float


class SessionBudget:
    """The governed plan, and what the session measured of its own CPU."""

    def __init__(
        self, governor: RateGovernor | None, cpu_s: Callable[[], float] = own_cpu_s
    ) -> None:
        self.governor = governor
        self._cpu_s = cpu_s
        self._lock = threading.Lock()
        self._mark: _Mark | None = None
        self._first: _Mark | None = None
        self._last: _Mark | None = None  # the last observed slot's end
        self._slot_s = 0.0
        self._due = float("inf")  # when the next slot ends
        self._base: SamplingPlan | None = None  # the session's plan, ungoverned
        self.rates_hz: set[float] = set()  # the rates windows were started at

    def begin(
        self, now: float, *, tree: Callable[[], int], plan: SamplingPlan, window_s: float
    ) -> None:
        """Mark the start and set the first windows' rate from the cost model for the
        processes `tree()` counts (called only when the model applies: it scans /proc)."""
        self._mark = self._first = _Mark(self._cpu_s(), now)
        # Slots end half a window off the windows' ends, so each holds the py-spy runs
        # reaped at one set of window ends (a slot ending with the windows would find
        # them not yet reaped, and the next slot would count them twice over).
        self._slot_s = window_s
        self._due = now + 1.5 * window_s
        self._base = plan
        self.tree_grew(tree)

    def tree_grew(self, tree: Callable[[], int]) -> None:
        """Until a slot has been measured, the cost model sets the rate for the processes
        sampled now, `tree()` of them (a launched job's workers start after its first
        windows)."""
        g, plan = self.governor, self._base
        if g is None or g.budget_cores is None or g.observed or plan is None:
            return
        n = tree()
        runs = 2 if plan.on_cpu_run else 1
        timing = plan.timing_rate_hz
        # the stack-change run is shared by the tree (ProfileSession._plan_for)
        share = max(1.0, timing / (plan.rate_hz * n)) if timing else 0.0
        g.rate_hz = min(
            g.rate_hz,
            starting_rate(
                g.budget_cores,
                g.max_rate_hz,
                runs_per_window=n * runs + (1 if timing else 0),
                window_s=self._slot_s,
                ticks_per_hz=n * runs + share,
            ),
        )

    def plan(self, base: SamplingPlan) -> SamplingPlan:
        """`base` at the governed rate; `base` itself without a budget."""
        g = self.governor
        if g is None or g.budget_cores is None:
            return base
        rate = g.rate_hz
        with self._lock:
            self.rates_hz.add(rate)
        return replace(
            base,
            rate_hz=rate,
            idle_rate_hz=None if base.idle_rate_hz is None else g.scaled(base.idle_rate_hz),
            timing_rate_hz=None if base.timing_rate_hz is None else g.scaled(base.timing_rate_hz),
            poll_s=max(base.poll_s, POLL_PERIODS / rate),
        )

    def tick(self, now: float, *, launched_exited: bool) -> str | None:
        """Observe the slot since the last mark once it is due; returns the governor's
        over-budget note when this slot made it so (None otherwise)."""
        with self._lock:
            if self._mark is None or now < self._due:
                return None
            self._due = now + self._slot_s
            mark, self._mark = self._mark, _Mark(self._cpu_s(), now)
            used = self._mark.cpu_s - mark.cpu_s
            wall = self._mark.wall_s - mark.wall_s
            if launched_exited:
                return None
            self._last = self._mark
            g = self.governor
            if g is None or g.budget_cores is None:
                return None
            was = g.over_budget
            g.observe(max(0.0, used) / wall)
            return g.over_budget if g.over_budget and not was else None

    def section(self) -> dict[str, Any]:
        """The document's `cpu_budget`: the budget, the rates the windows ran at, and the
        CPU serwatt measured of itself over the slots it observed."""
        g = self.governor
        out: dict[str, Any] = {
            "budget_cores": g.budget_cores if g is not None else None,
            "rates_hz": sorted(self.rates_hz),
            "over_budget": g.over_budget if g is not None else None,
            "own_cpu_cores": None,
            "own_cpu_source": "unavailable: no slot of a window length was observed",
        }
        if self._first is not None and self._last is not None:
            wall = self._last.wall_s - self._first.wall_s
            if wall > 0:
                out["own_cpu_cores"] = max(0.0, self._last.cpu_s - self._first.cpu_s) / wall
                out["own_cpu_source"] = (
                    f"measured: serwatt's process and its py-spy runs (os.times), over {wall:.0f} s"
                )
        return out
