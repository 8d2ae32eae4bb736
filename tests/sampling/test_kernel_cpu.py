"""CPU by the kernel's on-CPU intervals over stack spans (exact arithmetic)."""

from __future__ import annotations

import pytest

from collectors.samples import Frame, Sample
from collectors.sched_timeline import OnCpu, ThreadTimeline
from profiler.sampling.kernel_cpu import OnCpuTimes, on_cpu_ticks, on_cpu_times, span_cpu_s


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


def test_on_cpu_ticks_count_the_ticks_a_thread_ran_at_by_its_stack_then() -> None:
    # a change at 0 (pickle) and at 5 (json); ticks every 0.2 s from 0 to 10; the
    # thread ran 1-2 (pickle) and 6-9 (json), asleep otherwise
    th = ThreadTimeline(
        7, "t", None, None, [OnCpu(1.0, 2.0, "blocked"), OnCpu(6.0, 9.0, "blocked")]
    )
    times = on_cpu_times({7: th}, 0.0)
    ticks = [k / 5 for k in range(51)]
    changes = [_change(7, 0.0, "pickle"), _change(7, 5.0, "json")]
    assert on_cpu_ticks(changes, 10.0, times, ticks) == [6.0, 16.0]  # 1.0..2.0, 6.0..9.0
    # too few ticks on a CPU: the spans' CPU instead
    assert on_cpu_ticks(changes, 10.0, times, ticks[::10]) == pytest.approx([1.0, 3.0])
