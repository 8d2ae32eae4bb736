"""RAPL package energy from Linux powercap sysfs, wrap-corrected, in joules.

Terms:
- *zone*: one powercap directory `intel-rapl:N` (a package or `psys`) or
  `intel-rapl:N:M` (a subzone of zone N: `dram`, `core`, `uncore`). AMD Zen parts
  appear under the same `intel-rapl` names (kernel >= 5.8 / 5.11).
- *package zone*: a zone named `package-P` or `package-P-die-D`. P is the physical
  package id; the zone index N is NOT the package id (the kernel numbers zones in
  probe order), so the package always comes from the name.
- `energy_uj`: a counter in microjoules that wraps to 0 after `max_energy_range_uj`.
  Wraps are corrected per zone, before summing, by `wrap_delta_uj`; a wrap is only
  detectable if at most one happens between two reads, so `poll_period_s` is derived
  from the smallest range and a generous maximum power.
- `intel-rapl-mmio:*` zones duplicate the MSR zones and are ignored; `psys` already
  contains the packages and is reported separately, never added to them.

Unavailable is a value (`RaplStatus.reason`), with three distinct reasons:
`no_powercap` (no powercap sysfs, e.g. most VMs), `permission` (`energy_uj` is
root-only on kernels patched for CVE-2020-8694) and `unsupported` (powercap present
but no usable RAPL package zone). A read never turns an error into 0 J.

Microjoules never leave this module: readings are joules.
"""

from __future__ import annotations

import errno
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from serwatt.collectors.role import NODE_ENERGY, SourceContext
from serwatt.collectors.series import CumulativeSeries
from serwatt.collectors.status import CollectorStatus

UJ_PER_J = 1_000_000

# Generous per-zone power ceiling used to derive the poll period: the largest server
# packages draw ~500 W; 1000 W leaves a 2x margin so one wrap at most fits between reads.
DEFAULT_MAX_POWER_W = 1000.0
# Read twice as often as the fastest possible wrap.
WRAP_SAFETY_FACTOR = 2.0
MIN_POLL_PERIOD_S = 0.01
MAX_POLL_PERIOD_S = 10.0

REASON_NO_POWERCAP = "no_powercap"
REASON_PERMISSION = "permission"
REASON_UNSUPPORTED = "unsupported"

_ZONE_DIR = re.compile(r"^intel-rapl:(\d+)(?::(\d+))?$")
_PACKAGE_NAME = re.compile(r"^package-(\d+)(?:-die-(\d+))?$")

PERMISSION_FIX = (
    "energy_uj is readable by root only on kernels patched for CVE-2020-8694: run serwatt "
    "as root (the systemd unit does), or grant read access at boot, e.g. a udev rule or "
    "`chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj`"
)


def wrap_delta_uj(prev_uj: int, cur_uj: int, max_range_uj: int) -> int:
    """Energy between two raw reads of one zone, assuming at most one wrap between them.

    The counter runs from 0 up to `max_range_uj` and then restarts at 0, so a smaller
    second value means it wrapped once: the energy is what was left to the max plus
    what accumulated after the restart. Never negative.
    """
    if not (0 <= prev_uj <= max_range_uj and 0 <= cur_uj <= max_range_uj):
        raise ValueError(
            f"energy_uj outside [0, max_energy_range_uj={max_range_uj}]: {prev_uj} -> {cur_uj}"
        )
    if cur_uj >= prev_uj:
        return cur_uj - prev_uj
    return (max_range_uj - prev_uj) + cur_uj


def derive_poll_period_s(max_ranges_uj: list[int], max_power_w: float) -> float:
    """Longest safe period between reads: the fastest wrap at `max_power_w`, halved."""
    if not max_ranges_uj:
        return MAX_POLL_PERIOD_S
    if max_power_w <= 0:
        raise ValueError(f"max_power_w must be > 0, got {max_power_w}")
    fastest_wrap_s = min(max_ranges_uj) / UJ_PER_J / max_power_w
    return min(MAX_POLL_PERIOD_S, max(MIN_POLL_PERIOD_S, fastest_wrap_s / WRAP_SAFETY_FACTOR))


@dataclass(frozen=True)
class RaplZone:
    """One usable zone. `kind` is package, dram, psys, core, uncore or the raw name."""

    zone_id: str  # directory name, e.g. "intel-rapl:0:0"
    path: Path
    name: str  # contents of `name`, e.g. "package-1", "dram"
    kind: str
    package: int | None  # physical package id (from the name, or the parent's name)
    die: int | None
    max_energy_range_j: float


