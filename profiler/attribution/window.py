"""One target window with its energy and GPU idle time attributed to its codepaths.

Computed once per window and read by every consumer: the daemon's ledger, the run
record and the profile document.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from serwatt.collectors.nvml import DEFAULT_SAMPLE_PERIOD_S, GpuWindow, clip_intervals
from serwatt.profiler.attribution.apportion import (
    EnergyAttribution,
    GpuWaitAttribution,
    IdleSpan,
    attribute_energy,
    attribute_gpu_wait,
    gpus_used_by,
    overlap_factor,
    scaled_energy,
)
from serwatt.profiler.attribution.episodes import Episode, period_s
from serwatt.profiler.attribution.tracker import EnergyTracker, TrackerReport, WindowEnergy
from serwatt.profiler.attribution.window_records import (
    EnergyRecord,
    GpuFigures,
    GpuRecord,
    SlotSplit,
)
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS, UNKNOWN, series_directions
from serwatt.profiler.sampling.window import (
    CodepathWindow,
    DirectionWindow,
    TimedLabel,
    WindowReport,
)


def split_by_direction(value: float, cw: CodepathWindow | None) -> dict[str, float]:
    """A codepath's figure in one window (its joules) split as the codepath's CPU splits
    by direction in that window: joules follow CPU, the attribution's rule. With no CPU
    seen to split it by, all of it is `unknown`."""
    out = dict.fromkeys(DIRECTIONS, 0.0)
    if cw is None or not cw.cpu_s > 0 or not cw.direction:
        out[UNKNOWN] = value
        return out
    for d in DIRECTIONS:
        part = cw.direction.get(d)
        if part is not None:
            out[d] = value * part.cpu_s / cw.cpu_s
    return out


@dataclass(frozen=True)
class TargetAttribution:
    """One target window's joules and GPU-wait (one GpuWaitAttribution per GPU it used)."""

    energy: EnergyAttribution | None
    gpu_wait: tuple[GpuWaitAttribution, ...]
    gpus_used: tuple[int, ...]

    @property
    def energy_source(self) -> str | None:
        return self.energy.source if self.energy else None

    @property
    def energy_j(self) -> Mapping[str, float] | None:
        return self.energy.codepaths_j if self.energy else None


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
    # each sample stands for one tick of the timeline that produced it (its --idle run,
    # episodes.period_s), not of the on-CPU run whose rate the window carries as rate_hz:
    # the daemon runs them at different rates
    period = period_s(report)
    waits = tuple(
        _gpu_wait(g, report.timeline, period, report.started_at, report.ended_at, only_active)
        for g in we.gpus
        if g.index in used
    )
    return TargetAttribution(energy=energy, gpu_wait=waits, gpus_used=tuple(sorted(used)))


def used_gpus(gpus: Iterable[GpuWindow], pids: Iterable[int]) -> set[int]:
    return set(gpus_used_by(pids, {g.index: g.pids for g in gpus}))


def _covers(g: GpuWindow, start: float, end: float) -> bool:
    """Whether the GPU's utilisation intervals reach both edges of [start, end], to two
    NVML sample periods. Samples that stop early (a poll not yet made) or begin late would
    otherwise read as a short wait; such a span's wait is unknown instead. Holes inside
    (a sample the driver stamped 0, dropped) count as neither idle nor busy, as in a
    window's attribution."""
    # two periods: the sample that covers an edge may be one the driver stamped 0
    edge = 2 * (g.sample_period_s or DEFAULT_SAMPLE_PERIOD_S)
    ivs = clip_intervals(g.intervals, start, end)
    if not ivs:
        return False
    return min(iv.t0 for iv in ivs) <= start + edge and max(iv.t1 for iv in ivs) >= end - edge


def episode_with_gpu(ep: Episode, gpus: Iterable[GpuWindow]) -> Episode:
    """The episode with its GPU-wait seconds and GPU idle joules over [start, end].

    `gpus` is an NVML reading spanning the episode. Only GPUs up and listing the
    episode's pid count, and only where their samples cover the span. The thread was in
    the episode throughout, so it is one sample standing for the whole span, timed by the
    one GPU-wait algorithm a window's is (apportion.attribute_gpu_wait): the GPU-wait is
    the idle time of those GPUs over the span, the idle joules the GPU energy of its idle
    parts. With no such GPU both stay None (unknown, never 0); when the energy polls do
    not bracket an idle part, gpu_idle_j stays None.
    """
    readings = list(gpus)
    used = [g for g in readings if g.up and g.index in used_gpus(readings, {ep.pid})]
    if not used or not all(_covers(g, ep.start, ep.end) for g in used):
        return ep
    whole = TimedLabel(t=ep.start, tid=ep.pid, thread_id=ep.pid, codepath=ep.codepath)
    wait_s = 0.0
    idle_j: float | None = 0.0
    for g in used:
        w = _gpu_wait(g, (whole,), ep.end - ep.start, ep.start, ep.end)
        wait_s += w.idle_s
        if idle_j is not None and w.idle_energy_j is not None:
            assert w.unattributed_idle_energy_j is not None
            idle_j += math.fsum(w.idle_energy_j.values()) + w.unattributed_idle_energy_j
        else:
            idle_j = None
    return replace(ep, gpu_wait_s=wait_s, gpu_idle_j=idle_j)


