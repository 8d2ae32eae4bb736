"""CPU weighting: turning classified samples into CPU seconds (pure functions).

Samples are not CPU seconds. A sample says where a thread *was*; /proc says how
much CPU each thread *used*. The model, per window and per thread:

    cpu_s(sample i) = delta_cpu_s(thread) * w_i / sum_j w_j     (j over the thread's samples)

`delta_cpu_s(thread)` is the thread's measured CPU delta over the window
(collectors.procstat: schedstat ns when live, else utime+stime ticks). `w_i` is the
expected part of the time sample i stands for that the thread spent running, read
from the thread's cumulative CPU (and run-queue wait) series, polled every `poll_s`
during the window (`CpuSeries`):

- **On-CPU samples** (a second py-spy run without --idle, which drops a thread whose
  /proc state is not R) stand for *runnable* time: running, or waiting in a run
  queue for a CPU. State R covers both, so on a busy node a thread's on-CPU samples
  follow its runnable time, not its CPU. Per thread, schedstat gives CPU C and
  run-queue wait D; the part of a sample's runnable time that was running is
  C / (C + D) over [t_i - h, t_i + h] (`CpuSeries.running_fraction`). That is the
  weight, everywhere: compute preempted by an OpenMP thread (a high D) weighs less
  than a checkpoint that ran alone on a CPU (D ~ 0). speedscope gives an on-CPU
  run's samples no times of their own (a thread that was not always R has fewer
  samples than ticks), so a thread's on-CPU samples are placed at the quantiles of
  its cumulative runnable time C + D (`runnable_times`): they are a Poisson sampling
  of exactly that time. Placed so, a sample's time is still off by ~0.1 s (the
  sqrt(n) of its rank), so near a phase edge C / (C + D) mixes both phases and pulls
  every weight toward the mean. When the window has a stack-change run (profile's
  timing run: every change of a thread's stack stamped to a tick), each sample is
  moved into the nearest span where its thread was in the sample's codepath, and
  C / (C + D) is taken over that span only (`Phases`).
- **Wake-up waits at blocking lines.** After a wakeup a thread waits in the run
  queue at the line it blocked on (the sleep, the queue get), so when a thread
  alternates work and sleep faster than the poll, the local fraction cannot tell the
  two apart. The --idle run shows where the thread was blocked: a leaf line whose
  wall time (its --idle samples) exceeds its R-state time (its on-CPU samples) by
  more than twice the Poisson noise of the --idle count is a blocking line, blocked
  for the difference. A thread waits once after every switch-out: after a voluntary
  one (it blocked) the wait is a wake-up wait at a blocking line, after an
  involuntary one (preempted) it is at whatever line ran. /proc counts both, so the
  wake-up part of the window's wait D is D x voluntary / (voluntary + involuntary)
  switches (the same mean wait after either kind is assumed). That part goes to the
  blocking lines, in proportion to their blocked time, at most each line's R-state
  time (a sample there keeps the rest of its weight). Then every on-CPU sample's
  weight is multiplied by C / (C + q D) over [t_i - h, t_i + h], q the part of D the
  blocking lines did not take (preemption, and what they could not hold), so no
  wait is removed twice; with no blocking line and a stationary wait every weight is
  equal (q = 1: the C / (C + D) above). A thread that sleeps at a barrier inside
  compute (an OpenMP join) has a "blocking line" that also runs: the switch counts
  keep its preemption waits off that line. Without schedstat (no D) every on-CPU
  weight is 1.
- **--idle samples** (threads with CPU but no on-CPU sample: py-spy knows no kernel
  tid before Python 3.11, or `--no-on-cpu-run`) stand for wall time: the weight is
  the thread's CPU utilisation (0..1) over [t_i - h, t_i + h]. A thread that slept
  the whole window gives its samples ~0 CPU no matter how many there are; a thread
  that alternated pickling and sleeping in phases longer than h gives its CPU to the
  pickling samples.

A sample that is one look at a thread while it ran (on-CPU samples) is what makes
threads sharing the GIL come out right: a thread waiting for the GIL is off-CPU at
whatever Python line it waits on (often a function entry such as json.dumps), and
only on-CPU samples exclude those moments.

If every w_i of a thread is 0 while its delta > 0 (usage too short to show in the
series), the delta falls back to uniform so no measured CPU is dropped.

A live kernel thread that no sample maps to (native threads: OpenMP, CUDA, NCCL
helpers; a Python thread py-spy could not map) keeps its CPU as its own: it is the
`unmapped threads` row (`Weighting.unsampled_per_tid_s`), counted in `other`, and
never spread over other threads' samples (OpenMP workers' CPU once went to a
checkpoint's short-lived hashing thread that way, 5x its truth). Samples of threads
with no live CPU count (a thread that started and exited inside the window, or one
py-spy knows no tid of) share only the CPU of the threads that exited during the
window (`exited_cpu_s`: the process's CPU, which keeps an exited thread's, less its
live threads'); what no such sample takes stays in the row as exited threads' CPU.

Wall seconds per codepath = samples x (window wall time / ticks): time some thread
spent there, counted per thread (two threads in pickle for 1 s give 2 s).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from serwatt.collectors.samples import Sample
from serwatt.profiler.classify.codepaths import CODEPATHS, Classification
from serwatt.profiler.classify.direction import DIRECTIONS, UNKNOWN
from serwatt.profiler.sampling.window import CodepathWindow, DirectionWindow


def _interp(t: Sequence[float], v: Sequence[float], when: float) -> float:
    """v at `when`, linearly interpolated between the points, clamped to the ends."""
    if not t:
        return 0.0
    if when <= t[0]:
        return v[0]
    if when >= t[-1]:
        return v[-1]
    i = bisect.bisect_right(t, when)
    t0, t1 = t[i - 1], t[i]
    if t1 <= t0:
        return v[i]
    return v[i - 1] + (v[i] - v[i - 1]) * (when - t0) / (t1 - t0)


@dataclass(frozen=True)
class CpuSeries:
    """Cumulative CPU seconds of one thread at host times (ascending), and its
    cumulative run-queue wait seconds at the same times when schedstat gives them."""

    t: tuple[float, ...]
    cpu_s: tuple[float, ...]
    wait_s: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.cpu_s) != len(self.t) or (
            self.wait_s is not None and len(self.wait_s) != len(self.t)
        ):
            raise ValueError("a CpuSeries needs one value per time")

    def at(self, when: float) -> float:
        """Cumulative CPU at `when`, linearly interpolated, clamped to the ends."""
        return _interp(self.t, self.cpu_s, when)

    def runnable_at(self, when: float) -> float:
        """Cumulative runnable time (CPU + run-queue wait) at `when`."""
        wait = _interp(self.t, self.wait_s, when) if self.wait_s is not None else 0.0
        return self.at(when) + wait

    def _clip(self, lo: float, hi: float) -> tuple[float, float]:
        if self.t:
            lo, hi = max(lo, self.t[0]), min(hi, self.t[-1])
        return lo, hi

    def utilisation(self, when: float, half_width_s: float) -> float:
        """CPU per wall second (0..1) over [when - h, when + h]."""
        lo, hi = self._clip(when - half_width_s, when + half_width_s)
        if hi <= lo:
            return 0.0
        return min(1.0, max(0.0, (self.at(hi) - self.at(lo)) / (hi - lo)))

    def running_fraction(
        self,
        when: float,
        half_width_s: float,
        *,
        wait_part: float = 1.0,
        within: tuple[float, float] | None = None,
    ) -> float | None:
        """CPU / (CPU + wait_part x run-queue wait) over [when - h, when + h] (cut to
        `within` when that leaves a span): the part of the thread's runnable time that it
        ran (wait_part: the part of the wait that counts here). None without wait data
        or runnable time."""
        if self.wait_s is None:
            return None
        lo, hi = when - half_width_s, when + half_width_s
        if within is not None and max(lo, within[0]) < min(hi, within[1]):
            lo, hi = max(lo, within[0]), min(hi, within[1])
        lo, hi = self._clip(lo, hi)
        if hi <= lo:
            return None
        cpu = max(0.0, self.at(hi) - self.at(lo))
        wait = max(0.0, _interp(self.t, self.wait_s, hi) - _interp(self.t, self.wait_s, lo))
        runnable = cpu + wait_part * wait
        if runnable <= 0:
            return None
        return cpu / runnable


def runnable_times(n: int, series: CpuSeries, start: float, end: float) -> list[float] | None:
    """Host times of a thread's n on-CPU samples over [start, end]: the k-th at the
    (k + 0.5)/n quantile of its cumulative runnable time. None when the series shows
    no runnable time in the span (keep the sampler's own times)."""
    if n <= 0 or end <= start or len(series.t) < 2:
        return None
    inner = [t for t in series.t if start < t < end]
    ts = [start, *inner, end]
    rs = [series.runnable_at(t) for t in ts]
    for i in range(1, len(rs)):  # a hostile or wrapped counter must not run backwards
        rs[i] = max(rs[i], rs[i - 1])
    total = rs[-1] - rs[0]
    if total <= 0:
        return None
    out: list[float] = []
    j = 1
    for k in range(n):
        target = rs[0] + total * (k + 0.5) / n
        while j < len(rs) - 1 and rs[j] < target:
            j += 1
        r0, r1 = rs[j - 1], rs[j]
        t0, t1 = ts[j - 1], ts[j]
        out.append(t1 if r1 <= r0 else t0 + (t1 - t0) * (target - r0) / (r1 - r0))
    return out


@dataclass(frozen=True)
class Phases:
    """One thread's codepath from instant to instant, from the stack-change run (every
    change stamped to a tick): the spans where each codepath was on the thread's stack."""

    spans: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]]  # codepath -> (starts, ends)

    @classmethod
    def from_changes(cls, changes: Sequence[tuple[float, str]], end: float) -> Phases:
        """changes: (host time, codepath) at each change of the thread's stack, in time
        order; the last holds until `end`."""
        starts: dict[str, list[float]] = {}
        ends: dict[str, list[float]] = {}
        current: tuple[float, str] | None = None
        for t, cp in [*changes, (end, "")]:
            if current is not None and (cp != current[1] or t >= end):
                if t > current[0]:
                    starts.setdefault(current[1], []).append(current[0])
                    ends.setdefault(current[1], []).append(min(t, end))
                current = None
            if current is None and t < end:
                current = (t, cp)
        return cls({cp: (tuple(starts[cp]), tuple(ends[cp])) for cp in starts})

    def place(self, when: float, codepath: str, max_shift_s: float) -> tuple[float, float, float]:
        """(time, span start, span end): `when` if it falls in a span of `codepath`, else
        the nearest edge of one within max_shift_s; (when, -inf, inf) when none is."""
        starts, ends = self.spans.get(codepath, ((), ()))
        i = bisect.bisect_right(starts, when) - 1
        if i >= 0 and when < ends[i]:
            return when, starts[i], ends[i]
        best = (when, -math.inf, math.inf)
        gap = max_shift_s
        if i >= 0 and when - ends[i] <= gap:  # the span before ended just before
            gap = when - ends[i]
            best = (ends[i], starts[i], ends[i])
        if i + 1 < len(starts) and starts[i + 1] - when <= gap:
            best = (starts[i + 1], starts[i + 1], ends[i + 1])
        return best


