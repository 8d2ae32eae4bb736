"""A profile session: back-to-back sampling windows over one process tree.

A session profiles a root process (launched by `serwatt profile -- CMD` or attached
with `--pid`) and every Python descendant that appears while it runs (dataloader
workers, torchrun children, multiprocessing pools): each is a separate *target*
with its own worker thread running back-to-back `sample_window`s, until the target
exits, `duration_s` ends, or `stop()` is called.

Each window goes through the window pipeline the daemon runs too
(profiler.attribution.pipeline: attributed once against the session's energy tracker,
when it has one, then the one AttributedWindow to every *sink*, then the episodes it
closed). A sink is any object with

    on_start(info: SessionInfo) -> None               # once, before the first window
    on_window(window: AttributedWindow) -> None       # every window of every target
    on_episodes(episodes: Sequence[Episode]) -> None  # episodes as they close
    finish() -> object                                # once, at the end

The session calls them from one thread at a time (under a lock), so sinks need no
locking of their own. The session starts and stops the tracker; what a sink's
finish() returns is its own (the energy sink's sections go to the profile document).
"""

from __future__ import annotations

import atexit
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TextIO

from serwatt.collectors import procstat
from serwatt.collectors.pyspy import (
    NotPython,
    PySpy,
    SamplingError,
    SamplingPlan,
    StopEvent,
    TargetGone,
    precheck,
)
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.pipeline import Delivery, WindowPipeline
from serwatt.profiler.attribution.tracker import EnergyTracker, TrackerReport
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.classify import source_cache
from serwatt.profiler.profile.accumulator import Accumulator
from serwatt.profiler.profile.cpu_budget import SessionBudget
from serwatt.profiler.profile.stack_profile import StackProfile
from serwatt.profiler.sampling import collect, eligible
from serwatt.profiler.sampling.budget import RateGovernor
from serwatt.profiler.sampling.collect import (
    ClassifierLike,
    RawWindow,
    collect_window,
    finish_window,
)
from serwatt.profiler.sampling.retry import RetryPolicy
from serwatt.profiler.sampling.window import WindowReport
from serwatt.profiler.terminal_escape import escape_text

# a window that ran this long before it failed as its target exited had samples to lose
LOST_WINDOW_MIN_S = 1.0
# counted runs at py-spy's default rate, an on-CPU run beside the --idle one, no
# stack-change run (`serwatt profile` adds one: profiler/cli/profile.py)
SESSION_PLAN = SamplingPlan(on_cpu_run=True)
# A failure of a target's window ends that target's sampling (the session says why),
# except a process only just starting: py-spy found no interpreter in it yet, so it is
# tried again every 0.3 s, ten times at most, while younger than YOUNG_S.
SESSION_RETRY = RetryPolicy(young_tries=10, young_pause_s=0.3)
YOUNG_S = 5.0
# a launched wrapper root is checked this often for its exec into Python
EXEC_POLL_S = 0.05


class SessionSink(Protocol):
    def on_start(self, info: SessionInfo) -> None: ...

    def on_window(self, window: AttributedWindow) -> None: ...

    def on_episodes(self, episodes: Sequence[Episode]) -> None: ...

    def finish(self) -> object: ...


@dataclass(frozen=True)
class SessionInfo:
    root_pid: int
    command: str
    started_at: float  # epoch seconds
    rate_hz: float
    window_s: float
    procfs: Path
    # the energy tracker's status at the start (None: no tracker), read by the pipeline
    tracker: TrackerReport | None = None


@dataclass
class TargetStats:
    pid: int
    command: str
    python: str | None = None
    windows: int = 0
    collected: int = 0  # windows sampled (classified ones are `windows`)
    samples: int = 0
    cpu_s: float = 0.0
    first_t: float | None = None
    last_t: float | None = None
    exited: bool = False
    error: str | None = None  # why it stopped being sampled, when not a normal exit
    windows_lost: int = 0  # windows that ran and were lost as it exited (lost_at_exit)


@dataclass
class SessionResult:
    info: SessionInfo
    ended_at: float
    targets: list[TargetStats]
    acc: Accumulator
    episodes: list[Episode] = field(default_factory=list)  # in the order they closed
    # the CPU budget, the rates it set and serwatt's own measured CPU (cpu_budget.py)
    cpu_budget: dict[str, Any] = field(default_factory=dict)
    stacks: StackProfile = field(default_factory=StackProfile)
    # deliveries a sink failed (attribution/pipeline.py): sink class name -> count, and
    # the first failures' messages; a run with any ends in an error (delivery_problem)
    sink_failures: dict[str, int] = field(default_factory=dict)
    sink_errors: list[str] = field(default_factory=list)

    def delivery_problem(self) -> str | None:
        """What a run whose windows did not all reach its sinks (its record, its
        document's energy) must say before it exits non-zero; None when all did."""
        if not self.sink_failures:
            return None
        counts = ", ".join(f"{n} to {sink}" for sink, n in sorted(self.sink_failures.items()))
        first = f"; first: {self.sink_errors[0]}" if self.sink_errors else ""
        return f"deliveries failed ({counts}): the outputs they feed are incomplete{first}"


