"""CPU weighting (pure): samples are not CPU seconds."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serwatt.collectors import procstat
from serwatt.collectors.samples import Frame, Sample
from serwatt.profiler.classify.codepaths import CODEPATHS, Classification
from serwatt.profiler.sampling.collect import RawWindow, exited_threads_cpu
from serwatt.profiler.sampling.weighting import (
    CpuSeries,
    Phases,
    codepath_windows,
    distribute_cpu,
    runnable_times,
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
    assert w.unsampled_cpu_s == 0 and w.exited_pool_s == 0


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


def test_unmapped_samples_share_only_exited_threads_cpu() -> None:
    # 7 and 8 are live threads no sample maps to: their CPU is theirs, not the samples'
    samples = [s(1, 0.1), s(None, 0.1), s(None, 0.2)]
    w = distribute_cpu(samples, {1: 0.5, 7: 0.3, 8: 0.1}, exited_cpu_s=0.2)
    assert w.cpu_s[0] == pytest.approx(0.5)
    assert w.cpu_s[1] == w.cpu_s[2] == pytest.approx(0.1)
    assert w.exited_pool_s == pytest.approx(0.2)
    assert w.unsampled_per_tid_s == {7: pytest.approx(0.3), 8: pytest.approx(0.1)}


def test_the_exited_pool_goes_by_each_samples_running_part() -> None:
    # two samples of an exited thread: one a wake-up wait (running part 0.25), one its
    # work; the pool goes as that thread's own CPU would, not evenly
    samples = [s(1, 0.1), s(None, 0.1), s(None, 0.2)]
    w = distribute_cpu(
        samples, {1: 0.5}, exited_cpu_s=0.25, prior=[1.0, 0.25, 1.0], pool_prior=[1.0, 0.25, 1.0]
    )
    assert w.cpu_s == (pytest.approx(0.5), pytest.approx(0.05), pytest.approx(0.2))
    assert w.exited_pool_s == pytest.approx(0.25)
    with pytest.raises(ValueError, match="pool_prior must align"):
        distribute_cpu(samples, {1: 0.5}, exited_cpu_s=0.25, pool_prior=[1.0])


def test_exited_threads_keep_their_run_queue_wait() -> None:
    # thread 12 exits between the second and the last snapshot: its wait up to its last
    # sighting is known, as a live thread's is, so its on-CPU samples can be weighed
    def snap(t: float, threads: dict[int, tuple[int, int]]) -> procstat.CpuSnapshot:
        return procstat.CpuSnapshot(
            pid=11,
            t=t,
            threads={
                tid: procstat.ThreadCpu(tid, "x", ns // 10**7, ns, "R", wait_ns=wait)
                for tid, (ns, wait) in threads.items()
            },
        )

    snaps = (
        snap(0.0, {11: (10**8, 10**7), 12: (2 * 10**7, 0)}),
        snap(0.1, {11: (2 * 10**8, 3 * 10**7), 12: (6 * 10**7, 5 * 10**7)}),
        snap(0.2, {11: (3 * 10**8, 4 * 10**7)}),
    )
    raw = RawWindow(
        pid=11, rate_hz=100.0, poll_s=0.1, procfs=Path("/proc"),
        window=None,  # type: ignore[arg-type]  # not read
        snapshots=snaps, cpu=procstat.delta(snaps[0], snaps[-1]), exited=False, python=None,
        process_cpu_s=0.3,
    )  # fmt: skip
    exited = exited_threads_cpu(raw, [11, 12])
    assert exited.wait_per_tid_s == {12: pytest.approx(0.05)}
    assert exited.per_tid_s == {}  # sampled: its CPU is in the pool
    assert exited.pool_s == pytest.approx(0.3 - 0.2)


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
    rq = runqueue_weights(on_cpu, idle, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 1.0})
    prior = rq.weights
    assert rq.blocking_s == pytest.approx(1.0) and rq.preemption_s == 0
    w = distribute_cpu(on_cpu, {1: 1.0}, prior=prior)
    work = sum(c for c, smp in zip(w.cpu_s, on_cpu, strict=True) if smp.frames == WORK)
    assert work == pytest.approx(1.0)  # all the CPU where it ran
    # without the correction half of it went to the sleep line
    plain = distribute_cpu(on_cpu, {1: 1.0})
    assert sum(c for c, smp in zip(plain.cpu_s, on_cpu, strict=True) if smp.frames == WORK) == (
        pytest.approx(0.5)
    )


def test_a_line_whose_whole_r_state_time_is_wait_keeps_no_negative_weight() -> None:
    # 7 R-state samples at 50 Hz: the cap 7/50 s, times 50/7, is 1 + 2e-16 in floats. A
    # weight of -2e-16 made a codepath's CPU -1e-18 s, and the report refused the record.
    on_cpu, idle = loop_window(run_s=1.0, wait_s=0.14, sleep_s=8.0)
    rq = runqueue_weights(on_cpu, idle, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 5.0})
    assert rq.blocking_s == pytest.approx(0.14)
    assert all(p == 0.0 for p, smp in zip(rq.weights, on_cpu, strict=True) if smp.frames == SLEEP)
    w = distribute_cpu(on_cpu, {1: 1.0}, prior=rq.weights)
    assert min(w.cpu_s) >= 0.0 and sum(w.cpu_s) == pytest.approx(1.0)


def test_no_run_queue_wait_or_no_blocking_changes_nothing() -> None:
    on_cpu, idle = loop_window(run_s=1.0, wait_s=0.0, sleep_s=9.0)
    rq = runqueue_weights(on_cpu, idle, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 0.0})
    assert rq.blocking_s == rq.preemption_s == 0 and set(rq.weights) == {1.0}
    # A busy thread preempted at its work lines: no line is blocked, nothing moves.
    busy_r = [at(1, WORK)] * 500
    busy_i = [at(1, WORK)] * 100
    rq = runqueue_weights(
        busy_r, busy_i, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 3.0}
    )
    assert rq.blocking_s == rq.preemption_s == 0 and set(rq.weights) == {1.0}


def test_a_wait_is_never_taken_beyond_the_line_r_state_time() -> None:
    # schedstat says 5 s of waiting, but only 1 s of R-state samples sit on the sleep
    # line: at most that is taken, and the work line keeps all its weight.
    on_cpu, idle = loop_window(run_s=1.0, wait_s=1.0, sleep_s=8.0)
    rq = runqueue_weights(on_cpu, idle, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 5.0})
    prior = rq.weights
    assert rq.blocking_s == pytest.approx(1.0)
    assert all(p == 1.0 for p, smp in zip(prior, on_cpu, strict=True) if smp.frames == WORK)
    assert all(p == 0.0 for p, smp in zip(prior, on_cpu, strict=True) if smp.frames == SLEEP)
    # every weight 0 for a thread would drop its CPU: distribute_cpu falls back to uniform
    w = distribute_cpu([at(1, SLEEP)] * 3, {1: 0.3}, prior=[0.0, 0.0, 0.0])
    assert sum(w.cpu_s) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="align"):
        distribute_cpu([at(1, SLEEP)] * 3, {1: 0.3}, prior=[1.0])


# -- run-queue wait everywhere: the local running fraction C / (C + D) --------------

COMPUTE = (Frame("step", "/train.py", 20),)
SAVE = (Frame("_save", "/torch/serialization.py", 900),)


def phased(*, period_s: float = 2.0, save_s: float = 0.5, windows: int = 5, rate: float = 100):
    """One always-runnable thread over `windows` periods: `save_s` of torch.save running
    alone (no wait), then compute while an OpenMP thread takes half the CPU (it waits as
    long as it runs). Returns the on-CPU samples (one per 1/rate of runnable time, at
    the right times), the series polled every 0.1 s, and the true CPU per phase."""
    t, cpu, wait = [0.0], [0.0], [0.0]
    step = 0.1
    while t[-1] < period_s * windows - 1e-9:
        now = t[-1] + step
        saving = (now - 1e-9) % period_s < save_s
        cpu.append(cpu[-1] + (step if saving else step / 2))
        wait.append(wait[-1] + (0.0 if saving else step / 2))
        t.append(now)
    series = CpuSeries(tuple(t), tuple(cpu), tuple(wait))
    samples = []
    n = round(period_s * windows * rate)
    for k in range(n):
        when = (k + 0.5) / rate
        frames = SAVE if when % period_s < save_s else COMPUTE
        samples.append(Sample(pid=1, tid=1, thread_id=1, thread_name=None, t=when, frames=frames))
    truth_save = save_s * windows
    truth_compute = (period_s - save_s) / 2 * windows
    return samples, series, truth_save, truth_compute


def _save_share(samples, cpu_s) -> float:
    save = sum(c for c, smp in zip(cpu_s, samples, strict=True) if smp.frames == SAVE)
    return save / sum(cpu_s)


def test_compute_that_waits_for_a_cpu_weighs_less_than_a_save_that_ran_alone() -> None:
    """The issue's case: a thread that is always runnable, preempted in compute by an
    OpenMP thread, alone on a CPU in torch.save. Its on-CPU samples follow runnable
    time (save 25% of them), its CPU is 40% save: weighting by the local C / (C + D)
    gives the CPU share, uniform weighting the runnable share."""
    samples, series, save_s, compute_s = phased()
    truth = save_s / (save_s + compute_s)
    assert truth == pytest.approx(0.4)
    wait = series.wait_s[-1]
    rq = runqueue_weights(
        samples, samples, on_cpu_rate_hz=100, idle_rate_hz=100, wait_per_tid_s={1: wait},
        series={1: series}, span=(0.0, 10.0), half_width_s=0.1,
    )  # fmt: skip
    w = distribute_cpu(samples, {1: save_s + compute_s}, prior=rq.weights)
    # within h of a phase edge a weight mixes both phases: 1.8 pp here
    assert _save_share(samples, w.cpu_s) == pytest.approx(truth, abs=0.02)
    assert rq.blocking_s == 0 and rq.preemption_s == pytest.approx(wait, rel=0.02)
    # the old weighting (uniform over on-CPU samples away from blocking lines): 25%
    plain = distribute_cpu(samples, {1: save_s + compute_s})
    assert _save_share(samples, plain.cpu_s) == pytest.approx(0.25, abs=0.01)


def phase_changes(period_s: float = 2.0, save_s: float = 0.5, windows: int = 5):
    """What the stack-change run gives for `phased()`'s thread: (time, codepath)."""
    out = []
    for w in range(windows):
        out += [(w * period_s, "torch"), (w * period_s + save_s, "other")]
    return out


