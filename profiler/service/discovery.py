"""Find the Python processes that are configured targets, by reading procfs.

A process is a target when every criterion its target's `match` gives holds
(cmdline regex on the space-joined command line, exe regex on the resolved
executable, systemd unit and cgroup regex from /proc/<pid>/cgroup, exact
environment values from /proc/<pid>/environ, the pid in a pid file) and it runs
Python (by its exe; by a libpython in its maps only when the target's match names its
exe, as for uwsgi). The first target (in config order) that matches a process gets it, so a
process is sampled once.

Never targets: this process, and what profiler/sampling/eligible.py refuses (kernel
threads, serwatt itself, py-spy, processes that are not CPython): the rule a profile
applies to the children it follows.

A pid file is the job's. One on a FUSE mount, or reached through a link into one, is
not read at all: its path is resolved with the mount of each component checked before
it is asked anything (profiler/classify/target_files.py `resolve_off_fuse`: a FUSE
request never answered leaves the thread that made it unkillable); any other is read
from the inode resolved, through the one bounded open (a FIFO, device or anything but a
regular file is refused before it is opened, at most PID_FILE_MAX_BYTES) on a worker
owned by its target with a deadline (profiler/owned_io.py: a network filesystem can
stall too), and its content counts only when it is ASCII digits. One that cannot be
read costs its own target that scan, counted in `target_errors` (the daemon's
`serwatt_sampler_errors_total{kind="pid_file_..."}`), never the scan or another target.

A process's procfs files are the job's too: its cmdline and environ wait for its
memory-map lock, which its own threads hold. So every read that decides whether a
process is a target runs on a worker of its user's (profiler/owned_io.py), waited on
PROC_READ_WAIT_S; one that does not answer costs that process its admission this scan,
counted under each target it was yet to be checked against (`proc_read_stuck`), never
the scan; a user with PROC_READS_PER_USER reads stuck has no process read until one
returns.

Processes come and go while we read them: a process that vanishes mid-scan, or
whose files we may not read, is skipped and counted in `stats`, never raised.
The procfs root is a parameter so tests (and containers with the host's /proc
mounted elsewhere) can point it at another tree.
"""

from __future__ import annotations

import os
import re
import socket
import stat
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from serwatt.collectors import procstat
from serwatt.collectors.mounts import OnFuse
from serwatt.collectors.procstat import ProcessFiles
from serwatt.profiler.classify.target_files import resolve_off_fuse
from serwatt.profiler.owned_io import OwnedWorkers, Stuck
from serwatt.profiler.records.run_ids import render_run_id
from serwatt.profiler.safeio import NO_SUCH_FILE, InputFileError, read_bounded
from serwatt.profiler.sampling import eligible
from serwatt.profiler.service.config import TargetMatch, TargetSpec

# A pid and its newline; a longer file is not a pid file.
PID_FILE_MAX_BYTES = 64
# How long one scan waits for one target's pid file. A local file answers in
# microseconds; one that has not by then is left to its worker and the target misses
# this scan (and every scan while that read is still stuck: one worker per target).
PID_FILE_WAIT_S = 0.5
# Kinds counted in target_errors.
PID_FILE_STUCK = "pid_file_stuck"  # the read did not answer in time
PID_FILE_REFUSED = "pid_file_refused"  # not a regular file, too long, unreadable
PID_FILE_INVALID = "pid_file_invalid"  # not ASCII digits
_PID_FILES = OwnedWorkers(per_owner=1, name="serwatt-pid-file")
# How long one scan waits for one process's procfs files (cmdline, cgroup, environ, exe,
# stat: the reads that decide whether it is a target). cmdline and environ take the
# process's memory-map lock, which its own threads hold; procfs answers in microseconds
# otherwise. A process not read by then is not admitted this scan.
PROC_READ_WAIT_S = 0.5
# Reads of one user's processes left running past their wait, at most: past it, that
# user's processes are not read at all until one returns (each stalled process would
# otherwise cost the scan its wait, and a thread, anew).
PROC_READS_PER_USER = 4
PROC_READ_STUCK = "proc_read_stuck"  # a process's procfs files did not answer in time
_PROC_READS = OwnedWorkers(per_owner=PROC_READS_PER_USER, name="serwatt-proc-read")

