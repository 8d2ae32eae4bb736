"""The daemon's small parts outside its slot loop: the per-process state it keeps for
each tracked target (`_Tracked`), its own CPU reading (`_OwnCpu`), the config fields a
reload leaves to the restart (`_bound_at_start`) and the host fingerprint it records
(`_host_fingerprint`). daemon.py imports them; nothing here runs the daemon.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from serwatt.collectors.nvml import NvmlCollector
from serwatt.profiler.records.host import fingerprint
from serwatt.profiler.service.clock import Clock
from serwatt.profiler.service.config import Config

# --------------------------------------------------------------------------- state


@dataclass
class _Tracked:
    """A discovered process the daemon samples (keyed by pid and start time)."""

    proc: Any  # profiler.service.discovery.DiscoveredProcess
    python: str = "unknown"
    cpu_source: str = "unknown"  # what weighed its last window's CPU: kernel | estimate
    last_sampled_at: float = 0.0
    retry_at: float = 0.0  # do not sample before this (monotonic s) after a refusal
    refused: str | None = None  # the kind of the last refusal, None when sampling works
    faults: int = 0  # sampler failures in a row (not the target's doing)
    # the last re-scan did not find it (exited, or its target was removed); forgotten
    # once no window of it is in flight
    unmatched: bool = False

    @property
    def key(self) -> tuple[int, float]:
        return (self.proc.pid, self.proc.start_time)


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _OwnCpu:
    """This process's CPU and its reaped children's (the py-spy windows: the daemon
    starts no other children), and the wall clock, at one instant."""

    daemon_s: float
    samplers_s: float
    wall_s: float

    @staticmethod
    def now(clock: Clock) -> _OwnCpu:
        t = os.times()
        return _OwnCpu(t.user + t.system, t.children_user + t.children_system, clock.monotonic())


# The config fields bound at startup (socket, record file, hardware collectors): a reload
# logs their change and keeps the running value.
_FIXED_FIELDS = (
    "listen",
    "record_dir",
    "path_sysfs",
    "collector_modes",
    "cpu_tdp_w",
    "sampler_priority",
    "pyroscope",
)


def _bound_at_start(config: Config) -> dict[str, Any]:
    """The values a reload leaves to the restart, by the name the log gives them: each
    source's mode by its `mode_option` (collectors/source.py), the rest by field."""
    out: dict[str, Any] = {}
    for name in _FIXED_FIELDS:
        if name == "collector_modes":
            out |= config.collector_modes
        else:
            out[name] = getattr(config, name)
    return out


def _host_fingerprint(config: Config, nvml_status: Any = None) -> dict[str, Any]:
    return fingerprint(
        procfs=config.path_procfs,
        sysfs=config.path_sysfs,
        nvml_status=nvml_status,
        probe_gpus=nvml_status is None
        and config.collector_modes.get(str(NvmlCollector.mode_option)) != "off",
    )