@dataclass(frozen=True)
class Weighting:
    cpu_s: tuple[float, ...]  # per sample, aligned with the input samples
    exited_pool_s: float  # CPU of exited threads given to samples without a live CPU count
    # live threads with CPU and no sample (the `unmapped threads` row): tid -> cpu_s
    unsampled_per_tid_s: Mapping[int, float]
    exited_unsampled_s: float  # CPU of exited threads that no sample could take

    @property
    def unsampled_cpu_s(self) -> float:
        """Measured CPU no sample took (it goes to `other`)."""
        return sum(self.unsampled_per_tid_s.values()) + self.exited_unsampled_s


@dataclass(frozen=True)
class RunqueueWeights:
    """What `runqueue_weights` gives per on-CPU sample, and the wait it accounted for."""

    weights: tuple[float, ...]  # the running part (0..1) of the runnable time each stands for
    times: tuple[float, ...]  # each sample's host time (placed on runnable time)
    blocking_s: float  # run-queue wait taken off blocking lines (wake-up waits)
    preemption_s: float  # run-queue wait taken off the other samples, by local wait


def _leaf_line(s: Sample) -> tuple[str, int] | None:
    return (s.frames[0].filename, s.frames[0].line) if s.frames else None


def _blocking_waits(
    lines: Mapping[tuple[str, int] | None, list[int]],
    idle_counts: Counter,
    wait_s: float,
    on_cpu_rate_hz: float,
    idle_rate_hz: float,
) -> dict[tuple[str, int] | None, float]:
    """Wake-up wait seconds per blocking line (module doc), at most its R-state time."""
    blocked: dict[tuple[str, int] | None, float] = {}
    for line, n_idle in idle_counts.items():
        r_s = len(lines.get(line, ())) / on_cpu_rate_hz
        b = n_idle / idle_rate_hz - r_s
        if line is not None and n_idle >= 2 and b > 2 * math.sqrt(n_idle) / idle_rate_hz:
            blocked[line] = b
    total_b = sum(blocked.values())
    out = {}
    for line, b in blocked.items():
        n = len(lines.get(line, ()))
        if n:
            out[line] = min(n / on_cpu_rate_hz, wait_s * b / total_b)
    return out


