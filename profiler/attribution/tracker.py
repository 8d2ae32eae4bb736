"""The energy tracker: node energy and GPU readings per sampling window, and their
attribution to a target's codepaths.

`EnergyTracker` drives a list of node sources (collectors/source.py `SOURCES`): it
probes each under its config mode, and on its own thread reads each that is up on the
source's own period, ticking at the period RAPL's counter range allows (so wraps are
always corrected), NVML every `nvml_poll_s`. It keeps a few minutes of history and
answers `window(start, end)` for any past window by interpolating between polls. It
knows a source by its role (collectors/role.py), never by its name: the node energy
source (RAPL), CPU time (/proc/stat) and GPUs (NVML); any other source is probed and
read only. When the energy source is unavailable it falls back to the labelled CPU
model (collectors/cpu_model), so every figure carries its source: `rapl`, `model` or
`unavailable` (with the reason).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from serwatt.collectors import source as sources_mod
from serwatt.collectors.cpu_model import CpuPowerModel
from serwatt.collectors.cpustat import CpuStat
from serwatt.collectors.nvml import DEFAULT_POLL_S, GpuInfo, GpuWindow, NvmlBackend, NvmlCollector
from serwatt.collectors.rapl import DEFAULT_MAX_POWER_W, RaplCollector, RaplHistory, RaplStatus
from serwatt.collectors.role import CPU_TIME, GPU, NODE_ENERGY, OTHER, SourceContext
from serwatt.collectors.series import CumulativeSeries
from serwatt.collectors.source import MODES, Source, required_but_down, status_in_mode
from serwatt.collectors.status import CollectorStatus

POLL_CAP_S = 0.25  # RAPL is read at least this often, for window edges, whatever the range
NVML_POLL_S = DEFAULT_POLL_S
HISTORY_S = 900.0
# The status key of the CPU model, which stands in for the node energy source when it is
# down (the tracker's own, not a source: it reads nothing of its own)
CPU_MODEL = "cpu_model"

_S = TypeVar("_S")

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
    energy_collector: str = RaplCollector.name  # the node energy source's status key
    gpu_collector: str = NvmlCollector.name  # the GPU source's status key
    rapl: RaplStatus | None = None  # RAPL's zones, when it measures
    rapl_poll_period_s: float | None = None
    rapl_wraps: int = 0
    max_rapl_gap_s: float = 0.0
    fastest_wrap_s: float | None = None
    nvml_gpus: tuple[GpuInfo, ...] = ()

    @property
    def energy_status(self) -> CollectorStatus:
        return self.status[self.energy_collector]

    @property
    def model_status(self) -> CollectorStatus:
        return self.status[CPU_MODEL]

    @property
    def gpu_status(self) -> CollectorStatus:
        return self.status[self.gpu_collector]


class EnergyTracker:
    """Drives the node's sources (RAPL/CPU/NVML and any other) and answers per-window
    energy questions. Thread-safe."""

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
        sources: Sequence[type[Source]] | None = None,
        modes: Mapping[str, str] | None = None,
        options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """nvml_boottime: the host's boot clock for calibrating NVML timestamps (None: the
        real one); a replayed GPU passes its fake host's, as `clock` is its fake time.
        sources: the source classes to drive (None: collectors/source.py SOURCES); one each
        of the node energy, CPU time and GPU roles, any number of others. modes: the mode
        of each source's `mode_option` beyond rapl_mode/nvml_mode; options: each source's
        own settings by name (collectors/role.py SourceContext)."""
        self.modes = {"rapl": rapl_mode, "nvml": nvml_mode, **(modes or {})}
        for option, mode in self.modes.items():
            if mode not in MODES:
                raise ValueError(f"{option}_mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.sysfs_root = Path(sysfs_root)
        self.procfs_root = Path(procfs_root)
        self.tdp_w = tdp_w
        self.poll_cap_s = poll_cap_s
        self.nvml_poll_s = nvml_poll_s
        self._clock = clock
        gpu_options: dict[str, Any] = {"backend": nvml_backend, "read_every_s": nvml_poll_s}
        if nvml_boottime is not None:
            gpu_options["boottime"] = nvml_boottime
        ctx = SourceContext(
            self.sysfs_root,
            self.procfs_root,
            clock,
            {
                RaplCollector.name: {"max_power_w": rapl_max_power_w},
                NvmlCollector.name: gpu_options,
                **(options or {}),
            },
        )
        classes = sources_mod.SOURCES if sources is None else tuple(sources)
        self.sources: tuple[Source, ...] = tuple(cls.make(ctx) for cls in classes)
        # the role sources, typed: the tracker drives each through its role's interface
        self.rapl = self._one(NODE_ENERGY, RaplCollector)
        self.cpustat = self._one(CPU_TIME, CpuStat)
        self.nvml = self._one(GPU, NvmlCollector)
        self.readings: dict[str, Any] = {}  # other sources' last reading, by name
        self.read_failures: dict[str, str] = {}  # other sources' last read error, by name
        self._last_read: dict[str, float] = {}
        self._model: CpuPowerModel | None = None
        self._status: dict[str, CollectorStatus] | None = None
        self._rapl_history = RaplHistory()
        self._rapl_series = self._rapl_history.series
        self._cpu_series = CumulativeSeries(("busy", "total"))
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _one(self, role: str, kind: type[_S]) -> _S:
        got = [s for s in self.sources if s.role == role]
        if len(got) != 1 or not isinstance(got[0], kind):
            raise ValueError(
                f"the tracker needs one {role} source, a {kind.__name__}; got "
                f"{[type(s).__name__ for s in got] or 'none'}: fix the source list"
            )
        return got[0]

    def mode_of(self, src: Source) -> str:
        """The mode (auto, required, off) `src` runs in: its mode_option's in `modes`."""
        return "auto" if src.mode_option is None else self.modes.get(src.mode_option, "auto")

    @property
    def _last_nvml_poll(self) -> float:
        return self._last_read.get(self.nvml.name, -math.inf)

    # ------------------------------------------------------------------ status

    def probe(self) -> dict[str, CollectorStatus]:
        """Status per source (by its name) and of the CPU model (`cpu_model`). Raises
        EnergyUnavailableError when a `required` source is down."""
        with self._lock:
            if self._status is None:
                self._status = self._probe()
            status = self._status
        for src in self.sources:
            if self.mode_of(src) == "required" and not status[src.name].up:
                raise EnergyUnavailableError(required_but_down(src, status[src.name]))
        return status

    def _probe(self) -> dict[str, CollectorStatus]:
        out = {src.name: status_in_mode(src, self.mode_of(src)) for src in self.sources}
        ok = out[self.cpustat.name].up
        if out[self.rapl.name].up:
            out[CPU_MODEL] = CollectorStatus(
                False, "not_needed", f"{self.rapl.label} measures energy"
            )
        else:
            try:
                self._model = CpuPowerModel.for_node(self.procfs_root, self.tdp_w)
                out[CPU_MODEL] = CollectorStatus(ok, None if ok else "no_cpustat",
                                                 self._model.describe())  # fmt: skip
            except (OSError, ValueError) as exc:
                out[CPU_MODEL] = CollectorStatus(False, "unreadable", str(exc))
        return out

    def up(self, src: Source) -> bool:
        """Whether `src` is up (probed; `off` is down)."""
        return self.probe()[src.name].up

    def report(self) -> TrackerReport:
        """The tracker's status and self-metrics now (TrackerReport)."""
        status = self.probe()
        rapl_up = self.up(self.rapl)
        return TrackerReport(
            status=dict(status),
            energy_source=self.energy_source,
            energy_collector=self.rapl.name,
            gpu_collector=self.nvml.name,
            rapl=self.rapl.probe() if rapl_up else None,
            rapl_poll_period_s=self.rapl_poll_period_s,
            rapl_wraps=self.rapl_wraps,
            max_rapl_gap_s=self.max_rapl_gap_s,
            fastest_wrap_s=self.fastest_wrap_s() if rapl_up else None,
            nvml_gpus=self.nvml.probe().gpus if status[self.nvml.name].up else (),
        )

    @property
    def energy_source(self) -> str:
        s = self.probe()
        if s[self.rapl.name].up:
            return "rapl"
        if s[CPU_MODEL].up:
            return "model"
        return "unavailable"

    @property
    def rapl_poll_period_s(self) -> float | None:
        """The period the tracker reads RAPL at: the wrap-safe period, capped."""
        if not self.up(self.rapl):
            return None
        return self.rapl.tick_s(self.poll_cap_s)

    def tick_s(self) -> float:
        """The polling thread's period: the shortest bound an up source sets (RAPL's
        wrap-safe period), else the shortest read period of any source, capped."""
        status = self.probe()
        bounds = [
            t
            for s in self.sources
            if status[s.name].up and (t := s.tick_s(self.poll_cap_s)) is not None
        ]
        if bounds:
            return min(bounds)
        return min([self.poll_cap_s] + [s.read_every_s for s in self.sources if s.read_every_s])

    @property
    def rapl_read_errors(self) -> int:
        """RAPL reads that failed for at least one zone, since start (for self-metrics)."""
        return self._rapl_history.read_errors

    @property
    def last_rapl_errors(self) -> tuple[str, ...]:
        """The zone errors of the most recent failed read ("intel-rapl:0: ENOENT", ...)."""
        return self._rapl_history.last_errors

    @property
    def rapl_wraps(self) -> int:
        """Counter wraps corrected so far, all zones."""
        return self._rapl_history.wraps

    @property
    def max_rapl_gap_s(self) -> float:
        """The longest time between two RAPL reads."""
        return self._rapl_history.max_gap_s

    def fastest_wrap_s(self) -> float | None:
        """Shortest time any counted zone takes to wrap at the average power seen so
        far (None before two reads or at zero power). Reads further apart than half of
        this risk a missed wrap; the safe period assumes `max_power_w` instead."""
        with self._lock:
            if not self.up(self.rapl):
                return None
            return self._rapl_history.fastest_wrap_s(self.rapl.probe().zones)

    # ------------------------------------------------------------------ polling

    def poll_once(self) -> None:
        """Read every up source that is due (each on its own `read_every_s`)."""
        status = self.probe()
        with self._lock:
            now = self._clock()
            for src in self.sources:
                every = src.read_every_s
                last = self._last_read.get(src.name, -math.inf)
                if status[src.name].up and (every is None or now - last >= every * 0.9):
                    self._read(src)
                    self._last_read[src.name] = now
            horizon = now - HISTORY_S
            self._rapl_history.prune(horizon)
            self._cpu_series.prune(horizon)

    def _read(self, src: Source) -> None:
        """One read of `src`, kept as its role needs (under the lock)."""
        if src is self.cpustat:
            try:
                ct = self.cpustat.read()
                self._cpu_series.add(ct.t, busy=ct.busy_s, total=ct.total_s)
            except (OSError, ValueError):
                pass  # the gap is interpolated over; windows without data say so
        elif src is self.rapl:
            self._rapl_history.add(self.rapl.read())
        elif src is self.nvml:
            self.nvml.poll()
        else:
            try:
                self.readings[src.name] = src.read()
                self.read_failures.pop(src.name, None)
            except Exception as exc:  # one source's failed read must not stop the others'
                self.read_failures[src.name] = f"read failed: {exc}"

    def read_health(self) -> dict[str, tuple[bool, str]]:
        """(up, detail) of each up source the tracker only reads (role other): down
        while its latest read failed, with the error."""
        status = self.probe()
        with self._lock:
            return {
                s.name: (s.name not in self.read_failures, self.read_failures.get(s.name, ""))
                for s in self.sources
                if s.role == OTHER and status[s.name].up
            }

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
        period = self.tick_s()
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
        last = self._rapl_series.last_t if status[self.rapl.name].up else self._cpu_series.last_t
        nvml_before = self._last_nvml_poll
        if last is None or end > last:
            self.poll_once()
        # NVML is polled every nvml_poll_s, less often than the CPU: a CPU reading after
        # `end` says nothing of NVML's, whose samples could stop a whole poll interval
        # before `end` (the span's GPU-wait then unknown for want of its last edge). Read
        # it here unless poll_once just did (a span ending after now: the read is now).
        if status[self.nvml.name].up and self._last_nvml_poll == nvml_before and nvml_before < end:
            self.nvml.poll()
            self._last_read[self.nvml.name] = self._clock()

    def gpu_window(self, start: float, end: float) -> tuple[GpuWindow, ...]:
        """NVML readings over [start, end] (none when NVML is down); reads now if `end` is
        newer than the last poll, as `window` does, so a span that just ended is covered."""
        status = self.probe()
        if not status[self.nvml.name].up:
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
            gpus = self.nvml.window(start, end) if status[self.nvml.name].up else ()
            util = None
            if busy is not None and total is not None and total > 0:
                util = min(1.0, max(0.0, busy / total))
            energy = status[self.rapl.name]
            if energy.up:
                return self._rapl_window(start, end, util, busy, total, gpus)
            rapl_why = f"{self.rapl.name} {energy.reason}: {energy.detail}"
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
                why += f"; cpu model: {status[CPU_MODEL].detail}"
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
        errs = self._rapl_history.errors_between(start, end)
        if errs:
            # energy of a failed read is carried, then caught up by the next good one
            notes.append("RAPL read errors in this window: " + ", ".join(errs))
        has_dram = any(z.kind == "dram" for z in rs.zones)
        has_psys = any(z.kind == "psys" for z in rs.zones)
        per_pkg = self._rapl_history.per_package_j(start, end)
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
