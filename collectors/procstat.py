"""Per-thread CPU time and process facts from procfs.

Terms:
- *CPU seconds* of a thread: time the kernel ran it on a CPU (user + system).
  Two sources exist. `/proc/<pid>/task/<tid>/schedstat` gives nanoseconds
  (field 1, `sum_exec_runtime`) but reads 0 on kernels built or booted without
  schedstats (this VM: `cat /proc/self/schedstat` -> `0 0 1`).
  `/proc/<pid>/task/<tid>/stat` gives utime+stime in clock ticks (SC_CLK_TCK,
  usually 100/s, so 10 ms resolution). A snapshot reads both; a delta uses
  schedstat only when it is live for the process, else stat, and says which.
- A *snapshot* is one read of every thread of one process at one host time.

Every path is under an injectable procfs root so tests can read a tree in tmp_path.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS_PER_S: int = os.sysconf("SC_CLK_TCK")


class ProcessGone(Exception):
    """The process (or all its threads) vanished while being read."""


@dataclass(frozen=True)
class ThreadCpu:
    tid: int
    comm: str  # kernel thread name (/proc/.../comm), at most 15 bytes
    stat_ticks: int  # utime + stime, clock ticks
    sched_ns: int | None  # schedstat sum_exec_runtime, None when the file is absent
    state: str  # R, S, D, ...
    # schedstat run_delay: ns spent runnable but waiting for a CPU (None: no schedstat)
    wait_ns: int | None = None


@dataclass(frozen=True)
class CpuSnapshot:
    pid: int
    t: float  # host epoch seconds, taken just before the reads
    threads: dict[int, ThreadCpu]

    @property
    def schedstat_live(self) -> bool:
        """schedstat is usable when it counts anything a thread has used."""
        busy = [th for th in self.threads.values() if th.stat_ticks > 0]
        if not busy:
            return all(th.sched_ns is not None for th in self.threads.values())
        return all(th.sched_ns not in (None, 0) for th in busy)


@dataclass(frozen=True)
class CpuDelta:
    """Per-thread CPU seconds used between two snapshots of one process."""

    pid: int
    started_at: float
    ended_at: float
    per_tid_s: dict[int, float]
    source: str  # "schedstat" (ns) or "stat" (clock ticks)
    resolution_s: float  # one unit of the source: 1e-9 or 1/SC_CLK_TCK
    exited_tids: tuple[int, ...] = ()  # in `before`, gone in `after`: their last CPU is lost
    # seconds each thread waited in a run queue (schedstat run_delay); empty without schedstat
    wait_per_tid_s: dict[int, float] = field(default_factory=dict)

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


def _parse_stat(text: str) -> tuple[str, list[str]]:
    """Split a stat line into (comm, fields after comm). comm may hold spaces and ')'."""
    lpar = text.index("(")
    rpar = text.rindex(")")
    return text[lpar + 1 : rpar], text[rpar + 2 :].split()


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def read_thread(pid: int, tid: int, procfs: Path = Path("/proc")) -> ThreadCpu:
    task = procfs / str(pid) / "task" / str(tid)
    comm, fields = _parse_stat(_read(task / "stat"))
    # fields[0] is state (stat field 3); utime/stime are stat fields 14/15.
    state = fields[0]
    ticks = int(fields[11]) + int(fields[12])
    sched_ns: int | None
    wait_ns: int | None
    try:
        fields3 = _read(task / "schedstat").split()
        sched_ns, wait_ns = int(fields3[0]), int(fields3[1])
    except (FileNotFoundError, IndexError, ValueError):
        sched_ns = wait_ns = None
    return ThreadCpu(
        tid=tid, comm=comm, stat_ticks=ticks, sched_ns=sched_ns, state=state, wait_ns=wait_ns
    )


def thread_ids(pid: int, procfs: Path = Path("/proc")) -> set[int]:
    """The kernel tids of `pid` now; empty when the process is gone or unreadable."""
    try:
        return {int(name) for name in os.listdir(procfs / str(pid) / "task") if name.isdigit()}
    except OSError:
        return set()


def snapshot(pid: int, procfs: Path = Path("/proc")) -> CpuSnapshot:
    """Read every thread of `pid`. Threads that exit between listing and reading are skipped."""
    t = time.time()
    task_dir = procfs / str(pid) / "task"
    try:
        tids = sorted(int(name) for name in os.listdir(task_dir) if name.isdigit())
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(f"process {pid} is gone ({task_dir} missing)") from exc
    threads: dict[int, ThreadCpu] = {}
    for tid in tids:
        try:
            threads[tid] = read_thread(pid, tid, procfs)
        except (FileNotFoundError, ProcessLookupError):
            continue
    if not threads:
        raise ProcessGone(f"process {pid} has no readable threads")
    return CpuSnapshot(pid=pid, t=t, threads=threads)


def delta(before: CpuSnapshot, after: CpuSnapshot) -> CpuDelta:
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
    for tid, th in after.threads.items():
        prev = before.threads.get(tid)
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
    return CpuDelta(
        pid=after.pid,
        started_at=before.t,
        ended_at=after.t,
        per_tid_s=per_tid,
        source="schedstat" if use_sched else "stat",
        resolution_s=1e-9 if use_sched else 1.0 / CLOCK_TICKS_PER_S,
        exited_tids=exited,
        wait_per_tid_s=wait,
    )


def boot_time_s(procfs: Path = Path("/proc")) -> float:
    for line in _read(procfs / "stat").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError(f"no btime line in {procfs / 'stat'}")


def process_info(pid: int, procfs: Path = Path("/proc")) -> ProcessInfo:
    base = procfs / str(pid)
    try:
        comm, fields = _parse_stat(_read(base / "stat"))
        raw_cmdline = _read(base / "cmdline")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(f"no such process: {pid}") from exc
    ppid = int(fields[1])
    start_ticks = int(fields[19])  # stat field 22: starttime, ticks since boot
    try:
        exe: str | None = os.readlink(base / "exe")
    except OSError:
        exe = None
    cmdline = tuple(a for a in raw_cmdline.split("\0") if a)
    return ProcessInfo(
        pid=pid,
        ppid=ppid,
        start_time_s=boot_time_s(procfs) + start_ticks / CLOCK_TICKS_PER_S,
        cmdline=cmdline,
        exe=exe,
        comm=comm,
    )


def exists(pid: int, procfs: Path = Path("/proc")) -> bool:
    """True while the pid exists and is not a zombie."""
    try:
        _, fields = _parse_stat(_read(procfs / str(pid) / "stat"))
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return False
    return fields[0] not in ("Z", "X")


def _live_parents(procfs: Path) -> dict[int, int]:
    """pid -> ppid for every live (not zombie, not dead) process, from one procfs scan.

    Scanning ppid is how children are found: the per-task `children` file needs
    CONFIG_PROC_CHILDREN, absent on this VM's kernel."""
    parent_of: dict[int, int] = {}
    for name in os.listdir(procfs):
        if not name.isdigit():
            continue
        try:
            _, fields = _parse_stat(_read(procfs / name / "stat"))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if fields[0] not in ("Z", "X"):
            parent_of[int(name)] = int(fields[1])
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


