"""Per-thread CPU time and process facts from procfs: serwatt's one reader of
/proc/<pid> (stat, cmdline, exe, environ, cgroup, maps, mem, task/*) and of the boot time.

Terms:
- *CPU seconds* of a thread: time the kernel ran it on a CPU (user + system).
  Two sources exist. `/proc/<pid>/task/<tid>/schedstat` gives nanoseconds
  (field 1, `sum_exec_runtime`) but reads 0 on kernels built or booted without
  schedstats (this VM: `cat /proc/self/schedstat` -> `0 0 1`).
  `/proc/<pid>/task/<tid>/stat` gives utime+stime in clock ticks (SC_CLK_TCK,
  usually 100/s, so 10 ms resolution). A snapshot reads both; a delta uses
  schedstat only when it is live for the process, else stat, and says which.
- *Run-queue wait* of a thread: time it was runnable but waiting for a CPU
  (schedstat field 2, `run_delay`, ns). A thread waits after each switch-out: after a
  *voluntary* switch (it blocked: a sleep, a lock, a futex) the wait comes when it
  wakes, at the line it blocked on; after an *involuntary* one (preempted) at the line
  it was running. `/proc/<pid>/task/<tid>/status` counts both
  (`voluntary_ctxt_switches`, `nonvoluntary_ctxt_switches`); a snapshot reads them
  when asked (`switches=True`: the window's first and last snapshot).
- A *snapshot* is one read of every thread of one process at one host time.

Every file here may be hostile (serwatt runs as root and reads any process's files,
and the procfs root is a parameter): reads are bounded (`MAX_READ_BYTES`), a value
that does not parse is a clear error naming the file, and a thread whose files do
not parse is left out of its snapshot and counted (`CpuSnapshot.unreadable`), so one
odd thread never stops a window.

Every path is under an injectable procfs root so tests can read a tree in tmp_path.
"""

from __future__ import annotations

import os
import re
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS_PER_S: int = os.sysconf("SC_CLK_TCK")
# How much of a process's maps is searched for libpython: an interpreter's own libraries
# are mapped as it starts, so they come early; 256 MB of maps (a job with a million
# mappings) is not read whole on every rescan.
MAX_MAPS_BYTES = 4 * 1024 * 1024
# The most read of one small procfs file (stat, schedstat, status, comm are < 2 KiB on
# any real kernel): anything longer is not what the kernel writes there.
MAX_READ_BYTES = 64 * 1024


class ProcessGone(Exception):
    """The process (or all its threads) vanished while being read."""


class ProcessUnreadable(Exception):
    """procfs refused to let this process read a live process's file (not root, hidepid)."""


class NotProcfs(RuntimeError):
    """The procfs root given is not a procfs (its stat has no btime line)."""


class ProcfsCorrupt(ValueError):
    """A procfs file holds what the kernel never writes there (too long, unparsable)."""


@dataclass(frozen=True)
class ThreadCpu:
    tid: int
    comm: str  # kernel thread name (/proc/.../comm), at most 15 bytes
    stat_ticks: int  # utime + stime, clock ticks
    sched_ns: int | None  # schedstat sum_exec_runtime, None when the file is absent
    state: str  # R, S, D, ...
    # schedstat run_delay: ns spent runnable but waiting for a CPU (None: no schedstat)
    wait_ns: int | None = None
    # (voluntary, nonvoluntary) context switches from status; None: not read
    switches: tuple[int, int] | None = None


@dataclass(frozen=True)
class CpuSnapshot:
    pid: int
    t: float  # host epoch seconds, taken just before the reads
    threads: dict[int, ThreadCpu]
    # threads listed but left out: their files did not parse (tid, why)
    unreadable: tuple[tuple[int, str], ...] = ()

    @property
    def schedstat_live(self) -> bool:
        """schedstat is usable when it counts anything a thread has used."""
        busy = [th for th in self.threads.values() if th.stat_ticks > 0]
        if not busy:
            return all(th.sched_ns is not None for th in self.threads.values())
        return all(th.sched_ns not in (None, 0) for th in busy)


