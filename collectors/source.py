"""The one shape of a node signal source (`Source`) and the list of them (`SOURCES`).

A source reads one signal of the node. It has a `name` (the `collector` label, its key in
a tracker's status), the probe `reason`s that mean its hardware is simply absent here
(`absent_reasons`: `auto` then treats it as not present, not as down: not exported, no
alert), a `probe()` that says whether it can be read (collectors/status.py: up, or why
not and the fix) and a `read()` of its signal now. A new signal is one module with a
class that has these, and one line in SOURCES.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from serwatt.collectors.cpustat import CpuStat
from serwatt.collectors.nvml import NvmlCollector
from serwatt.collectors.rapl import RaplCollector
from serwatt.collectors.status import CollectorStatus


class Source(Protocol):
    name: ClassVar[str]
    absent_reasons: ClassVar[frozenset[str]]

    def probe(self) -> CollectorStatus: ...

    def read(self) -> Any: ...


SOURCES: tuple[type[Source], ...] = (RaplCollector, CpuStat, NvmlCollector)


def absent(name: str, reason: str | None) -> bool:
    """Whether source `name`'s probe `reason` means its hardware is not on this node."""
    return any(s.name == name and reason in s.absent_reasons for s in SOURCES)
