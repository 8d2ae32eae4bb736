"""`Checkpointer`: asynchronous checkpoints whose training stall is one copy into staging.

`checkpoint(state)` flattens the state tree, copies every tensor into a preallocated staging
arena laid out like the file's state region (page-aligned slots), hands the job to a
background thread and returns. The thread hashes the staging bytes, writes them to a temp
file, fsyncs it, renames it to `<prefix>-<seq>.many`, fsyncs the directory and chains the
receipt to the previous checkpoint's. The arena is reused while the layout (dtype and shape
of every slot) stays the same, so a steady training loop allocates no tensor memory per
checkpoint. One checkpoint is in flight at most: the staging arena is the only copy, so the
next `checkpoint()` waits for the previous write and reports how long.

With `overlap=True` (and the optimizer that updates the state) the call copies only what the
next forward pass can change: every tensor that is not a CPU parameter or state tensor of that
optimizer (module buffers such as BatchNorm's running statistics, the RNG state, numpy arrays)
and whatever `sync=` names. The optimizer's tensors change only in `optimizer.step()`, so the
background thread copies them while the next forward and backward passes run, and a step
pre-hook on the optimizer holds the first `step()` until that copy is done. The file is the
same, byte for byte, as the one a synchronous checkpoint at the same moment writes.

Crash safety is the writer's: a file appears under its final name only after its bytes are
fsynced, so a SIGKILL at any moment leaves every earlier checkpoint complete and verifiable.
"""

from __future__ import annotations

import atexit
import logging
import mmap
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from serwatt.profiler.many.format import DTYPES, ManyError, ManyFormatError, round_up
from serwatt.profiler.many.reader import load
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.state import (
    MAX_DEPTH,
    MAX_NODES,
    FlatState,
    flatten,
    load_state,
    state_metadata,
)
from serwatt.profiler.many.stepgate import StepGate
from serwatt.profiler.many.writer import SlotSource, write_file

log = logging.getLogger(__name__)

_SEQ_DIGITS = 8
# The name-table key (covered by the receipt) that says which slots an overlapped checkpoint
# copied on the background thread.
OVERLAP_KEY = "many.overlap"


class CheckpointError(ManyError):
    """A background checkpoint write failed; `__cause__` is the original exception."""


class TornCopyError(ManyError):
    """`detect_writes=True`: a tensor was written in place while the background thread copied
    it, so the copy may mix two states; that checkpoint is not written."""


@dataclass(frozen=True)
class Staged:
    """What `checkpoint()` did on the caller's thread. Times are `time.perf_counter` seconds.

    `stall_s` is the whole time the call blocked: `waited_s` (for the previous checkpoint's
    background write, which owns the staging arena until it is done; 0 when none was in
    flight) plus `copy_s` (flattening the tree and copying every tensor into staging,
    including any reallocation), plus the idle check between them.
    """

    path: str  # where the checkpoint will be once durable (`wait()`)
    seq: int
    nbytes: int
    waited_s: float
    copy_s: float
    stall_s: float
    reallocated: bool  # the staging arena was (re)allocated: first checkpoint or a new layout
    overlapped_slots: int = 0  # slots left to the background copy (overlap=True)
    overlapped_bytes: int = 0


@dataclass(frozen=True)
class Written:
    """A checkpoint the background thread made durable."""

    path: str
    seq: int
    receipt: Receipt
    write_s: float  # background time: hash + write + fsync + rename + directory fsync
    metadata: dict[str, Any]  # the metadata= given to checkpoint() (without the tree)
    overlap_copy_s: float = 0.0  # overlap=True: the background copy of the optimizer's tensors
    # overlap=True: how long the first optimizer.step() after the call waited in the step
    # pre-hook for that copy (0 when the copy was done first). Part of the checkpoint's cost.
    step_wait_s: float = 0.0


