"""The daemon's energy side: one tracker for the node, one reading per slot."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from serwatt.collectors.source import absent
from serwatt.collectors.status import REASON_OFF
from serwatt.profiler.attribution.tracker import (
    CPU_MODEL,
    EnergyTracker,
    EnergyUnavailableError,
    WindowEnergy,
)
from serwatt.profiler.attribution.window import AttributedWindow, attribute_span
from serwatt.profiler.records.sources import run_sources
from serwatt.profiler.sampling.window import WindowReport
from serwatt.profiler.service.clock import Clock
from serwatt.profiler.service.collector_health import Health, publish, run_collector
from serwatt.profiler.service.config import Config
from serwatt.profiler.service.ledger import Ledger

log = logging.getLogger("serwatt.daemon")


class RequiredCollectorMissing(Exception):
    """A collector the config marks as required is unavailable on this node."""


@dataclass(frozen=True)
class SlotEnergy:
    windows: list[AttributedWindow]  # one per report, in order


# Collector states that mean "not in use here", not "failed": not exported.
_UNUSED_REASONS = frozenset({"not_needed", REASON_OFF})


def not_present(name: str, reason: str | None, tracker: EnergyTracker | None = None) -> bool:
    """What `auto` finds on a node without the hardware (most cloud VMs): the collector is
    not present there, not down, so it is not exported and SerwattCollectorDown cannot
    fire for it. A permission or driver error on hardware that is there stays "down".
    Each source names its own (collectors/source.py `absent_reasons`), the sources of
    `tracker`'s list included."""
    extra = tuple(type(s) for s in tracker.sources) if tracker is not None else ()
    return absent(name, reason, extra)


class EnergySide:
    """The daemon's use of the energy tracker (profiler/attribution/tracker.py): one tracker for the
    node, one reading per slot, split over the slot's target windows.

    All windows of a slot are attributed against the slot's single energy reading
    (attribution.window.attribute_span): each target gets (its window CPU / node busy CPU
    over the slot) of the slot's dynamic energy, fitted by the one overlap rule so the
    targets' joules never sum past the node's, and what is left (idle part, other
    processes, targets not sampled this slot) is exported as
    `serwatt_unattributed_energy_joules_total`.
    """

    def __init__(
        self,
        config: Config,
        clock: Clock,
        *,
        nvml_backend: Any = None,
        tracker: EnergyTracker | None = None,
    ) -> None:
        """clock: the daemon's (service/clock.py), which times the collectors' reads.
        tracker: the node's, made by the caller (the replay harness's, in fake time);
        None: one made from `config`."""
        self._clock = clock
        self._tracker = tracker or EnergyTracker(
            sysfs_root=config.path_sysfs,
            procfs_root=config.path_procfs,
            tdp_w=config.cpu_tdp_w,
            modes=config.collector_modes,
            nvml_backend=nvml_backend,
        )
        t0 = clock.monotonic()
        try:
            self.status = self._tracker.probe()
        except EnergyUnavailableError as exc:
            raise RequiredCollectorMissing(f"collectors: {exc}") from None
        self._probe_s = clock.monotonic() - t0
        self._rapl_errors_seen = 0
        self.source = self._tracker.energy_source
        for name, st in self.status.items():
            if not_present(name, st.reason, self._tracker):
                log.info("collector %s not present (%s): %s", name, st.reason, st.detail)
            elif not st.up and st.reason not in _UNUSED_REASONS:
                log.info("collector %s unavailable: %s: %s", name, st.reason, st.detail)
        self._tracker.start()

    @property
    def nvml_status(self) -> Any:
        gpu = self._tracker.nvml
        return gpu.probe() if self.status[gpu.name].reason != REASON_OFF else None

    def declare(self, ledger: Ledger) -> None:
        if self.source in ("rapl", "model"):
            ledger.declare_energy_source(self.source)
        if self._tracker.up(self._tracker.nvml):
            for gpu in self._tracker.nvml.probe().gpus:
                ledger.declare_gpu(gpu.index)
        health = {
            name: (
                st.up,
                (st.detail or "") if st.up else f"unavailable: {st.reason}: {st.detail or ''}",
            )
            for name, st in self.status.items()
            if st.reason not in _UNUSED_REASONS and not not_present(name, st.reason, self._tracker)
        }
        publish(ledger, health, self._probe_s)

    def sources(self) -> dict[str, Any]:
        return run_sources(self.source, self.status)

    def slot(
        self, start: float, end: float, reports: list[WindowReport], ledger: Ledger
    ) -> SlotEnergy | None:
        we = run_collector(
            ledger,
            "energy",
            lambda: self._tracker.window(start, end),
            self._slot_health,
            monotonic=self._clock.monotonic,
        )
        if we is None:
            return None
        got = attribute_span(reports, we, slot=True)
        if got.node_j is not None:
            ledger.add_node_energy(
                we.source, node_j=got.node_j, unattributed_j=got.node_j - got.attributed_j
            )
        for g in we.gpus:
            if g.up:
                ledger.add_gpu_idle(g.index, max(0.0, g.idle_s))
        return SlotEnergy(list(got.windows))

    @property
    def tracker(self) -> EnergyTracker:
        """The node's tracker: the window pipeline reads closed episodes' GPU-wait from it."""
        return self._tracker

    def _slot_health(self, we: WindowEnergy) -> dict[str, Health]:
        """What one slot reading says of the collectors behind it: the node energy source
        (or the CPU model in its place) and the GPU source, by their roles."""
        health: dict[str, Health] = {}
        energy, gpu = self._tracker.rapl, self._tracker.nvml
        model = self.status.get(CPU_MODEL)
        if self.status[energy.name].up:
            # RAPL read errors carry the last good value forward (caught up on the next
            # good read), so the slot still says "rapl": count failed reads instead.
            errors = self._tracker.rapl_read_errors
            failing = errors > self._rapl_errors_seen
            self._rapl_errors_seen = errors
            ok = we.source == "rapl" and not failing
            if failing:
                detail = "read errors this slot: " + ", ".join(
                    self._tracker.last_rapl_errors or ("unknown",)
                )
            else:
                detail = "; ".join(we.notes) if ok else f"{we.source}: {we.reason}"
            health[energy.name] = (ok, detail)
        elif model is not None and model.up:
            ok = we.source == "model"
            detail = we.model or "" if ok else f"{we.source}: {we.reason}"
            health[CPU_MODEL] = (ok, detail)
        if self.status[gpu.name].up:
            down = [f"gpu {g.index}: {g.reason}" for g in we.gpus if not g.up]
            health[gpu.name] = (
                bool(we.gpus) and not down,
                "; ".join(down) or f"{len(we.gpus)} GPU(s)",
            )
        health.update(self._tracker.read_health())
        return health

    def close(self) -> None:
        self._tracker.stop()
