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
    (aw,) = attribute_span([report], we, slot=False).windows  # profiler.attribution.window
    tracker.stop()

A `serwatt profile` session attributes each window against its tracker, and its
`EnergySink` (profiler/profile/energy_sink.py) fills `energy`, `gpus` and each
codepath's `energy_j`, `gpu_wait_s` and `gpu_idle_j` in the profile document.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from serwatt.collectors.cpu_model import CpuPowerModel
from serwatt.collectors.cpustat import CpuStat
from serwatt.collectors.nvml import REASON_OFF, GpuInfo, GpuWindow, NvmlBackend, NvmlCollector
from serwatt.collectors.rapl import DEFAULT_MAX_POWER_W, RaplCollector, RaplStatus
from serwatt.collectors.series import CumulativeSeries
from serwatt.collectors.status import CollectorStatus

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
class TrackerReport:
    """What an EnergyTracker says of itself at one instant, for a run's document: its
    collectors' status (probe), the source a run carries, RAPL's zones and self-metrics
    (wraps corrected, the longest gap between reads, the fastest wrap at the power seen)
    and the GPUs NVML lists. The window pipeline reads it with each window
    (AttributedWindow.tracker), so the profile's sinks never read the tracker."""

    status: Mapping[str, CollectorStatus]
    energy_source: str
    rapl: RaplStatus | None = None  # RAPL's zones, when it measures
    rapl_poll_period_s: float | None = None
    rapl_wraps: int = 0
    max_rapl_gap_s: float = 0.0
    fastest_wrap_s: float | None = None
    nvml_gpus: tuple[GpuInfo, ...] = ()


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
        nvml_boottime: Callable[[], float] | None = None,
    ) -> None:
        """nvml_boottime: the host's boot clock for calibrating NVML timestamps (None: the
        real one); a replayed GPU passes its fake host's, as `clock` is its fake time."""
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
        self.nvml = (
            NvmlCollector(nvml_backend, clock=clock)
            if nvml_boottime is None
            else NvmlCollector(nvml_backend, clock=clock, boottime=nvml_boottime)
        )
        self._model: CpuPowerModel | None = None
        self._status: dict[str, CollectorStatus] | None = None
        self._rapl_series = CumulativeSeries(("package", "dram", "psys"))
        self._per_package: dict[int, CumulativeSeries] = {}
        self._cpu_series = CumulativeSeries(("busy", "total"))
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
            out["rapl"] = CollectorStatus(rs.up, rs.reason, rs.detail)
        out["cpustat"] = self.cpustat.probe()
        ok = out["cpustat"].up
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
            if ns.up:
                detail = "; ".join(
                    f"gpu {g.index} {g.name}: " + ("up" if g.up else f"{g.reason}") for g in ns.gpus
                )
            out["nvml"] = CollectorStatus(ns.up, ns.reason, detail)
        return out

    def report(self) -> TrackerReport:
        """The tracker's status and self-metrics now (TrackerReport)."""
        status = self.probe()
        rapl_up = status["rapl"].up
        return TrackerReport(
            status=dict(status),
            energy_source=self.energy_source,
            rapl=self.rapl.probe() if rapl_up else None,
            rapl_poll_period_s=self.rapl_poll_period_s,
            rapl_wraps=self.rapl_wraps,
            max_rapl_gap_s=self.max_rapl_gap_s,
            fastest_wrap_s=self.fastest_wrap_s() if rapl_up else None,
            nvml_gpus=self.nvml.probe().gpus if status["nvml"].up else (),
        )

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
                    self._per_package.setdefault(pkg, CumulativeSeries(("j",))).add(r.t, j=j)
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

    def _poll_if_before(self, end: float, status: Mapping[str, CollectorStatus]) -> None:
        last = self._rapl_series.last_t if status["rapl"].up else self._cpu_series.last_t
        nvml_before = self._last_nvml_poll
        if last is None or end > last:
            self.poll_once()
        # NVML is polled every nvml_poll_s, less often than the CPU: a CPU reading after
        # `end` says nothing of NVML's, whose samples could stop a whole poll interval
        # before `end` (the span's GPU-wait then unknown for want of its last edge). Read
        # it here unless poll_once just did (a span ending after now: the read is now).
        if status["nvml"].up and self._last_nvml_poll == nvml_before and nvml_before < end:
            self.nvml.poll()
            self._last_nvml_poll = self._clock()

    def gpu_window(self, start: float, end: float) -> tuple[GpuWindow, ...]:
        """NVML readings over [start, end] (none when NVML is down); reads now if `end` is
        newer than the last poll, as `window` does, so a span that just ended is covered."""
        status = self.probe()
        if not status["nvml"].up:
            return ()
        with self._lock:
            self._poll_if_before(end, status)
            return self.nvml.window(start, end)

    def window(self, start: float, end: float) -> WindowEnergy:
        """Energy and GPU readings over [start, end]; reads now if `end` is newer than
        the last poll, so a window that just ended is bracketed by real readings."""
        if end < start:
            raise ValueError(f"window end {end} is before its start {start}")
        status = self.probe()
        with self._lock:
            self._poll_if_before(end, status)
            busy = self._cpu_series.delta("busy", start, end)
            total = self._cpu_series.delta("total", start, end)
            gpus = self.nvml.window(start, end) if status["nvml"].up else ()
            util = None
            if busy is not None and total is not None and total > 0:
                util = min(1.0, max(0.0, busy / total))
            if status["rapl"].up:
                return self._rapl_window(start, end, util, busy, total, gpus)
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

    def _rapl_window(
        self,
        start: float,
        end: float,
        util: float | None,
        busy: float | None,
        total: float | None,
        gpus: tuple[GpuWindow, ...],
    ) -> WindowEnergy:
        """window()'s RAPL reading (under the lock): the package joules, their dynamic part
        by the node's CPU utilisation, DRAM and psys where present, per package, and notes
        on zones left out and failed reads."""
        pkg = self._rapl_series.delta("package", start, end)
        if pkg is None:
            return WindowEnergy(
                start, end, "unavailable",
                "no RAPL reading brackets this window (it began before the tracker)",
                gpus=gpus,
            )  # fmt: skip
        notes: list[str] = []
        if util is None:
            notes.append("node CPU time unavailable: idle part not separated")
        dyn = pkg * (util if util is not None else 1.0)
        rs = self.rapl.probe()
        if rs.skipped:
            notes.append(
                "zones left out: " + "; ".join(f"{s.zone_id}: {s.reason}" for s in rs.skipped)
            )
        errs = sorted({e for t, es in self._rapl_error_log if start <= t <= end for e in es})
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
