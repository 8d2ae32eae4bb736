"""One sampling window of one target: py-spy + per-thread CPU + classification + weighting.

`sample_window` is the unit the profile session and the daemon both run:

1. CPU snapshot of every thread of the target (collectors.procstat, with context-switch
   counts), and a poller that keeps snapshotting every `plan.poll_s` during the window (a
   per-thread series of CPU and run-queue wait: it lets weighting give CPU to busy
   moments, not to sleeps, and to running, not to waiting for a CPU);
2. one py-spy window (collectors.pyspy: the runs a SamplingPlan names), samples timed on
   the host clock;
3. CPU snapshot after; a thread's CPU delta, run-queue wait and the voluntary share of
   its switches are measured from the first to the last snapshot;
4. each sample classified; each thread's CPU delta spread over its samples by the
   running part of the time each stands for (profiler.sampling.weighting); every
   codepath of CODEPATHS filled, plus the timeline.

A procfs that does not parse never crashes a window: threads whose files are odd are
left out and counted in the notes; a target none of whose threads parse is a
SamplingError naming the file.

Classification has a deadline per window (CLASSIFY_DEADLINE_S): a source file that is
not loaded by then (profiler/classify/source_cache.py loads files on threads of its own)
is not waited for; its samples are `other`, low confidence, and the report counts it
(`classify_errors`: "classify_timeout", "source_too_costly"), so no file a target
names can hold a sampling thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from serwatt.collectors import procstat
from serwatt.collectors.pyspy import PySpy, SamplingError, SamplingPlan, TargetGone, WindowSamples
from serwatt.collectors.pyspy.chrometrace import KernelClock, resolve_changes
from serwatt.collectors.samples import Sample, SamplerErrors
from serwatt.collectors.sched_timeline import TimelineCounters
from serwatt.profiler.classify.codepaths import Classification
from serwatt.profiler.classify.durability import DurabilityReader, reader_for
from serwatt.profiler.classify.saver import saver_call
from serwatt.profiler.classify.target_files import exited_root, is_exited_root, remember_creds
from serwatt.profiler.sampling.kernel_cpu import (
    CPU_SOURCE_ESTIMATE,
    CPU_SOURCE_KERNEL,
    on_cpu_times,
    on_cpu_weights,
    reused_tids,
)
from serwatt.profiler.sampling.kernel_window import start_timeline, timeline_notes
from serwatt.profiler.sampling.stacks import fold_stacks
from serwatt.profiler.sampling.weighting import (
    CpuSeries,
    Phases,
    RunqueueWeights,
    Weighting,
    codepath_windows,
    distribute_cpu,
    runqueue_weights,
)
from serwatt.profiler.sampling.window import TimedLabel, UnmappedThread, WindowReport

# The most one window's classification waits for source files to load, in all.
CLASSIFY_DEADLINE_S = 5.0

# The stack-change run that times episode edges samples this many times faster than
# the counted runs, up to a ceiling: at 4x, an episode's duration is within one sampling
# period 95% of the time (profiler/attribution/episodes.py). The ceiling bounds py-spy's
# cost, which grows with its rate (docs/daemon.md).
TIMING_RATE_FACTOR = 4.0
TIMING_RATE_MAX_HZ = 400.0


def default_timing_rate_hz(rate_hz: float) -> float:
    """The stack-change run's rate for counted runs at `rate_hz`."""
    return max(rate_hz, min(TIMING_RATE_FACTOR * rate_hz, TIMING_RATE_MAX_HZ))


def timing_rate_hz(requested_hz: float | None, rate_hz: float) -> float | None:
    """The stack-change run's rate from a `--timing-rate` value: None asks for the
    default at `rate_hz`, 0 for no such run (None)."""
    if requested_hz is None:
        return default_timing_rate_hz(rate_hz)
    return requested_hz if requested_hz > 0 else None


class ClassifierLike(Protocol):
    def classify(
        self, sample: Sample, *, proc_root: Path | None = None, deadline: float | None = None
    ) -> Classification: ...


