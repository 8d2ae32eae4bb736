"""CPU weighting by the kernel's scheduler timeline (pure functions).

Where a window has the target's on-CPU intervals (collectors/sched_timeline.py) and its
stack-change run timed on the same clock (collectors/pyspy/clock.py), no model is
needed: a thread's stack at each change holds until its next change, and the CPU that
stack gets is the thread's on-CPU time inside that span. A thread waiting for the GIL
or in a run queue is off its CPU, so it gets nothing for that time; a thread that ran
alone gets all of it. The spans' on-CPU seconds are the `prior` of
`weighting.distribute_cpu`, which scales each thread's to its measured CPU delta
(schedstat, which leaves out what the hypervisor stole: the intervals are wall time on
the vCPU).

A change is stamped with the tick that first showed it; it happened after the tick
before. The CPU between the two goes to the new stack where the thread was asleep at the
tick before (it slept on the old line: a GIL wait, a queue get), else half to each.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from serwatt.collectors.samples import Sample
from serwatt.collectors.sched_timeline import BLOCKED, EXITED, ThreadTimeline

CPU_SOURCE_KERNEL = "kernel"  # on-CPU intervals from sched_switch
CPU_SOURCE_ESTIMATE = "estimate"  # py-spy's R state and /proc polls (weighting.py)
CPU_SOURCES = (CPU_SOURCE_KERNEL, CPU_SOURCE_ESTIMATE)


@dataclass(frozen=True)
class OnCpuTimes:
    """One thread's on-CPU intervals (host epoch seconds, ascending, disjoint) with the
    running total, so the on-CPU time between two instants is two bisections."""

    starts: tuple[float, ...]
    ends: tuple[float, ...]
    cum: tuple[float, ...]  # cum[i]: on-CPU seconds of intervals before i
    blocked: tuple[bool, ...]  # interval i ended with the thread going to sleep

    @classmethod
    def of(cls, th: ThreadTimeline, epoch_minus_mono: float) -> OnCpuTimes:
        ivs = sorted(
            (iv.start_s, iv.end_s, iv.off == BLOCKED)
            for iv in th.intervals
            if iv.end_s > iv.start_s
        )
        cum = [0.0]
        for a, b, _ in ivs:
            cum.append(cum[-1] + (b - a))
        return cls(
            tuple(a + epoch_minus_mono for a, _, _ in ivs),
            tuple(b + epoch_minus_mono for _, b, _ in ivs),
            tuple(cum),
            tuple(blk for _, _, blk in ivs),
        )

    def upto(self, t: float) -> float:
        """On-CPU seconds before `t`."""
        i = bisect.bisect_right(self.starts, t)  # intervals starting at or before t
        if i == 0:
            return 0.0
        return self.cum[i - 1] + min(t, self.ends[i - 1]) - self.starts[i - 1]

    def between(self, a: float, b: float) -> float:
        return max(0.0, self.upto(b) - self.upto(a)) if b > a else 0.0

    def asleep_at(self, t: float) -> bool:
        """Off its CPU at `t` because it blocked (not preempted, not yet born)."""
        i = bisect.bisect_right(self.starts, t)
        if i == 0:
            return False
        return self.ends[i - 1] <= t and self.blocked[i - 1]


def on_cpu_times(
    threads: Mapping[int, ThreadTimeline], epoch_minus_mono: float
) -> dict[int, OnCpuTimes]:
    return {tid: OnCpuTimes.of(th, epoch_minus_mono) for tid, th in threads.items()}


def _lead_in(tl: OnCpuTimes, t: float, before: float | None) -> float:
    """The on-CPU seconds just before a change seen at tick `t` that belong to the new
    stack. The change happened after the tick before (`before`), which still showed the
    old stack: if the thread was asleep then, the old stack was the line it slept on,
    which costs nothing once it wakes, so all of its CPU since goes to the new stack;
    otherwise the change is as likely anywhere in that CPU, and half goes to each."""
    if before is None or before >= t:
        return 0.0
    run = tl.between(before, t)
    return run if tl.asleep_at(before) else run / 2


def span_cpu_s(
    changes: Sequence[Sample],
    end: float,
    times: Mapping[int, OnCpuTimes],
    ticks: Sequence[float] = (),
) -> list[float]:
    """For each stack change (aligned with `changes`), its thread's on-CPU seconds from
    it to the thread's next change (or `end`); 0 for a thread the timeline lacks. With
    the run's `ticks`, the CPU between a change's tick and the tick before it is split
    between the two stacks (`_lead_in`) rather than all left to the old one."""
    out = [0.0] * len(changes)
    for tid, idx in _changes_by_tid(changes, times).items():
        tl = times[tid]
        lead = []
        for n, i in enumerate(idx):
            t = changes[i].t
            k = bisect.bisect_left(ticks, t) - 1
            before = ticks[k] if k >= 0 else None
            if n == 0 or before is None or before < changes[idx[n - 1]].t:
                lead.append(0.0)  # first sight of the thread, or no tick to split at
            else:
                lead.append(_lead_in(tl, t, before))
        for n, i in enumerate(idx):
            t = changes[i].t
            stop = changes[idx[n + 1]].t if n + 1 < len(idx) else max(end, t)
            nxt = lead[n + 1] if n + 1 < len(idx) else 0.0
            out[i] = max(0.0, tl.between(t, stop) + lead[n] - nxt)
    return out


# A thread switched out by py-spy's own switch-in is stamped at the same instant; allow
# for the two events' timestamps on different CPUs.
_AT_TICK_S = 20e-6
MIN_ON_CPU_TICKS = 20  # below this a thread's tick counts are too noisy: spans instead


def on_cpu_weights(
    changes: Sequence[Sample],
    end: float,
    times: Mapping[int, OnCpuTimes],
    ticks: Sequence[float],
) -> list[float]:
    """For each stack change (aligned with `changes`), the on-CPU seconds of its thread
    that its stack used, from the stack-change run's `ticks`:

    - between two ticks that showed the same stack, the thread's on-CPU seconds are that
      stack's: exact, however the ticks fall;
    - between two ticks that showed different stacks, the change happened somewhere, and
      calls too short to show at any tick may have run too: that CPU is shared by the
      ticks at which the thread was on a CPU (or was just taken off it by py-spy waking
      there), one share per tick, by the stack then.

    Why both. Counting on-CPU ticks alone is unbiased only while a tick's time does not
    depend on what the target runs, and on a loaded node it does: beside OpenMP threads
    `many.save`'s thread was on a CPU 52% of the time inside saves but at 38% of the
    ticks there (ticks came at 236/s inside, 335/s outside), so counts gave the save
    0.58-0.86 of its CPU; the seconds between same-stack ticks do not care when the ticks
    came. Seconds alone give all the CPU between two ticks to one of their stacks and
    miss calls shorter than a tick (two threads sharing the GIL: `other` 15.7-18.2 pp
    high, against 5.6-9.2 by counts and 3.8-5.9 by both; docs/benchmarks.md). A thread
    with fewer than MIN_ON_CPU_TICKS gets its spans' CPU (`span_cpu_s`) instead."""
    spans = span_cpu_s(changes, end, times, ticks)
    out = [0.0] * len(changes)
    for tid, idx in _changes_by_tid(changes, times).items():
        tl = times[tid]
        starts = [changes[i].t for i in idx]
        stop = max(end, starts[-1])
        lo = bisect.bisect_left(ticks, starts[0])
        hi = bisect.bisect_right(ticks, stop)
        mine = [*ticks[lo:hi], stop]
        same = [0.0] * len(idx)
        counts = [0.0] * len(idx)
        shared = 0.0
        for t, nxt in zip(mine, mine[1:], strict=False):
            n = bisect.bisect_right(starts, t) - 1
            if n < 0:
                continue
            k = bisect.bisect_right(tl.starts, t) - 1
            if k >= 0 and tl.ends[k] >= t - _AT_TICK_S:
                # on its CPU, or taken off it by py-spy's own wake-up there: leaving
                # those out made the mix bench worse (13.0 pp against 7.7-9.7 by counts)
                counts[n] += 1
            cpu = tl.between(t, nxt)
            if bisect.bisect_right(starts, nxt) - 1 == n or nxt == stop:
                same[n] += cpu
            else:
                shared += cpu
        total = sum(counts)
        for n, i in enumerate(idx):
            out[i] = same[n] + shared * counts[n] / total if total >= MIN_ON_CPU_TICKS else spans[i]
    return out


