"""py-spy's chrometrace output parsed into stack changes (pure: no I/O).

Why a second format: speedscope (collectors/pyspy/speedscope.py) has every sample in
order but no time, so a span of n samples is known only to about sqrt(n) periods
(py-spy's ticks are a Poisson process). chrometrace has the opposite: a `B`/`E` event
per frame whenever a thread's stack *changes*, stamped in microseconds since py-spy
started, and nothing for repeated identical samples. A change is what an episode
boundary is (profiler/attribution/episodes.py), so a chrometrace run times boundaries
to the tick that first showed them.

What an event stream means, from py-spy's chrometrace.rs: per sampled trace, `E` for
each frame of the previous stack that is gone (leaf first), then `B` for each new one
(root first), all at one `ts`; when the file is written, `E` for every frame still
open, at the write time. With `--threads` every stack's root is a pseudo-frame
`thread (<label>): <name>`, the same label speedscope profiles carry (kernel tid, or
hex pthread_t). `tid` in the events is py-spy's thread id and is not used.

The file is written by py-spy, but every name and path in it comes from the target's
memory: the event count is bounded, every event is checked for shape, and a stream
whose `E` does not close the frame on top is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from serwatt.collectors.pyspy.clock import PySpyClock, align
from serwatt.collectors.pyspy.speedscope import label_thread_id, partial_flags
from serwatt.collectors.pyspy.threads import ThreadMapping
from serwatt.collectors.samples import Frame, Sample
from serwatt.collectors.sched_timeline import ThreadTimeline

if TYPE_CHECKING:
    from serwatt.collectors.pyspy.speedscope import WindowSamples

# 10 s windows at 400 Hz of a few busy threads are ~10^5 events; far past that the file
# is not a window of a training process.
MAX_EVENTS = 2_000_000
MAX_STACK_DEPTH = 4096

_THREAD_FRAME = re.compile(r"^thread \((\S+)\)(?:: (.*))?$")
_PROCESS_FRAME = re.compile(r"^process \d+:")


@dataclass(frozen=True)
class StackChange:
    """A thread's stack from `ts_s` (seconds since py-spy started) until its next change
    or the end of the recording; frames leaf first, without py-spy's pseudo-frames."""

    ts_s: float
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class ThreadChanges:
    label: str  # as py-spy printed it: "6053" or "0x7FC5601786C0"
    name: str | None
    changes: tuple[StackChange, ...]


@dataclass(frozen=True)
class ChromeTrace:
    """Every thread's stack changes, and the recording's first and last event times."""

    threads: tuple[ThreadChanges, ...]
    first_ts_s: float
    end_ts_s: float