def test_the_stack_change_timeline_keeps_each_weight_in_its_own_phase() -> None:
    """With the phases' edges known to a tick (the stack-change run), a sample's
    running part is taken over its own phase only: the 1.8 pp mixing above goes, and a
    sample whose placed time fell on the wrong side of an edge (placement is off by
    ~0.1 s) is moved back into its phase before it is weighed."""
    samples, series, save_s, compute_s = phased()
    truth = save_s / (save_s + compute_s)
    phases = {1: Phases.from_changes(phase_changes(), 10.0)}
    codepaths = ["torch" if smp.frames == SAVE else "other" for smp in samples]
    wait = series.wait_s[-1]

    def share(on_cpu, **kw) -> float:
        rq = runqueue_weights(
            on_cpu, on_cpu, on_cpu_rate_hz=100, idle_rate_hz=100, wait_per_tid_s={1: wait},
            series={1: series}, half_width_s=0.1, **kw,
        )  # fmt: skip
        return _save_share(
            on_cpu, distribute_cpu(on_cpu, {1: save_s + compute_s}, prior=rq.weights).cpu_s
        )

    assert share(samples, phases=phases, codepaths=codepaths) == pytest.approx(truth, abs=1e-3)
    # every sample's time 0.08 s late: a save sample near its end now sits in compute
    late = [replace(smp, t=smp.t + 0.08) for smp in samples]
    without = share(late)
    assert abs(without - truth) > 0.02
    assert share(late, phases=phases, codepaths=codepaths) == pytest.approx(truth, abs=1e-3)
    with pytest.raises(ValueError, match="align"):
        share(samples, phases=phases, codepaths=codepaths[:-1])


