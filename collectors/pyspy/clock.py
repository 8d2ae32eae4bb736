"""py-spy's chrometrace times placed on the kernel's clock (pure: no I/O).

A chrometrace `ts` is microseconds since py-spy made its recorder (`Chrometrace::new`,
before it attaches), not an absolute time; serwatt knows only that this moment lies
between py-spy's spawn and its "Sampling process" banner (tenths of a second apart on a
loaded node). The scheduler timeline (collectors/sched_timeline.py) closes the gap:
py-spy's own threads are traced beside the target's, and

- its **sampling thread** sleeps between samples, so each of its switch-ins after a
  block is a tick: the moment it starts reading the target's stacks;
- its **main thread** sleeps on the channel between samples and is woken by each one;
  the recorder stamps `ts` right after that wake-up (microseconds of bookkeeping).

So every distinct `ts` of the run sits a few microseconds after one main-thread wake-up,
and py-spy's ticks are a Poisson process (irregular gaps), so only one offset lines the
whole run up. `align` finds it by voting: every (ts, wake-up) pair inside the spawn..
banner bounds votes for wake-up - ts; the mode is the offset, refined so that the
closest-following ts is on its wake-up. A change then goes to the tick that read it (the
sampling thread's last wake-up before the main thread's), which is when the stack was
seen: the change happened between the tick before and that one.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from serwatt.collectors.sched_timeline import ThreadTimeline

VOTE_BIN_S = 0.0002  # well below py-spy's shortest tick gaps at 400 Hz (~0.1 ms: rare)
MATCH_S = 0.001  # a ts further than this after its wake-up is not counted as matched
# a sample's read of the target (tick to hand-off) is ~0.1-1 ms; a wake-up further
# after the sampler's last sleep than this followed a tick it took without sleeping
TICK_READ_S = 0.005
_MAX_VOTERS = 400  # events that vote: enough to single out the offset, bounded cost


@dataclass(frozen=True)
class PySpyClock:
    """CLOCK_MONOTONIC of py-spy's ts 0, and its ticks, from the kernel's timeline."""

    offset_s: float  # mono seconds of ts 0
    matched: int  # distinct ts values within MATCH_S after a main-thread wake-up
    events: int  # distinct ts values in the run
    residual_p95_s: float  # of the matched: ts - its wake-up, 95th percentile
    ticks: tuple[float, ...]  # the sampling thread's wake-ups (mono), ascending

    def tick_of(self, ts_s: float) -> float:
        """Mono time of the tick whose sample produced an event at `ts_s`: the sampling
        thread's last wake-up before the main thread's wake-up that delivered it, or that
        wake-up itself when the sampler had not slept (a tick taken late, back to back)."""
        wake = ts_s + self.offset_s
        k = bisect.bisect_right(self.ticks, wake) - 1
        if k >= 0 and wake - self.ticks[k] <= TICK_READ_S:
            return self.ticks[k]
        return wake


def sampling_thread(threads: Mapping[int, ThreadTimeline], pyspy_pid: int) -> int | None:
    """The py-spy thread that woke most often: the one that samples (the others are
    the main thread, which we know, and a signal handler that sleeps throughout)."""
    cands = [
        th for tid, th in threads.items() if tid != pyspy_pid and _descends(threads, tid, pyspy_pid)
    ]
    if not cands:
        return None
    return max(cands, key=lambda th: len(th.wakes)).tid


def _descends(threads: Mapping[int, ThreadTimeline], tid: int, root: int) -> bool:
    seen = 0
    while tid != root and seen < 64:
        parent = threads[tid].parent if tid in threads else None
        if parent is None:
            return False
        tid, seen = parent, seen + 1
    return tid == root


def align(
    ts_s: Sequence[float],
    threads: Mapping[int, ThreadTimeline],
    pyspy_pid: int,
    *,
    lo_s: float,
    hi_s: float,
) -> PySpyClock | None:
    """py-spy's clock from its run's distinct event times `ts_s` (seconds) and its
    threads' timelines; ts 0 lies in [lo_s, hi_s] (mono: spawn and banner, widened by the
    caller for how late serwatt saw them). None when py-spy's threads were not traced or
    no offset is voted for by most events."""
    main = threads.get(pyspy_pid)
    sampler = sampling_thread(threads, pyspy_pid)
    if main is None or sampler is None or not ts_s:
        return None
    wakes = sorted(main.wakes)
    ticks = tuple(sorted(threads[sampler].wakes))
    uniq = sorted(set(ts_s))
    if not wakes or not ticks:
        return None
    step = max(1, len(uniq) // _MAX_VOTERS)
    votes: Counter[int] = Counter()
    for u in uniq[::step]:
        j0 = bisect.bisect_left(wakes, u + lo_s)
        j1 = bisect.bisect_right(wakes, u + hi_s)
        for w in wakes[j0:j1]:
            votes[round((w - u) / VOTE_BIN_S)] += 1
    if not votes:
        return None
    best_bin, _ = max(votes.items(), key=lambda kv: kv[1] + votes[kv[0] - 1] + votes[kv[0] + 1])
    guess = best_bin * VOTE_BIN_S
    # lags of each ts behind its wake-up under the guess; the smallest is ~0 in truth
    lags = []
    for u in uniq:
        t = u + guess
        j = bisect.bisect_right(wakes, t + VOTE_BIN_S) - 1
        if j >= 0 and -VOTE_BIN_S <= t - wakes[j] <= MATCH_S + VOTE_BIN_S:
            lags.append(t - wakes[j])
    # most events must agree; a run with one or two (a stack that never changed) has
    # nothing to misplace but its first sight of each thread, so any agreeing wake-up
    # will do
    if not lags or len(lags) < min(len(uniq), max(3, len(uniq) // 2)):
        return None
    offset = guess - min(lags)
    lags = sorted(lag - min(lags) for lag in lags if lag - min(lags) <= MATCH_S)
    return PySpyClock(
        offset_s=offset,
        matched=len(lags),
        events=len(uniq),
        residual_p95_s=lags[min(len(lags) - 1, int(0.95 * len(lags)))],
        ticks=ticks,
    )
