"""Find the Python processes that are configured targets, by reading procfs.

A process is a target when every criterion its target's `match` gives holds
(cmdline regex on the space-joined command line, exe regex on the resolved
executable, systemd unit and cgroup regex from /proc/<pid>/cgroup, exact
environment values from /proc/<pid>/environ, the pid in a pid file) and it runs
Python. The first target (in config order) that matches a process gets it, so a
process is sampled once.

Never targets: kernel threads, this process, serwatt itself, py-spy.

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

from profiler.records.run_ids import render_run_id
from profiler.service.config import TargetMatch, TargetSpec

PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?[a-z]*$")  # python, python3.11, python3.13t
_LIBPYTHON = re.compile(rb"/libpython\d+(\.\d+)*[a-z]*\.so")
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


class _Skip(Exception):
    """This process cannot be a target now; `reason` is counted in stats."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Proc:
    """Lazily read facts about one pid; each read may raise _Skip."""

    procfs: Path
    pid: int

    def __post_init__(self) -> None:
        # Plain strings and open(): pathlib costs more than the read itself over a
        # thousand processes every rescan.
        self.dir = f"{self.procfs}/{self.pid}"
        self._cache: dict[str, object] = {}

    def _read(self, name: str) -> bytes:
        try:
            with open(f"{self.dir}/{name}", "rb") as f:
                return f.read()
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            raise _Skip("vanished") from None
        except PermissionError:
            raise _Skip("permission") from None
        except OSError as exc:  # ESRCH and friends from a process exiting under us
            raise _Skip("vanished") from exc

    def stat(self) -> tuple[int, int, int]:
        """(ppid, flags, starttime in clock ticks since boot)."""
        if "stat" not in self._cache:
            raw = self._read("stat").decode("utf-8", "replace")
            # comm may hold spaces and parentheses: the fields start after the LAST ')'.
            fields = raw[raw.rindex(")") + 2 :].split()
            self._cache["stat"] = (int(fields[1]), int(fields[6]), int(fields[19]))
        return self._cache["stat"]  # type: ignore[return-value]

    def argv(self) -> list[str]:
        if "argv" not in self._cache:
            raw = self._read("cmdline")
            self._cache["argv"] = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
        return self._cache["argv"]  # type: ignore[return-value]

    def exe(self) -> str | None:
        if "exe" not in self._cache:
            try:
                target = os.readlink(f"{self.dir}/exe")
            except FileNotFoundError:
                if not os.path.exists(self.dir):
                    raise _Skip("vanished") from None
                target = None  # kernel threads and zombies have no exe
            except (PermissionError, OSError):
                target = None
            if target and target.endswith(" (deleted)"):
                target = target[: -len(" (deleted)")]
            self._cache["exe"] = target
        return self._cache["exe"]  # type: ignore[return-value]

    def cgroup_paths(self) -> list[str]:
        if "cgroup" not in self._cache:
            paths = []
            for line in self._read("cgroup").decode("utf-8", "replace").splitlines():
                parts = line.split(":", 2)
                if len(parts) == 3:
                    paths.append(parts[2])
            self._cache["cgroup"] = paths
        return self._cache["cgroup"]  # type: ignore[return-value]

    def units(self) -> list[str]:
        """Every unit named in the cgroup paths, outermost first (slices excluded)."""
        found: list[str] = []
        for path in self.cgroup_paths():
            for part in path.split("/"):
                if _UNIT_RE.search(part) and part not in found:
                    found.append(part)
        return found

    def environ(self) -> dict[str, str]:
        if "environ" not in self._cache:
            env = {}
            for item in self._read("environ").split(b"\0"):
                key, sep, value = item.partition(b"=")
                if sep:
                    env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
            self._cache["environ"] = env
        return self._cache["environ"]  # type: ignore[return-value]

    def maps_has_libpython(self) -> bool:
        try:
            return bool(_LIBPYTHON.search(self._read("maps")))
        except _Skip as skip:
            if skip.reason == "permission":
                return False
            raise


def _boot_time(procfs: Path) -> float:
    for line in (procfs / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError(f"{procfs}/stat has no btime line: is {procfs} a procfs?")


def _is_python(proc: _Proc) -> bool:
    exe = proc.exe()
    argv = proc.argv()
    names = [os.path.basename(exe)] if exe else []
    if argv:
        names.append(os.path.basename(argv[0]))
    if any(_PYTHON_NAME.match(n) for n in names):
        return True
    # Embedded interpreters (uwsgi, a C++ launcher) show Python only in their mappings.
    return proc.maps_has_libpython()


def _is_serwatt_or_pyspy(proc: _Proc) -> bool:
    argv = proc.argv()
    exe = proc.exe()
    if exe and os.path.basename(exe) == "py-spy":
        return True
    heads = [os.path.basename(a) for a in argv[:2]]
    if "py-spy" in heads[:1] or "serwatt" in heads:
        return True
    # `python -m profiler ...` is serwatt run from a checkout.
    return any(
        a == "-m" and b in ("profiler", "profiler.cli")
        for a, b in zip(argv, argv[1:], strict=False)
    )


def _read_pid_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _matches(proc: _Proc, match: TargetMatch, pid_file_pid: int | None) -> bool:
    if match.pid_file is not None and proc.pid != pid_file_pid:
        return False
    if match.cmdline is not None and not match.cmdline.search(" ".join(proc.argv())):
        return False
    if match.exe is not None:
        exe = proc.exe()
        if exe is None or not match.exe.search(exe):
            return False
    if match.systemd_unit is not None and match.systemd_unit not in proc.units():
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
    boot_s = _boot_time(procfs)
    ticks_per_s = os.sysconf("SC_CLK_TCK")
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
        proc = _Proc(procfs, pid)
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
            ppid, flags, start_ticks = proc.stat()
            if flags & PF_KTHREAD or pid == 2 or ppid == 2:
                count("kernel_thread")
                continue
            if _is_serwatt_or_pyspy(proc):
                count("self")
                continue
            if not _is_python(proc):
                count("not_python")
                continue
            units = proc.units()
            start_time = boot_s + start_ticks / ticks_per_s
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
                    ppid=ppid,
                )
            )
        except _Skip as skip:
            count(skip.reason)
        except (ValueError, IndexError):
            count("vanished")  # a half-written stat of an exiting process
    return found