def runqueue_weights(
    on_cpu: Sequence[Sample],
    idle: Sequence[Sample],
    *,
    on_cpu_rate_hz: float,
    idle_rate_hz: float,
    wait_per_tid_s: Mapping[int, float],
    wakeup_share_per_tid: Mapping[int, float] | None = None,
    series: Mapping[int, CpuSeries] | None = None,
    span: tuple[float, float] | None = None,
    half_width_s: float = 0.1,
    phases: Mapping[int, Phases] | None = None,
    codepaths: Sequence[str] | None = None,
) -> RunqueueWeights:
    """Per on-CPU sample, the running part (0..1) of the runnable time it stands for,
    and its time (model in the module doc). wakeup_share_per_tid: the voluntary part
    of each thread's switch-outs, the most of its wait that blocking lines may take
    (a thread not in it: all). span: the window's [start, end] on the host clock,
    where a thread's on-CPU samples are placed on its runnable time (None, or a
    thread without a series: the samples keep their times). phases (per tid) with
    codepaths (aligned with on_cpu): a placed sample is moved into the nearest span
    where the thread was in the sample's codepath (at most 3 half-widths away), and
    its running part is taken over that span only, so no weight mixes two phases."""
    if codepaths is not None and len(codepaths) != len(on_cpu):
        raise ValueError("codepaths must align with on_cpu")
    out = [1.0] * len(on_cpu)
    times = [s.t for s in on_cpu]
    within: list[tuple[float, float] | None] = [None] * len(on_cpu)
    if on_cpu_rate_hz <= 0 or idle_rate_hz <= 0:
        return RunqueueWeights(tuple(out), tuple(times), 0.0, 0.0)
    by_tid: dict[int, list[int]] = {}
    for i, s in enumerate(on_cpu):
        if s.tid is not None:
            by_tid.setdefault(s.tid, []).append(i)
    idle_counts: dict[int, Counter] = {}
    for s in idle:
        if s.tid in by_tid:
            idle_counts.setdefault(s.tid, Counter())[_leaf_line(s)] += 1
    blocking = preemption = 0.0
    for tid, idx in by_tid.items():
        ser = series.get(tid) if series else None
        if ser is not None and span is not None:
            placed = runnable_times(len(idx), ser, *span)
            if placed is not None:
                for i, t in zip(idx, placed, strict=True):
                    times[i] = t
        ph = phases.get(tid) if phases else None
        if ph is not None and codepaths is not None:
            for i in idx:
                t, lo, hi = ph.place(times[i], codepaths[i], 3 * half_width_s)
                times[i] = t
                if math.isfinite(lo):
                    within[i] = (lo, hi)
        wait_s = wait_per_tid_s.get(tid, 0.0)
        if wait_s <= 0:
            continue
        lines: dict[tuple[str, int] | None, list[int]] = {}
        for i in idx:
            lines.setdefault(_leaf_line(on_cpu[i]), []).append(i)
        share = 1.0 if wakeup_share_per_tid is None else wakeup_share_per_tid.get(tid, 1.0)
        at_lines = _blocking_waits(
            lines,
            idle_counts.get(tid, Counter()),
            wait_s * min(1.0, max(0.0, share)),
            on_cpu_rate_hz,
            idle_rate_hz,
        )
        for line, d in at_lines.items():
            blocking += d
            for i in lines[line]:
                # d is at most the line's R-state time, but n/rate*rate/n can round past 1
                out[i] = max(0.0, 1.0 - d * on_cpu_rate_hz / len(lines[line]))
        if ser is None:
            continue  # no local wait data: the rest of the wait moves no share
        # every sample's runnable time also holds the part of the local wait that the
        # blocking lines did not take (preemption): the running part of the rest
        left = max(0.0, 1.0 - sum(at_lines.values()) / wait_s)
        for i in idx:
            f = ser.running_fraction(times[i], half_width_s, wait_part=left, within=within[i])
            if f is not None:
                preemption += out[i] * (1.0 - f) / on_cpu_rate_hz
                out[i] *= f
    return RunqueueWeights(tuple(out), tuple(times), blocking, preemption)


