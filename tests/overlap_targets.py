"""Proof targets (tests/proofs/child.py factories) for `Checkpointer.checkpoint(...,
overlap=True)`: one checkpoint, the optimizer step it overlaps with, and the wait for it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def checkpoint_and_step(
    workdir: Path, *, overlap: bool = True, layers: int = 4, width: int = 128
) -> Callable[[], object]:
    """A 4-layer model and its SGD-with-momentum state (in-place updates: the step itself
    makes no tensors), its gradients kept from one backward pass. Each step checkpoints
    the usual nested dict, runs `optimizer.step()` (with overlap=True it waits in the step
    pre-hook for the background copy of the weights and momenta) and waits for the write,
    so the step is one whole checkpoint and one training update. `overlap=False` is the
    same loop through the synchronous copy, the reference."""
    import torch

    from serwatt.profiler.many import Checkpointer

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width) for _ in range(layers)], torch.nn.LayerNorm(width)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, foreach=False)
    model(torch.randn(8, width)).square().mean().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": 1}
    cp = Checkpointer(workdir / "ckpts", keep=2)
    cp.prepare(state)

    def step() -> object:
        cp.checkpoint(state, optimizer=opt, overlap=overlap)
        opt.step()
        return cp.wait()

    return step
