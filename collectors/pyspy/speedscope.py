"""py-spy's speedscope output and its status lines, parsed into timed samples (pure: no I/O).

Why speedscope, and how samples get a time: see collectors/pyspy/runner.py.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from serwatt.collectors.pyspy.threads import ThreadMapping
from serwatt.collectors.samples import Frame, Sample, SamplerErrors


@dataclass(frozen=True)
class ThreadTrack:
    """One thread's ordered samples from one speedscope file (frames leaf first)."""

    label: str  # the id exactly as py-spy printed it: "6053" or "0x7FC5601786C0"
    name: str | None
    stacks: tuple[tuple[Frame, ...], ...]

    @property
    def os_tid(self) -> int | None:
        return int(self.label) if self.label.isdigit() else None

    @property
    def pthread_id(self) -> int | None:
        return int(self.label, 16) if self.label.lower().startswith("0x") else None

    @property
    def thread_id(self) -> int:
        return label_thread_id(self.label)


def label_thread_id(label: str) -> int:
    """Sample.thread_id for a py-spy thread label: the pthread_t of a hex label, else the
    kernel tid it names (0 when it is neither)."""
    if label.lower().startswith("0x"):
        return int(label, 16)
    return int(label) if label.isdigit() else 0


_PROFILE_NAME = re.compile(r'^Thread (\S+)(?: "(.*)")?$')
_PSEUDO_FRAME = re.compile(r"^(thread \(|process \d+:)")


def parse_speedscope(doc: dict[str, Any]) -> list[ThreadTrack]:
    """Per-thread ordered stacks from a py-spy speedscope document."""
    try:
        frames_meta = doc["shared"]["frames"]
        profiles = doc["profiles"]
    except (KeyError, TypeError) as exc:
        raise ValueError("not a py-spy speedscope document (no shared.frames/profiles)") from exc
    frames: list[Frame] = [
        Frame(name=str(f["name"]), filename=str(f.get("file") or ""), line=int(f.get("line") or 0))
        for f in frames_meta
    ]
    tracks: list[ThreadTrack] = []
    for prof in profiles:
        m = _PROFILE_NAME.match(str(prof.get("name", "")))
        if not m:
            raise ValueError(f"unexpected speedscope profile name {prof.get('name')!r}")
        stacks = []
        for sample in prof.get("samples", []):
            # speedscope lists root first; serwatt's Sample is leaf first.
            stack = [frames[i] for i in sample]
            stack = [f for f in stack if not (f.line == 0 and _PSEUDO_FRAME.match(f.name))]
            stacks.append(tuple(reversed(stack)))
        tracks.append(ThreadTrack(label=m.group(1), name=m.group(2), stacks=tuple(stacks)))
    return tracks


_SAMPLES_LINE = re.compile(r"Samples: (\d+) Errors: (\d+)")
_BEHIND = re.compile(r"([\d.]+)(ns|µs|us|ms|s) behind in sampling")
_UNIT_S = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class PySpyStatus:
    samples: int | None
    errors: int | None
    behind_s: float
    behind_events: int
    target_exited: bool
    interrupted: bool


def parse_status(text: str) -> PySpyStatus:
    """py-spy's own accounting from its stdout: `Samples: N Errors: M`, lag warnings."""
    found = _SAMPLES_LINE.findall(text)
    last = found[-1] if found else None
    lags = [float(v) * _UNIT_S[u] for v, u in _BEHIND.findall(text)]
    return PySpyStatus(
        samples=int(last[0]) if last else None,
        errors=int(last[1]) if last else None,
        behind_s=max(lags, default=0.0),
        behind_events=len(lags),
        target_exited="process exited" in text or "process ended" in text,
        interrupted="Control-C pressed" in text,
    )


def partial_flags(stacks: Sequence[tuple[Frame, ...]]) -> list[bool]:
    """Mark stacks py-spy could not read to their root.

    In --nonblocking mode a stack can be cut short while the target runs. A thread
    keeps one root frame for its whole life (`<module>`, `Thread._bootstrap`, ...), so
    a sample whose outermost frame differs from the thread's most common root, or
    that has no frames, is partial.
    """
    roots = [(s[-1].name, s[-1].filename) if s else None for s in stacks]
    counted = Counter(r for r in roots if r is not None)
    if not counted:
        return [True] * len(stacks)
    modal = counted.most_common(1)[0][0]
    return [r is None or r != modal for r in roots]


def tick_indices(n_samples: int, n_ticks: int, *, alive_at_end: bool | None) -> list[int]:
    """Which of the window's ticks a thread's samples fell on.

    A thread sampled on every tick fills them all. A thread with fewer samples was
    either born during the window (alive at the end: its samples are the last ticks)
    or died during it (its samples are the first ticks). speedscope cannot tell
    which ticks were missed in between; this is the stated approximation.
    """
    if n_samples >= n_ticks or not alive_at_end:
        return list(range(n_samples))
    offset = n_ticks - n_samples
    return [offset + k for k in range(n_samples)]


