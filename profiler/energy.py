"""The energy tracker: node energy and GPU readings per sampling window, and their
attribution to a target's codepaths.

`EnergyTracker` polls RAPL (and /proc/stat) on its own thread at the period RAPL's
counter range allows (so wraps are always corrected) and NVML every `nvml_poll_s`,
keeps a few minutes of history, and answers `window(start, end)` for any past
window by interpolating between polls. When RAPL is unavailable it falls back to
the labelled CPU model (collectors/cpu_model), so every figure carries its source:
`rapl`, `model` or `unavailable` (with the reason).

    tracker = EnergyTracker(sysfs_root=Path("/sys"), procfs_root=Path("/proc"),
                            tdp_w=None, rapl_mode="auto", nvml_mode="auto")
    status = tracker.probe()          # {"rapl": CollectorStatus(up, reason, detail), ...}
    tracker.start()
    we = tracker.window(report.started_at, report.ended_at)       # WindowEnergy
    ta = tracker.attribute(report, we)                            # TargetAttribution
    tracker.stop()

`EnergyObserver` plugs the tracker into a `serwatt profile` session (observer
protocol of profiler/session.py) and fills `energy`, `gpus` and each codepath's
`energy_j`, `gpu_wait_s` and `gpu_idle_j` in the profile document.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.cpu_model import CpuPowerModel
from collectors.cpustat import CpuStat
from collectors.nvml import REASON_OFF, GpuWindow, NvmlBackend, NvmlCollector
from collectors.rapl import DEFAULT_MAX_POWER_W, RaplCollector
from profiler.attribution import (
    EnergyAttribution,
    GpuWaitAttribution,
    IdleSpan,
    attribute_energy,
    attribute_gpu_wait,
    gpus_used_by,
)
from profiler.codepaths import CODEPATHS
from profiler.window import TimedLabel, WindowReport

MODES = ("auto", "required", "off")
POLL_CAP_S = 0.25  # RAPL is read at least this often, for window edges, whatever the range
NVML_POLL_S = 0.5
HISTORY_S = 900.0

ENERGY_METHOD = (
    "package energy per window; dynamic part = energy x node CPU utilisation (/proc/stat), "
    "split by the target's CPU share of node busy CPU, then over codepaths by CPU-seconds; "
    "idle part and other processes' share stay unattributed"
)
GPU_WAIT_METHOD = (
    "GPU idle time (NVML utilisation samples; empty buffer counted idle only when "
    "utilisation reads 0) while any target thread was sampled in the codepath; counted once "
    "per instant, split equally between distinct serialization codepaths; summed over the "
    "GPUs the target uses (NVML compute pids)"
)


class EnergyUnavailableError(Exception):
    """A collector the operator marked `required` is not available. Says the fix."""


@dataclass(frozen=True)
class CollectorStatus:
    up: bool
    reason: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class WindowEnergy:
    """Node energy and GPU readings over [start, end] (host epoch seconds).

    source: "rapl" (measured), "model" (estimated) or "unavailable" (see reason).
    package_j / dynamic_j / idle_j: joules; dynamic + idle == package.
    """

    start: float
    end: float
    source: str
    reason: str | None
    package_j: float | None = None
    dynamic_j: float | None = None
    idle_j: float | None = None
    dram_j: float | None = None
    psys_j: float | None = None
    per_package_j: Mapping[int, float] = field(default_factory=dict)
    node_busy_cpu_s: float | None = None
    node_total_cpu_s: float | None = None
    model: str | None = None
    gpus: tuple[GpuWindow, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.start)


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


def _interp(times: list[float], values: list[float], t: float) -> float | None:
    if not times or t < times[0] or t > times[-1]:
        return None
    i = bisect.bisect_left(times, t)
    if times[i] == t:
        return values[i]
    t0, t1 = times[i - 1], times[i]
    v0, v1 = values[i - 1], values[i]
    return v1 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


class _Series:
    """Time-ordered cumulative readings with linear interpolation."""

    def __init__(self, names: Iterable[str]) -> None:
        self.t: deque[float] = deque()
        self.v: dict[str, deque[float]] = {n: deque() for n in names}

    def add(self, t: float, **values: float) -> None:
        if self.t and t <= self.t[-1]:
            return  # keep strictly increasing time
        self.t.append(t)
        for k, dq in self.v.items():
            dq.append(values[k])

    def prune(self, horizon: float) -> None:
        while len(self.t) > 2 and self.t[1] < horizon:
            self.t.popleft()
            for dq in self.v.values():
                dq.popleft()

    def delta(self, name: str, a: float, b: float) -> float | None:
        times = list(self.t)
        vals = list(self.v[name])
        va, vb = _interp(times, vals, a), _interp(times, vals, b)
        return None if va is None or vb is None else vb - va

    @property
    def last_t(self) -> float | None:
        return self.t[-1] if self.t else None


class EnergyTracker:
    """Polls RAPL/CPU/NVML and answers per-window energy questions. Thread-safe."""

    def __init__(
        self,
        sysfs_root: Path | str = Path("/sys"),
        procfs_root: Path | str = Path("/proc"),
        tdp_w: float | None = None,
        rapl_mode: str = "auto",
        nvml_mode: str = "auto",
        *,
        nvml_backend: NvmlBackend | type | None = None,
        rapl_max_power_w: float = DEFAULT_MAX_POWER_W,
        poll_cap_s: float = POLL_CAP_S,
        nvml_poll_s: float = NVML_POLL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for name, mode in (("rapl_mode", rapl_mode), ("nvml_mode", nvml_mode)):
            if mode not in MODES:
                raise ValueError(f"{name} must be one of {', '.join(MODES)}, got {mode!r}")
        self.sysfs_root = Path(sysfs_root)
        self.procfs_root = Path(procfs_root)
        self.tdp_w = tdp_w
        self.rapl_mode = rapl_mode
        self.nvml_mode = nvml_mode
        self.poll_cap_s = poll_cap_s
        self.nvml_poll_s = nvml_poll_s
        self._clock = clock
        self.rapl = RaplCollector(self.sysfs_root, max_power_w=rapl_max_power_w, clock=clock)
        self.cpustat = CpuStat(self.procfs_root, clock=clock)
        self.nvml = NvmlCollector(nvml_backend, clock=clock)
        self._model: CpuPowerModel | None = None
        self._status: dict[str, CollectorStatus] | None = None
        self._rapl_series = _Series(("package", "dram", "psys"))
        self._per_package: dict[int, _Series] = {}
        self._cpu_series = _Series(("busy", "total"))
        self._rapl_errors = 0
        self.rapl_wraps = 0  # counter wraps corrected so far, all zones
        self.max_rapl_gap_s = 0.0  # longest time between two RAPL reads
        self._last_rapl_errors: tuple[str, ...] = ()
        self._rapl_error_log: deque[tuple[float, tuple[str, ...]]] = deque(maxlen=256)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_nvml_poll = -math.inf

    # ------------------------------------------------------------------ status

    def probe(self) -> dict[str, CollectorStatus]:
        """Status per collector: rapl, cpustat, cpu_model, nvml. Raises
        EnergyUnavailableError when a `required` collector is down."""
        with self._lock:
            if self._status is None:
                self._status = self._probe()
            status = self._status
        if self.rapl_mode == "required" and not status["rapl"].up:
            r = status["rapl"]
            raise EnergyUnavailableError(
                f"RAPL is required but unavailable ({r.reason}): {r.detail}. Fix it, or set "
                "rapl to auto to fall back to the labelled CPU model"
            )
        if self.nvml_mode == "required" and not status["nvml"].up:
            n = status["nvml"]
            raise EnergyUnavailableError(
                f"NVML is required but unavailable ({n.reason}): {n.detail}. Fix it, or set "
                "nvml to auto to run without GPU-wait"
            )
        return status

    def _probe(self) -> dict[str, CollectorStatus]:
        out: dict[str, CollectorStatus] = {}
        if self.rapl_mode == "off":
            out["rapl"] = CollectorStatus(False, REASON_OFF, "RAPL disabled by configuration")
        else:
            rs = self.rapl.probe()
            out["rapl"] = CollectorStatus(rs.available, rs.reason, rs.detail)
        ok, why = self.cpustat.probe()
        out["cpustat"] = CollectorStatus(ok, None if ok else "unreadable", why)
        if out["rapl"].up:
            out["cpu_model"] = CollectorStatus(False, "not_needed", "RAPL measures energy")
        else:
            try:
                self._model = CpuPowerModel.for_node(self.procfs_root, self.tdp_w)
                out["cpu_model"] = CollectorStatus(ok, None if ok else "no_cpustat",
                                                   self._model.describe())  # fmt: skip
            except (OSError, ValueError) as exc:
                out["cpu_model"] = CollectorStatus(False, "unreadable", str(exc))
        if self.nvml_mode == "off":
            out["nvml"] = CollectorStatus(False, REASON_OFF, "NVML disabled by configuration")
        else:
            ns = self.nvml.probe()
            detail = ns.detail
            if ns.available:
                detail = "; ".join(
                    f"gpu {g.index} {g.name}: " + ("up" if g.up else f"{g.reason}") for g in ns.gpus
                )
            out["nvml"] = CollectorStatus(ns.available, ns.reason, detail)
        return out

    @property
    def energy_source(self) -> str:
        s = self.probe()
        if s["rapl"].up:
            return "rapl"
        if s["cpu_model"].up:
            return "model"
        return "unavailable"

    @property
    def rapl_poll_period_s(self) -> float | None:
        """The period the tracker reads RAPL at: the wrap-safe period, capped."""
        if not self.probe()["rapl"].up:
            return None
        safe = self.rapl.probe().poll_period_s or self.poll_cap_s
        return min(safe, self.poll_cap_s)

    @property
    def rapl_read_errors(self) -> int:
        """RAPL reads that failed for at least one zone, since start (for self-metrics)."""
        return self._rapl_errors

    @property
    def last_rapl_errors(self) -> tuple[str, ...]:
        """The zone errors of the most recent failed read ("intel-rapl:0: ENOENT", ...)."""
        return self._last_rapl_errors

    def fastest_wrap_s(self) -> float | None:
        """Shortest time any counted zone takes to wrap at the average power seen so
        far (None before two reads or at zero power). Reads further apart than half of
        this risk a missed wrap; the safe period assumes `max_power_w` instead."""
        with self._lock:
            t = self._rapl_series.t
            if len(t) < 2 or not self.probe()["rapl"].up:
                return None
            elapsed = t[-1] - t[0]
            zones = self.rapl.probe().zones
            out: list[float] = []
            for pkg, series in self._per_package.items():
                ranges = [
                    z.max_energy_range_j for z in zones if z.kind == "package" and z.package == pkg
                ]
                d = series.delta("j", series.t[0], series.t[-1]) if len(series.t) > 1 else None
                if ranges and d and d > 0:
                    out.append(min(ranges) / (d / elapsed))
            for kind in ("dram", "psys"):
                ranges = [z.max_energy_range_j for z in zones if z.kind == kind]
                d = self._rapl_series.delta(kind, t[0], t[-1])
                if ranges and d and d > 0:
                    out.append(min(ranges) / (d / len(ranges) / elapsed))
            return min(out) if out else None

    # ------------------------------------------------------------------ polling

    def poll_once(self) -> None:
        status = self.probe()
        with self._lock:
            now = self._clock()
            if status["cpustat"].up:
                try:
                    ct = self.cpustat.read()
                    self._cpu_series.add(ct.t, busy=ct.busy_s, total=ct.total_s)
                except (OSError, ValueError):
                    pass  # the gap is interpolated over; windows without data say so
            if status["rapl"].up:
                r = self.rapl.read()
                if self._rapl_series.last_t is not None:
                    self.max_rapl_gap_s = max(self.max_rapl_gap_s, r.t - self._rapl_series.last_t)
                self._rapl_series.add(
                    r.t, package=r.package_j, dram=r.dram_j or 0.0, psys=r.psys_j or 0.0
                )
                for pkg, j in r.per_package_j.items():
                    self._per_package.setdefault(pkg, _Series(("j",))).add(r.t, j=j)
                self.rapl_wraps = r.wraps
                if r.errors:
                    self._rapl_errors += 1
                    self._last_rapl_errors = r.errors
                    self._rapl_error_log.append((r.t, r.errors))
            if status["nvml"].up and now - self._last_nvml_poll >= self.nvml_poll_s * 0.9:
                self.nvml.poll()
                self._last_nvml_poll = now
            horizon = now - HISTORY_S
            self._rapl_series.prune(horizon)
            self._cpu_series.prune(horizon)
            for s in self._per_package.values():
                s.prune(horizon)

    def start(self) -> None:
        """First reading now (so windows starting from here are covered), then a thread."""
        self.probe()
        self.poll_once()
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="serwatt-energy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        period = self.rapl_poll_period_s or min(self.nvml_poll_s, self.poll_cap_s)
        while not self._stop.wait(period):
            try:
                self.poll_once()
            except Exception:  # a failed poll must not end polling; next one catches up
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.nvml.shutdown()

    def __enter__(self) -> EnergyTracker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ windows

    def window(self, start: float, end: float) -> WindowEnergy:
        """Energy and GPU readings over [start, end]; reads now if `end` is newer than
        the last poll, so a window that just ended is bracketed by real readings."""
        if end < start:
            raise ValueError(f"window end {end} is before its start {start}")
        status = self.probe()
        with self._lock:
            last = self._rapl_series.last_t if status["rapl"].up else self._cpu_series.last_t
            if last is None or end > last:
                self.poll_once()
            busy = self._cpu_series.delta("busy", start, end)
            total = self._cpu_series.delta("total", start, end)
            gpus = self.nvml.window(start, end) if status["nvml"].up else ()
            notes: list[str] = []
            util = None
            if busy is not None and total is not None and total > 0:
                util = min(1.0, max(0.0, busy / total))
            if status["rapl"].up:
                pkg = self._rapl_series.delta("package", start, end)
                if pkg is None:
                    return WindowEnergy(
                        start, end, "unavailable",
                        "no RAPL reading brackets this window (it began before the tracker)",
                        gpus=gpus,
                    )  # fmt: skip
                if util is None:
                    notes.append("node CPU time unavailable: idle part not separated")
                dyn = pkg * (util if util is not None else 1.0)
                rs = self.rapl.probe()
                if rs.skipped:
                    notes.append(
                        "zones left out: "
                        + "; ".join(f"{s.zone_id}: {s.reason}" for s in rs.skipped)
                    )
                errs = sorted(
                    {e for t, es in self._rapl_error_log if start <= t <= end for e in es}
                )
                if errs:
                    # energy of a failed read is carried, then caught up by the next good one
                    notes.append("RAPL read errors in this window: " + ", ".join(errs))
                has_dram = any(z.kind == "dram" for z in rs.zones)
                has_psys = any(z.kind == "psys" for z in rs.zones)
                per_pkg = {}
                for p, s in sorted(self._per_package.items()):
                    d = s.delta("j", start, end)
                    if d is not None:
                        per_pkg[p] = d
                return WindowEnergy(
                    start=start,
                    end=end,
                    source="rapl",
                    reason=None,
                    package_j=pkg,
                    dynamic_j=dyn,
                    idle_j=pkg - dyn,
                    dram_j=self._rapl_series.delta("dram", start, end) if has_dram else None,
                    psys_j=self._rapl_series.delta("psys", start, end) if has_psys else None,
                    per_package_j=per_pkg,
                    node_busy_cpu_s=busy,
                    node_total_cpu_s=total,
                    gpus=gpus,
                    notes=tuple(notes),
                )
            rapl_why = f"rapl {status['rapl'].reason}: {status['rapl'].detail}"
            if self._model is not None and util is not None:
                m = self._model.energy(end - start, util)
                return WindowEnergy(
                    start=start,
                    end=end,
                    source="model",
                    reason=rapl_why,
                    package_j=m.total_j,
                    dynamic_j=m.dynamic_j,
                    idle_j=m.idle_j,
                    node_busy_cpu_s=busy,
                    node_total_cpu_s=total,
                    model=self._model.describe(),
                    gpus=gpus,
                )
            why = rapl_why
            if self._model is None:
                why += f"; cpu model: {status['cpu_model'].detail}"
            else:
                why += "; no /proc/stat reading brackets this window"
            return WindowEnergy(start, end, "unavailable", why, gpus=gpus)

    def attribute(
        self,
        report: WindowReport,
        window_energy: WindowEnergy,
        node_busy_cpu_s: float | None = None,
        target_pids: Iterable[int] = (),
        only_active: bool = False,
    ) -> TargetAttribution:
        """Per-codepath joules (+ residual) and GPU-wait of one target window."""
        return attribute_window(
            report,
            window_energy,
            node_busy_cpu_s=node_busy_cpu_s,
            target_pids=target_pids,
            only_active=only_active,
        )


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


def _r(v: float | None, nd: int = 6) -> float | None:
    return None if v is None else round(v, nd)


@dataclass
class _GpuAcc:
    """One GPU's running totals over a profile."""

    index: int
    uuid: str | None
    name: str | None
    up: bool = True
    reason: str | None = None
    used: bool = False
    covered_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    energy_j: float | None = None
    energy_source: str | None = None
    sample_period_s: float | None = None
    clock: Any = None
    wait_s: dict[str, float] | None = None
    unattributed_wait_s: float = 0.0
    idle_j: dict[str, float] | None = None
    idle_j_missing: bool = False