class ProfileSession:
    def __init__(
        self,
        root_pid: int,
        *,
        classifier: ClassifierLike,
        plan: SamplingPlan = SESSION_PLAN,
        window_s: float = 5.0,
        duration_s: float | None = None,
        command: str | None = None,
        pyspy: PySpy | None = None,
        procfs: Path = Path("/proc"),
        tracker: EnergyTracker | None = None,
        sinks: Sequence[SessionSink] = (),
        follow_children: bool = True,
        progress: TextIO | None = sys.stderr,
        strict_root: bool = True,
        root_exit_check: Callable[[], bool] | None = None,
        root_may_be_wrapper: bool = False,
        governor: RateGovernor | None = None,
        collect: Callable[..., RawWindow] = collect_window,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """plan: the root's windows' py-spy runs (collectors/pyspy/plan.py); its
        timing_rate_hz is the stack-change run's budget the tree shares (_plan_for; None:
        no such run; profiler.sampling.collect.default_timing_rate_hz is what `serwatt
        profile` uses).
        strict_root: a SamplingError on the root's first window is raised from run()
        (bad --pid, free-threaded build, no ptrace permission); otherwise it is counted.
        root_may_be_wrapper: a root that is not Python (a shell or wrapper launched by
        `serwatt profile -- CMD`) is not an error: its Python descendants are profiled.
        root_exit_check: returns True once the launched command has exited (used to
        reap it: a zombie still shows in /proc).
        governor: the CPU budget's (profiler/profile/cpu_budget.py); None: every window
        at `plan`'s rates.
        collect: the time-critical half of a window (sampling/collect.py collect_window,
        same keywords); clock: the host's epoch time, the session's start and end. The
        replay harness (tests/replay/) plays recorded windows in fake time through them."""
        self.root_pid = root_pid
        self.classifier = classifier
        self.plan = plan
        self.window_s = window_s
        self.duration_s = duration_s
        self.pyspy = pyspy if pyspy is not None else PySpy()
        self.procfs = procfs
        self.tracker = tracker
        self.sinks = list(sinks)
        self._pipeline = WindowPipeline(tracker)
        self._episodes: list[Episode] = []
        self.follow_children = follow_children
        self.progress = progress
        self.strict_root = strict_root
        self.root_exit_check = root_exit_check
        self.root_may_be_wrapper = root_may_be_wrapper
        self.budget = SessionBudget(governor)
        self._collect = collect
        self._clock = clock
        self._launched_exited = False
        self._exec_seen_at: float | None = None  # when the launched root exec'd into Python
        self._timing_pid: int | None = root_pid  # the one target the stack-change run samples
        if command is None:
            try:
                command = " ".join(procstat.process_info(root_pid, procfs).cmdline)
            except procstat.ProcessGone:
                command = ""
        self.info = SessionInfo(
            root_pid=root_pid,
            command=command,
            started_at=self._clock(),
            rate_hz=plan.rate_hz,
            window_s=window_s,
            procfs=procfs,
            tracker=self._pipeline.tracker_report(),
        )
        self.acc = Accumulator()
        self.stacks = StackProfile()  # the classified stacks, for --pprof / --flamegraph
        self.targets: dict[int, TargetStats] = {}
        self._lock = threading.Lock()
        # a StopEvent wakes the blocked py-spy windows at once (collectors/pyspy/runner.py)
        self._stop = StopEvent()
        self._workers: dict[int, threading.Thread] = {}
        self._root_error: SamplingError | None = None
        self._raw_q: queue.Queue[RawWindow | None] = queue.Queue()
        self._finisher_thread = threading.Thread(
            target=self._finisher, name="serwatt-classify", daemon=True
        )
        self._live_samples = 0
        self._live_errors = 0
        self._live_partial = 0

    # ------------------------------------------------------------ control

    def stop(self) -> None:
        self._stop.set()

    def _deadline_passed(self) -> bool:
        return (
            self.duration_s is not None and self._clock() - self.info.started_at >= self.duration_s
        )

    def _remaining(self) -> float:
        if self.duration_s is None:
            return self.window_s
        return max(0.0, self.duration_s - (self._clock() - self.info.started_at))

    # ------------------------------------------------------------ workers

    def _worker(self, pid: int) -> None:
        stats = self.targets[pid]
        is_root = pid == self.root_pid
        young_retries = 0
        while not self._stop.is_set() and not self._deadline_passed():
            dur = min(self.window_s, self._remaining())
            if dur < 0.2:
                break
            began = time.monotonic()
            try:
                raw = self._collect(
                    pid,
                    duration_s=dur,
                    plan=self._plan_for(pid),
                    pyspy=self.pyspy,
                    procfs=self.procfs,
                    stop_event=self._stop,
                )
            except TargetGone as exc:
                self._lost_at_exit(stats, exc, time.monotonic() - began)
                stats.exited = True
                break
            except NotPython as exc:
                # a process just spawned may not have initialised its interpreter yet
                young = self._starting_python(pid)
                decided = SESSION_RETRY.after(exc.kind, in_a_row=young_retries + 1, young=young)
                if decided.action == "retry":
                    young_retries += 1
                    time.sleep(decided.after_s)
                    continue
                if is_root and self.root_may_be_wrapper and self._followed_exec(pid, stats):
                    continue
                self._record_failure(stats, exc, is_root)
                break
            except SamplingError as exc:
                if procstat.exiting(pid, self.procfs):
                    self._lost_at_exit(stats, exc, time.monotonic() - began)
                    stats.exited = True
                    break
                # SESSION_RETRY gives up on every other failure: the session says why
                self._record_failure(stats, exc, is_root)
                break
            # classification runs on the finisher thread so the next window starts now
            self._raw_q.put(raw)
            with self._lock:
                stats.collected += 1
                self._live_samples += len(raw.window.samples)
                self._live_errors += raw.window.errors.pyspy_errors
                self._live_partial += raw.window.errors.partial_stacks
            if raw.exited or not procstat.exists(pid, self.procfs):
                stats.exited = True
                break
            if is_root and self.root_exit_check is not None and self.root_exit_check():
                self._launched_exited = True
                stats.exited = True
                break
        with self._lock:
            if self._timing_pid == pid:
                self._timing_pid = None  # the next target to start a window takes it

    def _plan_for(self, pid: int) -> SamplingPlan:
        """The plan of `pid`'s next window: the session's, with its stack-change run only
        for one target of the tree: the root, or, once the root has stopped being sampled
        (a wrapper that is not Python, or it exited), the next target to ask. That run's
        rate is a budget the tree shares: timing_rate_hz over the processes in the tree,
        never below the counted runs' rate. Every process of a DataLoader tree with its own
        run at 4x the rate cost a 2-CPU node 45% of the job's steps (issue 22); the other
        targets get the counted runs."""
        plan = self.budget.plan(self.plan)
        shared = plan.timing_rate_hz
        if shared is None:
            return plan
        with self._lock:
            if self._timing_pid is None:
                self._timing_pid = pid
            if self._timing_pid != pid:
                return replace(plan, timing_rate_hz=None)
        rate = max(min(plan.rate_hz, shared), shared / self._tree_size())
        return replace(plan, timing_rate_hz=rate)

    def _tree_size(self) -> int:
        if not self.follow_children:
            return 1
        return 1 + len(procstat.descendants(self.root_pid, self.procfs))

    def _finisher(self) -> None:
        while True:
            raw = self._raw_q.get()
            if raw is None:
                return
            stats = self.targets[raw.pid]
            try:
                report = finish_window(raw, self.classifier, keep_stacks=True)
            except Exception as exc:  # a bad rule or source must not end the profile
                with self._lock:
                    self.acc.fail("classify_failed")
                    stats.error = f"classify_failed: {exc!r}"
                continue
            with self._lock:
                try:
                    self._deliver(report, stats)
                except Exception as exc:  # nothing in one window may end the finisher
                    self.acc.fail("window_failed")
                    stats.error = f"window_failed: {exc!r}"

    def _deliver(self, report: WindowReport, stats: TargetStats) -> None:
        for kind, n in report.classify_errors.items():
            self.acc.failures[kind] = self.acc.failures.get(kind, 0) + n
        stats.windows += 1
        stats.python = stats.python or report.python
        stats.samples += sum(w.samples for w in report.codepaths.values())
        stats.cpu_s += report.cpu_s
        stats.first_t = stats.first_t or report.started_at
        stats.last_t = report.ended_at
        # the processes still sampled: a window overlapping theirs waits for them, to be
        # fitted with theirs to the node's joules before any sink reads it
        live = [pid for pid, t in list(self._workers.items()) if t.is_alive()]
        for window in self._pipeline.attribute_held(report, live):
            self._to_sinks(window)

    def _to_sinks(self, window: AttributedWindow) -> None:
        self.stacks.add(window)
        self.acc.add(window, self.info.started_at)
        self._delivered(self._pipeline.deliver(window, self.sinks))

    def _delivered(self, delivery: Delivery) -> None:
        self._episodes.extend(delivery.episodes)
        for _ in delivery.failures:  # counted by sink in the pipeline, and here as one kind
            self.acc.fail("sink_failed")

    def _followed_exec(self, pid: int, stats: TargetStats) -> bool:
        """A launched root that is not Python yet (`env`, a pyenv shim, a launcher that
        execs Python in the same pid): wait until it is, then say so; True when its
        windows should be tried again. Probing it once, while it was still the shim,
        sampled nothing for the whole run. False once it exits or the session ends, and
        once an exec'd Python stays unsampleable past YOUNG_S."""
        while not procstat.python_kind(pid, self.procfs).is_python:
            if self._stop.is_set() or self._deadline_passed() or not self._root_running():
                return False
            self._stop.wait(EXEC_POLL_S)
        if self._exec_seen_at is None:
            self._exec_seen_at = time.monotonic()
            try:
                command = " ".join(procstat.process_info(pid, self.procfs).cmdline)
            except procstat.ProcessGone:
                return False
            with self._lock:
                was, stats.command = stats.command, command
            if self.progress is not None:
                print(
                    f"serwatt: pid {pid} exec'd into Python ({escape_text(command[:80])}) "
                    f"from {escape_text(was[:80])}; following it",
                    file=self.progress,
                )
        elif time.monotonic() - self._exec_seen_at > YOUNG_S:
            return False
        self._stop.wait(EXEC_POLL_S)  # its interpreter may not be initialised yet
        return True

    def _record_failure(self, stats: TargetStats, exc: SamplingError, is_root: bool) -> None:
        with self._lock:
            self.acc.fail(exc.kind)
            stats.error = f"{exc.kind}: {exc}"
            wrapper = self.root_may_be_wrapper and isinstance(exc, NotPython)
            if is_root and stats.collected == 0 and not wrapper:
                self._root_error = exc

    def _lost_at_exit(self, stats: TargetStats, exc: SamplingError, ran_s: float) -> None:
        """A window that ran and then failed as its target exited lost its samples: the
        exit is no error of the profile, but the loss is counted and said (a window that
        failed at once only found the target gone)."""
        if ran_s < LOST_WINDOW_MIN_S:
            return
        with self._lock:
            self.acc.fail("lost_at_exit")
            stats.windows_lost += 1
            stats.error = (
                f"lost_at_exit: the window's py-spy failed as the target exited, after "
                f"{ran_s:.1f} s; its samples are lost ({exc})"
            )

    def _starting_python(self, pid: int) -> bool:
        """A process younger than YOUNG_S whose executable is Python: py-spy may find no
        interpreter in it yet."""
        try:
            age_s = time.time() - procstat.process_info(pid, self.procfs).start_time_s
        except procstat.ProcessGone:
            return False
        return (
            age_s < YOUNG_S
            and procstat.exists(pid, self.procfs)
            and procstat.python_kind(pid, self.procfs).is_python
        )

    def _start_target(self, pid: int) -> None:
        if pid in self.targets:
            return
        try:
            info = procstat.process_info(pid, self.procfs)
            command = " ".join(info.cmdline)
        except procstat.ProcessGone:
            return
        self.targets[pid] = TargetStats(pid=pid, command=command)
        self.budget.tree_grew(lambda: len(self.targets))
        t = threading.Thread(target=self._worker, args=(pid,), name=f"serwatt-target-{pid}")
        self._workers[pid] = t
        t.start()

    def _discover(self) -> None:
        """Start sampling every descendant of the root that the daemon's rule admits."""
        for pid in procstat.descendants(self.root_pid, self.procfs):
            if pid in self.targets:
                continue
            try:
                refused = eligible.refusal(procstat.ProcessFiles(pid, self.procfs))
            except (procstat.ProcessGone, procstat.ProcessUnreadable, ValueError, IndexError):
                continue  # exited while read (a half-written stat), or not ours to read
            if refused is None:
                self._start_target(pid)

    # ------------------------------------------------------------ run

    def run(self) -> SessionResult:
        if self.tracker is not None:
            self.tracker.start()  # first reading now: the first window is bracketed
        try:
            return self._run()
        finally:
            if self.tracker is not None:
                self.tracker.stop()

    def _run(self) -> SessionResult:
        for sink in self.sinks:
            sink.on_start(self.info)
        # a bad target must fail fast, before children or progress output
        if self.strict_root and not self.root_may_be_wrapper:
            self.pyspy.probe(self.root_pid, procfs=self.procfs)
        elif procstat.exists(self.root_pid, self.procfs):
            precheck(self.root_pid, self.procfs)  # free-threaded: refuse at once
        self._finisher_thread.start()
        self.budget.begin(
            time.monotonic(), tree=self._tree_size, plan=self.plan, window_s=self.window_s
        )
        self._start_target(self.root_pid)
        if self.root_pid not in self.targets and self.strict_root:
            raise TargetGone(f"no such process: {self.root_pid} (it is not running)")
        last_progress = 0.0
        last_discover = 0.0
        try:
            while True:
                now = time.time()
                if self.follow_children and now - last_discover >= 0.5:
                    self._discover()
                    last_discover = now
                alive = [t for t in self._workers.values() if t.is_alive()]
                if not alive and (
                    not self.follow_children or not self._root_running() or self._stop.is_set()
                ):
                    break
                if self._deadline_passed() or self._stop.is_set():
                    self._stop.set()
                    if not alive:
                        break
                over = self.budget.tick(time.monotonic(), launched_exited=self._launched_exited)
                if over is not None and self.progress is not None:
                    print(f"serwatt: CPU budget not met: {over}", file=self.progress)
                if self.progress is not None and now - last_progress >= self._progress_every():
                    self._print_progress(now)
                    last_progress = now
                time.sleep(0.1)
        except KeyboardInterrupt:
            self._stop.set()
        self._join()
        if self.progress is not None:
            self._print_progress(time.time(), final=True)
        if self.strict_root and self._root_error is not None:
            raise self._root_error
        with self._lock:
            for window in self._pipeline.flush():
                try:
                    self._to_sinks(window)
                except Exception as exc:  # as in the finisher: the other windows go on
                    self.acc.fail("window_failed")
                    self.targets[window.report.pid].error = f"window_failed: {exc!r}"
        self._delivered(self._pipeline.finish(self.sinks))
        self._pipeline.finish_sinks(self.sinks)
        return SessionResult(
            info=self.info,
            ended_at=self._clock(),
            targets=list(self.targets.values()),
            acc=self.acc,
            episodes=self._episodes,
            cpu_budget=self.budget.section(),
            stacks=self.stacks,
            sink_failures=dict(self._pipeline.sink_failures),
            sink_errors=list(self._pipeline.sink_errors),
        )

    def _root_running(self) -> bool:
        if self.root_exit_check is not None:
            return not self.root_exit_check()
        return procstat.exists(self.root_pid, self.procfs)

    def _join(self) -> None:
        for t in list(self._workers.values()):
            t.join()
        if self._finisher_thread.is_alive():
            self._raw_q.put(None)
            # Each window's classification is bounded by its deadline; a finisher
            # that finishes no window in that long (plus slack) is abandoned, not
            # waited on: the session ends with what it has.
            while self._finisher_thread.is_alive():
                done = self.acc.windows + sum(self.acc.failures.values())
                self._finisher_thread.join(timeout=collect.CLASSIFY_DEADLINE_S + 5.0)
                if self._finisher_thread.is_alive() and (
                    self.acc.windows + sum(self.acc.failures.values()) == done
                ):
                    self.acc.fail("classify_abandoned")
                    # Its results are no longer taken, but the exit waits for it (as for
                    # source loads): a daemon thread ended inside re2 aborts the process.
                    atexit.register(self._finisher_thread.join, source_cache.EXIT_WAIT_S)
                    break

    def _progress_every(self) -> float:
        assert self.progress is not None
        return 0.5 if self.progress.isatty() else 5.0

    def _print_progress(self, now: float, final: bool = False) -> None:
        assert self.progress is not None
        with self._lock:
            samples = self._live_samples
            errs = self._live_errors + sum(self.acc.failures.values())
            partial = self._live_partial
            n_targets = len(self.targets)
        line = (
            f"serwatt: {now - self.info.started_at:6.1f} s elapsed, {n_targets} target(s), "
            f"{samples} samples, {errs} errors, {partial} partial stacks"
        )
        if self.progress.isatty():
            self.progress.write("\r" + line + ("\n" if final else ""))
        else:
            self.progress.write(line + "\n")
        self.progress.flush()
