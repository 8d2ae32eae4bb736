"""Serialization episodes: how long a thread was blocked in one serializer call.

A checkpoint's cost to a training job is mostly how long its training thread is
blocked in it. The timeline of a window (every thread at every tick of py-spy's
--idle run, profiler/sampling/window.py) says that directly:

- An *episode* is a maximal run of one thread's consecutive timeline samples in one
  codepath (not `other`). Up to GAP_TICKS ticks in between that are `other` or missing
  (py-spy drops a sample it could not read) do not end it; a sample of another
  codepath does.
- Each sample stands for its tick's cell: the sampling layer cuts the window into
  equal cells, one per tick, and puts each sample in the middle of its own
  (collectors/pyspy/speedscope.py: speedscope gives py-spy's samples in order, without
  times). An episode runs from its first sample's cell start to its last sample's cell
  end: `wall_s` is the period times the ticks from its first sample to its last.
- py-spy's ticks are not a grid but a Poisson process (its timer draws exponential
  intervals: docs/sampling.md), so the count is Poisson too: an episode of D seconds
  gets D/P samples give or take sqrt(D/P), and `wall_s` is within about 2*sqrt(n)*P of
  the truth (95%, n its samples), plus one period for the edges, plus py-spy's worst
  reported lag: that is `resolution_s`. One period (`period_s`) is the resolution only
  of samples that carry their own times.
- Windows of one target are back to back with a short unobserved gap between them
  (py-spy restarts). An episode still open at a window's end stays open until the next
  window shows whether it goes on; when it does, it is joined across the gap and the
  gap is counted in `wall_s` and stated as `unknown_s` (time not observed), not as
  time outside. An episode that starts right after, or ends right before, a gap may
  have begun or ended inside it: that is `edge_unknown_s`. Gaps longer than
  `max_join_gap_s` are never joined across.
- Like with like: a checkpoint is more than the serializer call. A writer that makes
  its file durable follows it with fsync/fdatasync, os.replace/rename and a directory
  fsync; those samples are `other` (C calls: profiler/classify/durability.py tags them).
  An episode of a codepath in TAIL_CODEPATHS takes in such samples that follow on the
  same thread within the same GAP_TICKS, and is `durable` when it contains an fsync-like
  sample (a rename alone makes a file atomic, not durable). `.many`'s own save fsyncs
  inside `many`'s frames (profiler/many/writer.py), so its fsync samples are `many`
  samples with a sync tag: the episode is durable the same way.
- `durable=False` means no fsync was *seen*: an fsync of d seconds gets no sample with
  probability exp(-d/P), so at 10 Hz a fast disk's 20 ms fsync is missed 4 times in 5.

`EpisodeTracker` takes each target's windows in order and keeps only the open
episodes between them, so the daemon and the profile session can run it without
keeping samples.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

from profiler.classify.codepaths import OTHER, SERIALIZATION_CODEPATHS
from profiler.sampling.window import TimedLabel, WindowReport

# Ticks that are `other` (or missing) inside an episode without ending it; the same
# bound applies to how far after the serializer a durability tail may start.
GAP_TICKS = 2
# Every serializer writes files that a caller may make durable: each takes a tail.
TAIL_CODEPATHS: frozenset[str] = frozenset(SERIALIZATION_CODEPATHS)
# Longest gap between two windows of a target that an episode is joined across: the
# profile session's and the daemon's windows are a py-spy restart apart (well under a
# second); a longer gap means windows were skipped, and joining would claim a stall
# nobody saw.
MAX_JOIN_GAP_S = 1.0

_SYNC = "sync"  # profiler.classify.durability.SYNC (sampling's labels carry it)
_OTHER = OTHER.codepath


@dataclass(frozen=True)
class Episode:
    """One thread's uninterrupted stay in one codepath (times: epoch s; durations: s).

    thread: the kernel tid, or py-spy's thread id when the tid is not known.
    wall_s: end - start, unknown_s included; within ±resolution_s of the true
        duration (95%) when edge_unknown_s is 0 and it is not truncated.
    period_s: the tick period of the run that timed it (the coarsest, when joined
        across windows of different rates).
    resolution_s: period_s + 2*sqrt(samples)*period_s (Poisson count noise of its
        samples) + py-spy's worst reported lag in its windows.
    unknown_s: unobserved time inside the episode (gaps between windows it was
        joined across).
    edge_unknown_s: unobserved time right before its start or after its end (it began
        or ended in a gap between windows): the true duration may be this much longer.
    truncated: sampling started or stopped while it ran (wall_s is a lower bound).
    durability_s: time its samples spent in durability calls (fsync, replace...).
    durable: an fsync-like call was seen in it (see the module docstring).
    main_thread: the thread is the process's main thread (tid == pid); None when the
        kernel tid is not known.
    gpu_wait_s, gpu_idle_j: None here; filled from NVML over [start, end] by
        profiler.attribution.window.episode_with_gpu (None when no GPU of the pid is seen).
    """

    pid: int
    thread: int
    codepath: str
    start: float
    end: float
    wall_s: float
    period_s: float
    resolution_s: float
    cpu_s: float
    main_thread: bool | None
    durable: bool
    unknown_s: float = 0.0
    edge_unknown_s: float = 0.0
    truncated: bool = False
    durability_s: float = 0.0
    samples: int = 0
    gpu_wait_s: float | None = None
    gpu_idle_j: float | None = None


_Key = tuple[bool, int]  # (kernel tid known, tid or py-spy thread id)


def _key(label: TimedLabel) -> _Key:
    return (True, label.tid) if label.tid is not None else (False, label.thread_id)


def period_s(report: WindowReport) -> float:
    """The tick period of a window's timeline (its --idle run)."""
    if report.timeline_period_s > 0:
        return report.timeline_period_s
    if report.rate_hz > 0:
        return 1.0 / report.rate_hz
    raise ValueError(
        f"window of pid {report.pid} at {report.started_at:.3f} has neither "
        "timeline_period_s nor rate_hz: its samples cannot be timed"
    )


