"""The window pipeline both drivers run: a finished window attributed, handed to its
sinks, and its closed serialization episodes (with their GPU readings) after it.

py-spy's windows are collected and classified by profiler/sampling/collect.py
(`collect_window`, `finish_window`); what happens to a window from then on is here, once:
`serwatt profile` (profiler/profile/session.py) and the daemon
(profiler/service/daemon.py) differ only in which sinks they hand it to and when. The
profile's sinks are its document, energy and record; the daemon's are the ledger behind
/metrics, the run record and the run's checkpoint watch.

A sink that raises stops the window's delivery there: the sinks after it and the episode
tracker do not see the window, and the exception goes to the driver, which decides
(the daemon counts and logs it; a sink that refuses a malformed window raises
WindowRejected so the daemon can tell it from a failed write).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from profiler.attribution.episodes import Episode, EpisodeTracker
from profiler.attribution.tracker import EnergyTracker
from profiler.attribution.window import AttributedWindow, attribute, episode_gpu_reading
from profiler.sampling.window import WindowReport


class WindowSink(Protocol):
    def on_window(self, window: AttributedWindow) -> None: ...

    def on_episodes(self, episodes: Sequence[Episode]) -> None: ...


class WindowRejected(ValueError):
    """A sink refused a window as malformed (the daemon's ledger: a report that does not
    add up); the window goes no further."""


class WindowPipeline:
    """Attribution, delivery and episodes for the windows of one driver.

    tracker: the node's energy and NVML readings (None: the run measures no energy); a
    window is attributed against it, and each closed episode gets the GPU's idle time
    and joules over its span from it. One EpisodeTracker follows every process's windows
    (each process's windows come in order).
    """

    def __init__(self, tracker: EnergyTracker | None = None) -> None:
        self.tracker = tracker
        self.episodes = EpisodeTracker()

    def attribute(self, report: WindowReport) -> AttributedWindow:
        """The window against the reading of its own span (`serwatt profile`; the daemon
        attributes a slot's windows together against the slot's reading:
        attribution.window.attribute_slot). A reading that fails keeps the window,
        without joules, saying why."""
        if self.tracker is None:
            return AttributedWindow(report)
        try:
            return attribute(report, self.tracker.window(report.started_at, report.ended_at))
        except Exception as exc:
            return AttributedWindow(report, failure=f"{type(exc).__name__}: {exc}")

    def deliver(self, window: AttributedWindow, sinks: Iterable[WindowSink]) -> list[Episode]:
        """The window to every sink in order, then the episodes it closed; returns them."""
        sinks = tuple(sinks)
        for sink in sinks:
            sink.on_window(window)
        return self.close(self.episodes.add(window.report), sinks)

    def finish(self, sinks: Iterable[WindowSink], pid: int | None = None) -> list[Episode]:
        """Close the episodes still open (of `pid`, or of every process) into the sinks."""
        return self.close(self.episodes.finish(pid), tuple(sinks))

    def close(self, episodes: list[Episode], sinks: Sequence[WindowSink]) -> list[Episode]:
        """Closed episodes with their GPU-wait (where NVML sees a GPU the process uses),
        then to every sink; returns them as the sinks got them."""
        if not episodes:
            return []
        if self.tracker is not None:
            episodes = [episode_gpu_reading(self.tracker, ep) for ep in episodes]
        for sink in sinks:
            sink.on_episodes(episodes)
        return episodes
