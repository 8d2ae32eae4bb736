"""Attribution maths: worked examples and hypothesis properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serwatt.collectors.series import interpolate
from serwatt.profiler.attribution.apportion import (
    IdleSpan,
    attribute_energy,
    attribute_gpu_wait,
    gpus_used_by,
)
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.sampling.window import TimedLabel


def test_energy_worked_example() -> None:
    # 100 J measured, node 50% busy -> 50 J dynamic; target ran 1 of the node's 2 busy
    # CPU-seconds -> 25 J; its codepaths by CPU time.
    a = attribute_energy(
        total_j=100.0,
        dynamic_j=50.0,
        target_cpu_s=1.0,
        node_busy_cpu_s=2.0,
        codepath_cpu_s={"pickle": 0.6, "json": 0.2, "other": 0.2},
        source="rapl",
    )
    assert a.target_share == 0.5 and a.target_j == 25.0
    assert a.codepaths_j["pickle"] == pytest.approx(15.0)
    assert a.codepaths_j["json"] == pytest.approx(5.0)
    assert a.codepaths_j["other"] == pytest.approx(5.0)
    assert set(a.codepaths_j) == set(CODEPATHS)
    assert a.unattributed_j == pytest.approx(75.0)
    assert a.unattributed_idle_j == 50.0 and a.unattributed_other_processes_j == 25.0
    assert a.unattributed_target_unsampled_j == pytest.approx(0.0)


def test_target_cpu_above_node_busy_is_clamped() -> None:
    a = attribute_energy(
        total_j=10.0,
        dynamic_j=8.0,
        target_cpu_s=3.0,
        node_busy_cpu_s=2.5,
        codepath_cpu_s={"torch": 1.0, "other": 1.0},  # 1 s of target CPU unsampled
        source="model",
    )
    assert a.target_share == 1.0 and a.target_j == 8.0
    assert a.codepaths_j["torch"] == pytest.approx(8.0 / 3)
    assert a.unattributed_target_unsampled_j == pytest.approx(8.0 / 3)
    with pytest.raises(ValueError, match="total_j"):
        attribute_energy(
            total_j=-1,
            dynamic_j=0,
            target_cpu_s=0,
            node_busy_cpu_s=0,
            codepath_cpu_s={},
            source="rapl",
        )


finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(
    total=finite,
    dyn_frac=st.floats(0, 1),
    target_cpu=finite,
    node_busy=finite,
    cps=st.dictionaries(st.sampled_from(CODEPATHS), finite),
)
def test_energy_identities(
    total: float, dyn_frac: float, target_cpu: float, node_busy: float, cps: dict[str, float]
) -> None:
    a = attribute_energy(
        total_j=total,
        dynamic_j=total * dyn_frac,
        target_cpu_s=target_cpu,
        node_busy_cpu_s=node_busy,
        codepath_cpu_s=cps,
        source="rapl",
    )
    attributed = math.fsum(a.codepaths_j.values())
    assert all(v >= 0 for v in a.codepaths_j.values())
    assert a.unattributed_j >= 0
    assert attributed <= total * (1 + 1e-12) + 1e-12
    assert attributed + a.unattributed_j == pytest.approx(total, rel=1e-9, abs=1e-9)
    parts = (
        a.unattributed_idle_j + a.unattributed_other_processes_j + a.unattributed_target_unsampled_j
    )
    assert parts == pytest.approx(a.unattributed_j, rel=1e-9, abs=1e-9)


def _labels(tid: int, cp: str, t0: float, t1: float, dt: float) -> list[TimedLabel]:
    n = round((t1 - t0) / dt)
    return [TimedLabel(t=t0 + i * dt, tid=tid, thread_id=tid, codepath=cp) for i in range(n)]


def test_gpu_wait_counts_once_and_splits_between_codepaths() -> None:
    dt = 0.01
    # t in [0, 10): GPU busy [0,4), idle [4,7), 50% busy [7,10)
    spans = [IdleSpan(0, 4, 1.0), IdleSpan(4, 7, 0.0), IdleSpan(7, 10, 0.5)]
    tl = (
        _labels(1, "other", 0, 4, dt)  # training loop while GPU busy
        + _labels(1, "pickle", 4, 6, dt)  # main thread pickles while GPU idle
        + _labels(2, "pickle", 4, 5, dt)  # a second pickling thread: counts once
        + _labels(3, "json", 5, 6, dt)  # json alongside pickle: split
        + _labels(1, "other", 6, 7, dt)
        + _labels(1, "torch", 7, 9, dt)
    )  # [9, 10): no samples -> unattributed
    energy = [(float(t), 100.0 * t) for t in range(11)]  # 100 W flat
    w = attribute_gpu_wait(
        gpu_index=0,
        timeline=tl,
        sample_period_s=dt,
        spans=spans,
        start=0,
        end=10,
        energy_points=energy,
    )
    assert w.idle_s == pytest.approx(3.0 + 1.5)
    assert w.wait_s["pickle"] == pytest.approx(1.0 + 0.5)
    assert w.wait_s["json"] == pytest.approx(0.5)
    assert w.wait_s["other"] == pytest.approx(1.0)
    assert w.wait_s["torch"] == pytest.approx(1.0)  # 2 s at 50% idle
    assert w.unattributed_s == pytest.approx(0.5)
    assert w.idle_energy_j is not None
    assert w.idle_energy_j["pickle"] == pytest.approx(150.0)
    assert w.unattributed_idle_energy_j == pytest.approx(50.0)


def test_gpu_wait_without_gpu_data_is_not_idle() -> None:
    tl = _labels(1, "pickle", 0, 5, 0.1)
    w = attribute_gpu_wait(
        gpu_index=0, timeline=tl, sample_period_s=0.1, spans=[IdleSpan(3, 5, 0.0)], start=0, end=5
    )
    assert w.covered_s == pytest.approx(2.0)
    assert w.wait_s["pickle"] == pytest.approx(2.0)
    assert w.idle_energy_j is None  # no energy points given
    w = attribute_gpu_wait(
        gpu_index=0, timeline=tl, sample_period_s=0.1, spans=[], start=0, end=5, only_active=True
    )
    assert w.idle_s == 0.0


def test_gpus_used_by() -> None:
    assert gpus_used_by([10, 11], {0: [10], 1: [99], 2: [11, 5], 3: []}) == [0, 2]


@st.composite
def _wait_case(draw: st.DrawFn):
    start = draw(st.floats(0, 100))
    length = draw(st.floats(0.01, 20))
    end = start + length
    cuts = sorted(draw(st.lists(st.floats(start - 2, end + 2), min_size=2, max_size=12)))
    spans = [
        IdleSpan(a, b, draw(st.floats(0, 1)))
        for a, b in zip(cuts, cuts[1:], strict=False)
        if b > a and draw(st.booleans())
    ]
    dt = draw(st.floats(0.005, 1.0))
    tl = [
        TimedLabel(
            t=draw(st.floats(start - 1, end + 1)),
            tid=draw(st.integers(1, 4)),
            thread_id=0,
            codepath=draw(st.sampled_from(CODEPATHS)),
        )
        for _ in range(draw(st.integers(0, 40)))
    ]
    steps = draw(st.lists(st.floats(0, 500), min_size=2, max_size=8))
    pts, acc = [], 0.0
    for i, p in enumerate(steps):
        acc += p
        pts.append((start - 3 + i * (length + 6) / (len(steps) - 1), acc))
    return start, end, spans, dt, tl, pts


@settings(max_examples=200, deadline=None)
@given(case=_wait_case())
def test_gpu_wait_identities(case) -> None:
    start, end, spans, dt, tl, pts = case
    w = attribute_gpu_wait(
        gpu_index=0,
        timeline=tl,
        sample_period_s=dt,
        spans=spans,
        start=start,
        end=end,
        energy_points=pts,
    )
    true_idle = sum(max(0.0, min(s.t1, end) - max(s.t0, start)) * (1 - s.busy_frac) for s in spans)
    total_wait = math.fsum(w.wait_s.values())
    assert all(v >= 0 for v in w.wait_s.values()) and w.unattributed_s >= 0
    assert w.idle_s == pytest.approx(true_idle, rel=1e-9, abs=1e-9)
    assert total_wait + w.unattributed_s == pytest.approx(w.idle_s, rel=1e-9, abs=1e-9)
    assert total_wait <= w.idle_s + 1e-9 <= (end - start) + 2e-9
    # idle joules never exceed the GPU energy measured over the window
    assert w.idle_energy_j is not None and w.unattributed_idle_energy_j is not None
    gpu_j = interpolate(pts, end) - interpolate(pts, start)  # type: ignore[operator]
    idle_j = math.fsum(w.idle_energy_j.values()) + w.unattributed_idle_energy_j
    assert 0 <= idle_j <= gpu_j * (1 + 1e-9) + 1e-9
