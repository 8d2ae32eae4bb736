"""CPU by the kernel's on-CPU intervals over stack spans (exact arithmetic)."""

from __future__ import annotations

import pytest

from serwatt.collectors.samples import Frame, Sample
from serwatt.collectors.sched_timeline import OnCpu, ThreadTimeline
from serwatt.profiler.sampling.kernel_cpu import (
    OnCpuTimes,
    on_cpu_times,
    on_cpu_weights,
    reused_tids,
    span_cpu_s,
)


def _thread(tid: int, ivs: list[tuple[float, float]]) -> ThreadTimeline:
    return ThreadTimeline(tid, "t", None, None, [OnCpu(a, b, "blocked") for a, b in ivs])


def _change(tid: int, t: float, fn: str) -> Sample:
    return Sample(pid=1, tid=tid, thread_id=tid, thread_name=None, t=t,
                  frames=(Frame(fn, "x.py", 1),))  # fmt: skip


def test_between_sums_the_overlap_of_each_interval() -> None:
    times = OnCpuTimes.of(_thread(7, [(1.0, 2.0), (3.0, 3.5), (4.0, 6.0)]), 100.0)
    assert times.between(100.0, 107.0) == pytest.approx(3.5)
    assert times.between(101.5, 104.5) == pytest.approx(0.5 + 0.5 + 0.5)
    assert times.between(102.0, 103.0) == 0.0  # off the CPU throughout
    assert times.between(105.0, 104.0) == 0.0
    assert times.upto(100.5) == 0.0


def test_a_span_gets_its_threads_on_cpu_time_until_the_next_change() -> None:
    # thread 7: on-CPU 0-1 and 2-3; thread 8: 0.5-2.5
    times = on_cpu_times(
        {7: _thread(7, [(0.0, 1.0), (2.0, 3.0)]), 8: _thread(8, [(0.5, 2.5)])}, 0.0
    )
    changes = [
        _change(7, 0.0, "pickle"),
        _change(8, 0.0, "json"),
        _change(7, 1.5, "json"),  # pickle's span 0-1.5 holds 1.0 s of CPU
        _change(9, 0.0, "other"),  # a thread the timeline lacks: nothing
    ]
    got = span_cpu_s(changes, 3.0, times)
    assert got == pytest.approx([1.0, 2.0, 1.0, 0.0])


def test_the_cpu_between_two_ticks_goes_by_what_the_thread_did_at_the_first() -> None:
    # ticks at 0, 1, 2, 3. Thread 7 slept through tick 1 (blocked 0.5-1.5: a GIL wait
    # at the old line), ran 1.5-2.5; the change shows at tick 2: its 0.5 s since the
    # wake-up is the new stack's. Thread 8 ran 0-3 without a break; its change at tick 2
    # happened somewhere in 1-2: half of that second to each stack.
    th7 = ThreadTimeline(
        7, "t", None, None, [OnCpu(0.0, 0.5, "blocked"), OnCpu(1.5, 2.5, "blocked")]
    )
    th8 = ThreadTimeline(8, "t", None, None, [OnCpu(0.0, 3.0, "preempted")])
    times = on_cpu_times({7: th7, 8: th8}, 0.0)
    changes = [
        _change(7, 0.0, "other"), _change(7, 2.0, "pickle"),
        _change(8, 0.0, "pickle"), _change(8, 2.0, "json"),
    ]  # fmt: skip
    got = span_cpu_s(changes, 3.0, times, ticks=[0.0, 1.0, 2.0, 3.0])
    assert got == pytest.approx([0.5, 1.0, 1.5, 1.5])
    # without the ticks, all of it stays with the stack before
    assert span_cpu_s(changes, 3.0, times) == pytest.approx([1.0, 0.5, 2.0, 1.0])


def test_cpu_between_same_stack_ticks_is_that_stacks_whenever_the_ticks_came() -> None:
    # a change at 0 (pickle) and at 5 (json); the thread ran 1-2 (pickle) and 6-9
    # (json). Ticks came every 0.05 s while it ran pickle and every 0.5 s while it ran
    # json (py-spy's ticks on a loaded node follow what the target does): by counts of
    # on-CPU ticks json would get 7 of 28; the seconds between ticks that showed one
    # stack are exact, 1 s and 3 s
    ticks = [k / 2 for k in range(21) if not 1 <= k / 2 <= 2] + [1 + k / 20 for k in range(21)]
    ticks.sort()
    th = ThreadTimeline(
        7, "t", None, None, [OnCpu(1.0, 2.0, "blocked"), OnCpu(6.0, 9.0, "blocked")]
    )
    times = on_cpu_times({7: th}, 0.0)
    changes = [_change(7, 0.0, "pickle"), _change(7, 5.0, "json")]
    assert on_cpu_weights(changes, 10.0, times, ticks) == pytest.approx([1.0, 3.0])


def test_cpu_between_ticks_that_showed_two_stacks_goes_by_on_cpu_ticks() -> None:
    # the thread ran throughout 0-10; its stack alternated at every tick (0.1 s apart),
    # so every tick interval is shared: by the on-CPU ticks, pickle (even ticks) 51,
    # json (odd) 50 of the 10 s
    th = ThreadTimeline(7, "t", None, None, [OnCpu(0.0, 10.0, "preempted")])
    times = on_cpu_times({7: th}, 0.0)
    ticks = [k / 10 for k in range(101)]
    changes = [_change(7, t, "pickle" if k % 2 == 0 else "json") for k, t in enumerate(ticks)]
    got = on_cpu_weights(changes, 10.05, times, ticks)
    pickle_s = sum(g for c, g in zip(changes, got, strict=True) if c.frames[0].name == "pickle")
    assert pickle_s == pytest.approx(10.0 * 51 / 101)
    assert sum(got) == pytest.approx(10.0)
    # too few ticks on a CPU: the spans' CPU instead
    assert on_cpu_weights(changes[:3], 0.2, times, ticks[:3]) == pytest.approx(
        span_cpu_s(changes[:3], 0.2, times, ticks[:3])
    )


def test_a_dead_threads_tid_seen_later_is_the_thread_born_after_it() -> None:
    # 20 ran 1-2 and exited; 21 (born 3) and 22 (born 6) are its successors on the same
    # pthread_t, which py-spy keeps calling 20; 99 (an OpenMP worker, born 0) is never
    # named and was alive throughout: it is not a successor of 20
    th = {
        20: ThreadTimeline(20, "h", 1, 1.0, [OnCpu(1.0, 2.0, "exited")]),
        21: ThreadTimeline(21, "h", 1, 3.0, [OnCpu(3.0, 4.0, "exited")]),
        22: ThreadTimeline(22, "h", 1, 6.0, [OnCpu(6.0, 7.0, "exited")]),
        99: ThreadTimeline(99, "omp", 1, 0.0, [OnCpu(0.0, 9.0, "preempted")]),
        1: ThreadTimeline(1, "main", None, None, [OnCpu(0.0, 9.0, "preempted")]),
    }
    times = on_cpu_times(th, 0.0)
    changes = [_change(20, 1.5, "many"), _change(20, 3.5, "many"), _change(20, 6.5, "many"),
               _change(20, 8.0, "many"), _change(1, 3.5, "other")]  # fmt: skip
    got = [s.tid for s in reused_tids(changes, times, th)]
    # at 8.0 every successor had exited: the change stays where py-spy put it
    assert got == [20, 21, 22, 20, 1]
