"""The classified stacks of a whole profile session, with each stack's CPU, joules and
GPU-wait: what `--pprof` and `--flamegraph` write (profiler/profile/pprof.py,
flamegraph.py).

A window's stacks come folded from finish_window (profiler/sampling/stacks.py). Its
attributed joules and GPU-wait are per (codepath, direction); here each is split over
that pair's stacks in the window: joules by the stacks' CPU (energy follows CPU, as
the codepath's joules are split by direction), GPU-wait by their samples (a wait is
wall time, which samples measure, not CPU). CPU no sample carried (the `unmapped
threads` of `other`) has no stack and is in the table, not here.

Bounded: at most MAX_SESSION_STACKS distinct stacks; later new ones are counted under
one pseudo-stack per (codepath, direction), and how many were merged is kept."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.sampling.stacks import OVERFLOW_FRAME, StackKey

MAX_SESSION_STACKS = 20_000


@dataclass
class StackFigures:
    samples: int = 0
    cpu_s: float = 0.0
    energy_j: float = 0.0
    gpu_wait_s: float = 0.0


class StackProfile:
    def __init__(self, cap: int = MAX_SESSION_STACKS) -> None:
        self.cap = cap
        self.stacks: dict[StackKey, StackFigures] = {}
        self.merged = 0  # distinct stacks past the cap, counted under OVERFLOW_FRAME
        self.has_energy = False
        self.has_gpu_wait = False

    def __iter__(self) -> Iterator[tuple[StackKey, StackFigures]]:
        return iter(self.stacks.items())

    def __len__(self) -> int:
        return len(self.stacks)

    def _figures(self, key: StackKey) -> StackFigures:
        got = self.stacks.get(key)
        if got is None:
            if len(self.stacks) >= self.cap:
                self.merged += 1
                key = ((OVERFLOW_FRAME,), key[1], key[2])
                got = self.stacks.get(key)
            if got is None:
                got = self.stacks[key] = StackFigures()
        return got

    def add(self, window: AttributedWindow) -> None:
        stacks = window.report.stacks
        if not stacks:
            return
        figures = window.by_direction()
        cpu: dict[tuple[str, str], float] = {}
        samples: dict[tuple[str, str], int] = {}
        for (_, cp, d), t in stacks.items():
            cpu[cp, d] = cpu.get((cp, d), 0.0) + t.cpu_s
            samples[cp, d] = samples.get((cp, d), 0) + t.samples
        wait: dict[tuple[str, str], float] = {}
        for (cp, d, _gpu), s in figures.gpu_wait_s.items():
            wait[cp, d] = wait.get((cp, d), 0.0) + s
        energy = figures.energy_j
        self.has_energy = self.has_energy or energy is not None
        self.has_gpu_wait = self.has_gpu_wait or bool(figures.gpu_wait_s)
        for key, t in stacks.items():
            cd = (key[1], key[2])
            f = self._figures(key)
            f.samples += t.samples
            f.cpu_s += t.cpu_s
            if energy is not None and cpu[cd] > 0:
                f.energy_j += energy.get(cd, 0.0) * t.cpu_s / cpu[cd]
            if samples[cd] > 0:
                f.gpu_wait_s += wait.get(cd, 0.0) * t.samples / samples[cd]