class _Staging:
    """Page-aligned anonymous memory laid out like a `.many` state region for one layout."""

    def __init__(self, flat: FlatState) -> None:
        self.layout = flat.layout
        self.offsets: list[int] = []
        total = 0
        for s in flat.slots:
            self.offsets.append(total)
            total += round_up(s.length)
        self.nbytes = total
        self.mm = mmap.mmap(-1, max(total, mmap.PAGESIZE))
        # Fault every page in now: otherwise the first copy into the arena pays the kernel's
        # zero-fill page faults on the training thread.
        np.frombuffer(self.mm, dtype=np.uint8)[:: mmap.PAGESIZE] = 0
        self.lengths = [s.length for s in flat.slots]
        self.codes = [s.code for s in flat.slots]
        self.shapes = [s.shape for s in flat.slots]
        self.bytes = [
            np.frombuffer(self.mm, dtype=np.uint8, count=n, offset=o)
            for n, o in zip(self.lengths, self.offsets, strict=True)
        ]
        self._numpy: dict[int, np.ndarray] = {}
        self._torch: dict[int, Any] = {}

    def numpy_view(self, i: int) -> np.ndarray:
        v = self._numpy.get(i)
        if v is None:
            v = self._numpy[i] = (
                self.bytes[i].view(DTYPES[self.codes[i]][1]).reshape(self.shapes[i])
            )
        return v

    def torch_view(self, i: int) -> Any:
        v = self._torch.get(i)
        if v is None:
            import torch

            dtype = getattr(torch, DTYPES[self.codes[i]][0])
            if self.lengths[i]:
                raw = torch.frombuffer(
                    self.mm, dtype=torch.uint8, count=self.lengths[i], offset=self.offsets[i]
                )
                v = raw.view(dtype).reshape(self.shapes[i])
            else:
                v = torch.empty(self.shapes[i], dtype=dtype)
            self._torch[i] = v
        return v

    def copy_in(self, flat: FlatState, skip: frozenset[int] = frozenset()) -> None:
        """Copy every slot of `flat` but those in `skip` (which `copy_slots` copies later)."""
        torch_slots = [i for i, s in enumerate(flat.slots) if s.kind == "torch" and i not in skip]
        if torch_slots:
            self.copy_slots(flat, torch_slots)
        for i, s in enumerate(flat.slots):
            if s.kind == "numpy" and s.length and i not in skip:
                np.copyto(self.numpy_view(i), s.value, casting="equiv")

    def copy_slots(self, flat: FlatState, slots: list[int]) -> None:
        """Copy the torch slots `slots` (torch's copy releases the GIL: the training thread
        computes meanwhile)."""
        import torch

        with torch.no_grad():
            for i in slots:
                self.torch_view(i).copy_(flat.slots[i].value)


@dataclass
class _Job:
    path: str
    seq: int
    sources: list[SlotSource]
    metadata: dict[str, Any]  # name-table metadata: the caller's plus the tree
    user_metadata: dict[str, Any]
    # overlap=True: the slots the background thread copies before writing, from `flat`, and
    # (detect_writes=True) each one's tensor version counter at the call.
    flat: FlatState | None = None
    pending: list[int] | None = None
    versions: list[int] | None = None
    overlap_copy_s: float = 0.0


def optimizer_cover(optimizer: Any, sync: Any = ()) -> Callable[[Any], bool]:
    """A test for "only `optimizer.step()` changes this tensor": a contiguous CPU tensor
    whose bytes lie within one of the optimizer's parameters or state tensors (a state dict
    holds them as detached views of the same memory, a DTensor as its local shard), and that
    overlaps no tensor in `sync`. Buffers, copies, other devices: False (copied before the
    call returns)."""
    import torch

    def local(t: Any) -> Any:
        return getattr(t, "_local_tensor", t)  # a DTensor's shard on this rank

    extents: dict[int, int] = {}  # start address -> end of every optimizer tensor on the CPU

    def add(t: Any) -> None:
        t = local(t)
        if isinstance(t, torch.Tensor) and t.is_cpu and t.numel():
            start = t.data_ptr()
            extents[start] = max(extents.get(start, 0), start + t.numel() * t.element_size())

    for group in optimizer.param_groups:
        for p in group["params"]:
            add(p)
    for per_param in optimizer.state.values():
        if isinstance(per_param, Mapping):
            for v in per_param.values():
                add(v)
    forced: list[tuple[int, int]] = []
    for t in sync:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"sync= holds tensors to copy synchronously, not {type(t).__name__}")
        t = local(t)
        if t.numel():
            forced.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))

    def covers(x: Any) -> bool:
        x = local(x)
        # is_cpu, not device.type: a fifth of the cost, on every tensor of every checkpoint
        if not isinstance(x, torch.Tensor) or not x.is_cpu or not x.numel():
            return False
        start = x.data_ptr()
        end = start + x.numel() * x.element_size()
        if not x.is_contiguous() or extents.get(start, -1) < end:
            return False
        return not any(a < end and start < b for a, b in forced)

    return covers