def tick_times(n_ticks: int, start: float, end: float) -> list[float]:
    """Best estimate of each tick's host time: the midpoint of equal slices of the span
    (the expected position of the k-th of N Poisson arrivals is (k+1)/(N+1); midpoints
    differ from that by less than one slice)."""
    if n_ticks <= 0:
        return []
    step = max(0.0, end - start) / n_ticks
    return [start + (k + 0.5) * step for k in range(n_ticks)]


# ---------------------------------------------------------------- thread mapping


@dataclass(frozen=True)
class WindowSamples:
    """What one py-spy window yielded for one pid."""

    pid: int
    started_at: float  # host epoch: sampling loop start (banner), or spawn when unseen
    ended_at: float  # host epoch: sampling loop end
    rate_hz: float
    ticks: int  # sampling ticks in the window (the longest thread track)
    samples: tuple[Sample, ...]
    errors: SamplerErrors
    exited: bool  # the target exited during the window
    mapping: ThreadMapping = field(default_factory=lambda: ThreadMapping({}, {}, ()))
    # from a second py-spy run without --idle (a SamplingPlan's on_cpu_run): only
    # samples of threads that were on a CPU; None when that run was not made
    on_cpu: tuple[Sample, ...] | None = None
    on_cpu_errors: SamplerErrors | None = None
    # from a py-spy run in chrometrace format (a SamplingPlan's timing_rate_hz): each
    # thread's stack at each change, at host times; a stack holds until the thread's
    # next change or `changes_end`. None when that run was not made or failed.
    changes: tuple[Sample, ...] | None = None
    changes_rate_hz: float = 0.0
    changes_end: float = 0.0
    # how far the changes' host times may be off (the same for all of them: one offset
    # per run; durations inside the window do not depend on it)
    changes_clock_s: float = 0.0
    # what timed the changes: "kernel" (py-spy's wake-ups in the scheduler timeline:
    # collectors/pyspy/clock.py), "spawn" (py-spy's spawn as ts 0), "" (no changes)
    changes_timed_by: str = ""
    # with "kernel": the stack-change run's ticks (host epoch, ascending), so a change's
    # tick before it is known: the change happened between the two
    changes_ticks: tuple[float, ...] = ()
    # that run's output as read, until collectors.pyspy.chrometrace.resolve_changes
    # parses it into the fields above (off the sampling path)
    changes_raw: Any = None


def assemble_samples(
    pid: int,
    tracks: Sequence[ThreadTrack],
    status: PySpyStatus,
    mapping: ThreadMapping,
    *,
    started_at: float,
    ended_at: float,
    rate_hz: float,
    alive_tids: set[int],
) -> WindowSamples:
    """Turn parsed tracks into timed Samples (pure: no I/O)."""
    n_ticks = max((len(tr.stacks) for tr in tracks), default=0)
    times = tick_times(n_ticks, started_at, ended_at)
    samples: list[Sample] = []
    partial_total = 0
    for tr in tracks:
        tid = mapping.tid_of.get(tr.label)
        alive = (tid in alive_tids) if tid is not None else None
        idx = tick_indices(len(tr.stacks), n_ticks, alive_at_end=alive)
        flags = partial_flags(tr.stacks)
        partial_total += sum(flags)
        for k, stack, partial in zip(idx, tr.stacks, flags, strict=True):
            samples.append(
                Sample(
                    pid=pid,
                    tid=tid,
                    thread_id=tr.thread_id,
                    thread_name=tr.name,
                    t=times[k],
                    frames=stack,
                    active=None,
                    partial=partial,
                )
            )
    samples.sort(key=lambda s: s.t)
    notes: list[str] = []
    if mapping.unmapped:
        notes.append(
            f"{len(mapping.unmapped)} thread(s) not mapped to a kernel tid: "
            + ", ".join(mapping.unmapped)
        )
    by_method = Counter(mapping.method.values())
    if by_method and set(by_method) != {"pyspy"}:
        notes.append(
            "thread ids mapped by " + ", ".join(f"{m}={n}" for m, n in sorted(by_method.items()))
        )
    if status.samples is None:
        notes.append("py-spy printed no 'Samples: N Errors: M' line")
    if status.behind_events:
        notes.append(f"py-spy fell behind {status.behind_events} time(s)")
    errors = SamplerErrors(
        pyspy_samples=status.samples or 0,
        pyspy_errors=status.errors or 0,
        partial_stacks=partial_total,
        behind_s=status.behind_s,
        notes=tuple(notes),
    )
    return WindowSamples(
        pid=pid,
        started_at=started_at,
        ended_at=ended_at,
        rate_hz=rate_hz,
        ticks=n_ticks,
        samples=tuple(samples),
        errors=errors,
        exited=status.target_exited,
        mapping=mapping,
    )