_LIBPYTHON = re.compile(r"libpython(\d+\.\d+)(t?)[\w.]*\.so")
_PYTHON_EXE = re.compile(r"python(\d+(?:\.\d+)?)?(t?)$")


@dataclass(frozen=True)
class PythonKind:
    """What a process's executable and mappings say about its interpreter."""

    is_python: bool
    version: str | None  # "3.11" when the exe or libpython names it
    free_threaded: bool
    evidence: str


def python_kind(pid: int, procfs: Path = Path("/proc")) -> PythonKind:
    """Guess from the exe name and mapped libpython whether `pid` runs CPython.

    This is a pre-check only: py-spy has the final word (it reads the interpreter's
    memory). Free-threaded builds name themselves `python3.13t` / `libpython3.13t.so`.
    """
    base = procfs / str(pid)
    try:
        exe = os.readlink(base / "exe")
    except OSError:
        exe = ""
    exe_name = os.path.basename(exe)
    m = _PYTHON_EXE.search(exe_name)
    if m and exe_name.startswith("python"):
        return PythonKind(True, m.group(1), m.group(2) == "t", f"exe {exe}")
    try:
        maps = _read(base / "maps")
    except OSError:
        maps = ""
    lm = _LIBPYTHON.search(maps)
    if lm:
        return PythonKind(True, lm.group(1), lm.group(2) == "t", f"maps {lm.group(0)}")
    return PythonKind(False, None, False, f"exe {exe or '?'} maps no libpython")
