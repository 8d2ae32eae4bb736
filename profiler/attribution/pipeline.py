"""The window pipeline both drivers run: a finished window attributed, handed to its
sinks, and its closed serialization episodes (with their GPU readings) after it.

py-spy's windows are collected and classified by profiler/sampling/collect.py
(`collect_window`, `finish_window`); what happens to a window from then on is here, once:
`serwatt profile` (profiler/profile/session.py) and the daemon
(profiler/service/daemon.py) differ only in which sinks they hand it to and when. The
profile's sinks are its document, energy and record; the daemon's are the ledger behind
/metrics, the run record and the run's checkpoint watch.

A sink that fails (a full disk under the record, a tracker error) is the pipeline's to
handle, once for both drivers: the failure is counted by sink (`sink_failures`) and kept
(`sink_errors`, the first few), and the window still goes to the sinks after it and to the
episode tracker, so no window is lost to a sink that did not fail. The drivers read the
failures from the delivery (`Delivery.failures`) and say them their own way: the daemon
in its recorder's health and log, `serwatt profile` in its failures and exit status. A sink
that refuses a malformed window raises WindowRejected: that window goes no further.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from serwatt.profiler.attribution.episodes import Episode, EpisodeTracker
from serwatt.profiler.attribution.tracker import EnergyTracker, TrackerReport, WindowEnergy
from serwatt.profiler.attribution.window import (
    AttributedWindow,
    attribute_span,
    episode_gpu_reading,
    fit_span,
)
from serwatt.profiler.sampling.window import WindowReport


class WindowSink(Protocol):
    def on_window(self, window: AttributedWindow) -> None: ...

    def on_episodes(self, episodes: Sequence[Episode]) -> None: ...


class FinishingSink(WindowSink, Protocol):
    """A sink with an end of its own (the profile's: its record is finished there)."""

    def finish(self) -> object: ...


class WindowRejected(ValueError):
    """A sink refused a window as malformed (the daemon's ledger: a report that does not
    add up); the window goes no further."""


# the first failures' messages kept for the driver to show; the rest are only counted
MAX_SINK_ERRORS = 5


@dataclass(frozen=True)
class SinkFailure:
    sink: str  # the sink's class name
    error: Exception

    def __str__(self) -> str:
        return f"{self.sink}: {type(self.error).__name__}: {self.error}"


@dataclass(frozen=True)
class Delivery:
    """What one delivery did: the episodes it closed, and the sinks that failed."""

    episodes: list[Episode] = field(default_factory=list)
    failures: list[SinkFailure] = field(default_factory=list)


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
        self.sink_failures: dict[str, int] = {}  # sink class name -> failed deliveries
        self.sink_errors: list[str] = []  # the first MAX_SINK_ERRORS, as SinkFailure says
        self._read_until: float | None = None  # the node read up to here (_advance)
        # attribute_held: windows not handed back yet, each process's last window's end,
        # the processes that exited, the longest window seen
        self._held: list[AttributedWindow] = []
        self._last_end: dict[int, float] = {}
        self._exited: set[int] = set()
        self._longest_s = 0.0

    def attribute(self, report: WindowReport) -> AttributedWindow:
        """The window as a span of its own against the reading of it (`serwatt profile`;
        the daemon attributes a slot's windows together against the slot's reading: the
        same attribution.window.attribute_span). A reading that fails keeps the window,
        without joules, saying why."""
        if self.tracker is None:
            return AttributedWindow(report)
        advance = self._advance(self.tracker, report)
        state = self.tracker_report()
        try:
            reading = self.tracker.window(report.started_at, report.ended_at)
            (window,) = attribute_span([report], reading, slot=False).windows
            return replace(window, advance=advance, tracker=state)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            return AttributedWindow(report, failure=why, advance=advance, tracker=state)

    def tracker_report(self) -> TrackerReport | None:
        """The tracker's status and self-metrics now (None: no tracker, or it cannot say)."""
        if self.tracker is None:
            return None
        try:
            return self.tracker.report()
        except Exception:
            return None

    def attribute_held(self, report: WindowReport, live: Collection[int]) -> list[AttributedWindow]:
        """`attribute` for the windows of a process tree (`serwatt profile`), whose
        processes' windows overlap in time: each window against its own span, so together
        they may claim more than the node's joules. A window is held until no window of a
        process still sampled (`live`) can overlap it any more, then the windows that
        overlap one another are fitted together against their joint span's reading
        (attribution.window.fit_span, the rule a daemon slot's windows follow) and handed
        back, in order, before any sink reads them: the run record keeps what the
        document sums. One process's windows never overlap and come back at once. A
        process whose windows stopped coming (gone between windows: no window said it
        exited) holds nothing longer than two windows' length; a process first seen
        after a window was handed back is fitted without it."""
        window = self.attribute(report)
        pid = report.pid
        self._held.append(window)
        self._last_end[pid] = max(self._last_end.get(pid, report.ended_at), report.ended_at)
        self._longest_s = max(self._longest_s, report.ended_at - report.started_at)
        if report.exited:
            self._exited.add(pid)
        newest = max(self._last_end.values())
        first = min(w.report.started_at for w in self._held)
        ends = [self._last_end.get(p, first) for p in live if p not in self._exited]
        horizon = min((e for e in ends if newest - e <= 2 * self._longest_s), default=newest)
        return self._release(horizon)

    def flush(self) -> list[AttributedWindow]:
        """Every window attribute_held still holds, fitted (the session's end)."""
        return self._release(math.inf)

    def _release(self, horizon: float) -> list[AttributedWindow]:
        """The held windows no later window can overlap (ending by `horizon`), each group
        of windows overlapping one another fitted together."""
        groups: list[list[AttributedWindow]] = []
        for w in sorted(self._held, key=lambda w: (w.report.started_at, w.report.ended_at)):
            if groups and w.report.started_at < max(g.report.ended_at for g in groups[-1]):
                groups[-1].append(w)
            else:
                groups.append([w])
        out: list[AttributedWindow] = []
        kept: list[AttributedWindow] = []
        for group in groups:
            if max(w.report.ended_at for w in group) > horizon:
                kept.extend(group)
            else:
                out.extend(self._fit_group(group))
        self._held = kept
        return out

    def _fit_group(self, group: list[AttributedWindow]) -> list[AttributedWindow]:
        if self.tracker is None or sum(1 for w in group if w.energy_j) < 2:
            return group  # each window is already fitted to its own span
        start = min(w.report.started_at for w in group)
        end = max(w.report.ended_at for w in group)
        try:
            reading = self.tracker.window(start, end)
        except Exception:
            return group  # as attributed: no reading of the joint span to fit them to
        return list(fit_span(group, reading).windows)

    def _advance(self, tracker: EnergyTracker, report: WindowReport) -> WindowEnergy | None:
        """The node's reading from the end of the windows so far to this one's end: the
        pipeline is the one reader of the tracker, so a sink that totals the node (the
        profile's energy sink) reads these, each span once. A reading that fails is an
        unavailable span, saying why."""
        start = report.started_at if self._read_until is None else self._read_until
        if report.ended_at <= start:
            return None
        self._read_until = report.ended_at
        try:
            return tracker.window(start, report.ended_at)
        except Exception as exc:
            why = f"reading failed: {type(exc).__name__}: {exc}"
            return WindowEnergy(start, report.ended_at, "unavailable", why)

    def deliver(self, window: AttributedWindow, sinks: Iterable[WindowSink]) -> Delivery:
        """The window to every sink in order, then the episodes it closed. A sink that
        fails is counted and the others still get the window; WindowRejected stops it."""
        sinks = tuple(sinks)
        failures: list[SinkFailure] = []
        for sink in sinks:
            try:
                sink.on_window(window)
            except WindowRejected:
                raise
            except Exception as exc:
                failures.append(self._failed(sink, exc))
        closed = self.close(self.episodes.add(window.report), sinks)
        return Delivery(closed.episodes, failures + closed.failures)

    def finish(self, sinks: Iterable[WindowSink], pid: int | None = None) -> Delivery:
        """Close the episodes still open (of `pid`, or of every process) into the sinks."""
        return self.close(self.episodes.finish(pid), tuple(sinks))

    def finish_sinks(self, sinks: Iterable[FinishingSink]) -> list[SinkFailure]:
        """Every sink's finish, each failure counted as a delivery's is: the end of a
        run is delivered too (a record that cannot be finished is one not written)."""
        failures = []
        for sink in sinks:
            try:
                sink.finish()
            except Exception as exc:
                failures.append(self._failed(sink, exc))
        return failures

    def close(self, episodes: list[Episode], sinks: Sequence[WindowSink]) -> Delivery:
        """Closed episodes with their GPU-wait (where NVML sees a GPU the process uses),
        then to every sink, as deliver does a window."""
        if not episodes:
            return Delivery()
        if self.tracker is not None:
            episodes = [episode_gpu_reading(self.tracker, ep) for ep in episodes]
        failures = []
        for sink in sinks:
            try:
                sink.on_episodes(episodes)
            except Exception as exc:
                failures.append(self._failed(sink, exc))
        return Delivery(episodes, failures)

    def _failed(self, sink: WindowSink, exc: Exception) -> SinkFailure:
        failure = SinkFailure(type(sink).__name__, exc)
        self.sink_failures[failure.sink] = self.sink_failures.get(failure.sink, 0) + 1
        if len(self.sink_errors) < MAX_SINK_ERRORS:
            self.sink_errors.append(str(failure))
        return failure