class _CpuPoller:
    """Snapshots the target's threads every `poll_s` on a background thread."""

    def __init__(self, pid: int, procfs: Path, poll_s: float) -> None:
        self.pid = pid
        self.procfs = procfs
        self.poll_s = poll_s
        self.snapshots: list[procstat.CpuSnapshot] = []
        self.process_cpu_s: list[float | None] = []  # the process's CPU with each snapshot
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serwatt-cpu-poll", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                snap = procstat.snapshot(self.pid, self.procfs)
                self.process_cpu_s.append(_process_cpu_s(self.pid, self.procfs))
                self.snapshots.append(snap)
            except (procstat.ProcessGone, procstat.ProcfsCorrupt):
                return  # the window keeps the series so far; the last snapshot decides

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _series(snaps: list[procstat.CpuSnapshot], use_sched: bool) -> dict[int, CpuSeries]:
    """Per thread, its cumulative CPU (and, from schedstat, run-queue wait) at each
    snapshot."""
    per: dict[int, tuple[list[float], list[float], list[float]]] = {}
    for snap in snaps:
        for tid, th in snap.threads.items():
            if use_sched:
                v = (th.sched_ns or 0) / 1e9
            else:
                v = th.stat_ticks / procstat.CLOCK_TICKS_PER_S
            ts, cs, ws = per.setdefault(tid, ([], [], []))
            ts.append(snap.t)
            cs.append(v)
            ws.append((th.wait_ns or 0) / 1e9)
    return {
        tid: CpuSeries(tuple(ts), tuple(cs), tuple(ws) if use_sched else None)
        for tid, (ts, cs, ws) in per.items()
    }


@dataclass(frozen=True)
class RawWindow:
    """A window's measurements before classification (what must happen on time)."""

    pid: int
    rate_hz: float
    poll_s: float
    procfs: Path
    window: WindowSamples
    snapshots: tuple[procstat.CpuSnapshot, ...]
    cpu: procstat.ThreadCpuDelta
    exited: bool
    python: str | None
    # the process's CPU over the same snapshots (/proc/<pid>/stat, which keeps exited
    # threads' CPU); None when either read failed
    process_cpu_s: float | None = None
    # the scheduler timeline of the target's threads and of the stack-change run's
    # py-spy (plan.kernel_timeline), None when not asked for or not available, and why
    kernel: KernelClock | None = None
    kernel_counters: TimelineCounters | None = None
    kernel_problem: str | None = None


def collect_window(
    pid: int,
    *,
    duration_s: float,
    plan: SamplingPlan,
    pyspy: PySpy | None = None,
    procfs: Path = Path("/proc"),
    stop_event: threading.Event | None = None,
) -> RawWindow:
    """The time-critical half of a window: CPU snapshots every plan.poll_s around the
    py-spy runs `plan` names (collectors/pyspy/plan.py)."""
    spy = pyspy if pyspy is not None else PySpy()
    poll_s = plan.poll_s
    try:
        before = procstat.snapshot(pid, procfs, switches=True)
    except procstat.ProcessGone as exc:
        raise TargetGone(f"no such process: {pid} (it is not running)") from exc
    except procstat.ProcfsCorrupt as exc:
        raise SamplingError(f"cannot read the CPU time of process {pid}: {exc}") from exc
    process_before = _process_cpu_s(pid, procfs)
    # while it lives: its frames may be classified after it exits (target_files)
    remember_creds(str(procfs / str(pid) / "root"))
    python = procstat.python_version(pid, procfs)
    tracer, kernel_problem = start_timeline(pid, plan, procfs)
    epoch_minus_mono = time.time() - time.monotonic()
    poller = _CpuPoller(pid, procfs, poll_s)
    poller.start()
    try:
        if tracer is not None:
            window = spy.record_window(
                pid, duration_s=duration_s, plan=plan, stop_event=stop_event, procfs=procfs,
                on_spawn=tracer.add_pid,
            )  # fmt: skip
        else:
            window = spy.record_window(
                pid, duration_s=duration_s, plan=plan, stop_event=stop_event, procfs=procfs
            )
    finally:
        poller.stop()
        if tracer is not None:
            tracer.stop()
    kernel = None
    if tracer is not None:
        kernel = KernelClock(tracer.threads(), epoch_minus_mono)
    snaps = [before, *poller.snapshots]
    exited = window.exited
    # a target that exits mid-window has its CPU up to its last poll
    process_after = poller.process_cpu_s[-1] if poller.process_cpu_s else process_before
    try:
        snaps.append(procstat.snapshot(pid, procfs, switches=True))
        process_after = _process_cpu_s(pid, procfs)
    except procstat.ProcessGone:
        exited = True
    except procstat.ProcfsCorrupt:
        pass  # the CPU delta runs to the last snapshot that parsed
    cpu = procstat.delta(before, snaps[-1])
    process_cpu: float | None = None
    if process_before is not None and process_after is not None:
        process_cpu = max(0.0, process_after - process_before)
    return RawWindow(
        pid=pid,
        rate_hz=plan.rate_hz,
        poll_s=poll_s,
        procfs=procfs,
        window=window,
        snapshots=tuple(snaps),
        cpu=cpu,
        exited=exited,
        python=python,
        process_cpu_s=process_cpu,
        kernel=kernel,
        kernel_counters=tracer.counters() if tracer is not None else None,
        kernel_problem=kernel_problem,
    )