@dataclass(frozen=True)
class ThreadCpuDelta:
    """Per-thread CPU seconds one process used between two snapshots of it."""

    pid: int
    started_at: float
    ended_at: float
    per_tid_s: dict[int, float]
    source: str  # "schedstat" (ns) or "stat" (clock ticks)
    resolution_s: float  # one unit of the source: 1e-9 or 1/SC_CLK_TCK
    exited_tids: tuple[int, ...] = ()  # in `before`, gone in `after`: their last CPU is lost
    # seconds each thread waited in a run queue (schedstat run_delay); empty without schedstat
    wait_per_tid_s: dict[int, float] = field(default_factory=dict)
    # per thread, the part (0..1) of its switch-outs that were voluntary (it blocked):
    # the part of its run-queue wait spent waking up; only threads with switches in
    # both snapshots and at least one switch between them
    wakeup_share_per_tid: dict[int, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.per_tid_s.values())


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    start_time_s: float  # epoch seconds
    cmdline: tuple[str, ...]
    exe: str | None  # None when the link cannot be read (kernel thread, permission)
    comm: str


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat (or a task's stat) that serwatt uses."""

    comm: str  # may hold spaces and ')'
    state: str  # R, S, D, Z, X, ...
    ppid: int
    flags: int  # PF_* bits (PF_KTHREAD: a kernel thread)
    utime_ticks: int
    stime_ticks: int
    start_ticks: int  # clock ticks after boot

    def started_at(self, boot_s: float) -> float:
        """Start time in epoch seconds, given the node's boot time (`boot_time_s`)."""
        return boot_s + self.start_ticks / CLOCK_TICKS_PER_S


def parse_stat(text: str) -> ProcStat:
    """Parse a stat line. comm may hold spaces and parentheses, so the fields start after
    the LAST ')'. ValueError for a line that is not a whole stat (a process exiting)."""
    lpar = text.index("(")
    rpar = text.rindex(")")
    fields = text[rpar + 2 :].split()
    if len(fields) < 20:
        raise ValueError(f"stat line has {len(fields)} fields after comm, need >= 20")
    # fields[0] is stat field 3 (state); utime, stime, starttime are fields 14, 15, 22.
    return ProcStat(
        comm=text[lpar + 1 : rpar],
        state=fields[0],
        ppid=int(fields[1]),
        flags=int(fields[6]),
        utime_ticks=int(fields[11]),
        stime_ticks=int(fields[12]),
        start_ticks=int(fields[19]),
    )


def _read(path: Path | str, limit: int = MAX_READ_BYTES) -> str:
    """The file's text, at most `limit` bytes; ProcfsCorrupt when it is longer."""
    with open(path, "rb") as fh:
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise ProcfsCorrupt(f"{path}: longer than {limit} bytes, which no kernel writes there")
    return raw.decode("utf-8", "replace")


def parse_schedstat(text: str) -> tuple[int, int]:
    """(ns on a CPU, ns waiting in a run queue) from a schedstat line; ValueError when
    it is not three non-negative integers."""
    fields = text.split()
    if len(fields) != 3 or not all(f.isdigit() for f in fields):
        raise ValueError(f"schedstat is not three non-negative integers: {text[:80]!r}")
    return int(fields[0]), int(fields[1])


def parse_switches(text: str) -> tuple[int, int]:
    """(voluntary, nonvoluntary) context switches from a status file; ValueError when
    either line is missing or not a non-negative integer."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            v = value.strip()
            if not v.isdigit():
                raise ValueError(f"status {key} is not a non-negative integer: {v[:40]!r}")
            found[key] = int(v)
    if len(found) != 2:
        raise ValueError("status has no voluntary_ctxt_switches/nonvoluntary_ctxt_switches")
    return found["voluntary_ctxt_switches"], found["nonvoluntary_ctxt_switches"]


def read_thread(
    pid: int, tid: int, procfs: Path = Path("/proc"), *, switches: bool = False
) -> ThreadCpu:
    """One thread's CPU counters. ProcfsCorrupt (a ValueError) names the file that
    does not parse; a missing or odd schedstat reads as no schedstat, missing switch
    counts as None."""
    task = procfs / str(pid) / "task" / str(tid)
    try:
        st = parse_stat(_read(task / "stat"))
    except ValueError as exc:
        raise ProcfsCorrupt(f"{task / 'stat'}: {exc}") from exc
    sched_ns: int | None
    wait_ns: int | None
    try:
        sched_ns, wait_ns = parse_schedstat(_read(task / "schedstat"))
    except (FileNotFoundError, ValueError):
        sched_ns = wait_ns = None
    counts: tuple[int, int] | None = None
    if switches:
        try:
            counts = parse_switches(_read(task / "status"))
        except (FileNotFoundError, PermissionError, ValueError):
            counts = None
    return ThreadCpu(
        tid=tid,
        comm=st.comm,
        stat_ticks=st.utime_ticks + st.stime_ticks,
        sched_ns=sched_ns,
        state=st.state,
        wait_ns=wait_ns,
        switches=counts,
    )


def thread_ids(pid: int, procfs: Path = Path("/proc")) -> set[int]:
    """The kernel tids of `pid` now; empty when the process is gone or unreadable."""
    try:
        return {int(name) for name in os.listdir(procfs / str(pid) / "task") if name.isdigit()}
    except OSError:
        return set()


def snapshot(pid: int, procfs: Path = Path("/proc"), *, switches: bool = False) -> CpuSnapshot:
    """Read every thread of `pid` (with its context-switch counts if `switches`).
    Threads that exit between listing and reading are skipped; threads whose files do
    not parse are left out and listed in `unreadable`. ProcfsCorrupt when no thread
    parses, ProcessGone when the process is gone."""
    t = time.time()
    task_dir = procfs / str(pid) / "task"
    try:
        tids = sorted(int(name) for name in os.listdir(task_dir) if name.isdigit())
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError) as exc:
        raise ProcessGone(f"process {pid} is gone ({task_dir} missing)") from exc
    threads: dict[int, ThreadCpu] = {}
    unreadable: list[tuple[int, str]] = []
    for tid in tids:
        try:
            threads[tid] = read_thread(pid, tid, procfs, switches=switches)
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            continue
        except ProcfsCorrupt as exc:
            unreadable.append((tid, str(exc)))
    if not threads and unreadable:
        raise ProcfsCorrupt(
            f"no thread of process {pid} has a stat serwatt can parse (first: "
            f"{unreadable[0][1]}); is {procfs} a procfs?"
        )
    if not threads:
        raise ProcessGone(f"process {pid} has no readable threads")
    return CpuSnapshot(pid=pid, t=t, threads=threads, unreadable=tuple(unreadable))


def delta(before: CpuSnapshot, after: CpuSnapshot) -> ThreadCpuDelta:
    """CPU seconds per thread between two snapshots of the same process.

    Threads born during the interval count from zero. Threads that died during the
    interval are listed in `exited_tids`: procfs no longer shows them, so the CPU they
    used after `before` is not counted (the process-level stat keeps it, per thread
    it is gone).
    """
    if before.pid != after.pid:
        raise ValueError(f"snapshots of different processes: {before.pid} vs {after.pid}")
    use_sched = before.schedstat_live and after.schedstat_live
    per_tid: dict[int, float] = {}
    wait: dict[int, float] = {}
    wakeup: dict[int, float] = {}
    for tid, th in after.threads.items():
        prev = before.threads.get(tid)
        if th.switches is not None and prev is not None and prev.switches is not None:
            vol = max(0, th.switches[0] - prev.switches[0])
            invol = max(0, th.switches[1] - prev.switches[1])
            if vol + invol > 0:
                wakeup[tid] = vol / (vol + invol)
        if use_sched:
            now_ns = th.sched_ns or 0
            prev_ns = (prev.sched_ns or 0) if prev else 0
            per_tid[tid] = max(0, now_ns - prev_ns) / 1e9
            if th.wait_ns is not None:
                prev_wait = (prev.wait_ns or 0) if prev else 0
                wait[tid] = max(0, th.wait_ns - prev_wait) / 1e9
        else:
            prev_ticks = prev.stat_ticks if prev else 0
            per_tid[tid] = max(0, th.stat_ticks - prev_ticks) / CLOCK_TICKS_PER_S
    exited = tuple(sorted(set(before.threads) - set(after.threads)))
    return ThreadCpuDelta(
        pid=after.pid,
        started_at=before.t,
        ended_at=after.t,
        per_tid_s=per_tid,
        source="schedstat" if use_sched else "stat",
        resolution_s=1e-9 if use_sched else 1.0 / CLOCK_TICKS_PER_S,
        exited_tids=exited,
        wait_per_tid_s=wait,
        wakeup_share_per_tid=wakeup,
    )


# procfs root -> its btime, as first read by this process
_BOOT_S: dict[str, float] = {}


def boot_time_s(procfs: Path = Path("/proc")) -> float:
    """When the node booted, epoch seconds (the `btime` line of <procfs>/stat), read once
    per procfs root and kept: the kernel recomputes btime on every read as the wall clock
    minus the time since boot, so while NTP slews the clock it moves by a second now and
    then (prometheus/client_golang#289, osquery#6911), and every process start time with
    it. A daemon keys its processes and names their runs by start time: a moving btime
    would make a running job a new process and split its run in two."""
    key = str(procfs)
    if key in _BOOT_S:
        return _BOOT_S[key]
    # the node's stat grows with CPUs and interrupts (an `intr` line per IRQ source)
    for line in _read(procfs / "stat", limit=64 * MAX_READ_BYTES).splitlines():
        if line.startswith("btime "):
            return _BOOT_S.setdefault(key, float(line.split()[1]))
    raise NotProcfs(f"{procfs}/stat has no btime line: is {procfs} a procfs?")


def start_time_s(pid: int, procfs: Path = Path("/proc"), *, boot_s: float | None = None) -> float:
    """When `pid` started, epoch seconds. boot_s: the node's boot time when already known."""
    try:
        st = parse_stat(_read(procfs / str(pid) / "stat"))
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(f"no such process: {pid}") from exc
    return st.started_at(boot_time_s(procfs) if boot_s is None else boot_s)


def process_info(pid: int, procfs: Path = Path("/proc")) -> ProcessInfo:
    proc = ProcessFiles(pid, procfs)
    try:
        st = proc.stat()
        cmdline = tuple(proc.argv())
        exe = proc.exe()
    except ProcessGone as exc:
        raise ProcessGone(f"no such process: {pid}") from exc
    return ProcessInfo(
        pid=pid,
        ppid=st.ppid,
        start_time_s=st.started_at(boot_time_s(procfs)),
        cmdline=cmdline,
        exe=exe,
        comm=st.comm,
    )


def _stat_of(pid: int, procfs: Path) -> ProcStat | None:
    """The pid's stat; None when it is gone (or its stat is cut short: exiting)."""
    try:
        return parse_stat(_read(procfs / str(pid) / "stat"))
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None


def exists(pid: int, procfs: Path = Path("/proc")) -> bool:
    """True while the pid exists and is not a zombie."""
    st = _stat_of(pid, procfs)
    return st is not None and st.state not in ("Z", "X")


# The kernel's task flag for a task inside do_exit (include/linux/sched.h). It is set
# before the task's memory is torn down, which is when py-spy can no longer read it, and
# the task shows as running (R or D) until it becomes a zombie after that.
PF_EXITING = 0x00000004


def exiting(pid: int, procfs: Path = Path("/proc")) -> bool:
    """True when the pid is gone, a zombie, or on its way out (PF_EXITING): a target that
    was exiting when py-spy failed on it, not one py-spy failed on while it ran."""
    st = _stat_of(pid, procfs)
    return st is None or st.state in ("Z", "X") or bool(st.flags & PF_EXITING)


def _live_parents(procfs: Path) -> dict[int, int]:
    """pid -> ppid for every live (not zombie, not dead) process, from one procfs scan.

    Scanning ppid is how children are found: the per-task `children` file needs
    CONFIG_PROC_CHILDREN, absent on this VM's kernel."""
    parent_of: dict[int, int] = {}
    for name in os.listdir(procfs):
        if not name.isdigit():
            continue
        try:
            st = parse_stat(_read(procfs / name / "stat"))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if st.state not in ("Z", "X"):
            parent_of[int(name)] = st.ppid
    return parent_of


def children(pid: int, procfs: Path = Path("/proc")) -> list[int]:
    """Direct live children of `pid`."""
    return sorted(child for child, parent in _live_parents(procfs).items() if parent == pid)


def descendants(pid: int, procfs: Path = Path("/proc")) -> list[int]:
    """All live descendants of `pid`, breadth first."""
    parent_of = _live_parents(procfs)
    kids: dict[int, list[int]] = {}
    for child, parent in parent_of.items():
        kids.setdefault(parent, []).append(child)
    out: list[int] = []
    queue = sorted(kids.get(pid, []))
    while queue:
        p = queue.pop(0)
        out.append(p)
        queue.extend(sorted(kids.get(p, [])))
    return out


def thread_comm(pid: int, tid: int, procfs: Path = Path("/proc")) -> str | None:
    """A thread's kernel name (at most 15 bytes); None when it cannot be read."""
    try:
        return _read(procfs / str(pid) / "task" / str(tid) / "comm").strip()
    except (OSError, ValueError):
        return None


def read_mem_u32(
    pid: int, addresses: Sequence[int], procfs: Path = Path("/proc")
) -> dict[int, int]:
    """Signed 32-bit little-endian values at `addresses` of `pid`'s memory
    (/proc/<pid>/mem, needs ptrace access); addresses that cannot be read are left out."""
    out: dict[int, int] = {}
    try:
        fd = os.open(procfs / str(pid) / "mem", os.O_RDONLY)
    except OSError:
        return out
    try:
        for addr in addresses:
            try:
                raw = os.pread(fd, 4, addr)
            except OSError:
                continue
            if len(raw) == 4:
                out[addr] = struct.unpack("<i", raw)[0]
    finally:
        os.close(fd)
    return out


def effective_capabilities(procfs: Path = Path("/proc"), pid: int | str = "self") -> int | None:
    """The CapEff bit mask of `pid` (default: this process); None when unreadable."""
    try:
        for line in _read(procfs / str(pid) / "status").splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


class ProcessFiles:
    """Lazily read, cached files of one process, for scans over every pid.

    Each read raises ProcessGone (the process exited, or the entry is not a readable
    file) or ProcessUnreadable (permission). Paths are plain strings and reads plain
    open(): pathlib costs more than the read itself over a thousand processes.
    """

    def __init__(self, pid: int, procfs: Path | str = Path("/proc")) -> None:
        self.pid = pid
        self.dir = f"{procfs}/{pid}"
        self._stat: ProcStat | None = None
        self._argv: list[str] | None = None
        self._exe: tuple[str | None] | None = None
        self._cgroup: list[str] | None = None
        self._environ: dict[str, str] | None = None

    def read(self, name: str, limit: int = -1) -> bytes:
        """The file's bytes, at most `limit` of them (all when negative)."""
        try:
            with open(f"{self.dir}/{name}", "rb") as f:
                return f.read(limit)
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError) as exc:
            raise ProcessGone(f"process {self.pid}: {name} is gone") from exc
        except PermissionError as exc:
            raise ProcessUnreadable(f"process {self.pid}: {name}: permission denied") from exc
        except OSError as exc:  # ESRCH and friends from a process exiting under us
            raise ProcessGone(f"process {self.pid}: {name}: {exc}") from exc

    def stat(self) -> ProcStat:
        """ValueError when the stat line is cut short (the process is exiting)."""
        if self._stat is None:
            self._stat = parse_stat(self.read("stat").decode("utf-8", "replace"))
        return self._stat

    def argv(self) -> list[str]:
        """The command line; empty for kernel threads and zombies."""
        if self._argv is None:
            raw = self.read("cmdline")
            self._argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
        return self._argv

    def exe(self) -> str | None:
        """The resolved executable; None for kernel threads, zombies and when not allowed.
        A binary replaced on disk (an upgrade) reads as its old path, not "... (deleted)"."""
        if self._exe is None:
            try:
                target: str | None = os.readlink(f"{self.dir}/exe")
            except FileNotFoundError:
                if not os.path.exists(self.dir):
                    raise ProcessGone(f"process {self.pid} is gone") from None
                target = None
            except OSError:
                target = None
            if target and target.endswith(" (deleted)"):
                target = target[: -len(" (deleted)")]
            self._exe = (target,)
        return self._exe[0]

    def cgroup_paths(self) -> list[str]:
        """The cgroup path of every hierarchy in /proc/<pid>/cgroup."""
        if self._cgroup is None:
            paths = []
            for line in self.read("cgroup").decode("utf-8", "replace").splitlines():
                parts = line.split(":", 2)
                if len(parts) == 3:
                    paths.append(parts[2])
            self._cgroup = paths
        return self._cgroup

    def environ(self) -> dict[str, str]:
        """The environment the process started with (later setenv calls do not show)."""
        if self._environ is None:
            env = {}
            for item in self.read("environ").split(b"\0"):
                key, sep, value = item.partition(b"=")
                if sep:
                    env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
            self._environ = env
        return self._environ

    def python_kind(self, *, maps: bool = True) -> PythonKind:
        """Whether the process runs CPython; see `python_kind`. ProcessGone when it
        exits while being read.

        maps=False: by the exe (or argv[0]) alone; the maps are not read. A process's
        maps can be hundreds of MB (a job maps what it likes), so they are searched
        only for a process some criterion admitted by its exe (an embedded interpreter
        the operator named), and only their first MAX_MAPS_BYTES."""
        exe = self.exe()
        # The kernel's exe link wins; argv[0] is whatever the parent chose, so it counts
        # only when the link cannot be read.
        if exe is not None:
            name, evidence = os.path.basename(exe), f"exe {exe}"
        else:
            try:
                argv = self.argv()
            except ProcessUnreadable:
                argv = []
            name = os.path.basename(argv[0]) if argv else ""
            evidence = f"argv[0] {argv[0] if argv else '?'} (exe unreadable)"
        m = _PYTHON_NAME.match(name)
        if m:
            return PythonKind(True, _major_minor(m.group(1)), "t" in m.group(2), evidence)
        if not maps:
            return PythonKind(False, None, False, f"{evidence} (maps not read)")
        # Embedded interpreters (uwsgi, a C++ launcher) show Python only in their mappings.
        try:
            mapped = self.read("maps", MAX_MAPS_BYTES)
        except ProcessUnreadable:
            mapped = b""
        lm = _LIBPYTHON.search(mapped)
        if lm:
            return PythonKind(
                True,
                _major_minor(lm.group(1).decode()),
                b"t" in lm.group(2),
                f"maps {lm.group(0)[1:].decode()}",
            )
        searched = "" if len(mapped) < MAX_MAPS_BYTES else f" in its first {MAX_MAPS_BYTES} bytes"
        return PythonKind(False, None, False, f"{evidence} maps no libpython{searched}")


# python, python3, python3.11, python3.11.7, python3.13t (free-threaded), python3.7m
_PYTHON_NAME = re.compile(r"^python(\d+(?:\.\d+)*)?([a-z]*)$")
_LIBPYTHON = re.compile(rb"/libpython(\d+(?:\.\d+)*)([a-z]*)\.so")
_FULL_VERSION = re.compile(r"(\d+\.\d+\.\d+)")


def _major_minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


@dataclass(frozen=True)
class PythonKind:
    """What a process's executable and mappings say about its interpreter."""

    is_python: bool
    version: str | None  # "3.11" when the exe or libpython names it
    free_threaded: bool
    evidence: str


def python_kind(pid: int, procfs: Path = Path("/proc")) -> PythonKind:
    """Guess from the exe name (argv[0] when the exe link is unreadable) and a mapped
    libpython whether `pid` runs CPython. Never raises: a process that is gone is not
    Python.

    This is a pre-check only: py-spy has the final word (it reads the interpreter's
    memory). Free-threaded builds name themselves `python3.13t` / `libpython3.13t.so`.
    """
    try:
        return ProcessFiles(pid, procfs).python_kind()
    except (ProcessGone, ProcessUnreadable) as exc:
        return PythonKind(False, None, False, f"unreadable: {exc}")


def python_version(pid: int, procfs: Path = Path("/proc")) -> str | None:
    """ "3.11.7" when the executable's path names it (pyenv, venvs), else "3.11" from
    `python_kind`, else None."""
    try:
        exe = ProcessFiles(pid, procfs).exe() or ""
    except ProcessGone:
        exe = ""
    m = _FULL_VERSION.search(exe)
    if m:
        return m.group(1)
    return python_kind(pid, procfs).version
