"""Cumulative readings over time (energy counters, CPU seconds), and their value at
any instant between two readings by linear interpolation.

A *point* is (t, value): a reading of a cumulative quantity at host epoch second t.
Points are sorted by time. Between two points the quantity is taken to grow
linearly; outside the first and last point nothing is known, so the answer is None
(never an extrapolation).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Sequence
from operator import itemgetter

_TIME = itemgetter(0)


def interpolate(points: Sequence[tuple[float, float]], t: float) -> float | None:
    """The cumulative value at `t`: a point's own value at its time, else linear between
    the points either side. None with no points, or when `t` is outside
    [first time, last time] or NaN. With several points at one time, the first counts."""
    if not points or not points[0][0] <= t <= points[-1][0]:
        return None
    i = bisect.bisect_left(points, t, key=_TIME)
    t1, v1 = points[i]
    if t1 == t:
        return v1
    # bisect_left and the range check give t0 < t < t1: no division by zero
    t0, v0 = points[i - 1]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


class CumulativeSeries:
    """Named cumulative readings taken together at strictly increasing times."""

    def __init__(self, names: Iterable[str]) -> None:
        self.t: deque[float] = deque()
        self.v: dict[str, deque[float]] = {n: deque() for n in names}

    def add(self, t: float, **values: float) -> None:
        """Append one reading of every name; a time not after the last is dropped."""
        if self.t and t <= self.t[-1]:
            return
        self.t.append(t)
        for k, dq in self.v.items():
            dq.append(values[k])

    def prune(self, horizon: float) -> None:
        """Forget readings before `horizon`, keeping the one that brackets it."""
        while len(self.t) > 2 and self.t[1] < horizon:
            self.t.popleft()
            for dq in self.v.values():
                dq.popleft()

    def delta(self, name: str, a: float, b: float) -> float | None:
        """Growth of `name` from time a to b; None unless readings bracket both."""
        points = list(zip(self.t, self.v[name], strict=True))
        va, vb = interpolate(points, a), interpolate(points, b)
        return None if va is None or vb is None else vb - va

    @property
    def last_t(self) -> float | None:
        return self.t[-1] if self.t else None