def _process_cpu_s(pid: int, procfs: Path) -> float | None:
    """The process's utime + stime (all its threads, exited ones included), or None."""
    try:
        st = procstat.ProcessFiles(pid, procfs).stat()
    except (procstat.ProcessGone, procstat.ProcessUnreadable, ValueError):
        return None
    return (st.utime_ticks + st.stime_ticks) / procstat.CLOCK_TICKS_PER_S


@dataclass(frozen=True)
class ExitedCpu:
    """CPU of the threads that exited during a window, which no live thread's delta holds."""

    # exited threads a snapshot saw and no sample names: their CPU up to their last sighting
    per_tid_s: dict[int, float]
    # the rest of the process's CPU (exited threads that samples name, threads no
    # snapshot saw): one pool for the samples of threads without a live CPU count
    pool_s: float
    # every exited thread a schedstat snapshot saw: its run-queue wait up to its last
    # sighting, so its on-CPU samples are weighed by their running part as a live
    # thread's are (a DataLoader's index-queue feeders exit at each epoch's end)
    wait_per_tid_s: dict[int, float] = field(default_factory=dict)


def exited_threads_cpu(raw: RawWindow, sampled_tids: Iterable[int | None]) -> ExitedCpu:
    """Exited threads' CPU. One that a snapshot saw and no sample names (an OpenMP worker
    exiting with the interpreter) keeps its own; the rest of the process's CPU less its
    threads' is one pool, not per thread: a thread that starts after another exited
    reuses its pthread_t, and py-spy, which keys threads by it, files the newer thread's
    samples under the older one's tid. The pool only when a thread is known to have gone
    (gone from the last snapshot, or sampled with a tid no snapshot kept): otherwise the
    difference is the two clocks' rounding (ticks against schedstat ns), not a thread."""
    if not raw.snapshots:
        return ExitedCpu({}, 0.0)
    first, last = raw.snapshots[0].threads, raw.snapshots[-1].threads
    sched = raw.cpu.source == "schedstat"

    def cpu(th: procstat.ThreadCpu) -> float:
        return (th.sched_ns or 0) / 1e9 if sched else th.stat_ticks / procstat.CLOCK_TICKS_PER_S

    latest = {tid: th for snap in raw.snapshots for tid, th in snap.threads.items()}
    sampled = set(sampled_tids)
    gone = [tid for tid in latest if tid not in last]
    per_tid = {
        tid: max(0.0, cpu(latest[tid]) - (cpu(first[tid]) if tid in first else 0.0))
        for tid in gone
        if tid not in sampled
    }
    wait: dict[int, float] = {}
    for tid in gone:
        last_ns = latest[tid].wait_ns
        if sched and last_ns is not None:
            first_ns = (first[tid].wait_ns or 0) if tid in first else 0
            wait[tid] = max(0, last_ns - first_ns) / 1e9
    pool = 0.0
    known_gone = bool(gone) or any(t is not None and t not in latest for t in sampled)
    if known_gone and raw.process_cpu_s is not None:
        pool = max(0.0, raw.process_cpu_s - raw.cpu.total_s - sum(per_tid.values()))
    return ExitedCpu(per_tid, pool, wait)


def unmapped_threads(raw: RawWindow, per_tid_s: Mapping[int, float]) -> tuple[UnmappedThread, ...]:
    """The live threads with CPU and no sample, named from their last snapshot."""
    names: dict[int, str] = {}
    for snap in raw.snapshots:
        for tid, th in snap.threads.items():
            names[tid] = th.comm
    return tuple(
        UnmappedThread(tid=tid, name=names.get(tid, ""), cpu_s=v)
        for tid, v in sorted(per_tid_s.items())
    )