def distribute_cpu(
    samples: Sequence[Sample],
    cpu_per_tid_s: Mapping[int, float],
    *,
    exited_cpu_s: float = 0.0,
    series: Mapping[int, CpuSeries] | None = None,
    half_width_s: float = 0.25,
    prior: Sequence[float] | None = None,
    pool_prior: Sequence[float] | None = None,
) -> Weighting:
    """Each sample's share of its thread's measured CPU delta (model in the module doc).
    exited_cpu_s: CPU the window's exited threads used, which no live thread's delta
    holds; it goes only to samples whose thread has no live delta, by pool_prior.
    prior: per-sample weights (aligned with samples) for threads without a CPU series,
    e.g. `runqueue_weights`; None: 1 each. pool_prior: per-sample weights within the
    exited pool (aligned with samples: the running part of an on-CPU sample, 1 for
    others, whose units differ); None: 1 each."""
    if prior is not None and len(prior) != len(samples):
        raise ValueError("prior must align with samples")
    if pool_prior is not None and len(pool_prior) != len(samples):
        raise ValueError("pool_prior must align with samples")
    by_tid: dict[int | None, list[int]] = {}
    for i, s in enumerate(samples):
        tid = s.tid if (s.tid is not None and s.tid in cpu_per_tid_s) else None
        by_tid.setdefault(tid, []).append(i)
    out = [0.0] * len(samples)
    for tid, idx in by_tid.items():
        if tid is None:
            continue
        delta = cpu_per_tid_s[tid]
        if delta <= 0 or not idx:
            continue
        ser = series.get(tid) if series else None
        weights = [prior[i] for i in idx] if prior is not None else [1.0] * len(idx)
        if sum(weights) <= 0:
            weights = [1.0] * len(idx)
        if ser is not None and len(ser.t) >= 2:
            weights = [ser.utilisation(samples[i].t, half_width_s) for i in idx]
            if sum(weights) <= 0:
                weights = [1.0] * len(idx)
        total_w = sum(weights)
        for i, w in zip(idx, weights, strict=True):
            out[i] = delta * w / total_w
    unsampled = {t: v for t, v in cpu_per_tid_s.items() if t not in by_tid and v > 0}
    exited = max(0.0, exited_cpu_s)
    pool = 0.0
    unmapped = by_tid.get(None, [])
    if unmapped and exited > 0:
        # by each sample's running part (pool_prior), as a thread's own CPU is spread:
        # an exited thread's wake-up waits at its blocking lines take no more of the
        # pool than they would of its own CPU
        weights = [pool_prior[i] for i in unmapped] if pool_prior else [1.0] * len(unmapped)
        total_w = sum(weights)
        if total_w <= 0:
            weights, total_w = [1.0] * len(unmapped), float(len(unmapped))
        for i, w in zip(unmapped, weights, strict=True):
            out[i] = exited * w / total_w
        pool, exited = exited, 0.0
    return Weighting(
        cpu_s=tuple(out),
        exited_pool_s=pool,
        unsampled_per_tid_s=unsampled,
        exited_unsampled_s=exited,
    )


