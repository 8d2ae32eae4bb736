"""A run record as a sink of the window pipeline (profiler/attribution/pipeline.py): each
window and its closed episodes appended to one run. The daemon hands its windows to one
per run; `serwatt profile`'s RecordSink (profiler/profile/record_sink.py) writes through
one too, so both drivers record a window the same way."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.records.host import load_1min
from serwatt.profiler.records.store import Recorder


@dataclass(frozen=True)
class RunSink:
    """Appends to run `run_id` of `recorder` (started with Recorder.start_run); a failed
    append raises, and the driver says what the record missed."""

    recorder: Recorder
    run_id: str

    def on_window(self, window: AttributedWindow) -> None:
        self.recorder.append_window(
            self.run_id,
            window.report,
            energy=window.energy_record(),
            gpu=window.gpu_record(),
            load_1min=load_1min(),
            directed=window.by_direction(),
        )

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        self.recorder.append_episodes(self.run_id, episodes)