def _classify_counts(classifier: ClassifierLike, durability: object) -> tuple[int, int]:
    """(lookups not waited for, files given up as too costly) so far."""
    stats = getattr(classifier, "stats", None)
    not_ready = getattr(stats, "sources_not_ready", 0) + getattr(durability, "not_ready", 0)
    return not_ready, getattr(stats, "sources_too_costly", 0)


@dataclass
class _Classified:
    """A window's samples with their classifications (finish_window's first step).

    carriers: the samples that carry CPU, in the order distribute_cpu weighs them: the
    on-CPU run's (the first n_on_cpu, when it ran), then --idle samples of threads it
    did not see, then (the last len(held_s)) stack changes of threads neither counted
    run caught, each weighted by the time it held."""

    window: WindowSamples  # the stack changes resolved
    proc_root: Path  # the target's root, or its exited_root (sources at host paths)
    durability: DurabilityReader
    deadline: float
    counts_before: tuple[int, int]
    labels: list[Classification]  # of window.samples
    carriers: list[Sample]
    carrier_labels: list[Classification]
    n_on_cpu: int
    on_cpu_tids: set[int | None]
    changes: tuple[TimedLabel, ...]
    held_s: list[float]
    uncounted_tids: set[int | None]
    # cpu_source "kernel": the carriers of the threads in kernel_tids are their stack
    # changes, weighed by kernel_cpu.on_cpu_weights (kernel_prior); the rest --idle samples
    kernel_prior: list[float] | None = None
    kernel_tids: set[int | None] = field(default_factory=set)


@dataclass(frozen=True)
class _Weighed:
    """Where the window's CPU went (finish_window's second step)."""

    thread_cpu_s: dict[int, tuple[tuple[float, float], ...]]
    rq: RunqueueWeights | None
    weighting: Weighting  # one CPU share per carrier
    total_cpu_s: float
    wall_s: float
    runqueue_wait_s: float = 0.0  # the window's threads' run-queue wait (schedstat)


def finish_window(
    raw: RawWindow,
    classifier: ClassifierLike,
    *,
    deadline_s: float | None = None,
    keep_stacks: bool = False,
) -> WindowReport:
    """The CPU-bound half: classify every sample, weight, build the timelines, and say in
    notes what the window could not see.

    deadline_s: how long classification may wait for source files (None:
    CLASSIFY_DEADLINE_S); what was not ready by then is counted in the report's
    `classify_errors`. keep_stacks: fold the classified stacks into the report's
    `stacks` (profiler/sampling/stacks.py; ~10 ms per 1000 samples), for a caller that
    exports them (`serwatt profile --pprof/--flamegraph`)."""
    deadline = time.monotonic() + (CLASSIFY_DEADLINE_S if deadline_s is None else deadline_s)
    got = _classify(raw, classifier, deadline)
    weighed = _weigh(raw, got)
    window = got.window
    timeline, cpu_timeline = _timelines(got, weighed)
    codepaths = codepath_windows(
        got.labels,
        weighed.weighting.cpu_s,
        total_cpu_s=weighed.total_cpu_s,
        wall_s=weighed.wall_s,
        ticks=window.ticks,
        cpu_classifications=got.carrier_labels,
    )
    errors, classify_errors = _notes(raw, got, weighed, classifier)
    stacks = (
        fold_stacks(window.samples, got.labels, got.carriers, got.carrier_labels,
                    weighed.weighting.cpu_s)
        if keep_stacks
        else {}
    )  # fmt: skip
    return WindowReport(
        pid=raw.pid,
        started_at=window.started_at,
        ended_at=window.ended_at,
        rate_hz=raw.rate_hz,
        cpu_s=weighed.total_cpu_s,
        codepaths=codepaths,
        timeline=timeline,
        errors=errors,
        python=raw.python,
        exited=raw.exited,
        cpu_timeline=cpu_timeline,
        timeline_period_s=weighed.wall_s / window.ticks if window.ticks > 0 else 0.0,
        classify_errors=classify_errors,
        changes=got.changes if window.changes is not None else None,
        changes_period_s=1.0 / window.changes_rate_hz if window.changes_rate_hz > 0 else 0.0,
        changes_end=window.changes_end,
        changes_clock_s=window.changes_clock_s,
        thread_cpu_s=weighed.thread_cpu_s,
        unmapped_threads=unmapped_threads(raw, weighed.weighting.unsampled_per_tid_s),
        exited_unsampled_cpu_s=weighed.weighting.exited_unsampled_s,
        stacks=stacks,
        cpu_source=CPU_SOURCE_KERNEL if got.kernel_prior is not None else CPU_SOURCE_ESTIMATE,
        runqueue_wait_s=weighed.runqueue_wait_s,
    )


