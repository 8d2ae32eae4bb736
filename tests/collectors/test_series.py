"""The one interpolation of cumulative readings: edges, equal times, out of range."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serwatt.collectors.series import CumulativeSeries, interpolate


def test_interpolate_edges_and_between() -> None:
    pts = [(10.0, 0.0), (12.0, 4.0), (13.0, 10.0)]
    assert interpolate(pts, 10.0) == 0.0 and interpolate(pts, 13.0) == 10.0
    assert interpolate(pts, 12.0) == 4.0
    assert interpolate(pts, 11.5) == pytest.approx(3.0)
    assert interpolate(pts, 12.5) == pytest.approx(7.0)
    for outside in (9.999, 13.001, math.nan, -math.inf, math.inf):
        assert interpolate(pts, outside) is None
    assert interpolate([], 1.0) is None
    assert interpolate([(5.0, 7.0)], 5.0) == 7.0


def test_interpolate_equal_times_take_the_first_point() -> None:
    pts = [(0.0, 0.0), (1.0, 5.0), (1.0, 7.0), (2.0, 9.0)]
    assert interpolate(pts, 1.0) == 5.0
    assert interpolate(pts, 1.5) == pytest.approx(8.0)  # from the last point at t=1


@given(
    st.lists(
        st.tuples(st.floats(0, 1e6), st.floats(0, 1e3)),
        min_size=1,
        max_size=30,
        unique_by=lambda p: p[0],
    ),
    st.floats(0, 1e6),
)
def test_interpolate_stays_between_its_neighbours(raw: list[tuple[float, float]], t: float) -> None:
    pts = sorted(raw)
    v = interpolate(pts, t)
    if not pts[0][0] <= t <= pts[-1][0]:
        assert v is None
        return
    assert v is not None
    lo = max(p for p in pts if p[0] <= t)
    hi = min(p for p in pts if p[0] >= t)
    assert min(lo[1], hi[1]) - 1e-9 <= v <= max(lo[1], hi[1]) + 1e-9


def test_cumulative_series_delta_prune_and_order() -> None:
    s = CumulativeSeries(("j",))
    for t, j in ((0.0, 0.0), (1.0, 10.0), (1.0, 99.0), (0.5, 99.0), (2.0, 30.0)):
        s.add(t, j=j)  # times not after the last are dropped
    assert list(s.t) == [0.0, 1.0, 2.0] and s.last_t == 2.0
    assert s.delta("j", 0.5, 1.5) == pytest.approx(15.0)
    assert s.delta("j", -0.1, 1.0) is None
    s.prune(1.5)
    assert list(s.t) == [1.0, 2.0]  # the reading that brackets the horizon stays
    assert s.delta("j", 1.0, 2.0) == pytest.approx(20.0)
