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

A change is stamped with the tick that first showed it, so the span boundary is up to
one tick of the stack-change run late (0.75 of a period at 4x: docs/sampling.md); the
on-CPU time of that sliver goes to the stack before.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collectors.samples import Sample
from collectors.sched_timeline import ThreadTimeline

CPU_SOURCE_KERNEL = "kernel"  # on-CPU intervals from sched_switch
CPU_SOURCE_ESTIMATE = "estimate"  # py-spy's R state and /proc polls (weighting.py)


@dataclass(frozen=True)
class OnCpuTimes:
    """One thread's on-CPU intervals (host epoch seconds, ascending, disjoint) with the
    running total, so the on-CPU time between two instants is two bisections."""

    starts: tuple[float, ...]
    ends: tuple[float, ...]
    cum: tuple[float, ...]  # cum[i]: on-CPU seconds of intervals before i

    @classmethod
    def of(cls, th: ThreadTimeline, epoch_minus_mono: float) -> OnCpuTimes:
        ivs = sorted((iv.start_s, iv.end_s) for iv in th.intervals if iv.end_s > iv.start_s)
        cum = [0.0]
        for a, b in ivs:
            cum.append(cum[-1] + (b - a))
        return cls(
            tuple(a + epoch_minus_mono for a, _ in ivs),
            tuple(b + epoch_minus_mono for _, b in ivs),
            tuple(cum),
        )

    def upto(self, t: float) -> float:
        """On-CPU seconds before `t`."""
        i = bisect.bisect_right(self.starts, t)  # intervals starting at or before t
        if i == 0:
            return 0.0
        return self.cum[i - 1] + min(t, self.ends[i - 1]) - self.starts[i - 1]

    def between(self, a: float, b: float) -> float:
        return max(0.0, self.upto(b) - self.upto(a)) if b > a else 0.0


def on_cpu_times(
    threads: Mapping[int, ThreadTimeline], epoch_minus_mono: float
) -> dict[int, OnCpuTimes]:
    return {tid: OnCpuTimes.of(th, epoch_minus_mono) for tid, th in threads.items()}


def span_cpu_s(
    changes: Sequence[Sample], end: float, times: Mapping[int, OnCpuTimes]
) -> list[float]:
    """For each stack change (aligned with `changes`), its thread's on-CPU seconds from
    it to the thread's next change (or `end`); 0 for a thread the timeline lacks."""
    out = [0.0] * len(changes)
    next_t: dict[int | None, float] = {}
    order = sorted(range(len(changes)), key=lambda i: changes[i].t, reverse=True)
    for i in order:
        s = changes[i]
        stop = next_t.get(s.tid, max(end, s.t))
        next_t[s.tid] = s.t
        tl = times.get(s.tid) if s.tid is not None else None
        if tl is not None:
            out[i] = tl.between(s.t, stop)
    return out
