"""GPU busy/idle over time, GPU energy and GPU pids from NVML.

This is the only serwatt module that imports `pynvml` (from the `nvidia-ml-py`
distribution, never the deprecated `pynvml` one), and only when a real backend is
created: importing this module works on a machine with no GPU and no driver.

Terms:
- *utilisation sample*: one entry of the driver's ring buffer read by
  `nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, last_seen_us)`: a timestamp (µs)
  and the percent of the preceding sample period (1/6 s .. 1 s, by product) during
  which a kernel ran. A sample at ts therefore covers (previous ts, ts].
- *empty buffer*: the driver adds no samples while the GPU is idle, and the call
  fails with NOT_FOUND. We count that stretch as idle only when
  `nvmlDeviceGetUtilizationRates().gpu == 0` confirms it; otherwise it is uncovered
  (no data), never guessed.
- *clock domain*: the header calls sample timestamps "CPU timestamp in
  microseconds" but drivers differ (epoch vs since boot). `ClockCalibration` picks
  the domain whose "now" is nearest to the newest sample and converts to host epoch
  seconds, the clock py-spy samples and RAPL reads use.
- *GPU energy*: `nvmlDeviceGetTotalEnergyConsumption` (mJ since driver load, Volta+);
  on older GPUs power (`nvmlDeviceGetPowerUsage`, mW) integrated over polls.

Vendor errors are translated to serwatt's own types in one place,
`translate_nvml_error`; MIG, a missing driver, and permission problems become
unavailable-with-reason values. mJ and mW never leave this module.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from serwatt.collectors.role import GPU, SourceContext
from serwatt.collectors.series import interpolate
from serwatt.collectors.status import CollectorStatus

# NVML return codes (nvml.h), so translation does not need pynvml imported.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_GPU_UTILIZATION_SAMPLES = 1

REASON_PYNVML_MISSING = "pynvml_missing"
REASON_NO_DRIVER = "no_driver"
REASON_PERMISSION = "permission"
REASON_NO_GPU = "no_gpu"
REASON_MIG = "mig"
REASON_GPU_LOST = "gpu_lost"
REASON_NOT_SUPPORTED = "not_supported"
REASON_ERROR = "error"
REASON_NO_DATA = "no_data"

DEFAULT_SAMPLE_PERIOD_S = 1 / 6  # until the buffer shows the product's real period
# Keep this much history (utilisation intervals, energy points) for window queries.
HISTORY_S = 900.0
DEFAULT_POLL_S = 0.5


class NvmlError(Exception):
    """An NVML failure in serwatt's terms: `reason` is one of the REASON_* codes."""

    def __init__(self, reason: str, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


class NvmlNoNewSamples(NvmlError):
    """NOT_FOUND from nvmlDeviceGetSamples: the buffer has nothing newer (GPU idle?)."""


class NvmlNotSupported(NvmlError):
    pass


class NvmlGpuLost(NvmlError):
    pass


class NvmlUnavailable(NvmlError):
    """NVML cannot be used at all: no library/driver, no permission."""


def translate_nvml_error(exc: BaseException, what: str) -> NvmlError:
    """The single place where vendor exceptions become serwatt errors."""
    if isinstance(exc, NvmlError):
        return exc
    if isinstance(exc, ImportError):
        return NvmlUnavailable(
            REASON_PYNVML_MISSING,
            f"{what}: the pynvml module is missing: install nvidia-ml-py (not 'pynvml')",
        )
    code = getattr(exc, "value", None)
    text = f"{what}: {exc}"
    if code == NVML_ERROR_NOT_FOUND:
        return NvmlNoNewSamples(REASON_NO_DATA, text, code)
    if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
        return NvmlNotSupported(REASON_NOT_SUPPORTED, text, code)
    if code == NVML_ERROR_GPU_IS_LOST:
        return NvmlGpuLost(REASON_GPU_LOST, f"{text} (the GPU fell off the bus)", code)
    if code == NVML_ERROR_NO_PERMISSION:
        return NvmlUnavailable(
            REASON_PERMISSION,
            f"{text}: run serwatt as root or grant access to /dev/nvidia*",
            code,
        )
    if code in (
        NVML_ERROR_LIBRARY_NOT_FOUND,
        NVML_ERROR_DRIVER_NOT_LOADED,
        NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    ):
        return NvmlUnavailable(
            REASON_NO_DRIVER,
            f"{text}: no usable NVIDIA driver (libnvidia-ml.so.1 / nvidia kernel module)",
            code,
        )
    if code is not None:
        return NvmlError(REASON_ERROR, text, code)
    return NvmlError(REASON_ERROR, text)


class NvmlBackend(Protocol):
    """The vendor calls serwatt uses, in vendor units. Implementations may raise vendor
    exceptions (pynvml.NVMLError); NvmlCollector translates them."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def device_handle(self, index: int) -> Any: ...
    def device_name(self, handle: Any) -> str: ...
    def device_uuid(self, handle: Any) -> str: ...
    def mig_mode(self, handle: Any) -> int: ...
    def utilization_samples(self, handle: Any, last_seen_us: int) -> list[tuple[int, int]]: ...
    def utilization_rate(self, handle: Any) -> int: ...
    def total_energy_mj(self, handle: Any) -> int: ...
    def power_mw(self, handle: Any) -> int: ...
    def compute_pids(self, handle: Any) -> list[int]: ...


class PynvmlBackend:
    """The real backend: thin calls into pynvml (nvidia-ml-py), imported here, lazily."""

    def __init__(self) -> None:
        import pynvml  # noqa: PLC0415 - lazy on purpose: no GPU, no import cost

        self._n = pynvml

    def init(self) -> None:
        self._n.nvmlInit()

    def shutdown(self) -> None:
        self._n.nvmlShutdown()

    def device_count(self) -> int:
        return int(self._n.nvmlDeviceGetCount())

    def device_handle(self, index: int) -> Any:
        return self._n.nvmlDeviceGetHandleByIndex(index)

    def device_name(self, handle: Any) -> str:
        name = self._n.nvmlDeviceGetName(handle)
        return name.decode() if isinstance(name, bytes) else str(name)

    def device_uuid(self, handle: Any) -> str:
        uuid = self._n.nvmlDeviceGetUUID(handle)
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def mig_mode(self, handle: Any) -> int:
        return int(self._n.nvmlDeviceGetMigMode(handle)[0])

    def utilization_samples(self, handle: Any, last_seen_us: int) -> list[tuple[int, int]]:
        _vtype, samples = self._n.nvmlDeviceGetSamples(
            handle, self._n.NVML_GPU_UTILIZATION_SAMPLES, last_seen_us
        )
        return [(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in samples]

    def utilization_rate(self, handle: Any) -> int:
        return int(self._n.nvmlDeviceGetUtilizationRates(handle).gpu)

    def total_energy_mj(self, handle: Any) -> int:
        return int(self._n.nvmlDeviceGetTotalEnergyConsumption(handle))

    def power_mw(self, handle: Any) -> int:
        return int(self._n.nvmlDeviceGetPowerUsage(handle))

    def compute_pids(self, handle: Any) -> list[int]:
        return [int(p.pid) for p in self._n.nvmlDeviceGetComputeRunningProcesses(handle)]


def clean_samples(raw: Iterable[tuple[int, int]], last_seen_us: int) -> list[tuple[int, int]]:
    """Sort by timestamp; drop zero timestamps, values over 100, duplicates and samples
    not newer than `last_seen_us` (drivers return unsorted buffers with junk)."""
    seen: set[int] = set()
    out = []
    for ts, val in sorted(raw):
        if ts <= 0 or ts <= last_seen_us or not 0 <= val <= 100 or ts in seen:
            continue
        seen.add(ts)
        out.append((ts, val))
    return out


def _boottime_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def read_clock_pair(
    clock: Callable[[], float], boottime: Callable[[], float], tries: int = 5
) -> tuple[float, float]:
    """(epoch, boottime) read at one instant: the tightest of a few boottime-bracketed
    epoch reads. A pair split by a preemption (tens of ms on a loaded host) would shift
    every sample timestamp mapped through it by that much."""
    best: tuple[float, float, float] | None = None
    for _ in range(tries):
        b0 = boottime()
        epoch = clock()
        b1 = boottime()
        if best is None or b1 - b0 < best[0]:
            best = (b1 - b0, epoch, (b0 + b1) / 2)
    assert best is not None
    return best[1], best[2]


@dataclass(frozen=True)
class ClockCalibration:
    """How NVML sample timestamps map to host epoch seconds.

    domain: "epoch" (µs since 1970) or "boottime" (µs since boot).
    offset_s: added to ts/1e6 to get host epoch seconds.
    lag_s: host now minus the newest sample at calibration (sample age + delivery).
    """

    domain: str
    offset_s: float
    lag_s: float

    def to_host(self, ts_us: int) -> float:
        return ts_us / 1e6 + self.offset_s


def calibrate_clock(newest_ts_us: int, epoch_now_s: float, boot_now_s: float) -> ClockCalibration:
    ts_s = newest_ts_us / 1e6
    # Epoch and boot time differ by decades, so the nearer "now" names the domain even
    # when the newest sample is old (a GPU idle for hours).
    if abs(epoch_now_s - ts_s) <= abs(boot_now_s - ts_s):
        return ClockCalibration("epoch", 0.0, epoch_now_s - ts_s)
    offset = epoch_now_s - boot_now_s
    return ClockCalibration("boottime", offset, boot_now_s - ts_s)


@dataclass(frozen=True)
class UtilInterval:
    """(t0, t1] in host epoch seconds, during which the GPU was busy `busy_frac` of the time.

    `confirmed_idle` marks an empty-buffer stretch counted idle because
    nvmlDeviceGetUtilizationRates read 0.
    """

    t0: float
    t1: float
    busy_frac: float
    confirmed_idle: bool = False

    @property
    def idle_s(self) -> float:
        return (self.t1 - self.t0) * (1.0 - self.busy_frac)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str | None
    name: str | None
    up: bool
    reason: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class NvmlStatus(CollectorStatus):
    """Whether NVML can be used (up when at least one GPU is), and every GPU it lists."""

    gpus: tuple[GpuInfo, ...] = ()


@dataclass(frozen=True)
class GpuWindow:
    """One GPU over one window [start, end], host epoch seconds.

    covered_s: time with utilisation data (samples or confirmed-idle stretches).
    energy_j: GPU energy in the window, None when unknown; energy_source says how.
    energy_points: (t, cumulative J) polls bracketing the window, to integrate GPU
    energy over sub-intervals (the GPU-wait intervals) by interpolation.
    pids: processes NVML listed on this GPU during the window.
    """

    index: int
    uuid: str | None
    name: str | None
    up: bool
    reason: str | None
    start: float
    end: float
    intervals: tuple[UtilInterval, ...] = ()
    covered_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    energy_j: float | None = None
    energy_source: str | None = None
    energy_points: tuple[tuple[float, float], ...] = ()
    pids: frozenset[int] = frozenset()
    sample_period_s: float | None = None
    clock: ClockCalibration | None = None


def clip_intervals(
    intervals: Iterable[UtilInterval], start: float, end: float
) -> tuple[UtilInterval, ...]:
    out = []
    for iv in intervals:
        a, b = max(iv.t0, start), min(iv.t1, end)
        if b > a:
            out.append(UtilInterval(a, b, iv.busy_frac, iv.confirmed_idle))
    return tuple(out)


@dataclass
class _GpuState:
    info: GpuInfo
    handle: Any
    last_seen_us: int = 0
    covered_until: float | None = None  # host epoch end of the last interval
    intervals: list[UtilInterval] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)  # recent sample gaps, for the period
    energy_points: list[tuple[float, float]] = field(default_factory=list)
    energy_source: str | None = None
    energy_base_mj: int | None = None
    last_power: tuple[float, float] | None = None  # (t, watts), for integration
    pid_points: list[tuple[float, frozenset[int]]] = field(default_factory=list)
    lost_at: float | None = None

    @property
    def sample_period_s(self) -> float | None:
        if not self.gaps_s:
            return None
        return statistics.median(self.gaps_s[-64:])


class NvmlCollector:
    """Polls NVML (or an injected backend with the same interface) and answers per-window
    questions. Call `probe()` once, `poll()` every ~0.5 s (the ring buffer holds some
    tens of seconds), and `window(start, end)` for each sampling window."""

    # a Source (collectors/source.py): its status key, the reasons that mean absent, what
    # the tracker drives it as, the config mode that can turn it off or require it
    name: ClassVar[str] = "nvml"
    absent_reasons: ClassVar[frozenset[str]] = frozenset({REASON_NO_DRIVER, REASON_NO_GPU})
    role: ClassVar[str] = GPU
    mode_option: ClassVar[str | None] = "nvml"
    label: ClassVar[str] = "NVML"
    without: ClassVar[str] = "run without GPU-wait"

    def __init__(
        self,
        backend: NvmlBackend | type | None = None,
        clock: Callable[[], float] = time.time,
        boottime: Callable[[], float] = _boottime_s,
        read_every_s: float = DEFAULT_POLL_S,
    ) -> None:
        """read_every_s: how often the tracker polls (the ring buffer holds some tens of
        seconds, so any period well under that loses no sample)."""
        self.read_every_s: float | None = read_every_s
        self._backend_arg = backend
        self._backend: NvmlBackend | None = None
        self._clock = clock
        self._boottime = boottime
        self._lock = threading.Lock()
        self._status: NvmlStatus | None = None
        self._gpus: list[_GpuState] = []
        self.clock_calibration: ClockCalibration | None = None
        self.poll_errors: list[str] = []  # recent non-fatal NVML errors, newest last

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # vendor errors of any class: translated below
            raise translate_nvml_error(exc, what) from exc

    def probe(self) -> NvmlStatus:
        with self._lock:
            if self._status is None:
                self._status = self._probe()
            return self._status

    def _probe(self) -> NvmlStatus:
        try:
            arg = self._backend_arg
            if arg is None:
                backend: NvmlBackend = self._call("import pynvml", PynvmlBackend)
            elif isinstance(arg, type):
                backend = self._call("backend", arg)
            else:
                backend = arg
            self._call("nvmlInit", backend.init)
            self._backend = backend
            count = self._call("nvmlDeviceGetCount", backend.device_count)
        except NvmlError as exc:
            return NvmlStatus(False, exc.reason, str(exc))
        if count == 0:
            return NvmlStatus(False, REASON_NO_GPU, "NVML reports no GPU on this node")
        infos = []
        for i in range(count):
            handle = None
            try:
                handle = self._call("nvmlDeviceGetHandleByIndex", backend.device_handle, i)
                name = self._call("nvmlDeviceGetName", backend.device_name, handle)
                uuid = self._call("nvmlDeviceGetUUID", backend.device_uuid, handle)
            except NvmlError as exc:
                infos.append(GpuInfo(i, None, None, False, exc.reason, str(exc)))
                continue
            try:
                mig = self._call("nvmlDeviceGetMigMode", backend.mig_mode, handle)
            except NvmlNotSupported:
                mig = 0  # a GPU without MIG support is not in MIG mode
            except NvmlError as exc:
                infos.append(GpuInfo(i, uuid, name, False, exc.reason, str(exc)))
                continue
            if mig:
                info = GpuInfo(
                    i,
                    uuid,
                    name,
                    False,
                    REASON_MIG,
                    "MIG mode is on: NVML utilisation samples are not supported per MIG "
                    "instance, so GPU-wait cannot be measured on this GPU",
                )
            else:
                info = GpuInfo(i, uuid, name, True)
            infos.append(info)
            self._gpus.append(_GpuState(info=info, handle=handle))
        up = any(g.up for g in infos)
        reason = None if up else (infos[0].reason if infos else REASON_NO_GPU)
        return NvmlStatus(up, reason, None if up else "no usable GPU", tuple(infos))

    @classmethod
    def make(cls, ctx: SourceContext) -> NvmlCollector:
        return cls(clock=ctx.clock, **ctx.of(cls.name))

    def status(self) -> CollectorStatus:
        """The probe, its detail one line per GPU when up (`gpu 0 NVIDIA H200: up`)."""
        ns = self.probe()
        detail = ns.detail
        if ns.up:
            detail = "; ".join(
                f"gpu {g.index} {g.name}: " + ("up" if g.up else f"{g.reason}") for g in ns.gpus
            )
        return CollectorStatus(ns.up, ns.reason, detail)

    def tick_s(self, cap_s: float) -> float | None:
        return None

    def shutdown(self) -> None:
        if self._backend is not None:
            try:
                self._call("nvmlShutdown", self._backend.shutdown)
            except NvmlError:
                pass

    def read(self) -> None:
        """The Source read: poll (the samples land in the history window() answers from)."""
        self.poll()

    def poll(self) -> None:
        """Collect new samples, energy and pids from every usable GPU."""
        status = self.probe()
        if not status.up or self._backend is None:
            return
        with self._lock:
            for g in self._gpus:
                if not g.info.up or g.lost_at is not None:
                    continue
                try:
                    self._poll_gpu(self._backend, g)
                except NvmlGpuLost as exc:
                    g.lost_at = self._clock()
                    g.info = GpuInfo(
                        g.info.index, g.info.uuid, g.info.name, False, exc.reason, str(exc)
                    )
                except NvmlError as exc:
                    # One failed poll loses no history; the next poll catches up from
                    # last_seen_us, so the error is recorded, not raised.
                    self.poll_errors.append(f"gpu {g.info.index}: {exc}")
                    del self.poll_errors[:-32]
            self._prune()

    def _poll_gpu(self, b: NvmlBackend, g: _GpuState) -> None:
        now = self._clock()
        try:
            raw = self._call(
                "nvmlDeviceGetSamples", b.utilization_samples, g.handle, g.last_seen_us
            )
        except NvmlNoNewSamples:
            raw = []
        samples = clean_samples(raw, g.last_seen_us)
        if samples and self.clock_calibration is None:
            epoch_now, boot_now = read_clock_pair(self._clock, self._boottime)
            self.clock_calibration = calibrate_clock(samples[-1][0], epoch_now, boot_now)
        cal = self.clock_calibration
        if samples and cal is not None:
            prev_ts = g.last_seen_us or None
            for ts, _val in samples:
                if prev_ts is not None:
                    g.gaps_s.append((ts - prev_ts) / 1e6)
                prev_ts = ts
            period = g.sample_period_s or DEFAULT_SAMPLE_PERIOD_S
            prev_ts = g.last_seen_us or None
            for ts, val in samples:
                t1 = cal.to_host(ts)
                # A sample covers its own period only: after an empty-buffer stretch the
                # gap to the previous sample is not this sample's.
                t0 = t1 - period
                if prev_ts is not None:
                    t0 = max(t0, cal.to_host(prev_ts))
                if g.covered_until is not None:
                    t0 = max(t0, g.covered_until)
                if t1 > t0:
                    g.intervals.append(UtilInterval(t0, t1, val / 100.0))
                    g.covered_until = t1
                prev_ts = ts
            g.last_seen_us = samples[-1][0]
        elif not samples:
            # Empty buffer: idle only if the driver's current utilisation says so.
            rate = self._call("nvmlDeviceGetUtilizationRates", b.utilization_rate, g.handle)
            if rate == 0 and g.covered_until is not None and now > g.covered_until:
                g.intervals.append(UtilInterval(g.covered_until, now, 0.0, confirmed_idle=True))
                g.covered_until = now
            elif rate == 0 and g.covered_until is None:
                g.covered_until = now  # start of coverage: nothing known before this poll
        # stamped when read: the calls above take ms (more on a loaded host), and an
        # energy point stamped early skews the power interpolated between two polls
        self._poll_energy(b, g, self._clock())
        try:
            pids = frozenset(
                self._call("nvmlDeviceGetComputeRunningProcesses", b.compute_pids, g.handle)
            )
        except NvmlNotSupported:
            pids = frozenset()
        g.pid_points.append((now, pids))

    def _poll_energy(self, b: NvmlBackend, g: _GpuState, now: float) -> None:
        if g.energy_source != "nvml_power_integrated":
            try:
                mj = self._call("nvmlDeviceGetTotalEnergyConsumption", b.total_energy_mj, g.handle)
                if g.energy_base_mj is None:
                    g.energy_base_mj = mj
                g.energy_source = "nvml_energy_counter"
                g.energy_points.append((now, (mj - g.energy_base_mj) / 1000.0))
                return
            except NvmlNotSupported:
                g.energy_source = "nvml_power_integrated"  # pre-Volta
        try:
            watts = self._call("nvmlDeviceGetPowerUsage", b.power_mw, g.handle) / 1000.0
        except NvmlNotSupported:
            g.energy_source = None
            return
        if g.last_power is None:
            g.energy_points.append((now, 0.0))
        else:
            t_prev, w_prev = g.last_power
            total = g.energy_points[-1][1] + (w_prev + watts) / 2 * (now - t_prev)
            g.energy_points.append((now, total))
        g.last_power = (now, watts)

    def _prune(self) -> None:
        horizon = self._clock() - HISTORY_S
        for g in self._gpus:
            if g.intervals and g.intervals[0].t1 < horizon:
                g.intervals = [iv for iv in g.intervals if iv.t1 >= horizon]
            if len(g.energy_points) > 2 and g.energy_points[1][0] < horizon:
                g.energy_points = [p for p in g.energy_points if p[0] >= horizon] or [
                    g.energy_points[-1]
                ]
            if g.pid_points and g.pid_points[0][0] < horizon:
                g.pid_points = [p for p in g.pid_points if p[0] >= horizon]
            del g.gaps_s[:-256]

    def window(self, start: float, end: float) -> tuple[GpuWindow, ...]:
        """Per GPU: utilisation, idle seconds, energy and pids over [start, end]."""
        status = self.probe()
        out = []
        with self._lock:
            by_index = {g.info.index: g for g in self._gpus}
            for info in status.gpus:
                g = by_index.get(info.index)
                if g is None:
                    out.append(
                        GpuWindow(info.index, info.uuid, info.name, False, info.reason, start, end)
                    )
                    continue
                ivs = clip_intervals(g.intervals, start, end)
                covered = sum(iv.t1 - iv.t0 for iv in ivs)
                idle = sum(iv.idle_s for iv in ivs)
                e0 = interpolate(g.energy_points, start)
                e1 = interpolate(g.energy_points, end)
                energy = None if e0 is None or e1 is None else max(0.0, e1 - e0)
                pts = tuple(p for p in g.energy_points if start - 5.0 <= p[0] <= end + 5.0)
                pids: set[int] = set()
                for t, ps in g.pid_points:
                    if start <= t <= end:
                        pids |= ps
                # A GPU lost after this window ended was still up during it.
                up = g.info.up if g.lost_at is None else g.lost_at > end
                out.append(
                    GpuWindow(
                        index=info.index,
                        uuid=g.info.uuid,
                        name=g.info.name,
                        up=up,
                        reason=None if up else g.info.reason,
                        start=start,
                        end=end,
                        intervals=ivs,
                        covered_s=covered,
                        busy_s=covered - idle,
                        idle_s=idle,
                        energy_j=energy,
                        energy_source=g.energy_source if energy is not None else None,
                        energy_points=pts,
                        pids=frozenset(pids),
                        sample_period_s=g.sample_period_s,
                        clock=self.clock_calibration,
                    )
                )
        return tuple(out)
