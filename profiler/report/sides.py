"""One side of an A/B (its runs and their windows) and the figures read off its windows:
each window's value of a metric for a codepath or the total, per-run observations and
totals for the test, and the source each figure names."""

from __future__ import annotations

from dataclasses import dataclass

from serwatt.profiler.report.checkpoints import FILE_EVENTS, HEURISTIC
from serwatt.profiler.report.inputs import EpisodeInput, RunInput, WindowInput

TOTAL = "total"
CPU_SOURCE = "measured: py-spy samples weighted by procfs thread CPU"
SCHEMA1_NOTE = "no episodes recorded (schema 1)"


def window_has(w: WindowInput, metric: str) -> bool:
    if metric == "cpu_s":
        return True
    if metric == "energy_j":
        return w.energy_source in ("rapl", "model") or any(
            f.energy_j is not None for f in w.codepaths.values()
        )
    return any(f.gpu_wait_s is not None for f in w.codepaths.values())


def window_value(w: WindowInput, codepath: str, metric: str) -> float | None:
    """The window's figure, 0 for a codepath it did not see, None when unavailable."""
    if not window_has(w, metric):
        return None
    if codepath == TOTAL:
        if metric == "cpu_s":
            return w.cpu_s
        values = [getattr(f, metric) for f in w.codepaths.values()]
        return None if any(v is None for v in values) else float(sum(values))
    figures = w.codepaths.get(codepath)
    return 0.0 if figures is None else getattr(figures, metric)


@dataclass(frozen=True)
class Side:
    name: str
    runs: tuple[RunInput, ...]
    blocks: tuple[tuple[WindowInput, ...], ...]  # one per run with windows: the test's unit
    no_episodes: str = SCHEMA1_NOTE  # what a run without episodes says (the input's kind)

    @property
    def windows(self) -> list[WindowInput]:
        return [w for r in self.runs for w in r.windows]

    @property
    def has_episodes(self) -> bool:
        return any(r.episodes is not None for r in self.runs)

    @property
    def episodes(self) -> list[EpisodeInput]:
        return [e for r in self.runs for e in (r.episodes or ())]

    @property
    def file_events(self) -> bool:
        """Every run watched its checkpoint directory: checkpoints are the files written."""
        return all(r.checkpoints is not None for r in self.runs)

    @property
    def identified_by(self) -> str:
        return FILE_EVENTS if self.file_events else HEURISTIC


def observations(side: Side, codepath: str, metric: str) -> tuple[list[float], list[float]]:
    """Per run: (Σ value, Σ window-seconds) over the run's windows that have the value."""
    values, weights = [], []
    for block in side.blocks:
        values_in = [(window_value(w, codepath, metric), w.wall_s) for w in block]
        got = [(v, secs) for v, secs in values_in if v is not None]
        if not got:
            continue
        values.append(float(sum(v for v, _s in got)))
        weights.append(float(sum(s for _v, s in got)))
    return values, weights


def side_totals(side: Side, codepath: str, metric: str) -> tuple[float | None, float]:
    """(Σ value over windows that have it, Σ those windows' seconds)."""
    total, wall, seen = 0.0, 0.0, False
    for w in side.windows:
        v = window_value(w, codepath, metric)
        if v is not None:
            total += v
            wall += w.wall_s
            seen = True
    return (total if seen else None), wall


def energy_source(side: Side) -> str:
    used = sorted(
        {
            w.energy_source
            for w in side.windows
            if w.energy_source is not None and window_has(w, "energy_j")
        }
    )
    if not used:
        reasons = sorted({r.energy_reason or r.energy_source for r in side.runs})
        return "unavailable: " + "; ".join(reasons)
    return used[0] if len(used) == 1 else "mixed: " + ", ".join(used)


def gpu_source(side: Side) -> str:
    if any(window_has(w, "gpu_wait_s") for w in side.windows):
        return "measured: nvml"
    return "unavailable: " + "; ".join(
        sorted({r.gpu_source.removeprefix("unavailable: ") for r in side.runs})
    )


def metric_source(side: Side, metric: str) -> str:
    if metric == "cpu_s":
        return CPU_SOURCE
    if metric == "energy_j":
        src = energy_source(side)
        return src if src.startswith("unavailable") else f"{src} (windows' energy source)"
    return gpu_source(side)
