"""CPU weighting (pure): samples are not CPU seconds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.samples import Frame, Sample
from profiler.classify.codepaths import CODEPATHS, Classification
from profiler.sampling.weighting import (
    CpuSeries,
    codepath_windows,
    distribute_cpu,
    runqueue_weights,
)

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


# -- run-queue wait on blocking lines ---------------------------------------------

WORK = (Frame("chunk", "/loop.py", 5),)
SLEEP = (Frame("<module>", "/loop.py", 9),)


def at(tid: int, frames: tuple[Frame, ...]) -> Sample:
    return Sample(pid=1, tid=tid, thread_id=tid, thread_name=None, t=0.0, frames=frames)


def loop_window(*, run_s: float, wait_s: float, sleep_s: float, cpu_rate: float = 50):
    """One thread over a 10 s window: runs `run_s` at WORK, waits in the run queue
    `wait_s` after each wakeup at SLEEP, is asleep `sleep_s` at SLEEP. The on-CPU run
    sees running and waiting (state R); the --idle run (10 Hz) sees all three."""
    on_cpu = [at(1, WORK)] * round(run_s * cpu_rate) + [at(1, SLEEP)] * round(wait_s * cpu_rate)
    idle = [at(1, WORK)] * round(run_s * 10) + [at(1, SLEEP)] * round((wait_s + sleep_s) * 10)
    return on_cpu, idle


def test_waits_after_wakeups_are_taken_off_the_line_the_thread_slept_on() -> None:
    # The bench's shape on an oversubscribed CPU: waits as long as it runs.
    on_cpu, idle = loop_window(run_s=1.0, wait_s=1.0, sleep_s=8.0)
    prior, taken = runqueue_weights(
        on_cpu, idle, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 1.0}
    )
    assert taken == pytest.approx(1.0)
    w = distribute_cpu(on_cpu, {1: 1.0}, prior=prior)
    work = sum(c for c, smp in zip(w.cpu_s, on_cpu, strict=True) if smp.frames == WORK)
    assert work == pytest.approx(1.0)  # all the CPU where it ran
    # without the correction half of it went to the sleep line
    plain = distribute_cpu(on_cpu, {1: 1.0})
    assert sum(c for c, smp in zip(plain.cpu_s, on_cpu, strict=True) if smp.frames == WORK) == (
        pytest.approx(0.5)
    )


def test_no_run_queue_wait_or_no_blocking_changes_nothing() -> None:
    on_cpu, idle = loop_window(run_s=1.0, wait_s=0.0, sleep_s=9.0)
    prior, taken = runqueue_weights(
        on_cpu, idle, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 0.0}
    )
    assert taken == 0 and set(prior) == {1.0}
    # A busy thread preempted at its work lines: no line is blocked, nothing moves.
    busy_r = [at(1, WORK)] * 500
    busy_i = [at(1, WORK)] * 100
    prior, taken = runqueue_weights(
        busy_r, busy_i, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 3.0}
    )
    assert taken == 0 and set(prior) == {1.0}


def test_a_wait_is_never_taken_beyond_the_line_r_state_time() -> None:
    # schedstat says 5 s of waiting, but only 1 s of R-state samples sit on the sleep
    # line: at most that is taken, and the work line keeps all its weight.
    on_cpu, idle = loop_window(run_s=1.0, wait_s=1.0, sleep_s=8.0)
    prior, taken = runqueue_weights(
        on_cpu, idle, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 5.0}
    )
    assert taken == pytest.approx(1.0)
    assert all(p == 1.0 for p, smp in zip(prior, on_cpu, strict=True) if smp.frames == WORK)
    assert all(p == 0.0 for p, smp in zip(prior, on_cpu, strict=True) if smp.frames == SLEEP)
    # every weight 0 for a thread would drop its CPU: distribute_cpu falls back to uniform
    w = distribute_cpu([at(1, SLEEP)] * 3, {1: 0.3}, prior=[0.0, 0.0, 0.0])
    assert sum(w.cpu_s) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="align"):
        distribute_cpu([at(1, SLEEP)] * 3, {1: 0.3}, prior=[1.0])
