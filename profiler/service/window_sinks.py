"""The daemon's sinks of the window pipeline (profiler/attribution/pipeline.py) beside the
run record (profiler/records/run_sink.py): the ledger behind /metrics, and a run's
checkpoint watch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.pipeline import WindowRejected
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.service.ledger import Ledger
from serwatt.profiler.service.run_checkpoints import RunCheckpoints


@dataclass(frozen=True)
class LedgerSink:
    """One target's windows into the ledger's counters, keyed by (codepath, direction),
    with the sources its classifier could not use (not loaded by the window's deadline,
    too costly to index: kinds classify_timeout, source_too_costly) as sampler errors.
    A window the ledger refuses (it validates all before it adds any) is rejected:
    nothing else records it."""

    ledger: Ledger
    target: str

    def on_window(self, window: AttributedWindow) -> None:
        f = window.by_direction()
        try:
            if window.attribution is None:
                self.ledger.add_window(self.target, samples=f.samples, cpu_s=f.cpu_s)
            else:
                self.ledger.add_window(
                    self.target,
                    samples=f.samples,
                    cpu_s=f.cpu_s,
                    energy_j=f.energy_j,
                    energy_source=window.energy_source,
                    gpu_wait_s=f.gpu_wait_s,
                    gpu_wait_energy_j=f.gpu_wait_energy_j,
                )
        except ValueError as exc:
            raise WindowRejected(str(exc)) from exc
        for kind, n in window.report.classify_errors.items():
            self.ledger.add_sampler_error(self.target, kind, n)

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        """The counters carry windows only; episodes go to the record."""


@dataclass(frozen=True)
class CheckpointsSink:
    """A run's closed episodes into its checkpoint watch, when its target names a
    checkpoints directory (RunCheckpoints keeps no watch otherwise)."""

    checkpoints: RunCheckpoints
    run_id: str

    def on_window(self, window: AttributedWindow) -> None:
        """The watch takes episodes, not windows."""

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        self.checkpoints.add_episodes(self.run_id, episodes)