class _CpuIndex:
    """Per thread, the CPU-carrying samples of one window as sorted times + prefix sums."""

    def __init__(self, labels: Iterable[TimedLabel]) -> None:
        grouped: dict[_Key, list[tuple[float, float]]] = {}
        for lab in labels:
            grouped.setdefault(_key(lab), []).append((lab.t, lab.cpu_s))
        self._by: dict[_Key, tuple[list[float], list[float]]] = {}
        for key, pairs in grouped.items():
            pairs.sort()
            prefix = [0.0]
            for _t, c in pairs:
                prefix.append(prefix[-1] + c)
            self._by[key] = ([t for t, _ in pairs], prefix)

    def between(self, key: _Key, lo: float, hi: float) -> float:
        """CPU of the thread's samples with lo <= t < hi."""
        got = self._by.get(key)
        if got is None or hi <= lo:
            return 0.0
        times, prefix = got
        return prefix[bisect.bisect_left(times, hi)] - prefix[bisect.bisect_left(times, lo)]


@dataclass
class _Open:
    """An episode not yet closed."""

    pid: int
    key: _Key
    codepath: str
    start: float
    last_edge: float  # end of the last sample's cell
    period: float  # the coarsest tick period it was timed with
    lag: float  # py-spy's worst reported lag in its windows
    window: int  # sequence number of the window of its start
    hit_window: int  # ... and of its last sample
    samples: int = 0
    durable: bool = False
    durability_s: float = 0.0
    unknown_s: float = 0.0
    pending_unknown_s: float = 0.0  # gaps after the last sample: inside if it goes on
    gap_s: float = 0.0  # observed ticks since the last sample that were not its
    touches_end: bool = False  # its last sample is the last tick before a gap
    edge_unknown_start: float = 0.0
    truncated_start: bool = False
    cpu_s: float = 0.0
    pending_cpu_s: float = 0.0  # CPU after the last sample: inside if it goes on

    def tolerance(self) -> float:
        # GAP_TICKS whole ticks; the half tick absorbs float error in the cell edges
        return (GAP_TICKS + 0.5) * self.period


@dataclass
class _Target:
    started_at: float
    ended_at: float
    open: dict[_Key, _Open]