def _event(ev: Any, k: int) -> tuple[str, str, str, int, int, int]:
    if not isinstance(ev, dict):
        raise ValueError(f"chrometrace event {k} is not an object")
    ph, name, ts = ev.get("ph"), ev.get("name"), ev.get("ts")
    pid, tid = ev.get("pid"), ev.get("tid")
    args = ev.get("args")
    args = args if isinstance(args, dict) else {}
    filename, line = args.get("filename", ""), args.get("line", 0)
    if ph not in ("B", "E") or not isinstance(name, str) or not isinstance(filename, str):
        raise ValueError(f"chrometrace event {k} is not a py-spy B/E frame event: {ev!r:.200}")
    if not (isinstance(ts, int) and isinstance(tid, int) and _is_int(pid)):
        raise ValueError(f"chrometrace event {k} has a non-integer ts/pid/tid: {ev!r:.200}")
    if isinstance(ts, bool) or isinstance(tid, bool):
        raise ValueError(f"chrometrace event {k} has a boolean ts/tid: {ev!r:.200}")
    return str(ph), name, filename, int(line) if _is_int(line) else 0, ts, tid


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_chrometrace(doc: Any) -> ChromeTrace:
    """Stack changes per thread from a py-spy chrometrace document (a JSON list)."""
    if not isinstance(doc, list):
        raise ValueError("not a py-spy chrometrace document (expected a JSON list of events)")
    if len(doc) > MAX_EVENTS:
        raise ValueError(f"chrometrace has {len(doc)} events, more than {MAX_EVENTS}")
    # per py-spy thread id: the open frames (root first) and the changes so far
    open_frames: dict[int, list[tuple[str, str, int]]] = {}
    changes: dict[int, list[StackChange]] = {}
    pending: dict[int, int] = {}  # tid -> ts of events not yet turned into a change
    labels: dict[int, tuple[str, str | None] | None] = {}
    first = last = None

    def flush(tid: int) -> None:
        ts = pending.pop(tid, None)
        if ts is None:
            return
        stack = open_frames.get(tid, [])
        frames = tuple(
            Frame(name=n, filename=f, line=ln)
            for n, f, ln in reversed(stack)
            if not (ln == 0 and f == "" and (_THREAD_FRAME.match(n) or _PROCESS_FRAME.match(n)))
        )
        changes.setdefault(tid, []).append(StackChange(ts_s=ts / 1e6, frames=frames))
        if labels.get(tid) is None:
            labels[tid] = _thread_label(stack)

    for k, raw in enumerate(doc):
        ph, name, filename, line, ts, tid = _event(raw, k)
        if first is None or ts < first:
            first = ts
        if last is None or ts > last:
            last = ts
        if tid in pending and pending[tid] != ts:
            flush(tid)
        stack = open_frames.setdefault(tid, [])
        if ph == "B":
            if len(stack) >= MAX_STACK_DEPTH:
                raise ValueError(f"chrometrace stack deeper than {MAX_STACK_DEPTH} frames")
            stack.append((name, filename, line))
        else:
            if not stack or stack[-1][0] != name or stack[-1][1] != filename:
                raise ValueError(
                    f"chrometrace event {k} ends {name!r} but the open frame is "
                    f"{stack[-1][0] if stack else None!r}: not a py-spy event stream"
                )
            stack.pop()
        pending[tid] = ts
    for tid in list(pending):
        flush(tid)
    if first is None or last is None:
        return ChromeTrace(threads=(), first_ts_s=0.0, end_ts_s=0.0)
    end = last / 1e6
    threads = []
    for tid, chs in changes.items():
        # py-spy's closing events (every open frame ended at write time) are the end of
        # the recording, not a change to an empty stack
        if chs and not chs[-1].frames and chs[-1].ts_s == end:
            chs = chs[:-1]
        label = labels.get(tid)
        if label is None or not chs:
            continue
        threads.append(ThreadChanges(label=label[0], name=label[1], changes=tuple(chs)))
    return ChromeTrace(threads=tuple(threads), first_ts_s=first / 1e6, end_ts_s=end)


def _thread_label(stack: Sequence[tuple[str, str, int]]) -> tuple[str, str | None] | None:
    """The `--threads` pseudo-frame's label and name (the root, below any process frames)."""
    for name, filename, line in stack:
        if line == 0 and filename == "":
            m = _THREAD_FRAME.match(name)
            if m:
                return m.group(1), m.group(2)
    return None


def timed_changes(
    pid: int,
    trace: ChromeTrace,
    mapping: ThreadMapping,
    *,
    host_of: Callable[[float], float],
) -> tuple[Sample, ...]:
    """Each stack change as a Sample at its host time (`host_of` maps py-spy's ts
    seconds). Threads get kernel tids from the window's mapping of the same labels;
    a stack cut short (nonblocking read) is `partial`, as in speedscope samples."""
    out: list[Sample] = []
    for th in trace.threads:
        tid = mapping.tid_of.get(th.label)
        thread_id = label_thread_id(th.label)
        stacks = [c.frames for c in th.changes]
        for change, partial in zip(th.changes, partial_flags(stacks), strict=True):
            out.append(
                Sample(
                    pid=pid,
                    tid=tid,
                    thread_id=thread_id,
                    thread_name=th.name,
                    t=host_of(change.ts_s),
                    frames=change.frames,
                    partial=partial,
                )
            )
    out.sort(key=lambda s: s.t)
    return tuple(out)