def episode_gpu_reading(tracker: EnergyTracker, ep: Episode) -> Episode:
    """`episode_with_gpu` against the tracker's NVML history; the episode unchanged when
    NVML is not up or cannot give that span (its GPU figures stay None, never 0)."""
    try:
        gpus = tracker.gpu_window(ep.start, ep.end)
    except Exception:
        return ep
    return episode_with_gpu(ep, gpus)


def _gpu_wait(
    g: GpuWindow,
    timeline: Iterable[TimedLabel],
    period: float,
    start: float,
    end: float,
    only_active: bool = False,
) -> GpuWaitAttribution:
    """The one GPU-wait computation, for a window's samples and an episode's span alike."""
    return attribute_gpu_wait(
        gpu_index=g.index,
        timeline=timeline,
        sample_period_s=period,
        spans=[IdleSpan(iv.t0, iv.t1, iv.busy_frac) for iv in g.intervals],
        start=start,
        end=end,
        energy_points=g.energy_points,
        only_active=only_active,
    )


def _label(codepath: str, direction: str) -> str:
    """A direction the codepath's series do not carry counts as `unknown`."""
    return direction if direction in series_directions(codepath) else UNKNOWN


@dataclass(frozen=True)
class DirectedFigures:
    """One window's figures keyed by (codepath, direction[, gpu]) (AttributedWindow
    .by_direction); energy_j None when the window had no energy attribution."""

    samples: Mapping[tuple[str, str], int]
    cpu_s: Mapping[tuple[str, str], float]
    energy_j: Mapping[tuple[str, str], float] | None
    gpu_wait_s: Mapping[tuple[str, str, int | str], float]
    gpu_wait_energy_j: Mapping[tuple[str, str, int | str], float]
    energy_source: str | None = None  # where energy_j came from (rapl, model)


_K = TypeVar("_K")
_V = TypeVar("_V", int, float)


def _sum_into(into: dict[_K, _V], parts: Mapping[_K, _V]) -> None:
    for key, v in parts.items():
        into[key] = into.get(key, 0) + v


@dataclass
class DirectedTotals:
    """The one fold of attributed windows into codepath x direction totals: each window's
    DirectedFigures (AttributedWindow.by_direction) summed. The daemon's ledger keeps one
    per target behind /metrics; the profile document's CPU, joules and GPU-wait by
    direction, and a window's GPU record, read it; the run record's direction rows are
    the same figures, summed per run in its file (records/direction_rows.py)."""

    samples: dict[tuple[str, str], int] = field(default_factory=dict)
    cpu_s: dict[tuple[str, str], float] = field(default_factory=dict)
    energy_j: dict[tuple[str, str], float] = field(default_factory=dict)
    gpu_wait_s: dict[tuple[str, str, int | str], float] = field(default_factory=dict)
    gpu_wait_energy_j: dict[tuple[str, str, int | str], float] = field(default_factory=dict)
    # the same joules by their source (the ledger's `source` label); a source is listed
    # once a window came with it, even with no joules
    energy_j_by_source: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)

    def add(self, f: DirectedFigures) -> None:
        _sum_into(self.samples, f.samples)
        _sum_into(self.cpu_s, f.cpu_s)
        _sum_into(self.energy_j, f.energy_j or {})
        if f.energy_source is not None:
            _sum_into(self.energy_j_by_source.setdefault(f.energy_source, {}), f.energy_j or {})
        _sum_into(self.gpu_wait_s, f.gpu_wait_s)
        _sum_into(self.gpu_wait_energy_j, f.gpu_wait_energy_j)

    def by_codepath(self, values: Mapping[tuple[str, str], float]) -> dict[str, dict[str, float]]:
        """{codepath: {direction: value}} for every codepath and direction (0 where none)."""
        out = {cp: dict.fromkeys(DIRECTIONS, 0.0) for cp in CODEPATHS}
        for (cp, d), v in values.items():
            out[cp][d] += v
        return out

    def wait_by_direction(self) -> dict[str, dict[str, float]]:
        """GPU-wait per codepath and direction over every GPU; a codepath is listed, with
        every direction, once it has a part that is not 0."""
        out: dict[str, dict[str, float]] = {}
        for (cp, d, _gpu), s in self.gpu_wait_s.items():
            if s:
                out.setdefault(cp, dict.fromkeys(DIRECTIONS, 0.0))[d] += s
        return out


