"""What a node source is to the energy tracker (its `role`) and what it is made from
(`SourceContext`): the part of a source's shape (collectors/source.py) that its own
module declares, kept here so the collectors import it without importing each other.

A role is the interface the tracker drives a source through:
- NODE_ENERGY: the node's energy counter (RAPL's `probe()` zones, `read()` joules); the
  CPU model stands in for it when it is down;
- CPU_TIME: node busy/total CPU seconds (`read()` a CpuTimes), the dynamic/idle split;
- GPU: per-GPU readings (`read()` polls, `window(start, end)` answers);
- OTHER: a signal the tracker only probes and reads on its period: it is in the status,
  collector health and the run's `sources`, and its last reading is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NODE_ENERGY = "node_energy"
CPU_TIME = "cpu_time"
GPU = "gpu"
OTHER = "other"
ROLES = (NODE_ENERGY, CPU_TIME, GPU, OTHER)


@dataclass(frozen=True)
class SourceContext:
    """What every source is made from (`Source.make`): the node's roots and clock, and
    each source's own settings by its name (RAPL's `max_power_w`, NVML's `backend`...)."""

    sysfs_root: Path
    procfs_root: Path
    clock: Callable[[], float]
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def of(self, name: str) -> Mapping[str, Any]:
        return self.options.get(name, {})