@dataclass(frozen=True)
class SkippedZone:
    zone_id: str
    reason: str


@dataclass(frozen=True)
class RaplStatus(CollectorStatus):
    """Whether RAPL can be read, and if not, why (reason: None | no_powercap | permission |
    unsupported, detail: a sentence with the fix); when up, the zones read."""

    zones: tuple[RaplZone, ...] = ()
    skipped: tuple[SkippedZone, ...] = ()
    poll_period_s: float | None = None  # longest safe period between reads

    @property
    def packages(self) -> tuple[int, ...]:
        return tuple(sorted({z.package for z in self.zones if z.kind == "package"}))  # type: ignore[misc]


@dataclass(frozen=True)
class RaplReading:
    """Cumulative energy since the collector's first read, wrap-corrected, in joules.

    `package_j` sums the package zones; `dram_j` and `psys_j` are None when the node
    has no such zone. `errors` lists zones that failed this read: their energy is
    carried from their last good read (never 0) and caught up on the next good read.
    """

    t: float  # host epoch seconds at the read
    package_j: float
    dram_j: float | None
    psys_j: float | None
    per_package_j: Mapping[int, float]
    wraps: int  # wraps corrected so far, all zones
    errors: tuple[str, ...] = field(default_factory=tuple)


class RaplError(Exception):
    """RAPL was used while unavailable."""


def _read_text(path: Path) -> str:
    with open(path) as f:
        return f.read().strip()