def _classify(raw: RawWindow, classifier: ClassifierLike, deadline: float) -> _Classified:
    """Every sample of the window classified, and the samples that carry its CPU chosen.

    Sources are read inside the target's root (/proc/<pid>/root). That path dies with the
    target, a zombie's included, and the call-site rules still need its sources: a target
    gone is classified from the same paths on the host (right unless it lived in another
    mount namespace), and only what its credentials, remembered while it lived, would let
    it read (none remembered: nothing read; target_files.exited_root). One that exits
    while its window is classified (the profiled
    command's root, exiting as its last window closes) is classified again that way:
    its reads through /proc/<pid>/root failed partway, and those samples were `other`."""
    durability = reader_for(classifier)
    counts_before = _classify_counts(classifier, durability)
    pid, procfs = raw.pid, raw.procfs
    root = procfs / str(pid) / "root"
    exited = Path(exited_root(str(root)))
    if not procstat.exists(pid, procfs):
        return _classify_in(raw, classifier, deadline, exited, durability, counts_before)
    got = _classify_in(raw, classifier, deadline, root, durability, counts_before)
    if not procstat.exists(pid, procfs):
        got = _classify_in(raw, classifier, deadline, exited, durability, counts_before)
    return got


def _classify_in(
    raw: RawWindow,
    classifier: ClassifierLike,
    deadline: float,
    proc_root: Path,
    durability: DurabilityReader,
    counts_before: tuple[int, int],
) -> _Classified:
    """_classify with the sources read inside `proc_root` (an exited_root: at host paths)."""
    window = resolve_changes(raw.window, raw.kernel)
    # durability first: few files decide where each checkpoint ends (see prepare)
    durability.prepare(
        (s.frames for s in (*(window.changes or ()), *window.samples)), proc_root, deadline
    )

    def classify(s: Sample) -> Classification:
        return classifier.classify(s, proc_root=proc_root, deadline=deadline)

    labels = [classify(s) for s in window.samples]
    on_cpu_tids: set[int | None] = set()
    kernel_prior: list[float] | None = None
    covered: set[int | None] = set()
    spans: list[Sample] = []
    if raw.kernel is not None and window.changes_timed_by == "kernel":
        times = on_cpu_times(raw.kernel.threads, raw.kernel.epoch_minus_mono)
        window = replace(
            window, changes=tuple(reused_tids(window.changes or (), times, raw.kernel.threads))
        )
        spans = [s for s in window.changes or () if not s.partial and s.tid in times]
    if spans:
        # each thread the timeline traced and the stack-change run saw carries its CPU
        # on its stack changes, weighed by the kernel's timeline (kernel_cpu.py). None
        # named by its kernel tid (py-spy on Python < 3.11 knows none): the estimates
        kernel_prior = on_cpu_weights(spans, window.changes_end, times, window.changes_ticks)
        covered = {s.tid for s in spans}
        carriers = list(spans)
        carrier_labels = [classify(s) for s in spans]
        for s, c in zip(window.samples, labels, strict=True):
            if s.tid not in covered:
                carriers.append(s)
                carrier_labels.append(c)
        kernel_prior.extend([1.0] * (len(carriers) - len(spans)))
        n_on_cpu = 0
    elif window.on_cpu is not None:
        on_cpu_tids = {s.tid for s in window.on_cpu if s.tid is not None}
        carriers = [s for s in window.on_cpu if s.tid is not None]
        n_on_cpu = len(carriers)  # the carriers' prefix that runqueue_weights weighs
        carrier_labels = [classify(s) for s in carriers]
        # threads with CPU but no on-CPU sample (and unmapped ones) use --idle samples
        for s, c in zip(window.samples, labels, strict=True):
            if s.tid not in on_cpu_tids:
                carriers.append(s)
                carrier_labels.append(c)
    else:
        carriers = list(window.samples)
        carrier_labels = list(labels)
        n_on_cpu = 0
    # stack changes (the timing run): a stack cut short is no change, so it is left out
    changes = tuple(
        TimedLabel(
            t=s.t,
            tid=s.tid,
            thread_id=s.thread_id,
            codepath=c.codepath,
            durability=durability.kind(s.frames, proc_root, deadline),
            direction=c.direction,
            saver=saver_call(s.frames),
        )
        for s in window.changes or ()
        if not s.partial
        for c in (classify(s),)
    )
    # a thread the counted runs never caught (one that lived a few ms) but the stack-change
    # run did: its stack changes are its samples, each weighted by the time it held
    uncounted, held_s = _uncounted_changes(window, {s.tid for s in carriers})
    if kernel_prior is not None:
        uncounted, held_s = [], []  # the kernel's carriers hold every traced change
    carriers.extend(uncounted)
    carrier_labels.extend(classify(s) for s in uncounted)
    return _Classified(
        window=window, proc_root=proc_root, durability=durability, deadline=deadline,
        counts_before=counts_before, labels=labels, carriers=carriers,
        carrier_labels=carrier_labels, n_on_cpu=n_on_cpu, on_cpu_tids=on_cpu_tids,
        changes=changes, held_s=held_s, uncounted_tids={s.tid for s in uncounted},
        kernel_prior=kernel_prior, kernel_tids=covered,
    )  # fmt: skip


