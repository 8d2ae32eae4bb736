"""Node-wide CPU time from /proc/stat, in seconds.

The aggregate `cpu` line counts jiffies (1/USER_HZ s) per state, summed over all
CPUs: user nice system idle iowait irq softirq steal guest guest_nice. `guest` and
`guest_nice` are already included in `user` and `nice`, so they are not added again.

- busy = user + nice + system + irq + softirq + steal
- total = busy + idle + iowait

iowait counts as not busy: a CPU waiting on I/O executes nothing and draws close to
idle power. Steal counts as busy for this VM's accounting (the time was taken by
another guest on the host; it is not idle capacity we could have used).

The procfs root is injectable (`--path.procfs`) so tests read real files in tmp dirs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from serwatt.collectors.role import CPU_TIME, SourceContext
from serwatt.collectors.status import CollectorStatus

REASON_UNREADABLE = "unreadable"


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative node CPU seconds since boot, all CPUs together, at host time `t`."""

    t: float  # epoch seconds
    busy_s: float
    total_s: float
    ncpu: int

    @property
    def idle_s(self) -> float:
        return self.total_s - self.busy_s


@dataclass(frozen=True)
class NodeCpuDelta:
    """Node-wide CPU seconds (all CPUs) between two reads; `utilisation` is busy / total,
    in [0, 1]."""

    wall_s: float
    busy_s: float
    total_s: float

    @property
    def utilisation(self) -> float:
        if self.total_s <= 0:
            return 0.0
        return min(1.0, max(0.0, self.busy_s / self.total_s))


class CpuStatError(Exception):
    pass


def parse_proc_stat(text: str, user_hz: int) -> tuple[float, float, int]:
    """(busy_s, total_s, ncpu) from /proc/stat contents."""
    agg: list[int] | None = None
    ncpu = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = line.split()[1:]
            if len(fields) < 4:
                raise CpuStatError(f"/proc/stat cpu line has {len(fields)} fields, need >= 4")
            agg = [int(x) for x in fields[:8]] + [0] * (8 - min(8, len(fields)))
        elif line.startswith("cpu") and line[3:4].isdigit():
            ncpu += 1
    if agg is None:
        raise CpuStatError("/proc/stat has no aggregate 'cpu ' line")
    user, nice, system, idle, iowait, irq, softirq, steal = agg
    busy = user + nice + system + irq + softirq + steal
    total = busy + idle + iowait
    return busy / user_hz, total / user_hz, ncpu


class CpuStat:
    """Reads node-wide busy/total CPU seconds under `procfs_root` (default /proc)."""

    # a Source (collectors/source.py): its status key, the reasons that mean absent, what
    # the tracker drives it as; no config mode (always auto)
    name: ClassVar[str] = "cpustat"
    absent_reasons: ClassVar[frozenset[str]] = frozenset()
    role: ClassVar[str] = CPU_TIME
    mode_option: ClassVar[str | None] = None
    label: ClassVar[str] = "/proc/stat"
    without: ClassVar[str] = "run without the node's CPU time"
    read_every_s: float | None = None  # every tick of the tracker

    @classmethod
    def make(cls, ctx: SourceContext) -> CpuStat:
        return cls(ctx.procfs_root, clock=ctx.clock, **ctx.of(cls.name))

    def status(self) -> CollectorStatus:
        return self.probe()

    def tick_s(self, cap_s: float) -> float | None:
        return None

    def __init__(
        self,
        procfs_root: Path | str = Path("/proc"),
        clock: Callable[[], float] = time.time,
        user_hz: int | None = None,
    ) -> None:
        self.procfs_root = Path(procfs_root)
        self._clock = clock
        self.user_hz = user_hz or os.sysconf("SC_CLK_TCK")

    def probe(self) -> CollectorStatus:
        try:
            self.read()
        except (OSError, CpuStatError, ValueError) as exc:
            return CollectorStatus(
                False, REASON_UNREADABLE, f"cannot read {self.procfs_root / 'stat'}: {exc}"
            )
        return CollectorStatus(True)

    def read(self) -> CpuTimes:
        t = self._clock()
        text = (self.procfs_root / "stat").read_text()
        busy, total, ncpu = parse_proc_stat(text, self.user_hz)
        return CpuTimes(t=t, busy_s=busy, total_s=total, ncpu=ncpu)


def cpu_delta(a: CpuTimes, b: CpuTimes) -> NodeCpuDelta:
    total = max(0.0, b.total_s - a.total_s)
    # busy <= total in jiffies; in seconds the two differences round apart (a node busy
    # the whole interval gave busy 2.240000000000691 > total 2.2399999999997817)
    busy = min(total, max(0.0, b.busy_s - a.busy_s))
    return NodeCpuDelta(wall_s=max(0.0, b.t - a.t), busy_s=busy, total_s=total)
