"""The kernel's scheduler timeline: when each target thread was on a CPU, and why it left.

An *on-CPU interval* of a thread runs from a `sched_switch` that puts it on a CPU
(switch-in) to the one that takes it off (switch-out). The switch-out says why: the
thread was still runnable (`prev_state` R or R+: **preempted**, it waits in the run
queue) or it went to sleep (S, D, I, ...: **blocked**), or it exited (X, Z). This is
what py-spy cannot tell apart (`/proc/<tid>/stat` reads R both on a CPU and in the run
queue: docs/sampling.md).

Source: a private **tracefs instance** (`<tracefs>/instances/serwatt-<pid>-<n>`) with
`trace_clock` `mono`, so every timestamp is CLOCK_MONOTONIC, the clock of
`time.monotonic()` that the rest of serwatt uses. The kernel does the filtering and the
buffering:
- `set_event_pid` holds the target threads (and any other pid added, e.g. py-spy's), and
  the `event-fork` option adds every thread or process they start, so threads that start
  mid-window are covered from their first switch-in. `sched_switch` is recorded when
  either side is listed.
- the ring buffer is `buffer_kb` per CPU, in no-overwrite mode: when the reader is behind,
  the kernel drops new events and counts them (`per_cpu/cpuN/stats`, "dropped events"),
  which `counters()` reports.

Why not a library: perf's Python binding (`python3-perf`) is a Fedora package that Debian
does not ship; Debian's `python3-bpfcc` compiles its BPF C with LLVM at every start
(seconds of CPU, kernel headers matching the running kernel, the system Python only, not
a venv); the PyPI BPF/perf bindings (`pylibbpf`, `py-perf-event`, `bpfmaps`) are
pre-1.0 and unmaintained or unverified. tracefs needs no compiler and no library: a few
file writes and a line parser.

Bounds, whatever the switch rate or the target's thread count:
- kernel memory: `buffer_kb` per CPU;
- CPU: the reader wakes every `poll_s` and reads at most `max_bytes_per_poll`; what it
  leaves stays in the ring buffer, and what does not fit there is dropped by the kernel
  (counted);
- our memory: at most `max_threads` threads and `max_intervals` intervals are kept; the
  rest are counted (`threads_dropped`, `intervals_dropped`), never stored.

The collector only reads and parses; the weighting lives in profiler/sampling.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from serwatt.collectors.status import CollectorStatus

TRACEFS = Path("/sys/kernel/tracing")
INSTANCE_PREFIX = "serwatt-"
PREEMPTED = "preempted"
BLOCKED = "blocked"
EXITED = "exited"
OPEN = "open"  # still on a CPU when last read

FIX = (
    "run serwatt as root (or with CAP_PERFMON and tracefs mounted at /sys/kernel/tracing: "
    "`mount -t tracefs nodev /sys/kernel/tracing`); without it serwatt weighs samples "
    "by its /proc estimates (cpu_source=estimate)"
)

_SWITCH = re.compile(
    rb"\s(\d+\.\d+): sched_switch: prev_comm=.{0,16} prev_pid=(\d+) prev_prio=-?\d+ "
    rb"prev_state=(\S+) ==> next_comm=(.{0,16}) next_pid=(\d+) next_prio=-?\d+$"
)
_FORK = re.compile(
    rb"\s(\d+\.\d+): sched_process_fork: comm=.{0,16} pid=(\d+) "
    rb"child_comm=(.{0,16}) child_pid=(\d+)$"
)
_MAX_LINE = 512  # a sched line is ~200 bytes; a longer fragment is garbage, not kept
_counter = itertools.count()


@dataclass(frozen=True)
class OnCpu:
    """One on-CPU interval of a thread, CLOCK_MONOTONIC seconds."""

    start_s: float
    end_s: float
    off: str  # PREEMPTED | BLOCKED | EXITED | OPEN


@dataclass
class ThreadTimeline:
    tid: int
    comm: str
    parent: int | None  # the tid that started it, when it started under the trace
    born_s: float | None  # its fork, when seen
    intervals: list[OnCpu] = field(default_factory=list)
    on_cpu_s: float = 0.0  # every interval's length, kept also past max_intervals
    switch_ins: int = 0
    wakes: list[float] = field(default_factory=list)  # switch-ins after a block
    # spans in which the thread was on a CPU for an unknown part: each one holds unpaired
    # switches of this thread (TimelineCounters.unpaired_switches), from the last switch
    # known before them to the one that found a pair missing. No interval is made of it.
    unknown: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class TimelineCounters:
    """What the collector lost, so a consumer can say how far to trust it."""

    kernel_dropped: int  # events the ring buffer refused (reader behind)
    kernel_overrun: int  # events overwritten (0 in no-overwrite mode)
    intervals_dropped: int  # past max_intervals
    threads_dropped: int  # past max_threads
    lines_unparsed: int
    # a switch-out with no switch-in since the thread's last switch-out, or a switch-in
    # with one still open: the kernel (6.18 here) omits some switches, e.g. back from
    # the rcu_preempt kthread, with nothing counted as dropped. The interval is left out
    # (its start or end is unknown: stretching it could cover a long run-queue wait).
    unpaired_switches: int
    bytes_read: int
    reads_capped: int  # polls that stopped at max_bytes_per_poll with more waiting

    @property
    def complete(self) -> bool:
        return not (
            self.kernel_dropped
            or self.kernel_overrun
            or self.intervals_dropped
            or self.threads_dropped
        )


def mount() -> None:
    """Mounts tracefs at its one standard place when the kernel offers it and nothing is
    mounted there (a VM that booted without it, like this project's CI), as `perf` does.
    Never anywhere else: a tracefs root given as a parameter is used as it is. Failure
    is left to the probe."""
    if (TRACEFS / "instances").is_dir() or not TRACEFS.is_dir():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount(b"nodev", os.fsencode(TRACEFS), b"tracefs", 0, None)


def probe(root: Path = TRACEFS) -> CollectorStatus:
    """Whether a private tracefs instance with the mono clock and sched_switch can be
    made here (it makes one and removes it; it mounts tracefs first where it can)."""
    if root == TRACEFS:
        with contextlib.suppress(OSError):
            mount()
    if not (root / "instances").is_dir():
        return CollectorStatus(False, "no_tracefs", f"tracefs is not mounted at {root}; {FIX}")
    try:
        inst = _make_instance(root)
    except PermissionError:
        return CollectorStatus(False, "permission", f"cannot make a tracefs instance; {FIX}")
    except OSError as exc:
        return CollectorStatus(
            False, "tracefs_error", f"cannot make a tracefs instance ({exc}); {FIX}"
        )
    try:
        clocks = (inst / "trace_clock").read_text()
        if "mono" not in clocks.replace("[", " ").replace("]", " ").split():
            return CollectorStatus(False, "no_mono_clock", f"trace_clock has no mono: {FIX}")
        if not (inst / "events/sched/sched_switch/enable").exists():
            return CollectorStatus(False, "no_sched_switch", f"no sched_switch event; {FIX}")
        if not (inst / "options/event-fork").exists():
            return CollectorStatus(False, "no_event_fork", f"no event-fork option; {FIX}")
        return CollectorStatus(True)
    finally:
        _remove_instance(inst)


def _write(path: Path, text: str, *, append: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _make_instance(root: Path) -> Path:
    _remove_stale(root)
    inst = root / "instances" / f"{INSTANCE_PREFIX}{os.getpid()}-{next(_counter)}"
    inst.mkdir()
    return inst


def _remove_instance(inst: Path) -> None:
    with contextlib.suppress(OSError):
        _write(inst / "tracing_on", "0")
    with contextlib.suppress(OSError):
        inst.rmdir()


def _remove_stale(root: Path) -> None:
    """Instances a serwatt that died left behind (its pid is gone) hold kernel memory."""
    with contextlib.suppress(OSError):
        for inst in (root / "instances").iterdir():
            name = inst.name
            if not name.startswith(INSTANCE_PREFIX):
                continue
            owner = name[len(INSTANCE_PREFIX) :].split("-", 1)[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                _remove_instance(inst)


def _state_off(state: bytes) -> str:
    if state.startswith(b"R"):
        return PREEMPTED
    if state[:1] in (b"X", b"Z"):
        return EXITED
    return BLOCKED


class SchedTimeline:
    """Records the on-CPU intervals of the listed processes' threads (and of every thread
    or process they start) from `start()` to `stop()`. Thread-safe reads while running."""

    def __init__(
        self,
        pids: Iterable[int],
        *,
        root: Path = TRACEFS,
        procfs: Path = Path("/proc"),
        buffer_kb: int = 1024,
        poll_s: float = 0.1,
        max_bytes_per_poll: int = 512 * 1024,
        max_threads: int = 4096,
        max_intervals: int = 100_000,
    ) -> None:
        self._root = root
        self._procfs = procfs
        self._buffer_kb = buffer_kb
        self._poll_s = poll_s
        self._max_bytes = max_bytes_per_poll
        self._max_threads = max_threads
        self._max_intervals = max_intervals
        self._initial = sorted(set(pids))
        self._lock = threading.Lock()
        self._threads: dict[int, ThreadTimeline] = {}
        self._open: dict[int, float] = {}
        self._n_intervals = 0
        self._intervals_dropped = 0
        self._threads_dropped = 0
        self._unparsed = 0
        self._lost = 0
        self._bytes = 0
        self._capped = 0
        self._rest = b""
        self._inst: Path | None = None
        self._fd: int | None = None
        self._reader: threading.Thread | None = None
        self._stop = threading.Event()
        self.started_s: float | None = None
        self.stopped_s: float | None = None

    # -- setup -------------------------------------------------------------------------
    def start(self) -> None:
        inst = _make_instance(self._root)
        self._inst = inst
        try:
            _write(inst / "trace_clock", "mono")
            _write(inst / "buffer_size_kb", str(self._buffer_kb))
            _write(inst / "options/overwrite", "0")
            _write(inst / "options/event-fork", "1")
            _write(inst / "tracing_on", "0")
            for pid in self._initial:
                self._list(pid)
            for event in ("sched_switch", "sched_process_fork"):
                _write(inst / f"events/sched/{event}/enable", "1")
            self._fd = os.open(inst / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self.started_s = time.monotonic()
            _write(inst / "tracing_on", "1")
            # threads started between the first listing and event-fork taking effect
            for pid in self._initial:
                self._list(pid)
        except BaseException:
            self._teardown()
            raise
        self._reader = threading.Thread(target=self._run, name="sched-timeline", daemon=True)
        self._reader.start()

    def add_pid(self, pid: int) -> None:
        """Also trace `pid`'s threads (and what they start) from now on."""
        self._list(pid)

    def _list(self, pid: int) -> None:
        """Lists the process's threads for the kernel and in our table. The main thread
        goes first, in the table and then in the kernel's list, so a thread it starts
        from then on is seen at its fork; the threads already there are then listed."""
        assert self._inst is not None
        with self._lock:
            if pid not in self._threads:
                self._track(pid, _comm(self._procfs, pid, pid), None, None)
        with contextlib.suppress(OSError):
            _write(self._inst / "set_event_pid", str(pid), append=True)
        try:
            tids = [int(t) for t in os.listdir(self._procfs / str(pid) / "task") if t.isdigit()]
        except OSError:
            tids = []
        for t in tids:
            if t == pid:
                continue
            with self._lock:
                if t not in self._threads:
                    # a process's threads hang off its main thread, as if seen at fork
                    self._track(t, _comm(self._procfs, pid, t), pid, None)
            with contextlib.suppress(OSError):  # gone meanwhile
                _write(self._inst / "set_event_pid", str(t), append=True)

    def _track(self, tid: int, comm: str, parent: int | None, born: float | None) -> bool:
        if len(self._threads) >= self._max_threads:
            self._threads_dropped += 1
            return False
        self._threads[tid] = ThreadTimeline(tid, comm, parent, born)
        return True

    # -- reading -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            self._drain(self._max_bytes)

    def _drain(self, budget: int) -> None:
        fd = self._fd
        if fd is None:
            return
        got = 0
        while got < budget:
            try:
                chunk = os.read(fd, min(65536, budget - got))
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return
            if not chunk:
                return
            got += len(chunk)
            self._feed(chunk)
        with self._lock:
            self._capped += 1

    def _feed(self, chunk: bytes) -> None:
        data = self._rest + chunk
        lines = data.split(b"\n")
        rest = lines.pop()
        self._rest = rest if len(rest) <= _MAX_LINE else b""
        with self._lock:
            self._bytes += len(chunk)
            for line in lines:
                self._line(line)

    def _line(self, line: bytes) -> None:
        m = _SWITCH.search(line)
        if m is not None:
            ts = float(m[1])
            prev, nxt = int(m[2]), int(m[5])
            if prev in self._threads:
                self._switch_out(prev, ts, _state_off(m[3]))
            if nxt in self._threads:
                self._switch_in(nxt, ts)
            return
        m = _FORK.search(line)
        if m is not None:
            child = int(m[4])
            if child not in self._threads and int(m[2]) in self._threads:
                comm = m[3].decode("utf-8", "replace")
                self._track(child, comm, int(m[2]), float(m[1]))
            return
        if line.strip() and not line.startswith(b"#"):
            self._unparsed += 1

    def _switch_in(self, tid: int, ts: float) -> None:
        th = self._threads[tid]
        if tid in self._open:
            # its switch-out is missing: when it left the CPU is unknown, so the interval
            # is left out rather than stretched over time it may have waited (counted)
            self._unpaired(th, self._open.pop(tid), ts)
        blocked_before = th.intervals[-1].off == BLOCKED if th.intervals else False
        if blocked_before and len(th.wakes) < self._max_intervals:
            th.wakes.append(ts)
        self._open[tid] = ts
        th.switch_ins += 1

    def _switch_out(self, tid: int, ts: float, off: str) -> None:
        th = self._threads[tid]
        start = self._open.pop(tid, None)
        if start is None:
            assert self.started_s is not None
            if th.switch_ins or th.born_s is not None:
                # its switch-in is missing (see TimelineCounters.unpaired_switches): it
                # came after the thread's last known switch
                known = [th.intervals[-1].end_s] if th.intervals else []
                known += [th.unknown[-1][1]] if th.unknown else []
                since = max(known, default=th.born_s or self.started_s)
                self._unpaired(th, since, ts)
                return
            start = self.started_s  # on a CPU since before the trace began
        self._close(th, start, ts, off)

    def _unpaired(self, th: ThreadTimeline, since: float, ts: float) -> None:
        self._lost += 1
        if th.unknown and th.unknown[-1][1] >= since:
            # back to back with the last one: one span (which also bounds their number)
            th.unknown[-1] = (th.unknown[-1][0], ts)
        elif len(th.unknown) < self._max_intervals:
            th.unknown.append((since, ts))

    def _close(self, th: ThreadTimeline, start: float, end: float, off: str) -> None:
        th.on_cpu_s += max(0.0, end - start)
        if self._n_intervals >= self._max_intervals:
            self._intervals_dropped += 1
            return
        th.intervals.append(OnCpu(start, end, off))
        self._n_intervals += 1

    # -- results -----------------------------------------------------------------------
    def threads(self) -> dict[int, ThreadTimeline]:
        """A copy of every thread's timeline so far; an interval still open is closed at
        now as OPEN (CLOCK_MONOTONIC)."""
        now = time.monotonic()
        with self._lock:
            out = {}
            room = self._max_intervals - self._n_intervals
            for tid, th in self._threads.items():
                copy = ThreadTimeline(
                    th.tid,
                    th.comm,
                    th.parent,
                    th.born_s,
                    list(th.intervals),
                    th.on_cpu_s,
                    th.switch_ins,
                    list(th.wakes),
                    list(th.unknown),
                )
                start = self._open.get(tid)
                if start is not None and room > 0:
                    room -= 1
                    end = self.stopped_s if self.stopped_s is not None else now
                    copy.intervals.append(OnCpu(start, end, OPEN))
                    copy.on_cpu_s += max(0.0, end - start)
                out[tid] = copy
            return out

    def counters(self) -> TimelineCounters:
        dropped = overrun = 0
        if self._inst is not None:
            dropped, overrun = _kernel_losses(self._inst)
        with self._lock:
            return TimelineCounters(
                kernel_dropped=dropped or self._final_dropped,
                kernel_overrun=overrun or self._final_overrun,
                intervals_dropped=self._intervals_dropped,
                threads_dropped=self._threads_dropped,
                lines_unparsed=self._unparsed,
                unpaired_switches=self._lost,
                bytes_read=self._bytes,
                reads_capped=self._capped,
            )

    _final_dropped = 0
    _final_overrun = 0

    def stop(self) -> None:
        """Stops tracing, reads what the kernel still holds (within the same per-poll
        budget, times the polls the window had) and removes the instance."""
        if self._inst is None:
            return
        self.stopped_s = time.monotonic()
        with contextlib.suppress(OSError):
            _write(self._inst / "tracing_on", "0")
        self._stop.set()
        if self._reader is not None:
            self._reader.join()
        self._drain(self._max_bytes)
        self._final_dropped, self._final_overrun = _kernel_losses(self._inst)
        self._teardown()

    def _teardown(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._inst is not None:
            _remove_instance(self._inst)
            self._inst = None

    def __enter__(self) -> SchedTimeline:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kernel_losses(inst: Path) -> tuple[int, int]:
    dropped = overrun = 0
    with contextlib.suppress(OSError):
        for cpu in (inst / "per_cpu").iterdir():
            with contextlib.suppress(OSError, ValueError):
                for line in (cpu / "stats").read_text().splitlines():
                    key, _, value = line.partition(":")
                    if key == "dropped events":
                        dropped += int(value)
                    elif key == "overrun":
                        overrun += int(value)
    return dropped, overrun


def _comm(procfs: Path, pid: int, tid: int) -> str:
    try:
        return (procfs / str(pid) / "task" / str(tid) / "comm").read_text().rstrip("\n")
    except OSError:
        return ""
