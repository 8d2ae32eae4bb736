"""The daemon's two pools: sampling threads (bounded) and classifiers (one per window),
and what a sampling thread runs: the daemon's sampler. What a window's runs are and when a
target is tried again: profiler/service/plan.py."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serwatt.collectors.pyspy import PySpy, SamplingPlan, StopEvent
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.sampling.collect import sample_window
from serwatt.profiler.sampling.window import WindowReport
from serwatt.profiler.service.config import Config


@dataclass
class SamplingJob:
    """One py-spy window of one process, run on a sampling thread."""

    key: tuple[int, float]
    target: str
    run_id: str
    pid: int
    window_s: float
    plan: SamplingPlan  # plan.daemon_plan(): the governor's rate when the window was set
    started_mono: float
    # wakes the window's py-spy supervision at once when set (collectors/pyspy/runner.py)
    stop: threading.Event = field(default_factory=StopEvent)
    done: threading.Event = field(default_factory=threading.Event)
    report: WindowReport | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None


class SamplerPool:
    """Bounded pool of sampling threads: never more than `limit` py-spy windows at once.

    A thread per window (windows last seconds, a thread costs microseconds) lets an
    overrunning window be abandoned without blocking the pool; it keeps counting
    against the limit until it really ends, so the bound on py-spy processes holds.
    """

    def __init__(self, limit: int, on_done: Callable[[], None]) -> None:
        self.limit = limit
        self._on_done = on_done
        self._threads: list[threading.Thread] = []

    def running(self) -> int:
        self._threads = [t for t in self._threads if t.is_alive()]
        return len(self._threads)

    def free(self) -> int:
        return max(0, self.limit - self.running())

    def submit(self, job: SamplingJob, work: Callable[[SamplingJob], WindowReport]) -> None:
        def body() -> None:
            try:
                job.report = work(job)
            except BaseException as exc:  # handed to the main thread, never lost
                job.error = exc
            finally:
                job.done.set()
                self._on_done()

        t = threading.Thread(target=body, name=f"serwatt-sample-{job.pid}", daemon=True)
        job.thread = t
        self._threads.append(t)
        t.start()


class ClassifierPool:
    """Classifiers for the sampling threads: one per concurrent window (a Classifier
    is not thread-safe), kept between windows so their caches stay warm."""

    def __init__(self, config: Config) -> None:
        self._rules_files = list(config.rules_files)
        self._procfs = config.path_procfs
        self._free: list[Any] = [self._make()]  # loads the rules now: bad rules fail here
        self._lock = threading.Lock()

    def _make(self) -> Any:
        if self._rules_files:
            return Classifier.from_files(self._rules_files, proc_fs=self._procfs)
        return Classifier.default(proc_fs=self._procfs)

    @contextlib.contextmanager
    def borrow(self) -> Iterator[Any]:
        with self._lock:
            classifier = self._free.pop() if self._free else None
        if classifier is None:
            classifier = self._make()
        try:
            yield classifier
        finally:
            with self._lock:
                self._free.append(classifier)


# Runs one window of one process on a sampling thread (blocking); raises a
# collectors.pyspy.SamplingError subclass when the window could not be sampled.
Sampler = Callable[[SamplingJob, Classifier], WindowReport]


@dataclass(frozen=True)
class PySpyWindows:
    """The daemon's sampler: a window is two py-spy runs (three with `timing_rate_hz`: the
    stack-change run that times phases, as `serwatt profile` does) and the target's CPU
    polls (profiler/sampling/collect.py)."""

    pyspy: PySpy
    procfs: Path
    keep_stacks: bool = False  # fold each window's stacks (the record's and the push's)

    def __call__(self, job: SamplingJob, classifier: Classifier) -> WindowReport:
        return sample_window(
            job.pid,
            duration_s=job.window_s,
            classifier=classifier,
            plan=job.plan,
            procfs=self.procfs,
            stop_event=job.stop,
            pyspy=self.pyspy,
            keep_stacks=self.keep_stacks,
        )