def _weigh(raw: RawWindow, got: _Classified) -> _Weighed:
    """Each thread's CPU spread over its carriers (profiler/sampling/weighting.py). The
    on-CPU carriers' times move to when their thread ran (runqueue_weights), in place."""
    window, cpu, carriers = got.window, raw.cpu, got.carriers
    series = _series(list(raw.snapshots), cpu.source == "schedstat")
    thread_cpu_s = {tid: tuple(zip(ser.t, ser.cpu_s, strict=True)) for tid, ser in series.items()}
    # the --idle carriers' threads: weighted by their polled CPU series
    idle_series = {
        tid: ser
        for tid, ser in series.items()
        if tid not in got.on_cpu_tids and tid not in got.uncounted_tids
    }
    sigma = window_time_sigma_s(window)
    n_on_cpu, n_counted = got.n_on_cpu, len(carriers) - len(got.held_s)
    seen = [*window.samples, *(window.on_cpu or ()), *(window.changes or ())]
    exited = exited_threads_cpu(raw, [s.tid for s in seen])
    prior: list[float] | None = None
    pool_prior: list[float] | None = None
    rq: RunqueueWeights | None = None
    if n_on_cpu:
        rq = runqueue_weights(
            carriers[:n_on_cpu],
            window.samples,
            on_cpu_rate_hz=raw.rate_hz,
            idle_rate_hz=window.rate_hz,
            wait_per_tid_s={**exited.wait_per_tid_s, **cpu.wait_per_tid_s},
            wakeup_share_per_tid=cpu.wakeup_share_per_tid,
            series=series,
            span=(window.started_at, window.ended_at),
            half_width_s=max(raw.poll_s, sigma),
            phases=_phases(got.changes, window.changes_end),
            codepaths=[c.codepath for c in got.carrier_labels[:n_on_cpu]],
        )
        # the counted carriers' running parts; the pool weighs held stack changes
        # (seconds, not a running part) as one carrier each
        prior = [*rq.weights, *([1.0] * (n_counted - n_on_cpu))]
        pool_prior = [*prior, *([1.0] * len(got.held_s))]
        carriers[:n_on_cpu] = [
            replace(s, t=t) for s, t in zip(carriers[:n_on_cpu], rq.times, strict=True)
        ]
    per_tid_s = {**exited.per_tid_s, **cpu.per_tid_s}
    if got.kernel_prior is not None:
        # a traced thread's CPU by its on-CPU time per span; an untraced one's by its
        # polled CPU series, as without the kernel
        traced = got.kernel_tids
        # a thread no CPU poll saw (it lived between two: many.save's hasher) has its
        # CPU in the timeline, not only in the exited threads' pool
        assert raw.kernel is not None
        born = {
            tid: raw.kernel.threads[tid].on_cpu_s
            for tid in traced
            if tid is not None and tid not in per_tid_s and tid in raw.kernel.threads
        }
        per_tid_s.update(born)
        pool_s = max(0.0, exited.pool_s - sum(born.values()))
        weighting = distribute_cpu(
            _lone_unmapped_as_main(carriers, raw.pid, per_tid_s),
            per_tid_s,
            exited_cpu_s=pool_s,
            series={t: ser for t, ser in series.items() if t not in traced},
            half_width_s=max(2 * raw.poll_s, sigma),
            prior=got.kernel_prior,
            pool_prior=got.kernel_prior,
        )
        return _Weighed(
            thread_cpu_s=thread_cpu_s,
            rq=None,
            weighting=weighting,
            total_cpu_s=sum(per_tid_s.values()) + pool_s,
            wall_s=max(0.0, window.ended_at - window.started_at),
            runqueue_wait_s=sum({**exited.wait_per_tid_s, **cpu.wait_per_tid_s}.values()),
        )
    if got.held_s:
        prior = [*(prior or [1.0] * n_counted), *got.held_s]
    weighting = distribute_cpu(
        _lone_unmapped_as_main(carriers, raw.pid, per_tid_s),
        per_tid_s,
        exited_cpu_s=exited.pool_s,
        series=idle_series,
        half_width_s=max(2 * raw.poll_s, sigma),
        prior=prior,
        pool_prior=pool_prior,
    )
    return _Weighed(
        thread_cpu_s=thread_cpu_s,
        rq=rq,
        weighting=weighting,
        total_cpu_s=sum(per_tid_s.values()) + exited.pool_s,
        wall_s=max(0.0, window.ended_at - window.started_at),
        runqueue_wait_s=sum({**exited.wait_per_tid_s, **cpu.wait_per_tid_s}.values()),
    )


