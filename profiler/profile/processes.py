"""The per-process view of a profile: each codepath's figures split by process.

A DataLoader job pickles in its workers and unpickles in its main process; the codepath
totals add the two. This keeps each profiled process's figures apart (samples, CPU-s,
thread-seconds, and its main thread's wall time), so the document's
`codepaths.<cp>.processes` and `serwatt profile --by process` show them per process.

`wall_s` of a codepath counts every thread (samples x tick): a run with 8 threads in
`other` for 34 s has 272 thread-seconds there. `main_thread_wall_s` counts one thread: the
main thread (kernel tid == pid) of the process, or of the main process for a codepath's
total. The main process is the root serwatt launched or attached to, or, when the root
was not sampled (a shell wrapping `python`), the Python target sampled first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.sampling.window import TimedLabel, WindowReport

WALL_METHOD = (
    "wall_s: thread-seconds, samples x tick summed over every thread (it can exceed "
    "duration_s with several threads); main_thread_wall_s: the main thread's samples x tick "
    "(kernel tid == pid), of the main process for a codepath's total"
)
ROLE_MAIN, ROLE_WORKER = "main", "worker"


@dataclass
class ProcessCodepath:
    """One process's figures in one codepath, summed over its windows."""

    samples: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0  # thread-seconds
    main_thread_wall_s: float = 0.0


@dataclass
class ProcessTally:
    """pid -> codepath -> its figures; `add` takes each classified window of a target."""

    by_pid: dict[int, dict[str, ProcessCodepath]] = field(default_factory=dict)

    def add(self, report: WindowReport) -> None:
        rows = self.by_pid.setdefault(report.pid, {cp: ProcessCodepath() for cp in CODEPATHS})
        for cp, w in report.codepaths.items():
            row = rows[cp if cp in rows else "other"]
            row.samples += w.samples
            row.cpu_s += w.cpu_s
            row.wall_s += w.wall_s
        tick_s = report.timeline_period_s or (1.0 / report.rate_hz if report.rate_hz > 0 else 0)
        for lab in main_thread_labels(report.timeline, report.pid):
            rows[lab.codepath if lab.codepath in rows else "other"].main_thread_wall_s += tick_s


def main_thread_labels(timeline: Sequence[TimedLabel], pid: int) -> list[TimedLabel]:
    """The main thread's samples: kernel tid == pid; when no sample has that tid and one
    Python thread has none (py-spy names a forked child's main thread by pthread_t on
    Python < 3.11), that thread's."""
    mine = [lab for lab in timeline if lab.tid == pid]
    if mine:
        return mine
    unmapped = {lab.thread_id for lab in timeline if lab.tid is None}
    if len(unmapped) != 1:
        return []
    return [lab for lab in timeline if lab.tid is None]


class TargetLike(Protocol):
    pid: int
    command: str
    windows: int
    first_t: float | None


def main_pid(root_pid: int, targets: Sequence[TargetLike]) -> int:
    """The main process: the root when it was sampled, else the target sampled first."""
    sampled = [t for t in targets if t.windows > 0]
    if any(t.pid == root_pid for t in sampled) or not sampled:
        return root_pid
    return min(sampled, key=lambda t: (t.first_t or 0.0, t.pid)).pid


def role(pid: int, main: int) -> str:
    return ROLE_MAIN if pid == main else ROLE_WORKER


def codepath_processes(
    tally: ProcessTally, codepath: str, commands: Mapping[int, str], main: int
) -> list[dict[str, Any]]:
    """A codepath's rows, one per process with samples or CPU there, the most CPU first."""
    out: list[dict[str, Any]] = []
    order = sorted(
        tally.by_pid.items(),
        key=lambda kv: (-kv[1][codepath].cpu_s, -kv[1][codepath].samples, kv[0]),
    )
    for pid, rows in order:
        r = rows[codepath]
        if not r.samples and r.cpu_s <= 0:
            continue
        out.append(
            {
                "pid": pid,
                "role": role(pid, main),
                "command": commands.get(pid, ""),
                "samples": r.samples,
                "cpu_s": round(r.cpu_s, 6),
                "wall_s": round(r.wall_s, 6),
                "main_thread_wall_s": round(r.main_thread_wall_s, 6),
            }
        )
    return out


def main_thread_wall_s(tally: ProcessTally, codepath: str, main: int) -> float:
    rows = tally.by_pid.get(main)
    return round(rows[codepath].main_thread_wall_s, 6) if rows else 0.0
