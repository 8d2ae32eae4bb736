"""One window's scheduler timeline: starting it for a target, and the notes it leaves.

collect.py's `collect_window` asks `start_timeline` for the kernel's scheduler timeline
(collectors.sched_timeline) when the plan asks for one (--kernel-timeline), and its
report notes say, through `timeline_notes`, whether CPU was weighed by that timeline
(kernel_cpu.py) or estimated, why not, and what data the timeline lost.
"""

from __future__ import annotations

from pathlib import Path

from serwatt.collectors import sched_timeline
from serwatt.collectors.pyspy import SamplingPlan, WindowSamples
from serwatt.collectors.pyspy.chrometrace import KernelClock
from serwatt.collectors.sched_timeline import FIX as TIMELINE_FIX
from serwatt.collectors.sched_timeline import SchedTimeline, TimelineCounters


def start_timeline(
    pid: int, plan: SamplingPlan, procfs: Path
) -> tuple[SchedTimeline | None, str | None]:
    """The window's scheduler timeline, started, or None and why not (None, None when the
    plan does not ask for one)."""
    if not plan.kernel_timeline:
        return None, None
    tracer = SchedTimeline([pid], root=sched_timeline.TRACEFS, procfs=procfs)
    try:
        tracer.start()
    except OSError as exc:
        return None, f"no scheduler timeline ({exc.strerror or exc}): {TIMELINE_FIX}"
    return tracer, None


def timeline_notes(
    window: WindowSamples,
    weighed_by_kernel: bool,
    kernel: KernelClock | None,
    kernel_problem: str | None,
    kc: TimelineCounters | None,
) -> list[str]:
    """The notes on the window's CPU source: kernel-weighed, or an estimate and why; and
    what the scheduler timeline lost, if it lost anything."""
    notes: list[str] = []
    if weighed_by_kernel:
        notes.append("cpu_source kernel: on-CPU intervals from the scheduler timeline")
    else:
        why = kernel_problem
        if why is None and kernel is not None:
            if window.changes is None:
                why = "no stack-change run to weigh by the scheduler timeline"
            elif window.changes_timed_by != "kernel":
                why = "py-spy's clock not aligned to the scheduler timeline"
            else:
                why = "no stack change named by its kernel thread id (Python < 3.11)"
        notes.append(f"cpu_source estimate{f' ({why})' if why else ''}")
    if kc is not None and (not kc.complete or kc.unpaired_switches):
        notes.append(
            f"scheduler timeline lost data: {kc.kernel_dropped} event(s) dropped, "
            f"{kc.intervals_dropped} interval(s) and {kc.threads_dropped} thread(s) past its "
            f"bounds, {kc.unpaired_switches} unpaired switch(es)"
        )
    return notes
