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
  reported lag: that is `resolution_s` of an episode timed by sample counts.
- A window with a stack-change run (WindowReport.changes: py-spy's chrometrace, each
  thread's stack at each change, stamped) gives each thread it saw cells that run from
  one change to the next instead: the same rules then find edges at the first tick
  that showed them. Each edge is late by an exponential lag of mean one stack-change
  period, so the duration's error is their difference: within ln(20) periods 95% of the
  time (CHANGE_EDGES_95). Such an episode's CPU is the thread's measured cumulative CPU
  between its edges (the counted samples' times are only good to sqrt(n) periods).
- Windows of one target are back to back with a short unobserved gap between them
  (py-spy restarts). An episode still in its codepath at a window's end stays open until
  the next window shows whether it goes on; when it does, it is joined across the gap
  and the gap is counted in `wall_s` and stated as `unknown_s` (time not observed), not
  as time outside. One that had already left it (its last ticks `other`) counts the gap
  like missing ticks: it is joined only if they and the gap are within GAP_TICKS. An
  episode that starts right after, or ends right before, a gap may have begun or ended
  inside it: that is `edge_unknown_s`. Gaps longer than
  `max_join_gap_s` are never joined across.
- Like with like: a checkpoint is more than the serializer call. A writer that makes
  its file durable follows it with fsync/fdatasync, os.replace/rename and a directory
  fsync; those samples are `other` (C calls: profiler/classify/durability.py tags them).
  An episode of a codepath in TAIL_CODEPATHS takes in such samples that follow on the
  same thread within TAIL_GAP_S (or GAP_TICKS, or TAIL_GAP_SHARE of the episode's wall
  time, whichever is longest), and is `durable` when it contains an fsync-like sample (a
  rename alone makes a file atomic, not durable). The share is for what a big save
  frees as it returns: a 30 s `json.dump` of 64 MB was followed by 0.26 s of freeing
  the lists it had dumped before its fsync began.
  `.many`'s own save fsyncs inside `many`'s frames (profiler/many/writer.py), so its
  fsync samples are `many` samples with a sync tag: the episode is durable the same way.
- Like with like at the other end: a save function of the job's own code often turns its
  state into what the serializer takes first (tensors to lists for JSON): `other`
  samples on the same thread, in the same call of the same save function
  (TimedLabel.saver, profiler/classify/saver.py). The run of such samples right before
  an episode, with no more than GAP_TICKS missing between them and it, is its
  `prepared_s`: not in the episode's wall_s (the serializer's own), taken into a
  checkpoint's stall (profiler/attribution/checkpoints.py). A run that reaches a
  window's end is joined across the gap to the next window's, as an episode is (the
  gap counts in it, unobserved).
- `durable=False` means no fsync was *seen*: an fsync of d seconds gets no sample with
  probability exp(-d/P), so at 10 Hz a fast disk's 20 ms fsync is missed 4 times in 5.

`EpisodeTracker` takes each target's windows in order and keeps only the open
episodes between them, so the daemon and the profile session can run it without
keeping samples.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from serwatt.collectors.series import interpolate
from serwatt.profiler.classify.codepaths import OTHER, SERIALIZATION_CODEPATHS
from serwatt.profiler.sampling.window import TimedLabel, WindowReport

# Ticks that are `other` (or missing) inside an episode without ending it.
GAP_TICKS = 2
# How long after the serializer returns its durability tail may start: the writer closes
# the file (flushing its last buffer), returns and reopens it to fsync. At the stack-change
# run's 400 Hz two ticks are 5 ms, and a 23 MB JSON checkpoint's close and reopen took 4
# ticks (10 ms) on a loaded 2-CPU VM, so its fsync was left out and the episode ended
# before its file did. Same-codepath gaps stay GAP_TICKS: only a durability call
# continues an episode past them.
TAIL_GAP_S = 0.05
# ... or this share of the episode's wall time, when longer: a save frees what it built
# as it returns (the training workload's save_json, 64 MB: 0.26 s after a 30.3 s dump,
# 0.9%; at 4 MB ~15 ms), and only then makes the file durable
TAIL_GAP_SHARE = 0.02
# Every serializer writes files that a caller may make durable: each takes a tail.
TAIL_CODEPATHS: frozenset[str] = frozenset(SERIALIZATION_CODEPATHS)
# Longest gap between two windows of a target that an episode is joined across: the
# profile session's and the daemon's windows are a py-spy restart apart (well under a
# second); a longer gap means windows were skipped, and joining would claim a stall
# nobody saw.
MAX_JOIN_GAP_S = 1.0

# 95% half-width of an episode timed by stack changes, in stack-change periods: each
# edge shows at the first tick after it, a lag exponential with mean one period
# (py-spy's ticks are Poisson), so the duration's error is the difference of two
# such lags: Laplace with scale one period, |error| <= ln(20) periods 95% of the time.
CHANGE_EDGES_95 = math.log(20.0)
TIMED_BY_CHANGES = "stack changes"


def error_quantile_s(resolution_s: float, timed_by: str, p: float) -> float:
    """The timing error a duration with this stated 95% half-width exceeds in one
    direction with probability p, under the error model of how it was timed. Stack
    changes: Laplace with scale one period (resolution_s is ln(20) periods), so
    ln(1/(2p)) periods; its tail is heavier than a normal's (scaling resolution_s as a
    normal sigma puts the 99.9% bound at 4.7 periods, which the error passes 0.44% of
    the time). Sample counts: the Poisson count noise, normal. timed_by may carry a
    suffix (a restore's ", N episodes")."""
    if not 0 < p < 0.5:
        raise ValueError(f"p={p}: a one-sided tail probability in (0, 0.5)")
    if timed_by.startswith(TIMED_BY_CHANGES):
        return resolution_s * math.log(0.5 / p) / CHANGE_EDGES_95
    normal = NormalDist()
    return resolution_s * normal.inv_cdf(1 - p) / normal.inv_cdf(0.975)


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
    resolution_s: timed by sample counts: period_s + 2*sqrt(samples)*period_s (Poisson
        count noise of its samples) + py-spy's worst reported lag in its windows; timed
        by stack changes: ln(20)*timing_period_s (95% of the difference of two edge
        lags, each exponential with mean timing_period_s) + the worst lag, plus, when
        its edges are in different windows, how far each window's stack-change clock
        may be off the host's (WindowReport.changes_clock_s).
    timed_by: "stack changes" when both edges came from the stack-change run (see the
        module docstring), else "sample counts".
    unknown_s: unobserved time inside the episode (gaps between windows it was
        joined across).
    edge_unknown_s: unobserved time right before its start or after its end (it began
        or ended in a gap between windows): the true duration may be this much longer.
    truncated: sampling started or stopped while it ran (wall_s is a lower bound).
    durability_s: time its samples spent in durability calls (fsync, replace...).
    prepared_s: time its thread spent right before it in the same call of the job's own
        save function, calling no serializer (the module docstring); not in wall_s.
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
    timed_by: str = "sample counts"  # or "stack changes"
    timing_period_s: float | None = None  # the stack-change run's tick period
    clock_s: float = 0.0  # part of resolution_s: its edges' py-spy clocks against the host
    # how much earlier than the host's its edges' times may be (a stack-change run's ts 0
    # is taken as its spawn, and py-spy starts later: WindowReport.changes_clock_s); a
    # duration within one window does not see it, a match against host-clock events does
    host_lag_s: float = 0.0
    # encode / decode when every one of its samples said so, else unknown (a checkpoint
    # matches encode episodes and a restore decode ones: profiler/attribution/checkpoints.py)
    direction: str = "unknown"
    prepared_s: float = 0.0


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
    """Per thread, the CPU-carrying samples of one window as sorted times + prefix sums
    (with `count`, each sample counts 1 instead of its CPU)."""

    def __init__(self, labels: Iterable[TimedLabel], *, count: bool = False) -> None:
        grouped: dict[_Key, list[tuple[float, float]]] = {}
        for lab in labels:
            grouped.setdefault(_key(lab), []).append((lab.t, 1.0 if count else lab.cpu_s))
        self._by: dict[_Key, tuple[list[float], list[float]]] = {}
        for key, pairs in grouped.items():
            pairs.sort()
            prefix = [0.0]
            for _t, c in pairs:
                prefix.append(prefix[-1] + c)
            self._by[key] = ([t for t, _ in pairs], prefix)

    def between(self, key: _Key, lo: float, hi: float) -> float:
        """CPU (or count) of the thread's samples with lo <= t < hi."""
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
    pending_samples: float = 0.0  # --idle samples after the last cell (stack-change cells)
    # cells from the stack-change run in every window it touched; the period of that run
    # and how far its clock may be off the host's in the windows of its start and end
    timed_by_changes: bool = False
    changes_period: float = 0.0
    start_clock: float = 0.0
    end_clock: float = 0.0
    # the thread's cumulative CPU (s) at its start and its last edge, when measured
    cpu_at_start: float | None = None
    cpu_at_end: float | None = None
    directions: set[str] = field(default_factory=set)  # of its own cells
    prepared_s: float = 0.0  # its save function's preparation right before it

    def take_cpu(self, cpu: _CpuIndex, ticks: _CpuIndex | None, lo: float, hi: float) -> None:
        """The thread's CPU (and, for stack-change cells, its --idle samples) in [lo, hi)."""
        self.cpu_s += cpu.between(self.key, lo, hi)
        if ticks is not None:
            self.samples += round(ticks.between(self.key, lo, hi))

    def tolerance(self) -> float:
        # GAP_TICKS whole ticks; the half tick absorbs float error in the cell edges
        return (GAP_TICKS + 0.5) * self.period


def _cumulative_cpu(report: WindowReport, key: _Key, t: float) -> float | None:
    """The thread's cumulative CPU seconds at `t` from the window's polls (clamped to
    them); None when the window has none for it."""
    has_tid, tid = key
    points = report.thread_cpu_s.get(tid) if has_tid else None
    if not points:
        return None
    t = min(max(t, points[0][0]), points[-1][0])
    return interpolate(points, t)


_Cell = tuple[float, float, TimedLabel]  # [a, b): where the thread was, and what it was


def _cells(
    report: WindowReport, period: float
) -> tuple[dict[_Key, list[_Cell]], dict[_Key, tuple[float, float]]]:
    """Per thread, its window as cells in time order; and, for threads timed by the
    stack-change run, that run's [first tick, end].

    A sample of the timeline stands for its tick's cell (t +/- period/2); a stack change
    holds from its time until the thread's next change or the end of that run. A
    thread the stack-change run saw is timed by it; others by their samples."""
    cells: dict[_Key, list[_Cell]] = {}
    timed: dict[_Key, tuple[float, float]] = {}
    if report.changes:
        begin = min(lab.t for lab in report.changes)
        end = max(report.changes_end, max(lab.t for lab in report.changes))
        by_thread: dict[_Key, list[TimedLabel]] = {}
        for lab in sorted(report.changes, key=lambda lab: lab.t):
            by_thread.setdefault(_key(lab), []).append(lab)
        for key, labs in by_thread.items():
            nexts = [lab.t for lab in labs[1:]] + [end]
            cells[key] = [(lab.t, b, lab) for lab, b in zip(labs, nexts, strict=True)]
            timed[key] = (begin, end)
    for lab in sorted(report.timeline, key=lambda lab: lab.t):
        key = _key(lab)
        if key not in timed:
            cells.setdefault(key, []).append((lab.t - period / 2, lab.t + period / 2, lab))
    return cells, timed


@dataclass
class _Target:
    started_at: float
    ended_at: float
    open: dict[_Key, _Open]
    # where the last window's observation ended for threads timed by stack changes
    # (that run's end), else its ended_at
    changes_end: float | None = None
    # a save function's preparation still running at the last window's end, per thread
    prep: dict[_Key, tuple[str, float, float]] = field(default_factory=dict)


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
        pid = report.pid
        period = period_s(report)
        target = self._targets.get(pid)
        closed: list[Episode] = []
        first = target is None
        gap = 0.0
        cells, timed = _cells(report, period)
        changes_gap = 0.0  # unobserved time before this window, for stack-change threads
        if target is None:
            target = self._targets[pid] = _Target(report.started_at, report.ended_at, {})
        else:
            gap, changes_gap = self._carry_over(target, report, timed, closed)
        target.changes_end = max((e for _, e in timed.values()), default=None)
        walk = _WindowWalk(
            self, report, self._seq, target, timed, period, first=first, gap=gap,
            changes_gap=changes_gap,
        )  # fmt: skip
        carried_preps, target.prep = target.prep, {}
        cursors = {
            key: walk.thread(key, thread_cells, carried_preps.get(key))
            for key, thread_cells in cells.items()
        }
        walk.rest_of_window(cursors)
        finishing = walk.finishing
        for ep in finishing:
            if ep.hit_window == walk.seq:
                walk.stamp_end(ep)
        exiting: set[int] = set()
        if report.exited:
            # the process ended: its episodes ended with it (where the samples stop); one
            # timed by stack changes still in its codepath at the last change was not seen
            # to end (that cell holds to the run's end, however long after the process
            # left it), so it is truncated like one sampling stopped in
            exiting = {
                id(ep) for ep in target.open.values() if ep.touches_end and ep.timed_by_changes
            }
            finishing.extend(target.open.values())
            del self._targets[pid]
        closed.extend(self._close(ep, truncated_end=id(ep) in exiting) for ep in finishing)
        closed.sort(key=lambda e: (e.end, e.thread))
        return closed

    def _carry_over(
        self,
        target: _Target,
        report: WindowReport,
        timed: Mapping[_Key, tuple[float, float]],
        closed: list[Episode],
    ) -> tuple[float, float]:
        """The episodes the target's last window left open, across the unobserved gap
        before this one: those the gap ends go into `closed`, the others count it. Returns
        (the gap, the gap of the stack-change run's threads)."""
        if report.started_at < target.started_at:
            raise ValueError(
                f"window of pid {report.pid} starting at {report.started_at:.3f} came after "
                f"one starting at {target.started_at:.3f}: EpisodeTracker.add takes each "
                "target's windows in time order"
            )
        gap = max(0.0, report.started_at - target.ended_at)
        changes_gap = 0.0
        if timed:
            seen_until = target.changes_end if target.changes_end is not None else target.ended_at
            changes_gap = max(0.0, min(b for b, _ in timed.values()) - seen_until)
        for key, carried in list(target.open.items()):
            unseen = changes_gap if key in timed else gap
            carried.pending_unknown_s += unseen
            # one that had already left its codepath counts the gap as missing ticks
            left = not carried.touches_end
            if gap > self.max_join_gap_s or (left and carried.gap_s + unseen > carried.tolerance()):
                closed.append(self._close(carried))
                del target.open[key]
            elif left:
                carried.gap_s += unseen
        target.started_at, target.ended_at = report.started_at, report.ended_at
        return gap, changes_gap

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
    def _take(ep: _Open, label: TimedLabel, width_s: float, *, sample: bool) -> None:
        """A cell of the episode's own (or its tail's): `sample` when it is one sample."""
        if sample:
            ep.samples += 1
        if label.codepath == ep.codepath:  # a durability tail (`other`) says no direction
            ep.directions.add(label.direction)
        if label.durability:
            ep.durability_s += width_s
            if label.durability == _SYNC:
                ep.durable = True

    @staticmethod
    def _close(ep: _Open, *, end_unknown: float = 0.0, truncated_end: bool = False) -> Episode:
        if ep.touches_end and end_unknown == 0.0:
            end_unknown = ep.pending_unknown_s
        has_tid, thread = ep.key
        start, end = ep.start, ep.last_edge
        resolution = ep.period * (1.0 + 2.0 * math.sqrt(ep.samples)) + ep.lag
        timed_by, timing_period, clock = "sample counts", None, 0.0
        if ep.timed_by_changes and ep.changes_period > 0:
            if ep.window != ep.hit_window:
                # edges on two py-spy runs' clocks: each run's offset to the host clock
                clock = ep.start_clock + ep.end_clock
            resolution = CHANGE_EDGES_95 * ep.changes_period + ep.lag + clock
            timed_by, timing_period = TIMED_BY_CHANGES, ep.changes_period
        cpu_s = ep.cpu_s
        if ep.timed_by_changes and ep.cpu_at_start is not None and ep.cpu_at_end is not None:
            # edges from the stack-change run, samples timed only to sqrt(n) periods: the
            # thread's own measured CPU between the edges, not the samples' inside them
            cpu_s = max(0.0, ep.cpu_at_end - ep.cpu_at_start)
        return Episode(
            pid=ep.pid,
            thread=thread,
            codepath=ep.codepath,
            start=start,
            end=end,
            wall_s=end - start,
            period_s=ep.period,
            resolution_s=resolution,
            cpu_s=cpu_s,
            main_thread=(thread == ep.pid) if has_tid else None,
            durable=ep.durable,
            unknown_s=ep.unknown_s,
            edge_unknown_s=ep.edge_unknown_start + end_unknown,
            truncated=ep.truncated_start or truncated_end,
            durability_s=ep.durability_s,
            samples=ep.samples,
            timed_by=timed_by,
            timing_period_s=timing_period,
            clock_s=clock,
            host_lag_s=max(ep.start_clock, ep.end_clock) if timed_by == TIMED_BY_CHANGES else 0.0,
            direction=next(iter(ep.directions)) if len(ep.directions) == 1 else "unknown",
            prepared_s=ep.prepared_s,
        )


class _WindowWalk:
    """One window's pass over its target's threads (EpisodeTracker.add): it extends the
    episodes left open, opens new ones and closes those that end; `finishing` holds the
    ones it closed, each with this window's part of its figures taken."""

    def __init__(
        self,
        tracker: EpisodeTracker,
        report: WindowReport,
        seq: int,
        target: _Target,
        timed: Mapping[_Key, tuple[float, float]],
        period: float,
        *,
        first: bool,
        gap: float,
        changes_gap: float,
    ) -> None:
        self.tracker, self.report, self.seq, self.target = tracker, report, seq, target
        self.timed, self.period = timed, period
        self.first, self.gap, self.changes_gap = first, gap, changes_gap
        self.lag = max(0.0, report.errors.behind_s)
        self.cpu = _CpuIndex(report.cpu_timeline or report.timeline)
        # stack-change cells are not samples: an episode's samples are then counted here
        self.ticks = _CpuIndex(report.timeline, count=True) if timed else None
        self.gap_limit = (GAP_TICKS + 0.5) * period  # as _Open.tolerance, for a preparation
        self.finishing: list[_Open] = []  # closed in this window

    def took(self, ep: _Open, lo: float, hi: float) -> None:
        ep.take_cpu(self.cpu, self.ticks if ep.key in self.timed else None, lo, hi)

    def took_last(self, ep: _Open) -> None:
        """What this window, the one of its last cell, adds to the episode's figures."""
        self.took(ep, ep.start if ep.window == self.seq else -math.inf, ep.last_edge)
        timed_here = ep.key in self.timed
        ep.cpu_at_end = _cumulative_cpu(self.report, ep.key, ep.last_edge) if timed_here else None

    def close(self, ep: _Open) -> None:
        if ep.hit_window == self.seq:
            self.took_last(ep)
        self.finishing.append(ep)

    def stamp_end(self, ep: _Open) -> None:
        """The stack-change clock and period of the window an episode last ran in."""
        ep.end_clock = self.report.changes_clock_s if ep.key in self.timed else 0.0
        ep.changes_period = max(ep.changes_period, self.report.changes_period_s)

    def thread(
        self,
        key: _Key,
        thread_cells: Sequence[_Cell],
        carried_prep: tuple[str, float, float] | None,
    ) -> float:
        """One thread's cells in order; returns its cursor (everything before it is
        accounted for). `carried_prep`: the preparation the last window ended in."""
        report, target, period = self.report, self.target, self.period
        by_changes = key in self.timed
        begin, end = self.timed[key] if by_changes else (report.started_at, report.ended_at)
        cur: _Open | None = target.open.pop(key, None)
        if cur is not None:
            cur.timed_by_changes = cur.timed_by_changes and by_changes
        cursor = begin  # everything before it is accounted for
        # the run of `other` cells in one save function call just before: (its key,
        # first cell start, last cell end)
        prep: tuple[str, float, float] | None = None
        joined_from: float | None = None
        if carried_prep is not None and not self.first and self.gap <= self.tracker.max_join_gap_s:
            # it ran to the last window's end: joined across the gap, as an episode
            # is (the gap counts in it, unobserved)
            prep = (carried_prep[0], carried_prep[1], begin)
            joined_from = carried_prep[1]
        for a, b, lab in thread_cells:
            seen = max(0.0, a - cursor)  # time without a sample of this thread
            if lab.codepath != _OTHER or not lab.saver:
                prepared = prep if lab.codepath != _OTHER else None
                prep = None
            elif prep is not None and prep[0] == lab.saver and a - prep[2] <= self.gap_limit:
                prep = prepared = (prep[0], prep[1], b)
            else:
                prep = prepared = (lab.saver, a, b)
            if cur is not None:
                cur, outcome = self._follow(cur, lab, a, b, seen, by_changes)
                if outcome is not None:
                    cursor = b
                    if outcome == "extended":
                        prep = None  # the episode's own (or its tail's)
                    continue
            if lab.codepath != _OTHER:
                cur = self._open(key, lab, a, b, prepared, joined_from, begin, by_changes)
            cursor = b
        if cur is not None:
            target.open[key] = cur
        elif prep is not None and end - prep[2] < period / 2:
            target.prep[key] = prep
        return cursor

    def _follow(
        self, cur: _Open, lab: TimedLabel, a: float, b: float, seen: float, by_changes: bool
    ) -> tuple[_Open | None, str | None]:
        """The open episode `cur` against the thread's next cell [a, b): ("extended": the
        cell is the episode's; "gap": an `other` cell it may still outlast; None: it
        ended before the cell, which is then free), with the episode or None once closed."""
        same = lab.codepath == cur.codepath
        takes_tail = cur.codepath in self.tracker.tail_codepaths
        tail = lab.codepath == _OTHER and lab.durability != "" and takes_tail
        # how long a gap a durability tail may still end (GAP_TICKS for others)
        tail_limit = (
            max(cur.tolerance(), TAIL_GAP_S, TAIL_GAP_SHARE * (cur.last_edge - cur.start))
            if takes_tail
            else cur.tolerance()
        )
        if same or tail:
            if cur.gap_s + seen <= (tail_limit if tail else cur.tolerance()):
                cur.unknown_s += cur.pending_unknown_s
                cur.cpu_s += cur.pending_cpu_s
                cur.samples += round(cur.pending_samples)
                cur.pending_unknown_s = cur.pending_cpu_s = cur.gap_s = 0.0
                cur.pending_samples = 0
                cur.touches_end = False
                cur.last_edge = b
                cur.period = max(cur.period, self.period)
                cur.lag = max(cur.lag, self.lag)
                cur.hit_window = self.seq
                self.tracker._take(cur, lab, b - a, sample=not by_changes)
                return cur, "extended"
            self.close(cur)
            return None, None
        if lab.codepath != _OTHER:
            self.close(cur)
            return None, None
        cur.gap_s += seen + (b - a)
        # past GAP_TICKS only a durability tail may still continue it
        if cur.gap_s > tail_limit:
            self.close(cur)
            return None, "gap"
        return cur, "gap"

    def _open(
        self,
        key: _Key,
        lab: TimedLabel,
        a: float,
        b: float,
        prepared: tuple[str, float, float] | None,
        joined_from: float | None,
        begin: float,
        by_changes: bool,
    ) -> _Open:
        """A new episode at the cell [a, b), with the preparation just before it, if any."""
        report = self.report
        first_edge = a
        if prepared is not None and prepared[0] == lab.saver and a - prepared[2] <= self.gap_limit:
            first_edge = prepared[1]
        cur = _Open(
            pid=report.pid,
            key=key,
            codepath=lab.codepath,
            start=a,
            last_edge=b,
            period=self.period,
            lag=self.lag,
            window=self.seq,
            hit_window=self.seq,
            timed_by_changes=by_changes,
            start_clock=report.changes_clock_s if by_changes else 0.0,
            cpu_at_start=_cumulative_cpu(report, key, a) if by_changes else None,
            prepared_s=a - first_edge,
        )
        if first_edge != joined_from and first_edge - begin < self.period / 2:
            # its first sample is the window's first tick: it may have begun
            # earlier (a preparation joined from the window before did not)
            if self.first:
                cur.truncated_start = True
            else:
                cur.edge_unknown_start = self.changes_gap if by_changes else self.gap
        self.tracker._take(cur, lab, b - a, sample=not by_changes)
        return cur

    def rest_of_window(self, cursors: Mapping[_Key, float]) -> None:
        """The rest of the window: open episodes whose thread sampled nothing more."""
        report, target = self.report, self.target
        for key, ep in list(target.open.items()):
            begin, end = self.timed.get(key, (report.started_at, report.ended_at))
            ep.gap_s += max(0.0, end - cursors.get(key, begin))
            if ep.gap_s > ep.tolerance():
                del target.open[key]
                self.close(ep)
                continue
            ep.touches_end = ep.gap_s < ep.period / 2
            counted = self.ticks if key in self.timed else None
            if ep.hit_window == self.seq:
                self.stamp_end(ep)
                self.took_last(ep)
                ep.pending_cpu_s = self.cpu.between(key, ep.last_edge, math.inf)
                ep.pending_samples = counted.between(key, ep.last_edge, math.inf) if counted else 0
            else:
                ep.pending_cpu_s += self.cpu.between(key, -math.inf, math.inf)
                if counted is not None:
                    ep.pending_samples += counted.between(key, -math.inf, math.inf)


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
