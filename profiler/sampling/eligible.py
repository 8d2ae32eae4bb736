"""Whether a process may be sampled: the one rule both drivers apply to what they find.

The daemon finds processes by its targets' match criteria (service/discovery.py); a
profile follows the descendants of the command it launched (profile/session.py). Either
way a candidate is refused when it is a kernel thread (or a zombie: no command line),
serwatt itself or a py-spy (sampling the sampler would count its own cost as the job's),
or not a CPython interpreter py-spy could read.
"""

from __future__ import annotations

import os

from serwatt.collectors.procstat import ProcessFiles

PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread

# The reasons a process is refused, as the daemon's discovery stats count them.
KERNEL_THREAD, SELF, NOT_PYTHON = "kernel_thread", "self", "not_python"


def is_serwatt_or_pyspy(proc: ProcessFiles) -> bool:
    exe = proc.exe()
    if exe and os.path.basename(exe) == "py-spy":
        return True
    argv = proc.argv()
    heads = [os.path.basename(a) for a in argv[:2]]
    if "py-spy" in heads[:1] or "serwatt" in heads:
        return True
    # `python -m profiler ...` is serwatt run from a checkout; `python -m collectors.fsevents
    # DIR` is a serwatt's checkpoint watch (its argv names the job's directory, which a
    # target's cmdline pattern may match)
    return any(
        a == "-m"
        and (
            b in ("serwatt", "serwatt.profiler", "serwatt.profiler.cli")
            or b.startswith("serwatt.collectors.")
        )
        for a, b in zip(argv, argv[1:], strict=False)
    )


def refusal(proc: ProcessFiles) -> str | None:
    """Why `proc` may not be sampled (KERNEL_THREAD, SELF or NOT_PYTHON), or None when it
    may. Raises procstat.ProcessGone or ProcessUnreadable as its reads do: the caller
    counts those (a process that exits mid-scan is neither refused nor sampled)."""
    if not proc.argv():
        return KERNEL_THREAD  # or a zombie: nothing to sample either way
    st = proc.stat()
    if st.flags & PF_KTHREAD or proc.pid == 2 or st.ppid == 2:
        return KERNEL_THREAD
    if is_serwatt_or_pyspy(proc):
        return SELF
    if not proc.python_kind().is_python:
        return NOT_PYTHON
    return None
