"""The real daemon in fake time: a clock that moves only when the daemon waits, a sampler
that plays scripted windows on that clock, and a procfs tree of fake Python processes.

`Daemon(config, clock=FakeClock(), sampler=ScriptedSampler(...))` runs the daemon's own
loop, pools, ledger and recorder; only time and py-spy are replaced. The sampling
threads are real threads: the clock advances only once every live sampling thread is
parked in it (waiting for its scripted end or its stop request), so what the main thread
sees after each wait does not depend on thread scheduling, and every time a test
asserts is exact.

No tests here; tests/service/test_daemon_schedule.py uses it.
"""

from __future__ import annotations

import heapq
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.sampling.window import CodepathWindow, WindowReport
from serwatt.profiler.service.config import load_config
from serwatt.profiler.service.daemon import Daemon
from serwatt.profiler.service.pools import SamplingJob
from serwatt.profiler.service.sdnotify import SdNotifier
from tests.daemon_support import daemon_config

# Exactly representable, so sums of the daemon's 0.5 s waits land on them exactly.
FAKE_START_MONO = 1000.0
FAKE_EPOCH_OFFSET = 1_800_000_000.0 - FAKE_START_MONO
# How long (real seconds) a sampling thread may take to reach the clock or end.
SETTLE_TIMEOUT_S = 30.0