_UNIT_RE = re.compile(r"\.(service|scope|socket|mount|swap|target|timer|path|device)$")


@dataclass(frozen=True)
class DiscoveredProcess:
    pid: int
    target: str
    start_time: float  # epoch seconds
    cmdline: str  # argv joined with spaces
    exe: str | None  # resolved /proc/<pid>/exe, None when unreadable
    unit: str | None  # systemd unit from /proc/<pid>/cgroup, None outside any unit
    run_id: str  # the target's `run` template, rendered
    ppid: int | None = None


def _units(proc: ProcessFiles) -> list[str]:
    """Every unit named in the cgroup paths, outermost first (slices excluded)."""
    found: list[str] = []
    for path in proc.cgroup_paths():
        for part in path.split("/"):
            if _UNIT_RE.search(part) and part not in found:
                found.append(part)
    return found


def _read_off_fuse(path: Path) -> bytes:
    """The pid file's bytes, read through the one bounded open from the very inode its
    path resolved to, each component's mount checked off FUSE first (target_files.py:
    a FUSE request its server never answers leaves the thread that made it unkillable,
    and the daemon with it). Raises OnFuse or InputFileError."""
    try:
        pfd = resolve_off_fuse(str(path))
    except FileNotFoundError:
        raise InputFileError(path, NO_SUCH_FILE) from None
    except OnFuse:
        raise
    except OSError as exc:
        raise InputFileError(path, f"cannot read the file: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(pfd).st_mode):  # no FIFO or device is opened
            raise InputFileError(path, "not a regular file; give the file itself")
        return read_bounded(f"/proc/self/fd/{pfd}", max_bytes=PID_FILE_MAX_BYTES)
    finally:
        os.close(pfd)


def _read_pid_file(target: str, path: Path, error: Callable[[str, str], None]) -> int | None:
    """The pid in a target's pid file; None (and `error(target, kind)` unless the file is
    missing) when there is none to read."""
    try:
        data = _PID_FILES.call(
            target, lambda: _read_off_fuse(path), PID_FILE_WAIT_S, what=f"pid file {path}"
        )
    except OnFuse:
        error(target, PID_FILE_REFUSED)  # never asked
        return None
    except Stuck:
        error(target, PID_FILE_STUCK)
        return None
    except InputFileError as exc:
        if exc.problem != NO_SUCH_FILE:  # not written yet: nothing wrong
            error(target, PID_FILE_REFUSED)
        return None
    text = data.strip()
    if not (text.isascii() and text.isdigit()):
        error(target, PID_FILE_INVALID)
        return None
    return int(text)


def _matches(proc: ProcessFiles, match: TargetMatch, pid_file_pid: int | None) -> bool:
    if match.pid_file is not None and proc.pid != pid_file_pid:
        return False
    if match.cmdline is not None and not match.cmdline.search(" ".join(proc.argv())):
        return False
    if match.exe is not None:
        exe = proc.exe()
        if exe is None or not match.exe.search(exe):
            return False
    if match.systemd_unit is not None and match.systemd_unit not in _units(proc):
        return False
    if match.cgroup is not None and not any(match.cgroup.search(p) for p in proc.cgroup_paths()):
        return False
    if match.environ:
        env = proc.environ()
        if any(env.get(k) != v for k, v in match.environ.items()):
            return False
    return True


def _admit(
    proc: ProcessFiles,
    targets: list[TargetSpec],
    pid_files: dict[str, int | None],
    boot_s: float,
    host: str,
    checking: list[int],
) -> DiscoveredProcess | str | None:
    """The process as the first target that matches it; a reason to count when it is
    not one; None when no target matches. Runs on a worker of its user's
    (`_PROC_READS`): every read of its procfs is here. `checking[0]` is the index of the
    target being checked."""
    # The command line first: empty for kernel threads and zombies, and most processes
    # fail the cheap criteria, so their stat is never read.
    if not proc.argv():
        return "kernel_thread"  # or a zombie: nothing to sample either way
    spec = None
    for i, t in enumerate(targets):
        checking[0] = i
        if _matches(proc, t.match, pid_files.get(t.name)):
            spec = t
            break
    if spec is None:
        return None
    if (
        spec.match.exe is None
        and not eligible.is_serwatt_or_pyspy(proc)
        and not proc.python_kind(maps=False).is_python
    ):
        # Only a target that names its exe admits an embedded interpreter (found in the
        # maps); others' maps are never read (one can be 260 MB).
        return eligible.NOT_PYTHON
    refused = eligible.refusal(proc)
    if refused is not None:
        return refused
    st = proc.stat()
    units = _units(proc)
    start_time = st.started_at(boot_s)
    unit = units[0] if units else None
    return DiscoveredProcess(
        pid=proc.pid,
        target=spec.name,
        start_time=start_time,
        cmdline=" ".join(proc.argv()),
        exe=proc.exe(),
        unit=unit,
        run_id=render_run_id(
            spec.run,
            target=spec.name,
            pid=proc.pid,
            start_time=start_time,
            unit=unit,
            host=host,
        ),
        ppid=st.ppid,
    )


def _pids(procfs: Path) -> list[int]:
    return sorted(int(name) for name in os.listdir(procfs) if name.isdigit())


def discover(
    targets: Iterable[TargetSpec],
    procfs: Path = Path("/proc"),
    *,
    exclude_pids: Iterable[int] | None = None,
    host: str | None = None,
    stats: MutableMapping[str, int] | None = None,
    target_errors: MutableMapping[tuple[str, str], int] | None = None,
) -> list[DiscoveredProcess]:
    """Every process that is one of `targets` now, by pid.

    exclude_pids: never targets (default: this process). stats: if given, counts of
    processes skipped by reason ("vanished", "permission", "kernel_thread", "self",
    "not_python") are added to it. target_errors: if given, (target, kind) counts of
    what cost a target this scan (its pid file: PID_FILE_STUCK, _REFUSED, _INVALID; a
    process whose procfs files did not answer: PROC_READ_STUCK, under each target it was
    yet to be checked against).
    """
    targets = list(targets)
    if not targets:
        return []
    procfs = Path(procfs)
    excluded = {os.getpid()} if exclude_pids is None else set(exclude_pids)
    host = host if host is not None else socket.gethostname().split(".")[0]
    boot_s = procstat.boot_time_s(procfs)

    def count(reason: str) -> None:
        if stats is not None:
            stats[reason] = stats.get(reason, 0) + 1

    def error(target: str, kind: str) -> None:
        if target_errors is not None:
            target_errors[(target, kind)] = target_errors.get((target, kind), 0) + 1

    pid_files = {
        t.name: _read_pid_file(t.name, t.match.pid_file, error)
        for t in targets
        if t.match.pid_file is not None
    }

    found: list[DiscoveredProcess] = []
    for pid in _pids(procfs):
        if pid in excluded:
            count("self")
            continue
        proc = ProcessFiles(pid, procfs)
        # what the reads got to, as they go: a stall then costs the targets it was to be
        # checked against (from that one on), not the scan
        checking: list[int] = [0]
        try:
            owner = os.stat(proc.dir).st_uid  # procfs: answers without blocking
            got = _PROC_READS.call(
                owner,
                partial(_admit, proc, targets, pid_files, boot_s, host, checking),
                PROC_READ_WAIT_S,
                what=f"procfs files of process {pid}",
            )
        except Stuck:
            for t in targets[checking[0] :]:
                error(t.name, PROC_READ_STUCK)
            continue
        except procstat.ProcessUnreadable:
            count("permission")
            continue
        except (procstat.ProcessGone, OSError, ValueError, IndexError):
            count("vanished")  # gone, or a half-written stat of an exiting process
            continue
        if isinstance(got, str):
            count(got)
        elif got is not None:
            found.append(got)
    return found
