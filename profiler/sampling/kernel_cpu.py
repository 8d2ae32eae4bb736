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
from dataclasses import dataclass

from collectors.samples import Sample
from collectors.sched_timeline import BLOCKED, ThreadTimeline

CPU_SOURCE_KERNEL = "kernel"  # on-CPU intervals from sched_switch
CPU_SOURCE_ESTIMATE = "estimate"  # py-spy's R state and /proc polls (weighting.py)


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
    by_tid: dict[int, list[int]] = {}
    for i, s in enumerate(changes):
        if s.tid is not None and s.tid in times:
            by_tid.setdefault(s.tid, []).append(i)
    for tid, idx in by_tid.items():
        tl = times[tid]
        idx.sort(key=lambda i: changes[i].t)
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


def on_cpu_ticks(
    changes: Sequence[Sample],
    end: float,
    times: Mapping[int, OnCpuTimes],
    ticks: Sequence[float],
) -> list[float]:
    """For each stack change (aligned with `changes`), the ticks of the stack-change run
    inside its span at which its thread was on a CPU (or was just taken off it by py-spy
    waking there). A tick's time does not depend on what the target runs, so these are a
    Poisson sampling of the thread's on-CPU time by stack: unbiased however short its
    calls are against the ticks, which the spans are not (a call that starts and ends
    between two ticks leaves no change). A thread with fewer than MIN_ON_CPU_TICKS gets
    its span CPU (`span_cpu_s`) instead."""
    spans = span_cpu_s(changes, end, times, ticks)
    out = [0.0] * len(changes)
    by_tid: dict[int, list[int]] = {}
    for i, s in enumerate(changes):
        if s.tid is not None and s.tid in times:
            by_tid.setdefault(s.tid, []).append(i)
    for tid, idx in by_tid.items():
        tl = times[tid]
        idx.sort(key=lambda i: changes[i].t)
        counts = [0.0] * len(idx)
        starts = [changes[i].t for i in idx]
        lo = bisect.bisect_left(ticks, starts[0])
        hi = bisect.bisect_right(ticks, max(end, starts[-1]))
        for t in ticks[lo:hi]:
            k = bisect.bisect_right(tl.starts, t) - 1
            if k < 0 or tl.ends[k] < t - _AT_TICK_S:
                # off its CPU. A thread switched out by py-spy's own wake-up on its CPU
                # counts: leaving those ticks out (their time may follow the thread's
                # system calls) made the bench worse, 13.0 pp against 7.7-9.7
                continue
            n = bisect.bisect_right(starts, t) - 1
            if n >= 0:
                counts[n] += 1
        if sum(counts) >= MIN_ON_CPU_TICKS:
            for n, i in enumerate(idx):
                out[i] = counts[n]
        else:
            for i in idx:
                out[i] = spans[i]
    return out