class FakeClock:
    """Monotonic and epoch time that advance only inside `wait`."""

    def __init__(self, sampling_thread_names: Callable[[], set[str]]) -> None:
        """sampling_thread_names: the names of the sampling threads to wait for (the
        pool names them serwatt-sample-PID)."""
        self.now = FAKE_START_MONO
        self._thread_names = sampling_thread_names
        self._cond = threading.Condition()
        self._generation = 0
        # thread ident -> (generation its condition was last found false in, wake time)
        self._parked: dict[int, tuple[int, float | None]] = {}
        self._calls: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._closed = False

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + FAKE_EPOCH_OFFSET

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run fn on the waiting (main) thread when fake time reaches t."""
        heapq.heappush(self._calls, (t, next(self._seq), fn))

    def park(self, done: Callable[[], bool], wake_at: float | None) -> None:
        """On a sampling thread: block until done() holds. wake_at: the time at which it
        holds by time alone (None: only another event, such as a stop request, ends it)."""
        me = threading.get_ident()
        with self._cond:
            while not (self._closed or done()):
                self._parked[me] = (self._generation, wake_at)
                self._cond.wait(timeout=1.0)
            self._parked.pop(me, None)

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        self._settle()
        deadline = self.now + timeout_s
        while not event.is_set():
            due = self._next_due()
            if due is None or due > deadline:
                self.now = deadline
                return False
            with self._cond:
                self.now = due
            while self._calls and self._calls[0][0] <= self.now:
                heapq.heappop(self._calls)[2]()
            self._settle()
        return True

    def close(self) -> None:
        """Release every parked thread (a test's end)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _next_due(self) -> float | None:
        with self._cond:
            times = [w for _, w in self._parked.values() if w is not None]
        if self._calls:
            times.append(self._calls[0][0])
        return min(times, default=None)

    def _settle(self) -> None:
        """Wait (real time) until every live sampling thread is parked with its
        condition checked at the current fake time and state."""
        with self._cond:
            self._generation += 1
            generation = self._generation
            self._cond.notify_all()
        give_up = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            names = self._thread_names()
            live = [t for t in threading.enumerate() if t.name in names and t.is_alive()]
            with self._cond:
                if all(self._parked.get(t.ident or 0, (-1, None))[0] == generation for t in live):
                    return
            if time.monotonic() > give_up:
                raise AssertionError(f"sampling threads did not settle: {live}")
            time.sleep(0.0005)


@dataclass(frozen=True)
class Scripted:
    """What one window does. duration_s: when it returns (None: at window_s), unless
    stopped first; error: raised then instead of a report; ignores_stop: a hung py-spy
    that a stop request does not end."""

    duration_s: float | None = None
    error: BaseException | None = None
    ignores_stop: bool = False


@dataclass
class Attempt:
    """One window as the sampler saw it (fake monotonic seconds)."""

    pid: int
    target: str
    started: float
    window_s: float
    rate_hz: float
    ended: float | None = None
    stop_seen: float | None = None  # when it first saw its stop request
    failed: str | None = None  # the error's kind


@dataclass
class ScriptedSampler:
    """Plays `script(pid, n)` for the n-th window (from 1) of each pid on the clock."""

    clock: FakeClock
    script: Callable[[int, int], Scripted] = lambda pid, n: Scripted()
    attempts: list[Attempt] = field(default_factory=list)

    def __call__(self, job: SamplingJob, classifier: object) -> WindowReport:
        clock = self.clock
        n = 1 + sum(1 for a in self.attempts if a.pid == job.pid)
        plan = self.script(job.pid, n)
        attempt = Attempt(job.pid, job.target, job.started_mono, job.window_s, job.plan.rate_hz)
        self.attempts.append(attempt)
        end = job.started_mono + (job.window_s if plan.duration_s is None else plan.duration_s)

        def done() -> bool:
            if job.stop.is_set() and attempt.stop_seen is None:
                attempt.stop_seen = clock.now
            return clock.now >= end or (job.stop.is_set() and not plan.ignores_stop)

        clock.park(done, end)
        attempt.ended = clock.now
        if plan.error is not None:
            attempt.failed = getattr(plan.error, "kind", "internal")
            raise plan.error
        # one pickle sample per started second, so the ledger's counts say which ran
        samples = max(1, int(clock.now - job.started_mono))
        return WindowReport(
            pid=job.pid,
            started_at=job.started_mono + FAKE_EPOCH_OFFSET,
            ended_at=clock.time(),
            rate_hz=job.plan.rate_hz,
            cpu_s=0.0,
            codepaths={
                cp: CodepathWindow(samples=samples if cp == "pickle" else 0) for cp in CODEPATHS
            },
            python="3.11",
        )


def give_root_creds(pid_dir: Path) -> None:
    """A fake process's credentials, as a real root process has them: serwatt reads a
    target's source only where the target itself could (/proc/PID/status, and its user
    namespace: this one, through a link to serwatt's own)."""
    (pid_dir / "status").write_text(
        "Name:\tpython3\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\nCapEff:\t000001ffffffffff\n"
    )
    (pid_dir / "ns").mkdir(exist_ok=True)
    (pid_dir / "ns" / "user").symlink_to("/proc/self/ns/user")


def make_proc(procfs: Path, pid: int, marker: str) -> None:
    """A fake Python process `python3 MARKER.py` under procfs (what discovery reads)."""
    d = procfs / str(pid)
    d.mkdir(parents=True)
    rest = ["S", "1", "1", "1", "0", "-1", "0"] + ["0"] * 12 + [str(100 + pid)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} (python3) " + " ".join(rest) + "\n")
    (d / "cmdline").write_bytes(b"python3\0" + f"{marker}.py".encode() + b"\0")
    (d / "exe").symlink_to("/usr/bin/python3.11")
    (d / "cgroup").write_text("0::/\n")
    (d / "environ").write_bytes(b"")
    (d / "maps").write_text("")
    give_root_creds(d)


def remove_proc(procfs: Path, pid: int) -> None:
    d = procfs / str(pid)
    for f in d.iterdir():
        f.unlink()
    d.rmdir()


def fake_config(procfs: Path, record_dir: Path, targets: dict[str, str], **keys: object) -> str:
    """daemon_config over fake processes: no energy collectors, 10 Hz, 1 s windows; `keys`
    (top-level config keys) replace those."""
    top: dict[str, object] = {"sample_rate_hz": 10, "window_s": 1} | keys
    return daemon_config(
        record_dir, targets, rapl=False, nvml=False, tdp_w=None, procfs=procfs, **top
    )


class FakeTimeDaemon:
    """A Daemon over fake processes in fake time. `procs`: {pid: marker}."""

    def __init__(
        self,
        tmp_path: Path,
        targets: dict[str, str],
        procs: dict[int, str],
        *,
        script: Callable[[int, int], Scripted] = lambda pid, n: Scripted(),
        **keys: object,
    ) -> None:
        """keys: top-level config keys (window_s=10, max_concurrent_samplers=2)."""
        self.procfs = tmp_path / "proc"
        self.procfs.mkdir()
        (self.procfs / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
        self.pids = set(procs)
        for pid, marker in procs.items():
            make_proc(self.procfs, pid, marker)
        self.config_path = tmp_path / "serwatt.yaml"
        self.config_path.write_text(fake_config(self.procfs, tmp_path / "runs", targets, **keys))
        self.clock = FakeClock(lambda: {f"serwatt-sample-{p}" for p in self.pids})
        self.sampler = ScriptedSampler(self.clock, script)
        self.daemon = Daemon(
            load_config(self.config_path),
            notifier=SdNotifier(env={}),
            clock=self.clock,
            sampler=self.sampler,
        )

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """fn at FAKE_START_MONO + t."""
        self.clock.call_at(FAKE_START_MONO + t, fn)

    def add_proc(self, pid: int, marker: str) -> None:
        self.pids.add(pid)
        make_proc(self.procfs, pid, marker)

    def reload(self, targets: dict[str, str], **keys: object) -> None:
        """Write a new config and SIGHUP (the handler runs before os.kill returns)."""
        self.config_path.write_text(
            fake_config(self.procfs, self.config_path.parent / "runs", targets, **keys)
        )
        os.kill(os.getpid(), signal.SIGHUP)

    def run_until(self, t: float) -> int:
        """Run the daemon until SIGTERM at FAKE_START_MONO + t; its exit code."""
        self.at(t, lambda: os.kill(os.getpid(), signal.SIGTERM))
        try:
            return self.daemon.run()
        finally:
            self.clock.close()

    def started(self, pid: int | None = None) -> list[float]:
        """Start times of the windows (of pid), relative to FAKE_START_MONO."""
        return [
            a.started - FAKE_START_MONO
            for a in self.sampler.attempts
            if pid is None or a.pid == pid
        ]