def _directed(
    report: WindowReport, codepaths_j: Mapping[str, float] | None, source: str | None
) -> DirectedFigures:
    """A window's samples, CPU and joules keyed by (codepath, direction), no GPU-wait:
    the split both AttributedWindow.by_direction and figures_of_records use."""
    samples: dict[tuple[str, str], int] = {}
    cpu_s: dict[tuple[str, str], float] = {}
    for cp, cw in report.codepaths.items():
        parts = cw.direction or {UNKNOWN: DirectionWindow(cw.samples, cw.cpu_s)}
        for d, part in parts.items():
            key = (cp, _label(cp, d))
            samples[key] = samples.get(key, 0) + part.samples
            cpu_s[key] = cpu_s.get(key, 0.0) + part.cpu_s
    energy_j: dict[tuple[str, str], float] | None = None
    if codepaths_j is not None:
        energy_j = {}
        for cp, j in codepaths_j.items():
            for d, joules in split_by_direction(j, report.codepaths.get(cp)).items():
                key = (cp, _label(cp, d))
                energy_j[key] = energy_j.get(key, 0.0) + joules
    return DirectedFigures(
        samples, cpu_s, energy_j, {}, {}, source if energy_j is not None else None
    )


# the GPU key of figures_of_records' GPU-wait: the record keeps it summed over GPUs
ALL_GPUS = "all"


def figures_of_records(
    report: WindowReport, energy: EnergyRecord | None, gpu: GpuRecord | None
) -> DirectedFigures:
    """A window's DirectedFigures from what the run record was handed (a writer given
    the records rather than the AttributedWindow: Recorder.append_window without
    `directed`): the same split of samples, CPU and joules, and the GPU-wait the GPU
    record already holds by direction, summed over GPUs (key ALL_GPUS)."""
    measured = energy is not None and energy.measured
    figures = _directed(
        report,
        energy.codepaths_j if energy is not None and measured else None,
        energy.source if energy is not None and measured else None,
    )
    waits = gpu.codepaths_wait_by_direction_s if gpu is not None else {}
    return replace(
        figures,
        gpu_wait_s={(cp, d, ALL_GPUS): s for cp, by_d in waits.items() for d, s in by_d.items()},
    )


@dataclass(frozen=True)
class AttributedWindow:
    """One target window and what was attributed to it: the value every consumer reads.

    reading: the energy/GPU reading it was attributed against (the window's own span for
    `serwatt profile`, the daemon's whole slot for the daemon; `slot` says which), or None
    when the run measures no energy. attribution: None without a reading. failure: why
    attribution raised (the window is still kept, without joules).
    """

    report: WindowReport
    reading: WindowEnergy | None = None
    attribution: TargetAttribution | None = None
    slot: bool = False
    failure: str | None = None
    # `serwatt profile`'s: the node's reading from where the last window's ended to where
    # this one ends (attribution/pipeline.py), so the profile's node totals miss no span
    # between windows; None when it had no new span (or the run measures no energy)
    advance: WindowEnergy | None = None
    # `serwatt profile`'s: the tracker's status and self-metrics as the window was
    # attributed, so its sinks never read the tracker (profile/energy_sink.py)
    tracker: TrackerReport | None = None

    @property
    def energy_j(self) -> Mapping[str, float] | None:
        return self.attribution.energy_j if self.attribution else None

    @property
    def energy_source(self) -> str | None:
        return self.attribution.energy_source if self.attribution else None

    def by_direction(self) -> DirectedFigures:
        """The window's per-codepath figures keyed by (codepath, direction), as the
        daemon's counters carry them (CODEPATH_DIRECTIONS: `other` is `unknown` only)."""
        ta = self.attribution
        e = ta.energy if ta is not None else None
        figures = _directed(self.report, e.codepaths_j if e else None, e.source if e else None)
        wait_s: dict[tuple[str, str, int | str], float] = {}
        wait_j: dict[tuple[str, str, int | str], float] = {}
        for g in ta.gpu_wait if ta is not None else ():
            for cp, total in g.wait_s.items():
                split = g.wait_by_direction_s.get(cp) or {UNKNOWN: total}
                idle_j = None if g.idle_energy_j is None else g.idle_energy_j.get(cp, 0.0)
                for d, s in split.items():
                    key3 = (cp, _label(cp, d), g.gpu_index)
                    wait_s[key3] = wait_s.get(key3, 0.0) + s
                    if idle_j is not None:
                        # idle joules follow the wait they were spent in
                        share = s / total if total > 0 else float(d == UNKNOWN)
                        wait_j[key3] = wait_j.get(key3, 0.0) + idle_j * share
        return replace(figures, gpu_wait_s=wait_s, gpu_wait_energy_j=wait_j)

    def energy_record(self) -> EnergyRecord | None:
        """What the run record keeps of the window's energy; None when the run measures no
        energy."""
        if self.failure is not None:
            return EnergyRecord.unavailable(f"attribution failed: {self.failure}")
        if self.reading is None:
            return None
        we, e = self.reading, self.attribution.energy if self.attribution else None
        slot = None
        if self.slot:
            # A slot reading: the span the energy was read over, and how it was split.
            slot = SlotSplit(
                start=we.start,
                end=we.end,
                node_busy_cpu_s=we.node_busy_cpu_s,
                target_share=e.target_share if e is not None else None,
                model=we.model,
                notes=tuple(we.notes),
            )
        if e is None:
            return EnergyRecord.unavailable(
                we.reason or "no energy reading for this window", slot=slot
            )
        return EnergyRecord(
            source=e.source,
            reason=we.reason,
            package_j=e.total_j,
            target_j=e.target_j,
            unattributed_j=e.unattributed_j,
            codepaths_j=dict(e.codepaths_j),
            slot=slot,
        )

    def gpu_record(self) -> GpuRecord | None:
        """The run record's GPU-wait per codepath summed over the GPUs the target used,
        plus each GPU's own figures. None when the window had no GPU data."""
        ta = self.attribution
        if ta is None or not ta.gpu_wait:
            return None
        wait_s = dict.fromkeys(CODEPATHS, 0.0)
        wait_j: dict[str, float] | None = dict.fromkeys(CODEPATHS, 0.0)
        fold = DirectedTotals()
        fold.add(self.by_direction())
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
                GpuFigures(
                    index=g.gpu_index,
                    covered_s=g.covered_s,
                    idle_s=g.idle_s,
                    unattributed_s=g.unattributed_s,
                    wait_s=dict(g.wait_s),
                )
            )
        return GpuRecord(
            codepaths_wait_s=wait_s,
            codepaths_wait_j=wait_j,
            # the codepaths that waited, split by direction (records: direction_rows)
            codepaths_wait_by_direction_s=fold.wait_by_direction(),
            gpus=tuple(gpus),
        )