def codepath_windows(
    classifications: Sequence[Classification],
    cpu_s: Sequence[float],
    *,
    total_cpu_s: float,
    wall_s: float,
    ticks: int,
    cpu_classifications: Sequence[Classification] | None = None,
) -> dict[str, CodepathWindow]:
    """Aggregate per codepath; every codepath present; CPU no sample took goes to `other`.

    Samples, wall and low-confidence counts come from `classifications` (the --idle
    samples). CPU comes from `cpu_s` aligned with `cpu_classifications` when given
    (the samples that carried the CPU: on-CPU samples), else with `classifications`.
    The codepaths' cpu_s sum to `total_cpu_s` exactly (up to float rounding), so
    shares over the target's CPU sum to 1 with `other`.
    """
    cpu_labels = cpu_classifications if cpu_classifications is not None else classifications
    if len(cpu_labels) != len(cpu_s):
        raise ValueError("classifications and cpu_s must align")
    tick_s = wall_s / ticks if ticks > 0 else 0.0
    samples = dict.fromkeys(CODEPATHS, 0)
    cpu = dict.fromkeys(CODEPATHS, 0.0)
    low = dict.fromkeys(CODEPATHS, 0)
    for c in classifications:
        cp = c.codepath if c.codepath in samples else "other"
        samples[cp] += 1
        if c.low_confidence:
            low[cp] += 1
    for c, w in zip(cpu_labels, cpu_s, strict=True):
        cp = c.codepath if c.codepath in cpu else "other"
        cpu[cp] += w
    assigned = sum(cpu.values())
    unsampled = max(0.0, total_cpu_s - assigned)
    cpu["other"] += unsampled
    dir_samples = {cp: dict.fromkeys(DIRECTIONS, 0) for cp in CODEPATHS}
    dir_cpu = {cp: dict.fromkeys(DIRECTIONS, 0.0) for cp in CODEPATHS}
    for c in classifications:
        cp = c.codepath if c.codepath in samples else "other"
        dir_samples[cp][_direction_of(c)] += 1
    for c, w in zip(cpu_labels, cpu_s, strict=True):
        cp = c.codepath if c.codepath in cpu else "other"
        dir_cpu[cp][_direction_of(c)] += w
    dir_cpu["other"][UNKNOWN] += unsampled
    return {
        cp: CodepathWindow(
            samples=samples[cp],
            cpu_s=cpu[cp],
            wall_s=samples[cp] * tick_s,
            low_confidence_samples=low[cp],
            direction={d: DirectionWindow(dir_samples[cp][d], dir_cpu[cp][d]) for d in DIRECTIONS},
        )
        for cp in CODEPATHS
    }


def _direction_of(c: Classification) -> str:
    return c.direction if c.direction in DIRECTIONS else UNKNOWN