def covered_slots(flat: FlatState, optimizer: Any, sync: Any = ()) -> list[int]:
    """The slots of `flat` that only `optimizer.step()` changes (`optimizer_cover`); every
    other slot is copied synchronously."""
    covers = optimizer_cover(optimizer, sync)
    return [i for i, s in enumerate(flat.slots) if s.kind == "torch" and covers(s.value)]


class Checkpointer:
    """Asynchronous, chained `.many` checkpoints of a state tree into `directory`.

    Files are `<prefix>-<seq>.many` (seq zero-padded to 8 digits, counting on from the newest
    file already there). `on_written(Written)` runs on the background thread after each
    durable checkpoint; if it raises, the error surfaces like a failed write. `keep=N` then
    deletes all but the newest N (not after a write or an on_written that failed). Call
    `checkpoint()` from one thread.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        prefix: str = "ckpt",
        keep: int | None = None,
        hash: bool = True,
        on_written: Callable[[Written], None] | None = None,
        max_depth: int = MAX_DEPTH,
        max_nodes: int = MAX_NODES,
    ) -> None:
        if not prefix or "/" in prefix or os.sep in prefix or prefix.startswith("."):
            raise ValueError(f"prefix {prefix!r} must be a plain file-name prefix")
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep}: keep at least the newest checkpoint (keep >= 1)")
        self.directory = os.fspath(directory)
        self.prefix = prefix
        self.keep = keep
        self.hash = hash
        self.on_written = on_written
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        os.makedirs(self.directory, exist_ok=True)
        self._name_re = re.compile(re.escape(prefix) + rf"-(\d{{{_SEQ_DIGITS},}})\.many")
        self._tmp_re = re.compile(
            r"\." + re.escape(prefix) + rf"-\d{{{_SEQ_DIGITS},}}\.many\.tmp-(\d+)-[0-9a-f]{{8}}"
        )
        self._remove_dead_temps()
        existing = self.checkpoints()
        self._seq = existing[-1][0] + 1 if existing else 0
        self._prev = self._newest_receipt(existing)
        self._staging: _Staging | None = None
        self._cond = threading.Condition()
        self._call_lock = threading.Lock()
        self._job: _Job | None = None
        self._error: BaseException | None = None
        self._last: Written | None = None
        self._closing = False
        self._closed = False
        self._gate = StepGate()  # holds optimizer.step() during an overlapped copy
        self._worker = threading.Thread(
            target=self._run, name=f"many-checkpointer-{prefix}", daemon=True
        )
        self._worker.start()
        # An in-flight checkpoint is finished at interpreter exit, not dropped with the thread.
        atexit.register(_finish_at_exit, weakref.ref(self))

    # -- the caller's side ------------------------------------------------------------------
    def checkpoint(
        self,
        state: Any,
        *,
        metadata: Mapping[str, Any] | None = None,
        optimizer: Any = None,
        overlap: bool = False,
        sync: Any = (),
        detect_writes: bool = False,
    ) -> Staged:
        """Copy `state` into staging and start writing it in the background.

        Blocks while the previous checkpoint is still being written, then for the copy.
        Raises `CheckpointError` first if the previous background write failed (that
        checkpoint was not written; this one is not started).

        `overlap=True` with the `optimizer` that updates `state`: only the slots that are not
        that optimizer's CPU parameters and state tensors, and those overlapping a tensor in
        `sync`, are copied before the call returns; the background thread copies the rest,
        and a step pre-hook holds the first `optimizer.step()` until it is done. Until then
        nothing but that `step()` may write those tensors in place (docs/many.md);
        `detect_writes=True` checks every such tensor's version counter after the copy and
        fails the checkpoint with `TornCopyError` (at the next call) when one moved.
        """
        if overlap and optimizer is None:
            raise ValueError(
                "overlap=True needs optimizer=: its step() is what must wait for the copy"
            )
        with self._call_lock:
            t0 = time.perf_counter()
            with self._cond:
                in_flight = self._job is not None
            self._wait_idle()
            t1 = time.perf_counter()
            flat = flatten(state, max_depth=self.max_depth, max_nodes=self.max_nodes, devices=True)
            pending = covered_slots(flat, optimizer, sync) if overlap else []
            meta = state_metadata(flat.doc, metadata)
            if overlap:
                if OVERLAP_KEY in meta:
                    raise ValueError(f"metadata key {OVERLAP_KEY!r} is reserved for overlap=True")
                meta[OVERLAP_KEY] = {
                    "overlapped": [flat.slots[i].name for i in pending],
                    "synchronous": len(flat.slots) - len(pending),
                    "detect_writes": bool(detect_writes),
                }
            reallocated = self._ensure_staging(flat)
            staging = self._staging
            assert staging is not None
            staging.copy_in(flat, frozenset(pending))
            seq = self._seq
            self._seq += 1
            path = os.path.join(self.directory, f"{self.prefix}-{seq:0{_SEQ_DIGITS}d}.many")
            sources = [
                SlotSource(s.name, s.shape, s.code, s.length, staging.bytes[i])
                for i, s in enumerate(flat.slots)
            ]
            job = _Job(path, seq, sources, meta, dict(metadata or {}))
            overlapped_bytes = 0
            if pending:
                job.flat, job.pending = flat, pending
                if detect_writes:
                    job.versions = [flat.slots[i].value._version for i in pending]
                overlapped_bytes = sum(flat.slots[i].length for i in pending)
                # Armed before the job is handed over: no step() can slip in between.
                self._gate.arm(optimizer)
            t2 = time.perf_counter()
            with self._cond:
                self._job = job
                self._cond.notify_all()
            return Staged(
                path=path,
                seq=seq,
                nbytes=flat.nbytes,
                # only a wait for a write in flight; with none, the idle check's few
                # microseconds (more on a loaded CPU) are the stall's, not a wait
                waited_s=t1 - t0 if in_flight else 0.0,
                copy_s=t2 - t1,
                stall_s=t2 - t0,
                reallocated=reallocated,
                overlapped_slots=len(pending),
                overlapped_bytes=overlapped_bytes,
            )

    def prepare(self, state: Any) -> bool:
        """Allocate (and fault in) the staging arena for `state`'s layout without checkpointing,
        so the first `checkpoint()` pays only the copy. True if it (re)allocated."""
        with self._call_lock:
            self._wait_idle()
            flat = flatten(state, max_depth=self.max_depth, max_nodes=self.max_nodes, devices=True)
            return self._ensure_staging(flat)

    def _ensure_staging(self, flat: FlatState) -> bool:
        if self._staging is not None and self._staging.layout == flat.layout:
            return False
        if self._staging is not None:
            log.info(
                "many checkpointer %s: state layout changed (%d -> %d slots); "
                "reallocating the staging arena",
                self.directory,
                len(self._staging.layout),
                len(flat.layout),
            )
        self._staging = None  # drop the old arena before mapping the new one
        self._staging = _Staging(flat)
        return True

    def wait(self) -> Written | None:
        """Block until no checkpoint is in flight; the last durable checkpoint (None if none).

        Raises `CheckpointError` if the background write failed.
        """
        with self._call_lock:
            self._wait_idle()
            return self._last

    def _wait_idle(self) -> None:
        if self._closed:
            raise ValueError(f"checkpointer for {self.directory} is closed")
        with self._cond:
            while self._job is not None:
                self._cond.wait()
            err, self._error = self._error, None
        self._gate.remove()
        if err is not None:
            raise CheckpointError(
                f"a background checkpoint in {self.directory} failed: {err}"
            ) from err

    def close(self) -> None:
        """Finish the checkpoint in flight (raising its error, if any) and stop the thread."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._worker.join()
            self._closed = True
            self._staging = None
            self._gate.remove()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- finding and restoring checkpoints ----------------------------------------------------
    def checkpoints(self) -> list[tuple[int, str]]:
        """(seq, path) of every complete checkpoint of this prefix in the directory, oldest
        first."""
        out = []
        for entry in os.scandir(self.directory):
            m = self._name_re.fullmatch(entry.name)
            if m and entry.is_file(follow_symlinks=False):
                out.append((int(m.group(1)), entry.path))
        return sorted(out)

    def latest(self) -> str | None:
        """Path of the newest checkpoint (highest seq), or None when there is none."""
        existing = self.checkpoints()
        return existing[-1][1] if existing else None

    def restore(self, *, verify: bool = True, as_numpy: bool = False) -> Any:
        """The newest checkpoint's state tree (mapped, copy-on-write), or None when there is none.

        With `verify=True` (the default) every byte is rehashed first; a damaged file raises
        `ManyFormatError` naming it (older checkpoints are in `checkpoints()`).
        """
        path = self.latest()
        if path is None:
            return None
        return load_state(path, verify=verify, as_numpy=as_numpy)

    # -- the background side ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._closing:
                    self._cond.wait()
                if self._job is None:
                    return
                job = self._job
            error: BaseException | None = None
            written: Written | None = None
            try:
                if job.pending is not None:
                    self._copy_overlapped(job)
                written = self._write(job)
            except BaseException as exc:  # surfaced at the next call, never dropped
                error = exc
                self._gate.release()
            with self._cond:
                if written is not None:
                    self._last = written
                else:
                    self._error = error
                self._job = None
                self._cond.notify_all()
            # The job holds the flattened tree and a view per slot: let it go now, not when
            # the next checkpoint rebinds these names (until then it is O(slots) of garbage).
            del job, written, error

    def _copy_overlapped(self, job: _Job) -> None:
        """Copy the slots left to the background, then release the step pre-hook."""
        assert job.flat is not None and job.pending is not None and self._staging is not None
        t0 = time.perf_counter()
        try:
            self._staging.copy_slots(job.flat, job.pending)
            job.overlap_copy_s = time.perf_counter() - t0
            # Checked before step() is released: the step's own writes come after it.
            if job.versions is not None:
                moved = [
                    job.flat.slots[i].name
                    for i, v in zip(job.pending, job.versions, strict=True)
                    if job.flat.slots[i].value._version != v
                ]
                if moved:
                    raise TornCopyError(
                        f"{len(moved)} tensor(s) were written in place while the background "
                        f"thread copied them (first: {moved[0]!r}); with overlap=True only the "
                        "optimizer's step() may change them, after it waited. Copy them "
                        "synchronously (sync=[...]) or move the write after step()"
                    )
        finally:
            self._gate.release()
        # The source tensors are not needed any more; the staging bytes are.
        job.flat = None
        job.versions = None

    def _write(self, job: _Job) -> Written:
        t0 = time.perf_counter()
        receipt = write_file(
            job.path, job.sources, prev=self._prev, metadata=job.metadata, hash=self.hash
        )
        self._prev = receipt
        # Final here: step() waits only while the copy runs, and the copy came before the write.
        step_wait_s = self._gate.waited_s if job.pending is not None else 0.0
        written = Written(
            job.path,
            job.seq,
            receipt,
            time.perf_counter() - t0,
            job.user_metadata,
            overlap_copy_s=job.overlap_copy_s,
            step_wait_s=step_wait_s,
        )
        if self.on_written is not None:
            self.on_written(written)
        # Pruning comes after on_written: a callback that uploads each file sees it through
        # before the one before it goes, and a callback that raises keeps every file.
        if self.keep is not None:
            for _, old in self.checkpoints()[: -self.keep]:
                try:
                    os.unlink(old)
                except FileNotFoundError:
                    pass
        return written

    # -- directory housekeeping ---------------------------------------------------------------
    def _remove_dead_temps(self) -> None:
        """Delete temp files left by writers of this prefix that were killed mid-write."""
        for entry in os.scandir(self.directory):
            m = self._tmp_re.fullmatch(entry.name)
            if not m:
                continue
            pid = int(m.group(1))
            try:
                os.kill(pid, 0)
                continue  # that writer is alive (or its pid was reused): leave its file
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass

    def _newest_receipt(self, existing: list[tuple[int, str]]) -> Receipt | None:
        """The chain continues from the newest readable checkpoint already in the directory."""
        for _, path in reversed(existing):
            try:
                ckpt = load(path, read="mmap")  # the receipt only: no slot is read
            except (ManyFormatError, OSError) as exc:
                log.warning(
                    "many checkpointer: skipping unreadable %s for the chain: %s", path, exc
                )
                continue
            receipt = ckpt.receipt
            ckpt.close()
            return receipt
        return None

    def __repr__(self) -> str:
        return f"<Checkpointer {self.directory} prefix={self.prefix!r} next_seq={self._seq}>"


def _finish_at_exit(ref: weakref.ref[Checkpointer]) -> None:
    cp = ref()
    if cp is None or cp._closed:
        return
    try:
        cp.close()
    except Exception as exc:
        log.error("many checkpointer %s: the last checkpoint failed at exit: %s", cp.directory, exc)