def test_phases_from_changes_and_placement() -> None:
    ph = Phases.from_changes([(0.0, "a"), (1.0, "a"), (2.0, "b"), (3.0, "a"), (9.0, "b")], 5.0)
    assert ph.spans == {"a": ((0.0, 3.0), (2.0, 5.0)), "b": ((2.0,), (3.0,))}
    assert ph.place(1.5, "a", 0.3) == (1.5, 0.0, 2.0)  # inside: kept
    assert ph.place(2.2, "a", 0.3) == (2.0, 0.0, 2.0)  # just after a span: its end
    assert ph.place(2.9, "a", 0.3) == (3.0, 3.0, 5.0)  # just before one: its start
    assert ph.place(2.5, "a", 0.3) == (2.5, -math.inf, math.inf)  # too far from either
    assert ph.place(1.0, "json", 0.3) == (1.0, -math.inf, math.inf)  # never on the stack
    assert Phases.from_changes([], 5.0).spans == {}


def test_a_stationary_wait_moves_no_share() -> None:
    samples = [at(1, WORK if k % 3 else SLEEP) for k in range(300)]
    samples = [Sample(1, 1, 1, None, (k + 0.5) / 100, s.frames) for k, s in enumerate(samples)]
    t = tuple(k / 10 for k in range(31))
    series = CpuSeries(t, tuple(x * 0.6 for x in t), tuple(x * 0.4 for x in t))
    rq = runqueue_weights(
        samples, samples, on_cpu_rate_hz=100, idle_rate_hz=100, wait_per_tid_s={1: 1.2},
        series={1: series}, span=(0.0, 3.0),
    )  # fmt: skip
    assert rq.weights == pytest.approx([0.6] * 300)


