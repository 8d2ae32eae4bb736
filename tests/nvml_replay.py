"""A fake NVML backend that replays GPU timelines through the real backend's interface.

`ReplayNvmlBackend` implements `collectors.nvml.NvmlBackend` method for method, in
vendor units (µs timestamps, %, mJ, mW), and raises the vendor's own exception
types (`pynvml.NVMLError(code)`, built without a driver), so the collector's single
error translation path is exercised exactly as with `PynvmlBackend`.

Timelines live in tests/fixtures/nvml/*.json. They are scripted from the documented
driver behaviour (nvml.h, and the field reports in shared/research/nvml-checkpoint.md),
not captured on hardware: this project had no GPU when they were written. Per GPU:

- `segments`: [{"until_s": 4.0, "busy": 96, "buffer": true}, ...] relative to the
  replay start; busy percent is constant within a segment; `buffer: false` means the
  driver adds no utilisation samples then (the empty-buffer idle case). The last
  segment extends forever.
- `period_s`: the driver sample period (1/6 s on datacenter parts, up to 1 s).
  Sample k is stamped at k x period and holds the mean busy % over the period it
  closes, as the driver reports it.
- `quirks`: `unsorted` (adjacent samples swapped), `zero_ts_every` (an extra sample
  with timestamp 0), `over_100_every` (an extra sample with a value over 100).
- `energy_counter` (Volta+ mJ counter) or power only; `idle_w`/`busy_w` give power
  as idle + (busy - idle) x utilisation; `energy_start_mj` is the counter at start.
- `pids` (the string "target" stands for the pids passed in), `mig`, `lost_at_s`.
- driver: `clock` ("epoch" | "boottime"), `buffer_depth`, `init_error` (an NVML code).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from serwatt.collectors.nvml import read_clock_pair

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"


def load_timeline(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _err(code: int) -> Exception:
    return pynvml.NVMLError(code)


@dataclass
class _Gpu:
    spec: dict[str, Any]
    index: int

    def __post_init__(self) -> None:
        self._segments = self._build_segments()

    def segments(self) -> list[tuple[float, float, float, bool]]:
        return self._segments

    def _build_segments(self) -> list[tuple[float, float, float, bool]]:
        """(start, end, busy_frac, buffer) with the last one extended to infinity."""
        out = []
        start = 0.0
        segs = self.spec["segments"]
        for i, seg in enumerate(segs):
            end = math.inf if i == len(segs) - 1 else float(seg["until_s"])
            out.append((start, end, seg["busy"] / 100.0, bool(seg.get("buffer", True))))
            start = end
        return out

    def busy_integral(self, a: float, b: float) -> float:
        """Integral of the busy fraction over [a, b] (relative seconds)."""
        total = 0.0
        for s, e, busy, _ in self.segments():
            lo, hi = max(a, s), min(b, e)
            if hi > lo:
                total += (hi - lo) * busy
        return total

    def buffer_at(self, t: float) -> bool:
        for s, e, _busy, buf in self.segments():
            if s < t <= e or (t == 0 and s == 0):
                return buf
        return True

    def power_w(self, busy_frac: float) -> float:
        idle, busy = float(self.spec["idle_w"]), float(self.spec["busy_w"])
        return idle + (busy - idle) * busy_frac

    def energy_j(self, a: float, b: float) -> float:
        idle, busy = float(self.spec["idle_w"]), float(self.spec["busy_w"])
        return idle * (b - a) + (busy - idle) * self.busy_integral(a, b)


class ReplayNvmlBackend:
    """Replays a timeline against `clock` (host epoch seconds), starting at `start`."""

    def __init__(
        self,
        timeline: dict[str, Any],
        target_pids: Iterable[int] = (),
        clock: Callable[[], float] = time.time,
        start: float | None = None,
        boot_epoch: float | None = None,
    ) -> None:
        self.timeline = timeline
        self.driver = timeline.get("driver", {})
        self.target_pids = list(target_pids)
        self.clock = clock
        self.start = clock() if start is None else start
        if boot_epoch is None:  # booted as long ago as this host, on the replay's clock
            epoch, boot = read_clock_pair(clock, lambda: time.clock_gettime(time.CLOCK_BOOTTIME))
            boot_epoch = epoch - boot
        self.boot_epoch = boot_epoch
        self.gpus = [_Gpu(spec, i) for i, spec in enumerate(timeline["gpus"])]
        self.calls: list[str] = []
        self.initialised = False

    # clocks -----------------------------------------------------------------
    def rel(self) -> float:
        return self.clock() - self.start

    def boottime(self) -> float:
        """CLOCK_BOOTTIME as this fake host sees it; pass to NvmlCollector(boottime=)."""
        return self.clock() - self.boot_epoch

    def _ts_us(self, rel_s: float) -> int:
        epoch = self.start + rel_s
        if self.driver.get("clock", "boottime") == "epoch":
            return round(epoch * 1e6)
        return round((epoch - self.boot_epoch) * 1e6)

    def _rel_of_ts(self, ts_us: int) -> float:
        if self.driver.get("clock", "boottime") == "epoch":
            return ts_us / 1e6 - self.start
        return ts_us / 1e6 + self.boot_epoch - self.start

    # ground truth for tests -----------------------------------------------------
    def true_idle_s(self, index: int, a_epoch: float, b_epoch: float) -> float:
        g = self.gpus[index]
        a, b = a_epoch - self.start, b_epoch - self.start
        return (b - a) - g.busy_integral(a, b)

    def true_energy_j(self, index: int, a_epoch: float, b_epoch: float) -> float:
        return self.gpus[index].energy_j(a_epoch - self.start, b_epoch - self.start)

    # NvmlBackend ----------------------------------------------------------------
    def _gpu(self, handle: Any, what: str) -> _Gpu:
        self.calls.append(what)
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        g: _Gpu = handle
        lost = g.spec.get("lost_at_s")
        if lost is not None and self.rel() >= float(lost):
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g

    def init(self) -> None:
        self.calls.append("init")
        code = self.driver.get("init_error")
        if code is not None:
            raise _err(int(code))
        self.initialised = True

    def shutdown(self) -> None:
        self.calls.append("shutdown")
        self.initialised = False

    def device_count(self) -> int:
        return len(self.gpus)

    def device_handle(self, index: int) -> Any:
        return self.gpus[index]

    def device_name(self, handle: Any) -> str:
        return str(self._gpu(handle, "name").spec["name"])

    def device_uuid(self, handle: Any) -> str:
        return str(self._gpu(handle, "uuid").spec["uuid"])

    def mig_mode(self, handle: Any) -> int:
        g = self._gpu(handle, "mig")
        if g.spec.get("mig") is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(g.spec["mig"])

    def _samples_until(
        self, g: _Gpu, now_rel: float, after_rel: float = -math.inf
    ) -> list[tuple[int, int]]:
        """The ring buffer at `now_rel`: the newest `buffer_depth` samples, from those
        stamped after `after_rel` (older ones cannot be returned anyway)."""
        period = float(g.spec["period_s"])
        depth = int(self.driver.get("buffer_depth", 120))
        k_last = math.floor(now_rel / period + 1e-9)
        k_first = max(1, k_last - 4 * depth)
        if after_rel > -math.inf:
            k_first = max(k_first, math.floor(after_rel / period))
        out: list[tuple[int, int]] = []
        for k in range(k_first, k_last + 1):
            t = k * period
            if not g.buffer_at(t):
                continue
            val = round(100 * g.busy_integral(t - period, t) / period)
            out.append((k, val))
        return out[-depth:]

    def utilization_samples(self, handle: Any, last_seen_us: int) -> list[tuple[int, int]]:
        g = self._gpu(handle, "samples")
        period = float(g.spec["period_s"])
        quirks = g.spec.get("quirks", {})
        rows: list[tuple[int, int]] = []
        after = -math.inf
        if last_seen_us > 0:
            after = self._rel_of_ts(last_seen_us)
        for k, val in self._samples_until(g, self.rel(), after):
            ts = self._ts_us(k * period)
            if ts <= last_seen_us:
                continue
            rows.append((ts, val))
            zero_every = quirks.get("zero_ts_every")
            if zero_every and k % zero_every == 0:
                rows.append((0, val))
            over_every = quirks.get("over_100_every")
            if over_every and k % over_every == 0:
                rows.append((ts - 1000, 396))  # junk seen in the field: > 100 %
        if quirks.get("unsorted"):
            for i in range(0, len(rows) - 1, 2):
                rows[i], rows[i + 1] = rows[i + 1], rows[i]
        if not rows:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return rows

    def utilization_rate(self, handle: Any) -> int:
        g = self._gpu(handle, "rate")
        period = float(g.spec["period_s"])
        now = self.rel()
        return round(100 * g.busy_integral(max(0.0, now - period), now) / period)

    def total_energy_mj(self, handle: Any) -> int:
        g = self._gpu(handle, "energy")
        if not g.spec.get("energy_counter", True):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(g.spec.get("energy_start_mj", 0)) + round(
            1000 * g.energy_j(0.0, max(0.0, self.rel()))
        )

    def power_mw(self, handle: Any) -> int:
        # Instantaneous, as GA100 and older GPUs report it (newer ones average 1 s).
        g = self._gpu(handle, "power")
        now = self.rel()
        busy = next(b for s, e, b, _ in g.segments() if s <= now < e)
        return round(1000 * g.power_w(busy))

    def compute_pids(self, handle: Any) -> list[int]:
        g = self._gpu(handle, "pids")
        out: list[int] = []
        for p in g.spec.get("pids", []):
            if p == "target":
                out.extend(self.target_pids)
            else:
                out.append(int(p))
        return out


class FakeClock:
    """A manual host clock for deterministic collector tests."""

    def __init__(self, t: float = 1_764_400_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t