def _timelines(
    got: _Classified, weighed: _Weighed
) -> tuple[tuple[TimedLabel, ...], tuple[TimedLabel, ...]]:
    """The --idle timeline (every thread at every tick, with its durability tag and the
    CPU its sample carries) and the CPU timeline (every carrier with its CPU)."""
    window, durability = got.window, got.durability
    cpu_s = weighed.weighting.cpu_s
    cpu_of = {id(s): w for s, w in zip(got.carriers, cpu_s, strict=True)}
    timeline = tuple(
        TimedLabel(
            t=s.t,
            tid=s.tid,
            thread_id=s.thread_id,
            codepath=c.codepath,
            active=s.active,
            cpu_s=cpu_of.get(id(s), 0.0),
            low_confidence=c.low_confidence,
            durability=durability.kind(s.frames, got.proc_root, got.deadline),
            direction=c.direction,
            saver=saver_call(s.frames),
        )
        for s, c in zip(window.samples, got.labels, strict=True)
    )
    cpu_timeline = tuple(
        TimedLabel(
            t=s.t,
            tid=s.tid,
            thread_id=s.thread_id,
            codepath=c.codepath,
            active=True if window.on_cpu is not None and s.tid in got.on_cpu_tids else s.active,
            cpu_s=w,
            low_confidence=c.low_confidence,
            direction=c.direction,
        )
        for s, c, w in zip(got.carriers, got.carrier_labels, cpu_s, strict=True)
    )
    return timeline, cpu_timeline


def _notes(
    raw: RawWindow, got: _Classified, weighed: _Weighed, classifier: ClassifierLike
) -> tuple[SamplerErrors, dict[str, int]]:
    """The window's errors with a note for each thing it could not see or had to estimate,
    and its classify errors (lookups not waited for, files too costly to index)."""
    window, cpu, rq, weighting = got.window, raw.cpu, weighed.rq, weighed.weighting
    errors = window.errors
    notes = list(errors.notes)
    notes.append(f"cpu source {cpu.source}")
    kernel = (got.kernel_prior is not None, raw.kernel, raw.kernel_problem, raw.kernel_counters)
    notes.extend(timeline_notes(window, *kernel))
    if window.on_cpu is not None and got.kernel_prior is None:
        notes.append(
            f"cpu carried by on-CPU samples for {len(got.on_cpu_tids)} thread(s)"
            if got.on_cpu_tids
            else "no on-CPU samples usable (py-spy knows no kernel tid): cpu on --idle samples"
        )
        if window.on_cpu_errors is not None:
            errors = errors.with_run(window.on_cpu_errors)
    if rq is not None and rq.blocking_s + rq.preemption_s > 0:
        notes.append(
            f"run-queue wait taken off on-CPU samples: {rq.blocking_s:.3f} s at blocking "
            f"lines, {rq.preemption_s:.3f} s by local wait"
        )
    if weighting.exited_pool_s > 0:
        notes.append(
            f"{weighting.exited_pool_s:.3f} cpu_s of exited threads on the samples of "
            "threads without a live CPU count"
        )
    if got.proc_root is not None and is_exited_root(str(got.proc_root)):
        notes.append("target exited: sources read from host paths")
    unreadable = {tid for snap in raw.snapshots for tid, _ in snap.unreadable}
    if unreadable:
        notes.append(f"{len(unreadable)} thread(s) with unparsable procfs files left out")
    if cpu.exited_tids:
        kept = "kept from the process's CPU" if raw.process_cpu_s is not None else "lost"
        notes.append(f"{len(cpu.exited_tids)} thread(s) exited mid-window (their CPU {kept})")
    not_ready, too_costly = (
        a - b
        for a, b in zip(
            _classify_counts(classifier, got.durability), got.counts_before, strict=True
        )
    )
    classify_errors: dict[str, int] = {}
    if not_ready:
        classify_errors["classify_timeout"] = 1
        notes.append("source files not loaded by the classify deadline: samples there `other`")
    if too_costly:
        classify_errors["source_too_costly"] = too_costly
        notes.append(f"{too_costly} source file(s) too costly to index: samples there `other`")
    return replace(errors, notes=tuple(notes)), classify_errors


