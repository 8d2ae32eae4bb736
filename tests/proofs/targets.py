"""Step factories for the proofs: `factory(workdir, **kwargs) -> step`.

`arena_update` is the hot path under proof; the others are the controls that show each
measurement can see an allocation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from profiler.many import Arena


def arena_update(
    workdir: Path, *, slots: int = 16, elems: int = 65536, by: str = "name"
) -> Callable[[], object]:
    """`Arena.update` of one slot per step, cycling over `slots` slots of float32[elems].

    The source arrays are built up front (a training loop updates from tensors it already
    has). `by="name"` updates by slot name; `by="handle"` passes the handle returned by the
    previous update of that slot (the generation-checked path).
    """
    arena = Arena.create(
        workdir / "proof.many", {f"s{i}": ((elems,), np.float32) for i in range(slots)}
    )
    values = [np.full(elems, i + 1, dtype=np.float32) for i in range(slots)]
    if by == "name":
        pairs = itertools.cycle([(f"s{i}", values[i]) for i in range(slots)])

        def step() -> object:
            name, value = next(pairs)
            return arena.update(name, value)

        return step
    if by == "handle":
        handles = [arena.handle(f"s{i}") for i in range(slots)]
        order = itertools.cycle(range(slots))

        def step_handle() -> object:
            i = next(order)
            handles[i] = arena.update(handles[i], values[i])
            return None

        return step_handle
    raise ValueError(f"by must be 'name' or 'handle', not {by!r}")


def empty(workdir: Path) -> Callable[[], object]:
    """The harness alone: a step that does nothing (every proof's zero line)."""
    return lambda: None


def allocating(workdir: Path, *, nbytes: int = 1 << 20) -> Callable[[], object]:
    """Control: a step that allocates a fresh buffer (malloc, and mmap above the threshold)."""
    return lambda: bytearray(nbytes)


def retaining(workdir: Path) -> Callable[[], object]:
    """Control: a step that keeps what it allocates (tracemalloc net grows per call)."""
    kept: list[bytes] = []
    return lambda: kept.append(bytes(64))