class EnergyObserver:
    """Session observer (profiler/session.py) adding joules and GPU-wait to a profile.

    Joules are attributed per target window (each window's own utilisation and CPU
    share) and summed. Node totals are accumulated span by span as windows arrive,
    and GPU-wait is computed over the merged timeline of every target once all
    targets' windows have passed a span (two window lengths behind the newest), so
    an instant where two processes serialize counts once, and a profile of any
    length stays inside the tracker's history.
    """

    def __init__(self, tracker: EnergyTracker) -> None:
        self.tracker = tracker
        self.status = tracker.probe()
        self._cp_j = dict.fromkeys(CODEPATHS, 0.0)
        self._parts = {"idle": 0.0, "other_processes": 0.0, "target_unsampled": 0.0}
        self._sources: set[str] = set()
        self._reasons: list[str] = []
        self._notes: list[str] = []
        self._labels: list[TimedLabel] = []
        self._pids: set[int] = set()
        self._rate_hz: float | None = None
        self._window_s = 5.0
        self._first: float | None = None
        self._last: float | None = None
        self._e_until: float | None = None  # node energy accumulated up to here
        self._g_until: float | None = None  # GPU-wait computed up to here
        self._node: dict[str, float] = {}
        self._node_missing: set[str] = set()
        self._per_pkg: dict[int, float] = {}
        self._node_unavailable_s = 0.0
        self._gpus: dict[int, _GpuAcc] = {}
        self._started = False

    def on_start(self, info: Any) -> None:
        if info is not None and getattr(info, "window_s", None):
            self._window_s = float(info.window_s)
        self.tracker.start()
        self._started = True

    def on_window(self, report: WindowReport) -> None:
        if not self._started:
            self.on_start(None)
        self._pids.add(report.pid)
        self._rate_hz = report.rate_hz
        self._labels.extend(report.timeline)
        self._first = (
            report.started_at if self._first is None else min(self._first, report.started_at)
        )
        self._last = report.ended_at if self._last is None else max(self._last, report.ended_at)
        self._advance_node(report.started_at, report.ended_at)
        we = self.tracker.window(report.started_at, report.ended_at)
        if we.source != "unavailable":
            ta = attribute_window(report, we)
            assert ta.energy is not None
            self._sources.add(ta.energy.source)
            for cp, j in ta.energy.codepaths_j.items():
                self._cp_j[cp] += j
            self._parts["idle"] += ta.energy.unattributed_idle_j
            self._parts["other_processes"] += ta.energy.unattributed_other_processes_j
            self._parts["target_unsampled"] += ta.energy.unattributed_target_unsampled_j
        elif we.reason:
            self._reasons.append(we.reason)
        # every target's window covering this far back has arrived by now
        self._advance_gpus(self._last - 2 * self._window_s)

    def _advance_node(self, start: float, end: float) -> None:
        a = start if self._e_until is None else self._e_until
        if end <= a:
            return
        self._e_until = end
        we = self.tracker.window(a, end)
        if we.source == "unavailable" or we.package_j is None:
            self._node_unavailable_s += end - a
            if we.reason:
                self._reasons.append(we.reason)
            return
        self._model = we.model
        for key, val in (
            ("package_j", we.package_j),
            ("dynamic_j", we.dynamic_j),
            ("idle_j", we.idle_j),
            ("dram_j", we.dram_j),
            ("psys_j", we.psys_j),
            ("node_busy_cpu_s", we.node_busy_cpu_s),
            ("node_total_cpu_s", we.node_total_cpu_s),
        ):
            if val is None:
                self._node_missing.add(key)
            else:
                self._node[key] = self._node.get(key, 0.0) + val
        for pkg, j in we.per_package_j.items():
            self._per_pkg[pkg] = self._per_pkg.get(pkg, 0.0) + j
        for note in we.notes:
            if note not in self._notes:
                self._notes.append(note)

    def _advance_gpus(self, until: float) -> None:
        if not self.status["nvml"].up or self._first is None or not self._rate_hz:
            return
        a = self._first if self._g_until is None else self._g_until
        if until <= a:
            return
        self._g_until = until
        labels = [lab for lab in self._labels if lab.t < until]
        # a label's sample still covers [t, t + 1/rate): keep what reaches past `until`
        keep_from = until - 1.0 / self._rate_hz
        self._labels = [lab for lab in self._labels if lab.t >= keep_from]
        gpu_windows = self.tracker.nvml.window(a, until)
        used = used_gpus(gpu_windows, self._pids)
        for g in gpu_windows:
            acc = self._gpus.setdefault(g.index, _GpuAcc(g.index, g.uuid, g.name))
            acc.up, acc.reason = g.up, g.reason
            acc.covered_s += g.covered_s
            acc.busy_s += g.busy_s
            acc.idle_s += g.idle_s
            if g.energy_j is not None:
                acc.energy_j = (acc.energy_j or 0.0) + g.energy_j
                acc.energy_source = g.energy_source
            acc.sample_period_s = g.sample_period_s or acc.sample_period_s
            acc.clock = g.clock or acc.clock
            if g.index not in used:
                continue
            acc.used = True
            w = gpu_wait_for(g, labels, self._rate_hz, a, until)
            acc.wait_s = acc.wait_s or dict.fromkeys(CODEPATHS, 0.0)
            for cp, v in w.wait_s.items():
                acc.wait_s[cp] += v
            acc.unattributed_wait_s += w.unattributed_s
            if w.idle_energy_j is None:
                acc.idle_j_missing = acc.idle_j_missing or w.idle_s > 0
            else:
                acc.idle_j = acc.idle_j or dict.fromkeys(CODEPATHS, 0.0)
                for cp, v in w.idle_energy_j.items():
                    acc.idle_j[cp] += v

    def finish(self) -> dict[str, Any]:
        try:
            if self._last is not None:
                self._advance_node(self._first or self._last, self._last)
                self._advance_gpus(self._last)
            return self._finish()
        finally:
            self.tracker.stop()

    def _energy_part(self) -> dict[str, Any]:
        if not self._sources or "package_j" not in self._node:
            reason = self._reasons[0] if self._reasons else "no window was profiled"
            if self.tracker.energy_source == "unavailable":
                st = self.status
                reason = (
                    f"rapl {st['rapl'].reason}: {st['rapl'].detail}; "
                    f"cpu model: {st['cpu_model'].detail}"
                )
            return {"source": "unavailable", "reason": reason, "package_j": None}
        (source,) = self._sources
        total = self._node["package_j"]
        attributed = math.fsum(self._cp_j.values())
        if attributed > total > 0:  # overlapping target windows: never claim more than measured
            scale = total / attributed
            for cp in self._cp_j:
                self._cp_j[cp] *= scale
            attributed = math.fsum(self._cp_j.values())
        node = {k: (None if k in self._node_missing else _r(v)) for k, v in self._node.items()}
        notes = list(self._notes)
        if self._node_unavailable_s > 0:
            notes.append(
                f"{self._node_unavailable_s:.2f} s of the profile had no energy reading "
                f"({self._reasons[0] if self._reasons else 'unknown'})"
            )
        part: dict[str, Any] = {
            "source": source,
            "reason": self.status["rapl"].detail if source == "model" else None,
            "package_j": _r(total),
            "attributed_j": _r(attributed),
            "unattributed_j": _r(max(0.0, total - attributed)),
            "dynamic_j": node.get("dynamic_j"),
            "idle_j": node.get("idle_j"),
            "dram_j": node.get("dram_j"),
            "psys_j": node.get("psys_j"),
            "per_package_j": {str(k): _r(v) for k, v in sorted(self._per_pkg.items())},
            "node_busy_cpu_s": node.get("node_busy_cpu_s"),
            "node_total_cpu_s": node.get("node_total_cpu_s"),
            "window": {"start": self._first, "end": self._last},
            "method": ENERGY_METHOD,
            "notes": notes,
        }
        if source == "model":
            part["reason"] = f"rapl {self.status['rapl'].reason}: {self.status['rapl'].detail}"
            part["model"] = getattr(self, "_model", None)
        if source == "rapl":
            rs = self.tracker.rapl.probe()
            part["rapl"] = {
                "poll_period_s": self.tracker.rapl_poll_period_s,
                "max_safe_period_s": rs.poll_period_s,
                "zones": [
                    {"zone": z.zone_id, "name": z.name, "kind": z.kind, "package": z.package}
                    for z in rs.zones
                ],
                "skipped": [{"zone": s.zone_id, "reason": s.reason} for s in rs.skipped],
                "wraps_corrected": self.tracker.rapl_wraps,
                "max_read_gap_s": round(self.tracker.max_rapl_gap_s, 6),
            }
            fastest = self.tracker.fastest_wrap_s()
            if fastest is not None and self.tracker.max_rapl_gap_s > fastest / 2:
                part["notes"].append(
                    f"RAPL reads were {self.tracker.max_rapl_gap_s:.2f} s apart at worst; at "
                    f"the power seen, a counter wraps every {fastest:.2f} s: a wrap may have "
                    "been missed"
                )
        if len(self._pids) == 1:
            # The residual's parts; between windows = py-spy restarts between windows.
            parts = {k: _r(v) for k, v in self._parts.items()}
            rest = part["unattributed_j"] - math.fsum(self._parts.values())
            parts["between_windows"] = _r(max(0.0, rest))
            part["unattributed_parts_j"] = parts
        return part

    def _finish(self) -> dict[str, Any]:
        energy = self._energy_part()
        measured = energy["source"] in ("rapl", "model")
        nv = self.status["nvml"]
        gpus: list[dict[str, Any]] = []
        wait_s: dict[str, float] | None = None
        idle_j: dict[str, float] | None = None
        for acc in sorted(self._gpus.values(), key=lambda a: a.index):
            row: dict[str, Any] = {
                "index": acc.index,
                "uuid": acc.uuid,
                "name": acc.name,
                "up": acc.up,
                "reason": acc.reason,
                "used_by_target": acc.used,
                "covered_s": _r(acc.covered_s),
                "busy_s": _r(acc.busy_s),
                "idle_s": _r(acc.idle_s),
                "energy_j": _r(acc.energy_j),
                "energy_source": acc.energy_source,
                "sample_period_s": _r(acc.sample_period_s),
                "clock": None
                if acc.clock is None
                else {"domain": acc.clock.domain, "offset_s": acc.clock.offset_s},
                "gpu_wait_s": None,
                "unattributed_wait_s": None,
                "gpu_idle_j": None,
            }
            if acc.used and acc.wait_s is not None:
                row["gpu_wait_s"] = {cp: _r(v) for cp, v in acc.wait_s.items()}
                row["unattributed_wait_s"] = _r(acc.unattributed_wait_s)
                wait_s = wait_s or dict.fromkeys(CODEPATHS, 0.0)
                for cp, v in acc.wait_s.items():
                    wait_s[cp] += v
                if acc.idle_j is not None and not acc.idle_j_missing:
                    row["gpu_idle_j"] = {cp: _r(v) for cp, v in acc.idle_j.items()}
                    idle_j = idle_j or dict.fromkeys(CODEPATHS, 0.0)
                    for cp, v in acc.idle_j.items():
                        idle_j[cp] += v
            gpus.append(row)
        if not gpus and nv.up:
            gpus = [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "up": g.up,
                    "reason": g.reason,
                    "used_by_target": False,
                }  # fmt: skip
                for g in self.tracker.nvml.probe().gpus
            ]
        codepaths = {
            cp: {
                "energy_j": _r(self._cp_j[cp]) if measured else None,
                "energy_source": energy["source"] if measured else None,
                "gpu_wait_s": _r(wait_s[cp]) if wait_s is not None else None,
                "gpu_idle_j": _r(idle_j[cp]) if idle_j is not None else None,
            }
            for cp in CODEPATHS
        }
        return {
            "energy": energy,
            "gpus": gpus,
            "codepaths": codepaths,
            "nvml": {
                "up": nv.up,
                "reason": nv.reason,
                "detail": nv.detail,
                "gpu_wait_method": GPU_WAIT_METHOD,
            },  # fmt: skip
        }
