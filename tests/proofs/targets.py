"""Step factories for the proofs: `factory(workdir, **kwargs) -> step`.

`arena_update` is the hot path under proof; the others are the controls that show each
measurement can see an allocation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from serwatt.profiler.many import Arena


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


def checkpointer(
    workdir: Path, *, layers: int = 4, width: int = 128, wait: bool = False
) -> Callable[[], object]:
    """`Checkpointer.checkpoint` of one nested training state per step (keep=2).

    The state is a torch model's and an AdamW optimizer's state dicts after two steps, plus
    an iteration count: the usual checkpoint dict, built once (a training loop passes the
    tensors it already has). Each step blocks for the previous step's background write,
    then copies into the staging arena and hands the write to the background thread, which
    therefore runs inside the measured loop too. `wait=True` also waits for the write, so
    each step is one whole checkpoint. The state (40 slots, about 0.8 MiB at width 128) is
    far under the writer's 8 MiB threshold for a hashing thread, so no thread is started per
    checkpoint, and each tensor (16384 elements) under torch's grain size for a parallel
    copy, so `copy_` runs on the calling thread.
    """
    import torch

    from serwatt.profiler.many import Checkpointer

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width) for _ in range(layers)], torch.nn.LayerNorm(width)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    for _ in range(2):
        model(torch.randn(8, width)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": 2}
    cp = Checkpointer(workdir / "ckpts", keep=2)
    cp.prepare(state)

    if wait:

        def step_wait() -> object:
            cp.checkpoint(state)
            return cp.wait()

        return step_wait
    return lambda: cp.checkpoint(state)


# The calls into CPython, numpy and blake3 that one `Arena.update` or one checkpoint makes,
# each alone as a step on the same kind of objects. What each costs in allocations belongs to
# the dependency (and moves with its version); how many of each an update or a checkpoint
# makes is serwatt's, and that is what the proofs assert.
DEPENDENCY_CALLS = (
    "ndarray_shape",  # numpy: `value.shape == views.shape`, the shape check
    "ndarray_flags",  # numpy: `value.flags.c_contiguous`, the layout check
    "blake3_hash",  # blake3: reset, update(the slot's memoryview), digest
    "handle",  # serwatt's own result object, `Handle(name, index, generation)`
    "condition_wait",  # CPython threading: `Condition.wait`, its waiter lock
)


def dependency_call(workdir: Path, *, call: str, elems: int = 65536) -> Callable[[], object]:
    """One of DEPENDENCY_CALLS per step, as `arena_update` / `checkpointer` make it."""
    import threading

    import blake3

    from serwatt.profiler.many import Handle

    value = np.full(elems, 1, dtype=np.float32)
    slot = np.zeros(elems, dtype=np.float32)
    if call == "ndarray_shape":
        shape = slot.shape
        return lambda: value.shape == shape
    if call == "ndarray_flags":
        return lambda: value.flags.c_contiguous
    if call == "blake3_hash":
        hasher = blake3.blake3(max_threads=1)
        buffer = slot.reshape(-1).view(np.uint8).data

        def step_hash() -> object:
            hasher.reset()
            hasher.update(buffer)
            return hasher.digest()

        return step_hash
    if call == "handle":
        return lambda: Handle("s0", 0, 7)
    if call == "condition_wait":
        cond = threading.Condition()

        def step_wait() -> object:
            with cond:
                return cond.wait(timeout=0)

        return step_wait
    raise ValueError(f"call must be one of {DEPENDENCY_CALLS}, not {call!r}")