class RaplCollector:
    """Reads powercap RAPL zones under `sysfs_root` (default /sys; `--path.sysfs`).

    Thread-safe: `read()` may be called from a poller thread and a window boundary.
    """

    # a Source (collectors/source.py): its status key, the reasons that mean absent, what
    # the tracker drives it as, the config mode that can turn it off or require it
    name: ClassVar[str] = "rapl"
    absent_reasons: ClassVar[frozenset[str]] = frozenset({REASON_NO_POWERCAP})
    role: ClassVar[str] = NODE_ENERGY
    mode_option: ClassVar[str | None] = "rapl"
    label: ClassVar[str] = "RAPL"
    without: ClassVar[str] = "fall back to the labelled CPU model"
    read_every_s: float | None = None  # read on every tick of the tracker; it paces them

    @classmethod
    def make(cls, ctx: SourceContext) -> RaplCollector:
        return cls(ctx.sysfs_root, clock=ctx.clock, **ctx.of(cls.name))

    def status(self) -> CollectorStatus:
        rs = self.probe()
        return CollectorStatus(rs.up, rs.reason, rs.detail)

    def tick_s(self, cap_s: float) -> float | None:
        """The longest the tracker may go between reads: the wrap-safe period, capped."""
        return min(self.probe().poll_period_s or cap_s, cap_s)

    def __init__(
        self,
        sysfs_root: Path | str = Path("/sys"),
        max_power_w: float = DEFAULT_MAX_POWER_W,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.max_power_w = float(max_power_w)
        self._clock = clock
        self._lock = threading.Lock()
        self._status: RaplStatus | None = None
        self._last_raw: dict[str, int] = {}
        self._total_uj: dict[str, int] = {}
        self._max_uj: dict[str, int] = {}
        self._wraps = 0

    @property
    def powercap_dir(self) -> Path:
        return self.sysfs_root / "class" / "powercap"

    def probe(self) -> RaplStatus:
        """Discover zones and check that each counted zone can be read. Cached."""
        with self._lock:
            if self._status is None:
                self._status = self._probe()
            return self._status

    def _probe(self) -> RaplStatus:
        base = self.powercap_dir
        if not base.is_dir():
            return RaplStatus(
                False,
                REASON_NO_POWERCAP,
                f"no powercap sysfs at {base} (common in VMs and containers without /sys "
                "mounted); energy falls back to the labelled CPU model",
            )
        entries = sorted(p for p in base.iterdir() if _ZONE_DIR.match(p.name))
        if not entries:
            return RaplStatus(
                False,
                REASON_UNSUPPORTED,
                f"{base} has no intel-rapl zones: the CPU or kernel exposes no RAPL "
                "(AMD needs kernel >= 5.8; load intel_rapl_common/intel_rapl_msr)",
            )
        names: dict[str, str] = {}
        skipped: list[SkippedZone] = []
        for p in entries:
            try:
                names[p.name] = _read_text(p / "name")
            except OSError as exc:
                skipped.append(SkippedZone(p.name, f"name unreadable: {exc.strerror or exc}"))
        zones: list[RaplZone] = []
        max_uj: dict[str, int] = {}
        permission_denied: list[str] = []
        for p in entries:
            if p.name not in names:
                continue
            zone = self._zone(p, names)
            if zone is None:
                permission_denied.append(p.name)
            elif isinstance(zone, SkippedZone):
                skipped.append(zone)
            else:
                zones.append(zone[0])
                max_uj[p.name] = zone[1]
        if permission_denied:
            return RaplStatus(
                False,
                REASON_PERMISSION,
                f"permission denied reading energy_uj of {', '.join(permission_denied)}: "
                + PERMISSION_FIX,
                skipped=tuple(skipped),
            )
        if not any(z.kind == "package" for z in zones):
            why = "; ".join(f"{s.zone_id}: {s.reason}" for s in skipped) or "none found"
            return RaplStatus(
                False,
                REASON_UNSUPPORTED,
                f"no usable RAPL package zone under {base} ({why})",
                zones=tuple(zones),
                skipped=tuple(skipped),
            )
        counted = [max_uj[z.zone_id] for z in zones if z.kind in ("package", "dram", "psys")]
        self._max_uj = max_uj
        return RaplStatus(
            True,
            None,
            None,
            zones=tuple(zones),
            skipped=tuple(skipped),
            poll_period_s=derive_poll_period_s(counted, self.max_power_w),
        )

    def _zone(self, p: Path, names: Mapping[str, str]) -> tuple[RaplZone, int] | SkippedZone | None:
        """One zone directory read: the zone and its counter's range in µJ, why it is left
        out, or None when its energy_uj may not be read (permission: the caller says how
        to fix it)."""
        m = _ZONE_DIR.match(p.name)
        assert m is not None
        name = names[p.name]
        kind, package, die = self._classify(name, m, names)
        if kind is None:
            return SkippedZone(p.name, f"unrecognised zone name {name!r}")
        try:
            raw_max = int(_read_text(p / "max_energy_range_uj"))
            if raw_max <= 0:
                raise ValueError(f"non-positive value {raw_max}")
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return SkippedZone(
                p.name,
                f"max_energy_range_uj unreadable ({why}): its wraps cannot be "
                "corrected, so the zone is left out rather than guessed",
            )
        try:
            raw = int(_read_text(p / "energy_uj"))
        except PermissionError:
            return None
        except (OSError, ValueError) as exc:
            return SkippedZone(p.name, f"energy_uj unreadable: {exc}")
        if not 0 <= raw <= raw_max:
            return SkippedZone(p.name, f"energy_uj {raw} outside [0, max_energy_range_uj]")
        return RaplZone(p.name, p, name, kind, package, die, raw_max / UJ_PER_J), raw_max

    @staticmethod
    def _classify(
        name: str, m: re.Match[str], names: Mapping[str, str]
    ) -> tuple[str | None, int | None, int | None]:
        top = m.group(2) is None
        pm = _PACKAGE_NAME.match(name)
        if top and pm:
            return "package", int(pm.group(1)), int(pm.group(2)) if pm.group(2) else None
        if top and name == "psys":
            return "psys", None, None
        if not top and name in ("dram", "core", "uncore"):
            parent = names.get(f"intel-rapl:{m.group(1)}", "")
            ppm = _PACKAGE_NAME.match(parent)
            if ppm is None:
                return None, None, None
            return name, int(ppm.group(1)), int(ppm.group(2)) if ppm.group(2) else None
        return None, None, None

    def read(self) -> RaplReading:
        """Read every counted zone once and return cumulative, wrap-corrected joules."""
        status = self.probe()
        if not status.up:
            raise RaplError(f"RAPL unavailable: {status.reason}: {status.detail}")
        with self._lock:
            t = self._clock()
            errors: list[str] = []
            for z in status.zones:
                if z.kind not in ("package", "dram", "psys"):
                    continue
                try:
                    raw = int(_read_text(z.path / "energy_uj"))
                    prev = self._last_raw.get(z.zone_id)
                    delta = 0 if prev is None else wrap_delta_uj(prev, raw, self._max_uj[z.zone_id])
                except (OSError, ValueError) as exc:
                    code = errno.errorcode.get(getattr(exc, "errno", 0) or 0, "")
                    errors.append(f"{z.zone_id}: {code or exc}")
                    continue
                if prev is not None and raw < prev:
                    self._wraps += 1
                self._last_raw[z.zone_id] = raw
                self._total_uj[z.zone_id] = self._total_uj.get(z.zone_id, 0) + delta
            per_package: dict[int, int] = {}
            dram: int | None = None
            psys: int | None = None
            for z in status.zones:
                uj = self._total_uj.get(z.zone_id, 0)
                if z.kind == "package":
                    assert z.package is not None
                    per_package[z.package] = per_package.get(z.package, 0) + uj
                elif z.kind == "dram":
                    dram = (dram or 0) + uj
                elif z.kind == "psys":
                    psys = (psys or 0) + uj
            return RaplReading(
                t=t,
                package_j=sum(per_package.values()) / UJ_PER_J,
                dram_j=None if dram is None else dram / UJ_PER_J,
                psys_j=None if psys is None else psys / UJ_PER_J,
                per_package_j={k: v / UJ_PER_J for k, v in sorted(per_package.items())},
                wraps=self._wraps,
                errors=tuple(errors),
            )


class RaplHistory:
    """RAPL readings over time, for per-window questions (the energy tracker's, used under
    its lock): cumulative joules by kind and by package, the wraps corrected, the longest
    gap between two reads and the reads that failed."""

    def __init__(self) -> None:
        self.series = CumulativeSeries(("package", "dram", "psys"))
        self.per_package: dict[int, CumulativeSeries] = {}
        self.read_errors = 0  # reads that failed for at least one zone
        self.wraps = 0  # counter wraps corrected so far, all zones
        self.max_gap_s = 0.0  # longest time between two reads
        self.last_errors: tuple[str, ...] = ()  # the zone errors of the latest failed read
        self._error_log: deque[tuple[float, tuple[str, ...]]] = deque(maxlen=256)

    def add(self, r: RaplReading) -> None:
        if self.series.last_t is not None:
            self.max_gap_s = max(self.max_gap_s, r.t - self.series.last_t)
        self.series.add(r.t, package=r.package_j, dram=r.dram_j or 0.0, psys=r.psys_j or 0.0)
        for pkg, j in r.per_package_j.items():
            self.per_package.setdefault(pkg, CumulativeSeries(("j",))).add(r.t, j=j)
        self.wraps = r.wraps
        if r.errors:
            self.read_errors += 1
            self.last_errors = r.errors
            self._error_log.append((r.t, r.errors))

    def prune(self, horizon: float) -> None:
        self.series.prune(horizon)
        for s in self.per_package.values():
            s.prune(horizon)

    def errors_between(self, start: float, end: float) -> list[str]:
        """The zone errors of the reads in [start, end], each once, sorted."""
        return sorted({e for t, es in self._error_log if start <= t <= end for e in es})

    def per_package_j(self, start: float, end: float) -> dict[int, float]:
        """Each package's joules over [start, end], where readings bracket it."""
        out = {}
        for p, s in sorted(self.per_package.items()):
            d = s.delta("j", start, end)
            if d is not None:
                out[p] = d
        return out

    def fastest_wrap_s(self, zones: tuple[RaplZone, ...]) -> float | None:
        """Shortest time any counted zone takes to wrap at the average power seen so
        far (None before two reads or at zero power)."""
        t = self.series.t
        if len(t) < 2:
            return None
        elapsed = t[-1] - t[0]
        out: list[float] = []
        for pkg, series in self.per_package.items():
            ranges = [
                z.max_energy_range_j for z in zones if z.kind == "package" and z.package == pkg
            ]
            d = series.delta("j", series.t[0], series.t[-1]) if len(series.t) > 1 else None
            if ranges and d and d > 0:
                out.append(min(ranges) / (d / elapsed))
        for kind in ("dram", "psys"):
            ranges = [z.max_energy_range_j for z in zones if z.kind == kind]
            d = self.series.delta(kind, t[0], t[-1])
            if ranges and d and d > 0:
                out.append(min(ranges) / (d / len(ranges) / elapsed))
        return min(out) if out else None
