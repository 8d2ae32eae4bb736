"""CPU weighting (pure): samples are not CPU seconds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.samples import Frame, Sample
from profiler.codepaths import CODEPATHS, Classification
from profiler.weighting import CpuSeries, codepath_windows, distribute_cpu

F = (Frame("f", "/a.py", 1),)


def s(tid: int | None, t: float) -> Sample:
    return Sample(pid=1, tid=tid, thread_id=tid or 0, thread_name=None, t=t, frames=F)


def test_busy_and_idle_thread_uniform() -> None:
    # 10 samples each; the busy thread used 1.0 s CPU, the idle one 0.
    samples = [s(1, i / 10) for i in range(10)] + [s(2, i / 10) for i in range(10)]
    w = distribute_cpu(samples, {1: 1.0, 2: 0.0})
    assert sum(w.cpu_s[:10]) == pytest.approx(1.0)
    assert all(c == pytest.approx(0.1) for c in w.cpu_s[:10])
    assert all(c == 0 for c in w.cpu_s[10:])  # idle samples take no CPU
    assert w.unsampled_cpu_s == 0 and w.unmapped_pool_s == 0


def test_series_gives_cpu_to_busy_moments_not_sleeps() -> None:
    # thread 1 was busy in [0, 1) and asleep in [1, 2); samples spread over both halves
    series = {1: CpuSeries(t=(0.0, 0.5, 1.0, 1.5, 2.0), cpu_s=(0.0, 0.5, 1.0, 1.0, 1.0))}
    samples = [s(1, 0.05 + i * 0.1) for i in range(20)]
    w = distribute_cpu(samples, {1: 1.0}, series=series, half_width_s=0.1)
    busy = sum(w.cpu_s[:10])
    asleep = sum(w.cpu_s[10:])
    assert busy + asleep == pytest.approx(1.0)
    assert asleep < 0.06 and busy > 0.94
    # uniform weighting would have given the sleep half 0.5
    u = distribute_cpu(samples, {1: 1.0})
    assert sum(u.cpu_s[10:]) == pytest.approx(0.5)


def test_flat_series_falls_back_to_uniform_and_keeps_all_cpu() -> None:
    series = {1: CpuSeries(t=(0.0, 1.0), cpu_s=(0.0, 0.0))}  # too coarse to show the use
    samples = [s(1, 0.5), s(1, 0.6)]
    w = distribute_cpu(samples, {1: 0.02}, series=series)
    assert w.cpu_s == (pytest.approx(0.01), pytest.approx(0.01))


def test_unmapped_threads_share_the_unmatched_pool() -> None:
    samples = [s(1, 0.1), s(None, 0.1), s(None, 0.2)]
    w = distribute_cpu(samples, {1: 0.5, 7: 0.3, 8: 0.1})
    assert w.cpu_s[0] == pytest.approx(0.5)
    assert w.cpu_s[1] == w.cpu_s[2] == pytest.approx(0.2)
    assert w.unmapped_pool_s == pytest.approx(0.4) and w.unsampled_cpu_s == 0


def test_native_thread_cpu_goes_to_other() -> None:
    samples = [s(1, 0.1), s(1, 0.2)]
    w = distribute_cpu(samples, {1: 0.4, 99: 0.6})  # 99: an OpenMP thread, no Python stack
    assert w.unsampled_cpu_s == pytest.approx(0.6)
    cls = [Classification("pickle", "r1"), Classification("json", "r2", "low")]
    cp = codepath_windows(cls, w.cpu_s, total_cpu_s=1.0, wall_s=2.0, ticks=2)
    assert set(cp) == set(CODEPATHS)
    assert cp["pickle"].cpu_s == pytest.approx(0.2) and cp["json"].cpu_s == pytest.approx(0.2)
    assert cp["other"].cpu_s == pytest.approx(0.6) and cp["other"].samples == 0
    assert cp["pickle"].wall_s == pytest.approx(1.0)  # 1 sample x (2 s / 2 ticks)
    assert cp["json"].low_confidence_samples == 1


@given(
    st.lists(st.tuples(st.integers(1, 4), st.floats(0, 10)), min_size=0, max_size=60),
    st.dictionaries(st.integers(1, 6), st.floats(0, 5), max_size=6),
)
def test_conservation(raw: list[tuple[int, float]], cpu: dict[int, float]) -> None:
    samples = [s(tid, t) for tid, t in raw]
    w = distribute_cpu(samples, cpu)
    assert all(c >= 0 for c in w.cpu_s)
    assert sum(w.cpu_s) + w.unsampled_cpu_s == pytest.approx(sum(cpu.values()), abs=1e-9)
    cls = [Classification("pickle")] * len(samples)
    cp = codepath_windows(cls, w.cpu_s, total_cpu_s=sum(cpu.values()), wall_s=1.0, ticks=10)
    assert sum(c.cpu_s for c in cp.values()) == pytest.approx(sum(cpu.values()), abs=1e-9)
