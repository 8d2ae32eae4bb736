"""Real-time priority for the sampler (py-spy), so its samples land when its timer says.

Why: on a node with more runnable threads than free CPUs, a py-spy at normal priority
that wakes for a sample often does not run at once. The scheduler lets the running
target thread finish its slice and notices the end of that slice at its next
accounting point (the tick, or a system call that updates the thread's runtime, such
as `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` behind `time.thread_time()`). py-spy then
runs right after that system call and finds the thread runnable (`R`, so "active") at
that line. Measured on the 2-vCPU reference VM (docs/sampling.md): with two busy
threads, 8% of on-CPU samples sat on `thread_time()` lines whose real cost is ~0.2%,
and bench/accuracy.py missed its 3 pp goal by that much. A SCHED_FIFO py-spy preempts
the running thread as soon as its timer fires, so sample times no longer follow the
target's system calls (max error 1.5 and 2.0 pp in the same bench).

It costs no more CPU (the same work, done on time). A SCHED_FIFO task that never
slept could starve a CPU; py-spy sleeps between samples, the kernel's RT throttling
(`kernel.sched_rt_runtime_us`, 95% by default) bounds it anyway, and serwatt kills a
py-spy that overruns its window (collectors/pyspy.py).

Modes, as for the energy collectors: 'auto' (try; fall back to normal priority with
a note saying why), 'required' (fail if it cannot be had), 'off'.
"""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

MODES = ("auto", "required", "off")
# The lowest real-time priority: above every normal (SCHED_OTHER) task, below any
# real-time work the node already runs (IRQ threads run at 50).
RT_PRIORITY = 1
CAP_SYS_NICE = 23
FIX = (
    "run serwatt as root or grant it CAP_SYS_NICE (systemd: AmbientCapabilities=CAP_SYS_NICE, "
    "and no RestrictRealtime=yes), or set RLIMIT_RTPRIO >= 1; or turn real-time sampling off "
    "(`--sampler-realtime off`, config `sampler_realtime: false`)"
)


def permission_problem(procfs: Path = Path("/proc")) -> str | None:
    """Why this process may not make another one SCHED_FIFO, or None if it may.

    A best guess from credentials alone: a seccomp filter (systemd's RestrictRealtime)
    or a cgroup without real-time budget still refuse at the call, which `make_realtime`
    reports."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
    except (OSError, ValueError):
        soft = 0
    if soft == resource.RLIM_INFINITY or soft >= RT_PRIORITY:
        return None
    try:
        for line in (procfs / "self" / "status").read_text().splitlines():
            if line.startswith("CapEff:"):
                if int(line.split()[1], 16) >> CAP_SYS_NICE & 1:
                    return None
                break
    except (OSError, ValueError, IndexError):
        pass
    return "no CAP_SYS_NICE and RLIMIT_RTPRIO is 0"


def make_realtime(pid: int, procfs: Path = Path("/proc")) -> str | None:
    """Put every thread of `pid` (a py-spy we started) under SCHED_FIFO at RT_PRIORITY.

    Threads it creates later inherit the policy. Returns None on success, else why not
    (the process keeps its normal priority). A thread that exits meanwhile is skipped."""
    param = os.sched_param(RT_PRIORITY)
    try:
        tids = [int(t) for t in os.listdir(procfs / str(pid) / "task") if t.isdigit()]
    except OSError:
        tids = [pid]
    done = 0
    for tid in tids or [pid]:
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, param)
            done += 1
        except ProcessLookupError:
            continue
        except OSError as exc:
            if exc.errno == errno.EPERM:
                return "sched_setscheduler(SCHED_FIFO) was refused (EPERM)"
            return f"sched_setscheduler(SCHED_FIFO) failed: {exc.strerror or exc}"
    if not done:
        return "the process exited before its priority could be set"
    return None


def policy_of(pid: int) -> str:
    """'fifo', 'rr', 'other', ... for tests and diagnostics."""
    names = {
        os.SCHED_OTHER: "other",
        os.SCHED_FIFO: "fifo",
        os.SCHED_RR: "rr",
        os.SCHED_BATCH: "batch",
        os.SCHED_IDLE: "idle",
    }
    return names.get(os.sched_getscheduler(pid), "unknown")
