"""What one attributed window hands the run record: its energy and its GPU-wait.

An *energy record* says where the window's joules came from (`source`: "rapl" measured,
"model" estimated, "unavailable" with its `reason`) and, when they were measured or
estimated, how they split: the node package's joules, the target's share and each
codepath's. A *slot* record (the daemon's) also says the span the energy was read over and
how the node's busy CPU split it. A *GPU record* is the window's GPU-wait per codepath
(seconds the GPUs the target used sat idle while it ran that codepath), summed over those
GPUs, with each GPU's own figures.

Both are built by profiler/attribution/window.py (`AttributedWindow.energy_record`,
`.gpu_record`) and written by the Recorder (profiler/records/store.py); `to_json` is the
exact mapping stored in `windows.energy_json` / `gpu_json`, which the reader
(profiler/records/reader.py) hands back as plain mappings. Units: joules (`_j`), seconds
(`_s`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serwatt.profiler.classify.codepaths import CODEPATHS

MEASURED_SOURCES = ("rapl", "model")


def _known_codepaths(values: Mapping[str, Any] | None, key: str) -> None:
    unknown = set(values or ()) - set(CODEPATHS)
    if unknown:
        raise ValueError(f"{key} names unknown codepath(s) {sorted(unknown)}")


@dataclass(frozen=True)
class SlotSplit:
    """How a slot reading was split: the span [start, end] (host epoch seconds) the energy
    was read over, the node's busy CPU-seconds in it and the target's share of them."""

    start: float
    end: float
    node_busy_cpu_s: float | None
    target_share: float | None  # None: the slot's energy was not attributed
    model: str | None  # the power model, when source is "model"
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnergyRecord:
    """One window's energy as the run record keeps it.

    codepaths_j: joules per codepath (codepaths not named count 0 J); required for a
    measured source ("rapl" / "model"). package_j / target_j / unattributed_j: the node's
    package joules, the target's share of them and the part of that share no codepath got.
    slot: set for a daemon slot reading, None for a window read over its own span.
    """

    source: str
    reason: str | None = None
    package_j: float | None = None
    target_j: float | None = None
    unattributed_j: float | None = None
    codepaths_j: Mapping[str, float] | None = None
    slot: SlotSplit | None = None

    def __post_init__(self) -> None:
        if self.measured and not isinstance(self.codepaths_j, Mapping):
            # Joules measured but not split by codepath would be recorded as "no
            # energy": refuse loudly instead of losing them quietly.
            raise ValueError(
                f"energy with source {self.source!r} needs codepaths_j {{codepath: joules}}"
            )
        _known_codepaths(self.codepaths_j, "codepaths_j")

    @classmethod
    def unavailable(cls, reason: str, slot: SlotSplit | None = None) -> EnergyRecord:
        return cls(source="unavailable", reason=reason, slot=slot)

    @property
    def measured(self) -> bool:
        """Whether the joules were measured or estimated (and so split by codepath)."""
        return self.source in MEASURED_SOURCES

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EnergyRecord:
        """The record as the writer was given it, from what to_json stored (a measured
        record without codepaths_j, or an unknown codepath, raises ValueError)."""
        slot = None
        if doc.get("slot") is not None:
            start, end = doc["slot"]
            slot = SlotSplit(
                start=start,
                end=end,
                node_busy_cpu_s=doc.get("node_busy_cpu_s"),
                target_share=doc.get("target_share"),
                model=doc.get("model"),
                notes=tuple(doc.get("notes") or ()),
            )
        return cls(
            source=doc["source"],
            reason=doc.get("reason"),
            package_j=doc.get("package_j"),
            target_j=doc.get("target_j"),
            unattributed_j=doc.get("unattributed_j"),
            codepaths_j=doc.get("codepaths_j"),
            slot=slot,
        )

    def to_json(self) -> dict[str, Any]:
        """The mapping stored in windows.energy_json."""
        out: dict[str, Any] = {"source": self.source, "reason": self.reason}
        if self.codepaths_j is not None:
            out.update(
                package_j=self.package_j,
                target_j=self.target_j,
                unattributed_j=self.unattributed_j,
                codepaths_j=dict(self.codepaths_j),
            )
        if self.slot is not None:
            s = self.slot
            out.update(
                slot=[s.start, s.end],
                node_busy_cpu_s=s.node_busy_cpu_s,
                target_share=s.target_share,
                model=s.model,
                notes=list(s.notes),
            )
        return out


@dataclass(frozen=True)
class GpuFigures:
    """One GPU's part of a window: seconds with utilisation data (covered_s), idle in them
    (idle_s), idle with no target sample covering the instant (unattributed_s), and the
    GPU-wait per codepath (wait_s)."""

    index: int
    covered_s: float
    idle_s: float
    unattributed_s: float
    wait_s: Mapping[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "covered_s": self.covered_s,
            "idle_s": self.idle_s,
            "unattributed_s": self.unattributed_s,
            "wait_s": dict(self.wait_s),
        }


@dataclass(frozen=True)
class GpuRecord:
    """One window's GPU-wait as the run record keeps it, summed over the GPUs the target
    used.

    codepaths_wait_s: seconds per codepath (codepaths not named count 0 s).
    codepaths_wait_j: the GPUs' idle joules during that wait, per codepath; None when some
    GPU's energy could not cover the window (unknown, never 0).
    codepaths_wait_by_direction_s: {codepath: {direction: seconds}}, only the codepaths
    that waited (profiler/records/direction_rows.py).
    """

    codepaths_wait_s: Mapping[str, float]
    codepaths_wait_j: Mapping[str, float] | None = None
    codepaths_wait_by_direction_s: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    gpus: tuple[GpuFigures, ...] = ()

    def __post_init__(self) -> None:
        _known_codepaths(self.codepaths_wait_s, "codepaths_wait_s")
        _known_codepaths(self.codepaths_wait_j, "codepaths_wait_j")

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GpuRecord:
        """The record as the writer was given it, from what to_json stored. A record
        from before directions were kept (schema 3) has none: {} (no codepath waited by
        direction), as a writer that kept no split would have been given."""
        return cls(
            codepaths_wait_s=doc["codepaths_wait_s"],
            codepaths_wait_j=doc.get("codepaths_wait_j"),
            codepaths_wait_by_direction_s=doc.get("codepaths_wait_by_direction_s") or {},
            gpus=tuple(GpuFigures(**g) for g in doc.get("gpus") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        """The mapping stored in windows.gpu_json."""
        out: dict[str, Any] = {
            "codepaths_wait_s": dict(self.codepaths_wait_s),
            "codepaths_wait_by_direction_s": {
                cp: dict(parts) for cp, parts in self.codepaths_wait_by_direction_s.items()
            },
            "gpus": [g.to_json() for g in self.gpus],
        }
        if self.codepaths_wait_j is not None:
            out["codepaths_wait_j"] = dict(self.codepaths_wait_j)
        return out
