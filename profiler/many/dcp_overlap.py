"""`OverlappedSaver`: multi-rank overlapped checkpoints through PyTorch DCP.

`dcp.async_save` with `DefaultStager(StagingOptions(use_async_staging=True))` copies the
state dict on a stager thread and plans and writes it (with the planner's collectives) on
an upload thread: the planner sees only the staged copy, so when that copy runs does not
matter to it. What DCP does not do is make the next `optimizer.step()` wait for the copy,
nor keep the forward pass's buffers out of it. `OverlappedSaver.async_save` does both, on
every rank:

1. every tensor of the state dict that is not a CPU parameter or state tensor of the
   optimizer (module buffers such as BatchNorm's running statistics, and what `sync=`
   names) is copied now, into a snapshot kept for the next checkpoint of the same layout,
   and the state dict handed to DCP holds those copies;
2. a `StepGate` holds the first `optimizer.step()` until DCP's staging future is done;
3. `dcp.async_save(..., async_stager=<one DefaultStager kept across checkpoints>)`, with
   the caller's storage writer (`ManyStorageWriter` for `.many` rank files).

One save is in flight at a time (the stager reuses its storages): the next `async_save`
first waits for the previous upload. Pass a `process_group` of its own (a gloo group) when
training runs collectives too: the upload thread's planning collectives then cannot
interleave with the training thread's.
"""

from __future__ import annotations

from typing import Any

from serwatt.profiler.many.checkpointer import optimizer_cover
from serwatt.profiler.many.stepgate import StepGate


class OverlappedSaver:
    def __init__(self) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        # Pinned and shared memory need an accelerator and a second process; off on a CPU.
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=False,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=False,
            )
        )
        self._gate = StepGate()
        self._snapshot: dict[tuple[Any, ...], Any] = {}
        self._inflight: Any = None
        self.synchronous: list[str] = []  # the last save's keys copied before it returned

    @property
    def step_wait_s(self) -> float:
        """How long the last save's first `step()` waited for its staging."""
        return self._gate.waited_s

    def async_save(
        self,
        state_dict: dict[str, Any],
        *,
        optimizer: Any,
        storage_writer: Any,
        checkpoint_id: Any = None,
        process_group: Any = None,
        no_dist: bool = False,
        sync: Any = (),
    ) -> Any:
        """Save `state_dict` through DCP, overlapping the copy of `optimizer`'s tensors with
        the next forward and backward passes. Returns DCP's `AsyncSaveResponse`."""
        import torch.distributed.checkpoint as dcp

        self.wait()
        covers = optimizer_cover(optimizer, sync)
        self.synchronous = []
        tree = self._copy_uncovered(state_dict, (), covers)
        self._gate.arm(optimizer)
        try:
            response = dcp.async_save(
                tree,
                storage_writer=storage_writer,
                checkpoint_id=checkpoint_id,
                process_group=process_group,
                async_stager=self._stager,
                no_dist=no_dist,
            )
        except BaseException:
            self._gate.release()
            raise
        if not isinstance(response, dcp.state_dict_saver.AsyncSaveResponse):
            self._gate.release()  # staged in the call: nothing left to wait for
            response.result()
            raise RuntimeError("DCP staged synchronously: its async stager was not used")
        response.staging_completion.add_done_callback(lambda _: self._gate.release())
        self._inflight = response
        return response

    def _copy_uncovered(self, x: Any, path: tuple[Any, ...], covers: Any) -> Any:
        import torch

        if isinstance(x, dict):
            return {k: self._copy_uncovered(v, (*path, k), covers) for k, v in x.items()}
        if isinstance(x, list | tuple):
            items = [self._copy_uncovered(v, (*path, i), covers) for i, v in enumerate(x)]
            return items if isinstance(x, list) else tuple(items)
        if not isinstance(x, torch.Tensor) or covers(x):
            return x
        key = (path, x.dtype, tuple(x.shape), str(x.device))
        kept = self._snapshot.get(key)
        if kept is None:
            kept = self._snapshot[key] = torch.empty_like(x)
        with torch.no_grad():
            kept.copy_(x)
        self.synchronous.append(".".join(str(p) for p in path))
        return kept

    def wait(self) -> None:
        """Block until the save in flight is written (raising its error); remove the hook."""
        response, self._inflight = self._inflight, None
        if response is not None:
            response.upload_completion.result()
        self._gate.remove()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._stager.close()
