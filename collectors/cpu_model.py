"""Estimated CPU package energy when RAPL is unavailable: an explicit linear model.

    P(u) = P_idle + (TDP - P_idle) * u,   P_idle = IDLE_FRACTION * TDP
    E    = P(u) * wall_s                    (dynamic part: (TDP - P_idle) * u * wall_s)

u is node CPU utilisation over the window from /proc/stat (busy / total, see
collectors/cpustat). TDP is the node total, resolved in this order:

1. `tdp_w` from config (the operator knows best; always preferred);
2. bare metal only: a small table of server CPUs keyed by the /proc/cpuinfo model
   name, TDP per package x physical packages;
3. otherwise DEFAULT_W_PER_CPU per logical CPU. A VM sees a slice of a host CPU,
   so a per-package TDP would overstate its power; a per-CPU figure scales with the
   slice (4 W per logical CPU, the same default CodeCarbon uses for unknown CPUs).

This is an estimate, not a measurement: every joule it produces is labelled
`source: model`, and `tdp_source` says which TDP it used. It is used only when RAPL
is unavailable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

IDLE_FRACTION = 0.3  # idle package power as a share of TDP (servers idle at ~20-40%)
DEFAULT_W_PER_CPU = 4.0

# TDP per package, watts, from the vendors' published specifications. Matched as a
# substring of the /proc/cpuinfo model name after whitespace normalisation.
TDP_TABLE_W: dict[str, float] = {
    "Xeon(R) Platinum 8480+": 350.0,
    "Xeon(R) Platinum 8468": 350.0,
    "Xeon(R) Platinum 8380": 270.0,
    "Xeon(R) Platinum 8358": 250.0,
    "Xeon(R) Platinum 8280": 205.0,
    "Xeon(R) Platinum 8168": 205.0,
    "Xeon(R) Gold 6248": 150.0,
    "AMD EPYC 9654": 360.0,
    "AMD EPYC 9754": 360.0,
    "AMD EPYC 7763": 280.0,
    "AMD EPYC 7742": 225.0,
}


@dataclass(frozen=True)
class CpuInfo:
    model_name: str | None
    packages: int  # distinct physical ids (1 when cpuinfo has none)
    logical_cpus: int
    hypervisor: bool  # the `hypervisor` cpu flag: we run in a VM


def parse_cpuinfo(text: str) -> CpuInfo:
    model: str | None = None
    physical: set[str] = set()
    logical = 0
    hypervisor = False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            logical += 1
        elif key == "model name" and model is None:
            model = " ".join(value.split())
        elif key == "physical id":
            physical.add(value)
        elif key == "flags" and "hypervisor" in value.split():
            hypervisor = True
    return CpuInfo(model, max(1, len(physical)), max(1, logical), hypervisor)


def read_cpuinfo(procfs_root: Path | str = Path("/proc")) -> CpuInfo:
    return parse_cpuinfo((Path(procfs_root) / "cpuinfo").read_text())


@dataclass(frozen=True)
class TdpChoice:
    tdp_w: float
    tdp_source: str  # "config", "table:<key> x N packages", "default:4 W x N cpus"


def resolve_tdp(info: CpuInfo, tdp_w: float | None = None) -> TdpChoice:
    if tdp_w is not None:
        if not tdp_w > 0:
            raise ValueError(f"tdp_w must be > 0 watts, got {tdp_w}")
        return TdpChoice(float(tdp_w), "config")
    if info.model_name and not info.hypervisor:
        for key, per_pkg in TDP_TABLE_W.items():
            if re.search(re.escape(key) + r"(?![0-9A-Za-z])", info.model_name):
                return TdpChoice(per_pkg * info.packages, f"table:{key} x {info.packages}")
    why = "vm" if info.hypervisor else "unknown model"
    return TdpChoice(
        DEFAULT_W_PER_CPU * info.logical_cpus,
        f"default:{DEFAULT_W_PER_CPU:g} W x {info.logical_cpus} cpus ({why})",
    )


@dataclass(frozen=True)
class ModelEnergy:
    """One window's estimated package energy, split into its idle and dynamic parts."""

    total_j: float
    idle_j: float
    dynamic_j: float
    utilisation: float
    tdp_w: float
    tdp_source: str
    source: str = "model"


class CpuPowerModel:
    """idle + (TDP - idle) x utilisation, over a window of `wall_s` seconds."""

    def __init__(self, tdp: TdpChoice, idle_fraction: float = IDLE_FRACTION) -> None:
        if not 0 <= idle_fraction <= 1:
            raise ValueError(f"idle_fraction must be in [0, 1], got {idle_fraction}")
        self.tdp = tdp
        self.idle_fraction = idle_fraction

    @classmethod
    def for_node(
        cls, procfs_root: Path | str = Path("/proc"), tdp_w: float | None = None
    ) -> CpuPowerModel:
        return cls(resolve_tdp(read_cpuinfo(procfs_root), tdp_w))

    @property
    def idle_w(self) -> float:
        return self.tdp.tdp_w * self.idle_fraction

    def energy(self, wall_s: float, utilisation: float) -> ModelEnergy:
        u = min(1.0, max(0.0, utilisation))
        wall = max(0.0, wall_s)
        idle_j = self.idle_w * wall
        dynamic_j = (self.tdp.tdp_w - self.idle_w) * u * wall
        return ModelEnergy(
            total_j=idle_j + dynamic_j,
            idle_j=idle_j,
            dynamic_j=dynamic_j,
            utilisation=u,
            tdp_w=self.tdp.tdp_w,
            tdp_source=self.tdp.tdp_source,
        )

    def describe(self) -> str:
        return (
            f"P = {self.idle_w:g} W + ({self.tdp.tdp_w:g} - {self.idle_w:g}) W x utilisation "
            f"(TDP {self.tdp.tdp_w:g} W from {self.tdp.tdp_source}, idle {self.idle_fraction:g}"
            " x TDP)"
        )