def reused_tids(
    changes: Sequence[Sample],
    times: Mapping[int, OnCpuTimes],
    threads: Mapping[int, ThreadTimeline],
) -> list[Sample]:
    """`changes` with each stack seen under the tid of a thread that had already exited
    given to the thread that was using that thread's name then. py-spy keys threads by
    pthread_t and keeps the tid it first read for one: a thread started after another
    exited may reuse its pthread_t (`many.save`'s hashing thread, one per save), and its
    stacks come under the dead thread's tid, whose timeline has no CPU for them. The
    kernel saw each thread's birth: the one meant is the latest-born thread that no
    change names, born after the dead one left its CPU and before the change, and not
    yet gone."""
    named = {s.tid for s in changes}
    gone: dict[int, float] = {}
    for tid, tl in times.items():
        th = threads.get(tid)
        if th is not None and th.intervals and th.intervals[-1].off == EXITED and tl.ends:
            gone[tid] = tl.ends[-1]
    born = sorted(
        (tl.starts[0], tid) for tid, tl in times.items() if tl.starts and tid not in named
    )
    if not gone or not born:
        return list(changes)
    births = [b for b, _ in born]
    out = []
    for s in changes:
        end = gone.get(s.tid) if s.tid is not None else None
        if end is not None and s.t > end:
            k = bisect.bisect_right(births, s.t) - 1
            while k >= 0 and births[k] > end:
                tid = born[k][1]
                if gone.get(tid, s.t) >= s.t - _AT_TICK_S:
                    s = replace(s, tid=tid)
                    break
                k -= 1
        out.append(s)
    return out


def _changes_by_tid(changes: Sequence[Sample], times: Mapping[int, object]) -> dict[int, list[int]]:
    """The indexes of `changes` of each thread the timeline has, in time order."""
    by_tid: dict[int, list[int]] = {}
    for i, s in enumerate(changes):
        if s.tid is not None and s.tid in times:
            by_tid.setdefault(s.tid, []).append(i)
    for idx in by_tid.values():
        idx.sort(key=lambda i: changes[i].t)
    return by_tid