def _attribute_one(report: WindowReport, reading: WindowEnergy, slot: bool) -> AttributedWindow:
    return AttributedWindow(report, reading, attribute_window(report, reading), slot=slot)


@dataclass(frozen=True)
class SpanAttribution:
    """A span's windows attributed against its one reading: `windows` in the order of the
    reports, their joules fitted to the node's (overlap_factor); `node_j` the node's
    measured joules (None: not measured), `attributed_j` what the windows hold of them."""

    windows: tuple[AttributedWindow, ...]
    node_j: float | None
    attributed_j: float


def attribute_span(
    reports: Sequence[WindowReport], reading: WindowEnergy, *, slot: bool
) -> SpanAttribution:
    """The one place windows get their joules and GPU-wait: every target window of one
    span against the span's reading. `serwatt profile` passes a span of one window (its
    own reading, slot False), the daemon a slot's windows (the slot's reading, slot True).
    Each window gets its CPU share of the span's dynamic joules, and where the shares sum
    past them (the targets' and the node's CPU clocks tick separately), all are scaled by
    one factor (apportion.overlap_factor); each sample's GPU-wait is timed by the timeline
    that produced it (attribute_window)."""
    return fit_span([_attribute_one(report, reading, slot) for report in reports], reading)


def fit_span(windows: Sequence[AttributedWindow], reading: WindowEnergy) -> SpanAttribution:
    """The one overlap fit: windows attributed over one span, whose joules together may
    not pass the node's dynamic joules over it (`reading`), all scaled by one factor
    where they do (apportion.overlap_factor). attribute_span fits a span's windows; the
    profile's pipeline fits the windows of a process tree that overlap in time
    (WindowPipeline.attribute_held) against the reading of their joint span."""
    if reading.source not in ("rapl", "model") or reading.package_j is None:
        return SpanAttribution(tuple(windows), None, _joules(windows))
    node_j = max(0.0, reading.package_j)
    dynamic_j = reading.dynamic_j if reading.dynamic_j is not None else node_j
    factor = overlap_factor(_joules(windows), dynamic_j)
    if factor != 1.0:
        windows = [_scaled(w, factor) for w in windows]
    return SpanAttribution(tuple(windows), node_j, min(_joules(windows), node_j))


def _joules(windows: Sequence[AttributedWindow]) -> float:
    return math.fsum(math.fsum(w.energy_j.values()) for w in windows if w.energy_j)


def _scaled(w: AttributedWindow, factor: float) -> AttributedWindow:
    ta = w.attribution
    if ta is None or ta.energy is None:
        return w
    return replace(w, attribution=replace(ta, energy=scaled_energy(ta.energy, factor)))