@dataclass(frozen=True)
class RawChanges:
    """A stack-change run's output as read, with what timing it needs: the host time of
    its ts 0 (py-spy's spawn) and when its banner was seen (bounds how late that is)."""

    text: str
    anchor: float
    banner_at: float
    rate_hz: float
    pyspy_pid: int = 0  # the py-spy that wrote it (its threads: collectors/pyspy/clock.py)


def resolve_changes(window: WindowSamples, kernel: KernelClock | None = None) -> WindowSamples:
    """The window with its stack-change run parsed into `changes` (or, when the output
    is not a py-spy chrometrace, a note saying why and no changes).

    With `kernel` (the window's scheduler timeline, which traced this py-spy), each
    change is timed by the tick that read it (collectors/pyspy/clock.py), and
    `changes_clock_s` is the alignment's residual; else by the spawn anchor, off by up to
    py-spy's start-up."""
    raw = window.changes_raw
    if raw is None:
        return window
    try:
        trace = parse_chrometrace(json.loads(raw.text))
    except ValueError as exc:  # json.JSONDecodeError is one
        note = f"no stack-change timing this window (unreadable chrometrace: {exc})"
        errors = replace(window.errors, notes=(*window.errors.notes, note))
        return replace(window, errors=errors, changes_raw=None)
    anchor = raw.anchor
    ck = kernel.align(trace, raw) if kernel is not None else None
    if ck is not None:
        assert kernel is not None
        shift = kernel.epoch_minus_mono
        note = (
            f"stack changes timed by the kernel timeline: {ck.matched} of {ck.events} "
            f"py-spy event times on its wake-ups (p95 {ck.residual_p95_s * 1e3:.2f} ms)"
        )
        return replace(
            window,
            changes=timed_changes(
                window.pid, trace, window.mapping, host_of=lambda ts: shift + ck.tick_of(ts)
            ),
            changes_rate_hz=raw.rate_hz,
            changes_end=shift + ck.offset_s + trace.end_ts_s,
            changes_clock_s=ck.residual_p95_s,
            changes_timed_by="kernel",
            changes_ticks=tuple(shift + t for t in ck.ticks),
            changes_raw=None,
            errors=replace(window.errors, notes=(*window.errors.notes, note)),
        )
    # the first event is py-spy's first sample, moments before or after its banner
    uncertainty = max(0.0, raw.banner_at - (anchor + trace.first_ts_s))
    return replace(
        window,
        changes=timed_changes(window.pid, trace, window.mapping, host_of=lambda ts: anchor + ts),
        changes_rate_hz=raw.rate_hz,
        changes_end=anchor + trace.end_ts_s,
        changes_clock_s=uncertainty,
        changes_timed_by="spawn",
        changes_raw=None,
    )


@dataclass(frozen=True)
class KernelClock:
    """A window's scheduler timeline as far as timing py-spy's runs needs it: every
    traced thread (py-spy's included) and the offset from CLOCK_MONOTONIC to the host
    epoch clock serwatt stamps windows with."""

    threads: Mapping[int, ThreadTimeline]
    epoch_minus_mono: float

    def align(self, trace: ChromeTrace, raw: RawChanges) -> PySpyClock | None:
        if not raw.pyspy_pid:
            return None
        ts = [c.ts_s for th in trace.threads for c in th.changes]
        lo = raw.anchor - self.epoch_minus_mono - 0.05
        hi = raw.banner_at - self.epoch_minus_mono + 0.05
        return align(ts, self.threads, raw.pyspy_pid, lo_s=lo, hi_s=hi)
