"""The one shape of a node signal source (`Source`) and the list of them (`SOURCES`).

A source reads one signal of the node. Its class declares what the energy tracker
(profiler/attribution/tracker.py) needs to drive it, so the tracker, the daemon's energy
side and the sinks iterate over sources and never branch on their names:
- `name`: the `collector` label, its key in the tracker's status and the run's `sources`;
- `absent_reasons`: the probe `reason`s that mean its hardware is simply absent here
  (`auto` then treats it as not present, not as down: not exported, no alert);
- `role` (collectors/role.py): the interface the tracker drives it through (node energy,
  CPU time, GPU, or other: probed and read only);
- `mode_option`: the config option that sets it `auto`/`required`/`off` (None: always
  auto), with `label` and `without` for the operator's messages;
- `read_every_s`: how often the tracker reads it (None: every tick); `tick_s(cap)`: the
  longest the tracker may go between ticks while it is up (None: no bound of its own);
- `make(ctx)`: the source made from the node's roots, clock and its own options;
- `probe()`: whether it can be read (collectors/status.py: up, or why not and the fix),
  cached; `status()`: that probe as the plain status a tracker and a record keep;
- `read()`: its signal now.

A new signal is one module with a class that has these, and one line in SOURCES.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from serwatt.collectors.cpustat import CpuStat
from serwatt.collectors.nvml import NvmlCollector
from serwatt.collectors.rapl import RaplCollector
from serwatt.collectors.role import SourceContext
from serwatt.collectors.status import REASON_OFF, CollectorStatus

MODES = ("auto", "required", "off")


class Source(Protocol):
    name: ClassVar[str]
    absent_reasons: ClassVar[frozenset[str]]
    role: ClassVar[str]
    mode_option: ClassVar[str | None]
    label: ClassVar[str]
    without: ClassVar[str]
    read_every_s: float | None

    @classmethod
    def make(cls, ctx: SourceContext) -> Source: ...

    def probe(self) -> CollectorStatus: ...

    def status(self) -> CollectorStatus: ...

    def tick_s(self, cap_s: float) -> float | None: ...

    def read(self) -> Any: ...


SOURCES: tuple[type[Source], ...] = (RaplCollector, CpuStat, NvmlCollector)


def with_mode() -> tuple[type[Source], ...]:
    """The sources an operator sets auto/required/off (a `mode_option`), in list order:
    the daemon config's `collectors:` keys, the keys a reload leaves to the restart and
    `serwatt profile`'s flags. SOURCES is read at each call, so a source added to it has
    its key and flag."""
    return tuple(s for s in SOURCES if s.mode_option is not None)


def absent(name: str, reason: str | None, sources: tuple[type[Source], ...] = ()) -> bool:
    """Whether source `name`'s probe `reason` means its hardware is not on this node
    (`sources`: where to look besides SOURCES, e.g. a tracker's own list)."""
    return any(s.name == name and reason in s.absent_reasons for s in (*SOURCES, *sources))


def status_in_mode(source: Source, mode: str) -> CollectorStatus:
    """The source's status under its config mode: `off` is not probed."""
    if mode == "off":
        return CollectorStatus(False, REASON_OFF, f"{source.label} disabled by configuration")
    return source.status()


def required_but_down(source: Source, status: CollectorStatus) -> str:
    """The error for a `required` source that is down: what failed and the two fixes."""
    return (
        f"{source.label} is required but unavailable ({status.reason}): {status.detail}. "
        f"Fix it, or set {source.mode_option} to auto to {source.without}"
    )