def sample_window(
    pid: int,
    *,
    duration_s: float,
    classifier: ClassifierLike,
    plan: SamplingPlan,
    pyspy: PySpy | None = None,
    procfs: Path = Path("/proc"),
    stop_event: threading.Event | None = None,
    keep_stacks: bool = False,
) -> WindowReport:
    """Sample one window of `pid` (blocking) with the runs `plan` names (keep_stacks: as
    finish_window's; the daemon's Pyroscope push needs the stacks). Raises
    collectors.pyspy.SamplingError subclasses (TargetGone, NotPython, UnsupportedPython,
    PtraceDenied).

    A target that exits mid-window yields the samples taken so far (`exited=True`).
    Callers that must keep windows back to back (the profile session) run
    collect_window and finish_window on different threads instead.
    """
    raw = collect_window(
        pid, duration_s=duration_s, plan=plan, pyspy=pyspy, procfs=procfs, stop_event=stop_event
    )
    return finish_window(raw, classifier, keep_stacks=keep_stacks)


def _lone_unmapped_as_main(
    carriers: list[Sample], pid: int, per_tid_s: Mapping[int, float]
) -> list[Sample]:
    """Samples of one Python thread with no kernel tid, in a process whose main thread
    (tid == pid, always the interpreter's) has CPU and no sample: that thread is the
    main thread (a forked child on Python < 3.11, which py-spy names by pthread_t)."""
    unmapped = {s.thread_id for s in carriers if s.tid is None}
    if len(unmapped) != 1 or pid not in per_tid_s or any(s.tid == pid for s in carriers):
        return carriers
    return [replace(s, tid=pid) if s.tid is None else s for s in carriers]


def _uncounted_changes(
    window: WindowSamples, counted: set[int | None]
) -> tuple[list[Sample], list[float]]:
    """The stack-change run's samples of threads with a tid that no counted sample has,
    and how long each stack held (to its thread's next change, or the end of the run)."""
    out = sorted(
        (
            s
            for s in window.changes or ()
            if not s.partial and s.tid is not None and s.tid not in counted
        ),
        key=lambda s: s.t,
    )
    held = [0.0] * len(out)
    next_t: dict[int | None, float] = {}
    for i in range(len(out) - 1, -1, -1):
        s = out[i]
        held[i] = max(0.0, next_t.get(s.tid, max(window.changes_end, s.t)) - s.t)
        next_t[s.tid] = s.t
    return out, held


def _phases(changes: Sequence[TimedLabel], end: float) -> dict[int, Phases]:
    """Each mapped thread's codepath spans from the stack-change run."""
    by_tid: dict[int, list[tuple[float, str]]] = {}
    for c in changes:
        if c.tid is not None:
            by_tid.setdefault(c.tid, []).append((c.t, c.codepath))
    return {tid: Phases.from_changes(sorted(ch), end) for tid, ch in by_tid.items()}


def window_time_sigma_s(window: WindowSamples) -> float:
    """Worst-case standard deviation of a sample's estimated time (mid-window)."""
    if window.ticks <= 0:
        return 0.0
    return (window.ended_at - window.started_at) / (2 * math.sqrt(window.ticks))
