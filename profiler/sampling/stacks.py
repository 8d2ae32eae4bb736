"""A window's classified stacks, folded: each distinct (stack, codepath, direction) with
its sample count and the CPU its carriers took. Classification used to drop the stacks;
they are what a flame graph or a pprof profile is made of ("which json.dumps call site?").

Bounded: at most MAX_WINDOW_STACKS distinct stacks a window and MAX_FRAMES frames a
stack, so a job with endless distinct stacks (generated code, deep recursion) costs a
fixed amount; what is cut is kept as a named pseudo-frame, never dropped silently."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from serwatt.collectors.samples import Frame, Sample
from serwatt.profiler.classify.codepaths import Classification
from serwatt.profiler.classify.direction import UNKNOWN, series_directions

# (function, file, line) leaf first, as py-spy orders frames
FrameKey = tuple[str, str, int]
# (frames, codepath, direction)
StackKey = tuple[tuple[FrameKey, ...], str, str]

MAX_WINDOW_STACKS = 2000
MAX_FRAMES = 128
# the stack a window's distinct stacks past MAX_WINDOW_STACKS are counted under
OVERFLOW_FRAME: FrameKey = ("(more distinct stacks than serwatt keeps)", "", 0)
TRUNCATED_FRAME: FrameKey = ("(deeper frames not kept)", "", 0)


@dataclass
class StackTally:
    samples: int = 0  # every classified sample (wall: --idle included)
    cpu_s: float = 0.0  # the CPU the stack's carriers took


def frame_key(f: Frame) -> FrameKey:
    return (f.name, f.filename, f.line)


def stack_frames(frames: Sequence[Frame]) -> tuple[FrameKey, ...]:
    kept = tuple(frame_key(f) for f in frames[:MAX_FRAMES])
    return kept + (TRUNCATED_FRAME,) if len(frames) > MAX_FRAMES else kept


def _direction(label: Classification) -> str:
    d = label.direction
    return d if d in series_directions(label.codepath) else UNKNOWN


def fold_stacks(
    samples: Iterable[Sample],
    labels: Iterable[Classification],
    carriers: Iterable[Sample],
    carrier_labels: Iterable[Classification],
    carrier_cpu_s: Iterable[float],
    *,
    cap: int = MAX_WINDOW_STACKS,
) -> dict[StackKey, StackTally]:
    """Samples by stack (all samples) and CPU by stack (the carriers, with the CPU the
    weighting gave each).

    A stack is numbered once per distinct stack, by its frames' identities: py-spy's
    parsers share one Frame object per distinct frame (and the objects live as long as
    the window's samples), so a tuple of ids names a stack without hashing its names;
    keying every sample by its frames' text cost ~40 ms per 1000 samples of 30 frames."""
    number: dict[tuple[int, ...], int] = {}
    stacks: list[tuple[FrameKey, ...]] = []
    tallies: dict[tuple[int, str, str], StackTally] = {}
    overflow: dict[tuple[str, str], StackTally] = {}

    def tally(sample: Sample, label: Classification) -> StackTally:
        ids = tuple(map(id, sample.frames))
        n = number.get(ids)
        if n is None:
            n = number[ids] = len(stacks)
            stacks.append(stack_frames(sample.frames))
        key = (n, label.codepath, _direction(label))
        got = tallies.get(key)
        if got is None:
            if len(tallies) >= cap:
                got = overflow.get(key[1:])
                if got is None:
                    got = overflow[key[1:]] = StackTally()
                return got
            got = tallies[key] = StackTally()
        return got

    for s, c in zip(samples, labels, strict=True):
        tally(s, c).samples += 1
    for s, c, cpu in zip(carriers, carrier_labels, carrier_cpu_s, strict=True):
        if cpu > 0:
            tally(s, c).cpu_s += cpu
    # equal stacks of distinct Frame objects (the stack-change run's frames are its own)
    # are one stack: merged, not overwritten
    out: dict[StackKey, StackTally] = {}
    merged = [((stacks[n], cp, d), t) for (n, cp, d), t in tallies.items()]
    merged += [(((OVERFLOW_FRAME,), cp, d), t) for (cp, d), t in overflow.items()]
    for key, t in merged:
        got = out.get(key)
        if got is None:
            out[key] = t
        else:
            got.samples += t.samples
            got.cpu_s += t.cpu_s
    return out
