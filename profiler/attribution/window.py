"""One target window with its energy and GPU idle time attributed to its codepaths.

Computed once per window and read by every consumer: the daemon's ledger, the run
record and the profile document.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from collectors.nvml import GpuWindow
from profiler.attribution.apportion import (
    EnergyAttribution,
    GpuWaitAttribution,
    IdleSpan,
    attribute_energy,
    attribute_gpu_wait,
    gpus_used_by,
)
from profiler.attribution.tracker import WindowEnergy
from profiler.classify.codepaths import CODEPATHS
from profiler.sampling.window import TimedLabel, WindowReport


@dataclass(frozen=True)
class TargetAttribution:
    """One target window's joules and GPU-wait, in the shapes the ledger takes."""

    energy: EnergyAttribution | None
    gpu_wait: tuple[GpuWaitAttribution, ...]
    gpus_used: tuple[int, ...]

    @property
    def energy_source(self) -> str | None:
        return self.energy.source if self.energy else None

    @property
    def energy_j(self) -> Mapping[str, float] | None:
        return self.energy.codepaths_j if self.energy else None

    @property
    def gpu_wait_s(self) -> dict[tuple[str, int], float]:
        return {(cp, w.gpu_index): s for w in self.gpu_wait for cp, s in w.wait_s.items()}

    @property
    def gpu_wait_energy_j(self) -> dict[tuple[str, int], float]:
        return {
            (cp, w.gpu_index): j
            for w in self.gpu_wait
            if w.idle_energy_j is not None
            for cp, j in w.idle_energy_j.items()
        }


def attribute_window(
    report: WindowReport,
    we: WindowEnergy,
    *,
    node_busy_cpu_s: float | None = None,
    target_pids: Iterable[int] = (),
    only_active: bool = False,
) -> TargetAttribution:
    energy = None
    busy = node_busy_cpu_s if node_busy_cpu_s is not None else we.node_busy_cpu_s
    if we.source in ("rapl", "model") and we.package_j is not None:
        energy = attribute_energy(
            total_j=we.package_j,
            dynamic_j=we.dynamic_j if we.dynamic_j is not None else we.package_j,
            target_cpu_s=report.cpu_s,
            node_busy_cpu_s=busy if busy is not None else report.cpu_s,
            codepath_cpu_s={cp: w.cpu_s for cp, w in report.codepaths.items()},
            source=we.source,
        )
    used = used_gpus(we.gpus, {report.pid, *target_pids})
    waits = tuple(
        gpu_wait_for(
            g, report.timeline, report.rate_hz, report.started_at, report.ended_at, only_active
        )  # fmt: skip
        for g in we.gpus
        if g.index in used
    )
    return TargetAttribution(energy=energy, gpu_wait=waits, gpus_used=tuple(sorted(used)))


def used_gpus(gpus: Iterable[GpuWindow], pids: Iterable[int]) -> set[int]:
    return set(gpus_used_by(pids, {g.index: g.pids for g in gpus}))


def gpu_wait_for(
    g: GpuWindow,
    timeline: Iterable[TimedLabel],
    rate_hz: float,
    start: float,
    end: float,
    only_active: bool = False,
) -> GpuWaitAttribution:
    return attribute_gpu_wait(
        gpu_index=g.index,
        timeline=timeline,
        sample_period_s=1.0 / rate_hz,
        spans=[IdleSpan(iv.t0, iv.t1, iv.busy_frac) for iv in g.intervals],
        start=start,
        end=end,
        energy_points=g.energy_points,
        only_active=only_active,
    )


def energy_record(we: Any, ta: Any) -> dict[str, Any]:
    """The `energy` mapping for append_window from a profiler.energy WindowEnergy and
    TargetAttribution (duck-typed: this module does not import the energy stack)."""
    if ta is None or ta.energy is None:
        return {
            "source": "unavailable",
            "reason": getattr(we, "reason", None) or "no energy reading for this window",
        }
    e = ta.energy
    return {
        "source": e.source,
        "reason": getattr(we, "reason", None),
        "package_j": e.total_j,
        "target_j": e.target_j,
        "unattributed_j": e.unattributed_j,
        "codepaths_j": dict(e.codepaths_j),
    }


def gpu_record(ta: Any) -> dict[str, Any] | None:
    """The `gpu` mapping for append_window: GPU-wait per codepath summed over the GPUs the
    target used, plus each GPU's own figures. None when the window had no GPU data."""
    if ta is None or not ta.gpu_wait:
        return None
    wait_s = dict.fromkeys(CODEPATHS, 0.0)
    wait_j: dict[str, float] | None = dict.fromkeys(CODEPATHS, 0.0)
    gpus = []
    for g in ta.gpu_wait:
        for cp, s in g.wait_s.items():
            wait_s[cp] += s
        if g.idle_energy_j is None:
            wait_j = None
        elif wait_j is not None:
            for cp, j in g.idle_energy_j.items():
                wait_j[cp] += j
        gpus.append(
            {
                "index": g.gpu_index,
                "covered_s": g.covered_s,
                "idle_s": g.idle_s,
                "unattributed_s": g.unattributed_s,
                "wait_s": dict(g.wait_s),
            }
        )
    out: dict[str, Any] = {"codepaths_wait_s": wait_s, "gpus": gpus}
    if wait_j is not None:
        out["codepaths_wait_j"] = wait_j
    return out
