"""Whether the machine was quiet while a test measured: the CPU the rest of the node used.

A test that holds serwatt to a quiet machine's figure means something only on a quiet
machine (`serial` tests, `make check`'s serial pass); it measures the load over its run
with this and says in its message how loaded the node was.
"""

from __future__ import annotations

from types import TracebackType

from serwatt.collectors.cpustat import CpuStat, cpu_delta
from serwatt.profiler.profile.cpu_budget import own_cpu_s


class OthersCpu:
    """`with OthersCpu() as load:` then `load.cores`: the node's CPU over the block, less
    this process's and its reaped descendants' (each subprocess the test waited for), in
    cores. Children still running at the end count as others."""

    def __init__(self) -> None:
        self._node = CpuStat()
        self.cores = 0.0

    def __enter__(self) -> OthersCpu:
        self._before, self._own = self._node.read(), own_cpu_s()
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        spent = cpu_delta(self._before, self._node.read())
        # the difference clamps at 0: /proc/stat's ticks and os.times() round differently
        others = max(0.0, spent.busy_s - (own_cpu_s() - self._own))
        self.cores = others / max(1e-9, spent.wall_s)
