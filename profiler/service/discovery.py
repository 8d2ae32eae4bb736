"""Find the Python processes that are configured targets, by reading procfs.

A process is a target when every criterion its target's `match` gives holds
(cmdline regex on the space-joined command line, exe regex on the resolved
executable, systemd unit and cgroup regex from /proc/<pid>/cgroup, exact
environment values from /proc/<pid>/environ, the pid in a pid file) and it runs
Python. The first target (in config order) that matches a process gets it, so a
process is sampled once.

Never targets: this process, and what profiler/sampling/eligible.py refuses (kernel
threads, serwatt itself, py-spy, processes that are not CPython): the rule a profile
applies to the children it follows.

Processes come and go while we read them: a process that vanishes mid-scan, or
whose files we may not read, is skipped and counted in `stats`, never raised.
The procfs root is a parameter so tests (and containers with the host's /proc
mounted elsewhere) can point it at another tree.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from collectors import procstat
from collectors.procstat import ProcessFiles
from profiler.records.run_ids import render_run_id
from profiler.sampling import eligible
from profiler.service.config import TargetMatch, TargetSpec

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


def _read_pid_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


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


def _pids(procfs: Path) -> list[int]:
    return sorted(int(name) for name in os.listdir(procfs) if name.isdigit())


def discover(
    targets: Iterable[TargetSpec],
    procfs: Path = Path("/proc"),
    *,
    exclude_pids: Iterable[int] | None = None,
    host: str | None = None,
    stats: MutableMapping[str, int] | None = None,
) -> list[DiscoveredProcess]:
    """Every process that is one of `targets` now, by pid.

    exclude_pids: never targets (default: this process). stats: if given, counts of
    processes skipped by reason ("vanished", "permission", "kernel_thread", "self",
    "not_python") are added to it.
    """
    targets = list(targets)
    if not targets:
        return []
    procfs = Path(procfs)
    excluded = {os.getpid()} if exclude_pids is None else set(exclude_pids)
    host = host if host is not None else socket.gethostname().split(".")[0]
    boot_s = procstat.boot_time_s(procfs)
    pid_files = {
        t.name: _read_pid_file(t.match.pid_file) for t in targets if t.match.pid_file is not None
    }

    def count(reason: str) -> None:
        if stats is not None:
            stats[reason] = stats.get(reason, 0) + 1

    found: list[DiscoveredProcess] = []
    for pid in _pids(procfs):
        if pid in excluded:
            count("self")
            continue
        proc = ProcessFiles(pid, procfs)
        try:
            # The command line first: empty for kernel threads and zombies, and most
            # processes fail the cheap criteria, so their stat is never read.
            if not proc.argv():
                count("kernel_thread")  # or a zombie: nothing to sample either way
                continue
            spec = next(
                (t for t in targets if _matches(proc, t.match, pid_files.get(t.name))), None
            )
            if spec is None:
                continue
            refused = eligible.refusal(proc)
            if refused is not None:
                count(refused)
                continue
            st = proc.stat()
            units = _units(proc)
            start_time = st.started_at(boot_s)
            unit = units[0] if units else None
            found.append(
                DiscoveredProcess(
                    pid=pid,
                    target=spec.name,
                    start_time=start_time,
                    cmdline=" ".join(proc.argv()),
                    exe=proc.exe(),
                    unit=unit,
                    run_id=render_run_id(
                        spec.run,
                        target=spec.name,
                        pid=pid,
                        start_time=start_time,
                        unit=unit,
                        host=host,
                    ),
                    ppid=st.ppid,
                )
            )
        except procstat.ProcessGone:
            count("vanished")
        except procstat.ProcessUnreadable:
            count("permission")
        except (ValueError, IndexError):
            count("vanished")  # a half-written stat of an exiting process
    return found
