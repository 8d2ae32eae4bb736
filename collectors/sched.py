"""Scheduling for the sampler (py-spy), so its samples land when its timer fires.

Why: on a node with more runnable threads than free CPUs, a py-spy with default
scheduling that wakes for a sample often does not run at once. The scheduler (EEVDF,
Linux 6.6+) lets the running target thread finish its slice and notices the end of that
slice at the thread's next accounting point: the tick, or a system call that reads the
thread's runtime, such as `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` behind
`time.thread_time()`. py-spy then runs right after that system call and finds the
thread runnable (`R`, so "active") at that line: with two busy threads and default
scheduling, on-CPU samples gather on `thread_time()` lines that cost almost nothing, and
bench/accuracy.py misses its goal (docs/benchmarks.md, "1.3 The cause: the sampler's
wake-ups followed the target's system calls").

What serwatt does to every py-spy thread, through sched_setattr(2):
- a custom slice of 0.1 ms (Linux 6.12+; the kernel's minimum). A waking task with
  a shorter slice preempts the running one at once, and the running one keeps only the
  shortest slice queued. No privilege is needed.
- nice -20, when allowed (CAP_SYS_NICE, or RLIMIT_NICE 40). It makes the preemption more
  certain.

Both keep py-spy in the normal (fair) class. A waking py-spy still goes to an idle CPU
when there is one, so it takes nothing from the targets on a node with spare CPUs.
SCHED_FIFO fixes the accuracy too, but a real-time task wakes on the CPU it last used
and preempts whatever runs there, taking far more of a busy target's time than this
scheme. The options measured against each other, with the figures: docs/benchmarks.md,
"1.4 Sampler scheduling options" and "1.5 Slice + nice -20".

Modes, as for the energy collectors: 'auto' (apply what is possible and note what was
not), 'required' (fail unless both apply), 'off'.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import struct
from pathlib import Path

from serwatt.collectors import procstat

MODES = ("auto", "required", "off")
SLICE_NS = 100_000  # 0.1 ms: the shortest custom slice the kernel accepts
NICE = -20
CAP_SYS_NICE = 23
FIX = (
    "run serwatt as root or grant it CAP_SYS_NICE (systemd: AmbientCapabilities=CAP_SYS_NICE "
    "and sched_setattr allowed by SystemCallFilter), on Linux 6.12 or later for the slice; "
    "or turn it off (`--sampler-priority off`, config `sampler_priority: false`)"
)
NO_SLICE = "this kernel has no custom scheduler slices (Linux 6.12+)"

# struct sched_attr, SCHED_ATTR_SIZE_VER1 (include/uapi/linux/sched/types.h)
_ATTR = struct.Struct("IIQiIQQQII")
_SCHED_OTHER = 0
_SYSCALLS = {  # (sched_setattr, sched_getattr)
    "x86_64": (314, 315),
    "aarch64": (274, 275),
    "ppc64le": (355, 356),
}
_libc = ctypes.CDLL(None, use_errno=True)


def _syscalls() -> tuple[int, int] | None:
    return _SYSCALLS.get(platform.machine())


def nice_problem(procfs: Path = Path("/proc")) -> str | None:
    """Why this process may not give another one nice -20, or None if it may."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    except (OSError, ValueError):
        soft = 0
    # RLIMIT_NICE n allows nice down to 20 - n
    if soft == resource.RLIM_INFINITY or 20 - soft <= NICE:
        return None
    caps = procstat.effective_capabilities(procfs)
    if caps is not None and caps >> CAP_SYS_NICE & 1:
        return None
    return "nice -20 not allowed (no CAP_SYS_NICE, RLIMIT_NICE below 40)"


def _syscall(which: int, *args: object) -> None:
    """sched_setattr (which=0) or sched_getattr (1); OSError with the kernel's errno."""
    calls = _syscalls()
    if calls is None:
        raise OSError(
            errno.ENOSYS, f"sched_setattr: unknown syscall number on {platform.machine()}"
        )
    if _libc.syscall(calls[which], *args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def get_attr(tid: int) -> tuple[int, int, int]:
    """(policy, nice, slice in ns) of a thread; slice 0 where the kernel has none."""
    buf = ctypes.create_string_buffer(_ATTR.size)
    _syscall(1, tid, buf, _ATTR.size, 0)
    _size, policy, _flags, nice, _prio, runtime, *_ = _ATTR.unpack(buf.raw)
    return policy, nice, runtime


def _set_attr(tid: int, nice: int) -> None:
    attr = _ATTR.pack(_ATTR.size, _SCHED_OTHER, 0, nice, 0, SLICE_NS, 0, 0, 0, 0)
    _syscall(0, tid, ctypes.create_string_buffer(attr), 0)


def make_prompt(pid: int, *, nice: bool, procfs: Path = Path("/proc")) -> list[str]:
    """Give every thread of `pid` (a py-spy we started) the short slice, and nice -20 if
    `nice`. Returns what could not be done (empty: all of it). Call it again once the
    process has started its threads: the kernel does not pass a custom slice on to new
    threads. A thread that exits meanwhile is skipped."""
    if _syscalls() is None:
        return [f"sched_setattr: unknown syscall number on {platform.machine()}"]
    problems: set[str] = set()
    done = 0
    for tid in sorted(procstat.thread_ids(pid, procfs)) or [pid]:
        try:
            # without the privilege keep the thread's nice (lowering it would be refused)
            _set_attr(tid, NICE if nice else get_attr(tid)[1])
            done += 1
            if get_attr(tid)[2] != SLICE_NS:
                problems.add(NO_SLICE)
        except ProcessLookupError:
            continue
        except OSError as exc:
            if exc.errno == errno.EPERM:
                problems.add("sched_setattr was refused (EPERM)")
            else:
                problems.add(f"sched_setattr failed: {exc.strerror or exc}")
    if not done and not problems:
        problems.add("the process exited before its scheduling could be set")
    return sorted(problems)