def test_blocking_lines_take_their_wait_first_and_the_rest_is_not_taken_twice() -> None:
    # The work/sleep loop again, now with a series: every 0.1 s the thread ran as long
    # as it waited, so the local fraction is 0.5 everywhere; the wake-up waits at the
    # sleep line account for all of D, nothing is left to take off the work samples.
    on_cpu, idle = loop_window(run_s=1.0, wait_s=1.0, sleep_s=8.0)
    on_cpu = [replace(s, t=(k + 0.5) / 10) for k, s in enumerate(on_cpu)]
    t = tuple(k / 10 for k in range(101))
    series = CpuSeries(t, tuple(x / 10 for x in t), tuple(x / 10 for x in t))
    rq = runqueue_weights(
        on_cpu, idle, on_cpu_rate_hz=50, idle_rate_hz=10, wait_per_tid_s={1: 1.0},
        series={1: series}, span=(0.0, 10.0),
    )  # fmt: skip
    assert rq.blocking_s == pytest.approx(1.0) and rq.preemption_s == 0
    w = distribute_cpu(on_cpu, {1: 1.0}, prior=rq.weights)
    work = sum(c for c, smp in zip(w.cpu_s, on_cpu, strict=True) if smp.frames == WORK)
    assert work == pytest.approx(1.0)


def test_on_cpu_samples_are_placed_on_runnable_time() -> None:
    # runnable only in [2, 4) of [0, 10): 20 samples go there, not on the last ticks
    t = tuple(float(k) for k in range(11))
    cum = tuple(min(2.0, max(0.0, x - 2.0)) for x in t)
    series = CpuSeries(t, tuple(c * 0.75 for c in cum), tuple(c * 0.25 for c in cum))
    times = runnable_times(20, series, 0.0, 10.0)
    assert times is not None and len(times) == 20
    assert all(2.0 <= x <= 4.0 for x in times) and times == sorted(times)
    assert times[0] == pytest.approx(2.05) and times[-1] == pytest.approx(3.95)
    flat = CpuSeries(t, (0.0,) * 11, (0.0,) * 11)
    assert runnable_times(5, flat, 0.0, 10.0) is None


def test_counters_that_run_backwards_or_overshoot_stay_in_range() -> None:
    # a hostile or corrupt procfs: cumulative values that fall, and more CPU than wall
    series = CpuSeries((0.0, 1.0, 2.0, 3.0), (0.0, 5.0, 1.0, 9.0), (0.0, -3.0, 2.0, 1.0))
    times = runnable_times(10, series, 0.0, 3.0)
    assert times is not None and times == sorted(times)
    assert all(0.0 <= x <= 3.0 for x in times)
    for when in (0.5, 1.5, 2.5):
        f = series.running_fraction(when, 0.5)
        assert f is None or 0.0 <= f <= 1.0
        assert 0.0 <= series.utilisation(when, 0.5) <= 1.0
    with pytest.raises(ValueError, match="one value per time"):
        CpuSeries((0.0, 1.0), (0.0,))