class EpisodeTracker:
    """Episodes of every target, from windows taken in order per target.

        tracker = EpisodeTracker()
        for report in windows:                 # each pid's windows in time order
            done = tracker.add(report)         # episodes that closed
        done += tracker.finish()               # those still open (sampling stopped)

    Not thread-safe: feed it from one thread (the profile session's finisher, the
    daemon's slot loop).
    """

    def __init__(
        self,
        *,
        max_join_gap_s: float = MAX_JOIN_GAP_S,
        tail_codepaths: Iterable[str] = TAIL_CODEPATHS,
    ) -> None:
        if not max_join_gap_s >= 0:
            raise ValueError(f"max_join_gap_s must be >= 0 seconds, got {max_join_gap_s}")
        self.max_join_gap_s = max_join_gap_s
        self.tail_codepaths = frozenset(tail_codepaths)
        self._targets: dict[int, _Target] = {}
        self._seq = 0

    def open_episodes(self, pid: int | None = None) -> int:
        """How many episodes are open (of `pid`, or of every target)."""
        targets = [self._targets.get(pid)] if pid is not None else list(self._targets.values())
        return sum(len(t.open) for t in targets if t is not None)

    def add(self, report: WindowReport) -> list[Episode]:
        """Take the next window of its target; return the episodes it closed.

        Raises ValueError for a window that starts before the previous window of the
        same pid (windows must come in order per target).
        """
        self._seq += 1
        seq = self._seq
        pid = report.pid
        period = period_s(report)
        lag = max(0.0, report.errors.behind_s)
        target = self._targets.get(pid)
        closed: list[Episode] = []
        first = target is None
        gap = 0.0
        if target is None:
            target = self._targets[pid] = _Target(report.started_at, report.ended_at, {})
        else:
            if report.started_at < target.started_at:
                raise ValueError(
                    f"window of pid {pid} starting at {report.started_at:.3f} came after one "
                    f"starting at {target.started_at:.3f}: EpisodeTracker.add takes each "
                    "target's windows in time order"
                )
            gap = max(0.0, report.started_at - target.ended_at)
            for key, carried in list(target.open.items()):
                carried.pending_unknown_s += gap
                if gap > self.max_join_gap_s:
                    closed.append(self._close(carried))
                    del target.open[key]
            target.started_at, target.ended_at = report.started_at, report.ended_at
        cpu = _CpuIndex(report.cpu_timeline or report.timeline)

        def close(ep: _Open) -> None:
            if ep.hit_window == seq:
                lo = ep.start if ep.window == seq else -math.inf
                ep.cpu_s += cpu.between(ep.key, lo, ep.last_edge)
            closed.append(self._close(ep))

        def open_new(label: TimedLabel, cell_start: float) -> _Open:
            ep = _Open(
                pid=pid,
                key=_key(label),
                codepath=label.codepath,
                start=cell_start,
                last_edge=cell_start + period,
                period=period,
                lag=lag,
                window=seq,
                hit_window=seq,
            )
            if cell_start - report.started_at < period / 2:
                # its first sample is the window's first tick: it may have begun earlier
                if first:
                    ep.truncated_start = True
                else:
                    ep.edge_unknown_start = gap
            self._take(ep, label, period)
            return ep

        by_thread: dict[_Key, list[TimedLabel]] = {}
        for lab in sorted(report.timeline, key=lambda lab: lab.t):
            by_thread.setdefault(_key(lab), []).append(lab)
        cursors: dict[_Key, float] = {}
        for key, labels in by_thread.items():
            cur: _Open | None = target.open.pop(key, None)
            cursor = report.started_at  # everything before it is accounted for
            for lab in labels:
                cell_start = lab.t - period / 2
                seen = max(0.0, cell_start - cursor)  # ticks without a sample of this thread
                if cur is not None:
                    same = lab.codepath == cur.codepath
                    tail = (
                        lab.codepath == _OTHER
                        and lab.durability != ""
                        and cur.codepath in self.tail_codepaths
                    )
                    if same or tail:
                        if cur.gap_s + seen <= cur.tolerance():
                            cur.unknown_s += cur.pending_unknown_s
                            cur.cpu_s += cur.pending_cpu_s
                            cur.pending_unknown_s = cur.pending_cpu_s = cur.gap_s = 0.0
                            cur.touches_end = False
                            cur.last_edge = lab.t + period / 2
                            cur.period = max(cur.period, period)
                            cur.lag = max(cur.lag, lag)
                            cur.hit_window = seq
                            self._take(cur, lab, period)
                            cursor = cur.last_edge
                            continue
                        close(cur)
                        cur = None
                    elif lab.codepath != _OTHER:
                        close(cur)
                        cur = None
                    else:
                        cur.gap_s += seen + period
                        cursor = lab.t + period / 2
                        if cur.gap_s > cur.tolerance():
                            close(cur)
                            cur = None
                        continue
                if lab.codepath != _OTHER:
                    cur = open_new(lab, cell_start)
                cursor = lab.t + period / 2
            if cur is not None:
                target.open[key] = cur
            cursors[key] = cursor
        # the rest of the window: open episodes whose thread sampled nothing more
        for key, ep in list(target.open.items()):
            ep.gap_s += max(0.0, report.ended_at - cursors.get(key, report.started_at))
            if ep.gap_s > ep.tolerance():
                del target.open[key]
                close(ep)
                continue
            ep.touches_end = ep.gap_s < ep.period / 2
            if ep.hit_window == seq:
                lo = ep.start if ep.window == seq else -math.inf
                ep.cpu_s += cpu.between(key, lo, ep.last_edge)
                ep.pending_cpu_s = cpu.between(key, ep.last_edge, math.inf)
            else:
                ep.pending_cpu_s += cpu.between(key, -math.inf, math.inf)
        if report.exited:
            # the process ended: its episodes ended with it (where the samples stop)
            for ep in target.open.values():
                closed.append(self._close(ep))
            del self._targets[pid]
        closed.sort(key=lambda e: (e.end, e.thread))
        return closed

    def finish(self, pid: int | None = None) -> list[Episode]:
        """Close the open episodes of `pid` (or of every target): sampling stopped.
        One still in its codepath at the last tick is `truncated`. The target's state is
        dropped (a later window of the pid starts afresh)."""
        pids = [pid] if pid is not None else list(self._targets)
        closed: list[Episode] = []
        for p in pids:
            target = self._targets.pop(p, None)
            if target is None:
                continue
            for ep in target.open.values():
                closed.append(self._close(ep, truncated_end=ep.touches_end))
        closed.sort(key=lambda e: (e.end, e.thread))
        return closed

    @staticmethod
    def _take(ep: _Open, label: TimedLabel, period: float) -> None:
        ep.samples += 1
        if label.durability:
            ep.durability_s += period
            if label.durability == _SYNC:
                ep.durable = True

    @staticmethod
    def _close(ep: _Open, *, end_unknown: float = 0.0, truncated_end: bool = False) -> Episode:
        if ep.touches_end and end_unknown == 0.0:
            end_unknown = ep.pending_unknown_s
        has_tid, thread = ep.key
        return Episode(
            pid=ep.pid,
            thread=thread,
            codepath=ep.codepath,
            start=ep.start,
            end=ep.last_edge,
            wall_s=ep.last_edge - ep.start,
            period_s=ep.period,
            resolution_s=ep.period * (1.0 + 2.0 * math.sqrt(ep.samples)) + ep.lag,
            cpu_s=ep.cpu_s,
            main_thread=(thread == ep.pid) if has_tid else None,
            durable=ep.durable,
            unknown_s=ep.unknown_s,
            edge_unknown_s=ep.edge_unknown_start + end_unknown,
            truncated=ep.truncated_start or truncated_end,
            durability_s=ep.durability_s,
            samples=ep.samples,
        )


def episodes_of(
    reports: Iterable[WindowReport], *, max_join_gap_s: float = MAX_JOIN_GAP_S
) -> list[Episode]:
    """Every episode of a finished set of windows (any pids; each pid's in any order)."""
    tracker = EpisodeTracker(max_join_gap_s=max_join_gap_s)
    out: list[Episode] = []
    for report in sorted(reports, key=lambda r: (r.pid, r.started_at)):
        out.extend(tracker.add(report))
    out.extend(tracker.finish())
    out.sort(key=lambda e: (e.start, e.pid, e.thread))
    return out
