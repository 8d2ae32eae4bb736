"""Checkpoint benchmark: the training stall and the restore of one real state, every way.

    .venv/bin/python bench/checkpoint.py [--size-mb 64] [--large] [--repeat 6]
        [--dir DIR] [--json FILE] [--methods a,b,...] [--torch-threads N]

The state is a real training checkpoint: a 4-block transformer-style MLP (LayerNorm,
Linear d->4d, GELU, Linear 4d->d; d chosen so the state has about --size-mb) after 3 AdamW
steps, saved as the usual nested dict `{"model": model.state_dict(), "optimizer":
opt.state_dict(), "iter_num": 3}` (weights, both AdamW moments and the step tensors; the
param_groups' lists, tuples, floats and bools). `--large` adds a 1024 MiB state after the
--size-mb one (about 8 GiB of memory at once; minutes on 2 cores).

Methods, each made durable (fsync of every file and of its directory):

- torch.save            `torch.save(state, tmp)`, fsync, rename        restore: torch.load
- dcp.save              `dcp.save(state, storage_writer=FileSystemWriter(dir), no_dist=True)`
- dcp.async_save        the same through `dcp.async_save`, with one `DefaultStager` kept across
                        checkpoints (its StateDictStager reuses the CPU storages it staged
                        into: DCP's shortest stall on a CPU)            restore: dcp.load
- dcp.async_save-fresh  `dcp.async_save` with the default staging (FileSystemWriter stages into
                        a new CPU state dict each time)
- safetensors           `save_file(flat tensors, tmp, metadata=the non-tensor leaves as JSON)`,
                        fsync, rename                                   restore: safe_open
- many.save_state       `many.save_state(path, state)`                  restore: load_state
- many.Checkpointer     `Checkpointer(dir, keep=1).checkpoint(state)`   restore: restore()

and two references on the same bytes: `memcpy` (numpy copyto of every tensor into a
preallocated, pre-faulted buffer) and `raw-write` (os.write of every tensor back to back, then
fsync).

Per method and round: the **training stall** (how long the training thread is blocked: the
whole save for the synchronous ones; until the call returns for the asynchronous ones), the
**total** (call until durable), bytes written, and the restore, cold and warm: *open* (until
the checkpoint can hand out tensors), *first tensor* (until the first tensor's bytes are
readable), *all bytes* (until one byte of every page of every tensor has been read). DCP's
load fills the whole state in one call, so it has no first-tensor time; torch.load reads
everything at open. After an asynchronous call returns, the bench goes on "training": every
tensor of the state is changed in place while the write runs, as the next optimizer step
would; the checkpoint must still hold the state as it was at the call.

Every load is compared with the state at the call, tensor by tensor (torch.equal, dtype and
shape) and every other leaf by value. A wrong load is reported and never timed or ranked, and
the bench exits 1. `--inject-wrong-load METHOD` flips one byte of that method's checkpoint on
disk after it is durable, to show that the check catches it.

Cold: after the save is durable each file is fsynced and its pages dropped with
posix_fadvise(POSIX_FADV_DONTNEED); then mincore(2) (through ctypes, on a fresh read-only
mapping that touches nothing) counts the file's resident pages. A cold sample counts only
when at most 1% of the pages are resident; a refused one is named in its round's line
(COLD REFUSED, with the resident share) and counted in the table. Before the rounds a probe
file says whether --dir can be made cold at all: where it cannot (tmpfs keeps its pages;
some FUSE and network filesystems ignore the hint) the bench says so at the start and in
the summary, refuses every cold sample, and the cold goals are "not measured"; with
--drop-caches (root) it also writes 1 to /proc/sys/vm/drop_caches when the hint left
pages, which drops the whole machine's clean page cache. Warm:
the same load right after the cold one (mincore then confirms at least 99% resident; a warm
sample that is not is refused the same way).

Rounds: one warm-up round (not counted: first-call allocations, imports), then --repeat
rounds (at least 6), the method order rotated by one each round. Statistics: mean and 95%
interval (Student t, profiler/intervals.py) over rounds; goals use per-round ratios (same round, so
neighbours and disk state are shared), as the geometric mean with the t interval of the mean
log ratio. Verdicts: CONFIRMED when the whole interval meets the goal, NOT MET when none of
it does, undecided otherwise.

`many.Checkpointer+overlap` (the copy of the optimizer's tensors overlapped with the next
step) is measured inside a real training loop, where a next step exists to overlap with:
bench/checkpoint_overlap.py, against this bench's many.Checkpointer and dcp.async_save, and
dcp.async_save with background staging.

Goals: many.Checkpointer stall <= 0.5x dcp.async_save's (the faster DCP variant) and <= 1.5x
memcpy; many.save_state throughput >= 0.8x raw-write (raw time / save time); many
open + first tensor <= 1/10 of dcp.load (cold and warm).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import mmap
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from serwatt.profiler.intervals import (  # noqa: E402
    CONFIRMED,
    NOT_MET,
    UNDECIDED,
    Interval,
    geometric_mean_interval,
    mean_interval,
    verdict,
)
from serwatt.profiler.profile.page_cache import resident_pages as mincore_pages  # noqa: E402

METHODS = (
    "torch.save",
    "dcp.save",
    "dcp.async_save",
    "dcp.async_save-fresh",
    "safetensors",
    "many.save_state",
    "many.Checkpointer",
    "memcpy",
    "raw-write",
)
REFERENCES = ("memcpy", "raw-write")
ASYNC = ("dcp.async_save", "dcp.async_save-fresh", "many.Checkpointer")
PAGE = mmap.PAGESIZE
COLD_MAX_RESIDENT = 0.01
WARM_MIN_RESIDENT = 0.99


class WrongLoad(AssertionError):
    """A loaded checkpoint differs from the state saved."""


# ------------------------------------------------------------------------------------------
# the state
# ------------------------------------------------------------------------------------------


def build_state(target_bytes: int, seed: int = 0) -> tuple[dict[str, Any], int]:
    """The nested checkpoint dict of a real model after 3 AdamW steps, and its width d."""
    blocks = 4
    # Per block 8 d^2 weights (d->4d, 4d->d); each parameter is stored 3 times (the value and
    # AdamW's two moments) at 4 bytes.
    d = max(32, round(math.sqrt(target_bytes / (blocks * 8 * 3 * 4)) / 32) * 32)
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [
            torch.nn.LayerNorm(d),
            torch.nn.Linear(d, 4 * d),
            torch.nn.GELU(),
            torch.nn.Linear(4 * d, d),
        ]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(3):
        model(torch.randn(8, d, generator=gen)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": 3}
    return state, d


def leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) in traversal order; dict keys and list indices as path segments."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{path}.{i}")
    else:
        yield path, obj


def tensors_of(state: Any) -> list[tuple[str, torch.Tensor]]:
    return [(p, v) for p, v in leaves(state) if isinstance(v, torch.Tensor)]


def scalars_of(state: Any) -> dict[str, Any]:
    return {p: v for p, v in leaves(state) if not isinstance(v, torch.Tensor)}


def check_same(want: Any, got_leaves: dict[str, Any], method: str) -> None:
    """Every leaf of `want` equals the loaded leaf at the same path; nothing more or less."""
    want_leaves = dict(leaves(want))
    if set(want_leaves) != set(got_leaves):
        missing = sorted(set(want_leaves) - set(got_leaves))[:5]
        extra = sorted(set(got_leaves) - set(want_leaves))[:5]
        raise WrongLoad(f"{method}: loaded paths differ (missing {missing}, extra {extra})")
    for p, w in want_leaves.items():
        g = got_leaves[p]
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                raise WrongLoad(f"{method}: {p} loaded as {type(g).__name__}, not a tensor")
            if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
                raise WrongLoad(f"{method}: tensor {p} differs from the state saved")
        elif type(g) is not type(w) and not (isinstance(w, tuple) and isinstance(g, list)):
            raise WrongLoad(f"{method}: {p} loaded as {type(g).__name__}, saved {type(w).__name__}")
        elif g != w:
            raise WrongLoad(f"{method}: {p} = {g!r}, saved {w!r}")


def touch(t: torch.Tensor) -> int:
    """Read one byte of every page of `t`: its bytes are resident and readable after this."""
    flat = t.detach().reshape(-1).view(torch.uint8).numpy()
    return int(flat[::PAGE].sum()) if flat.size else 0


# ------------------------------------------------------------------------------------------
# page cache
# ------------------------------------------------------------------------------------------


def resident_pages(path: Path) -> tuple[int, int]:
    """(resident, total) pages of `path` in the page cache, by mincore(2); reads nothing."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return mincore_pages(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def files_of(target: Path) -> list[Path]:
    if target.is_dir():
        return sorted(p for p in target.rglob("*") if p.is_file())
    return [target]


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_cache(target: Path, *, drop_caches: bool = False) -> float:
    """fsync and drop every page of the checkpoint's files; the fraction still resident.

    posix_fadvise(DONTNEED) drops a file's clean pages on disk filesystems; tmpfs (and
    some FUSE or network filesystems) keep them. With `drop_caches`, pages it left are
    dropped by writing 1 to /proc/sys/vm/drop_caches (root only; it drops the whole
    machine's clean page cache). mincore then says what is still resident: the caller
    refuses the cold sample when that is over COLD_MAX_RESIDENT."""
    paths = files_of(target)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    fraction = resident_fraction(target)
    if fraction > COLD_MAX_RESIDENT and drop_caches:
        os.sync()
        DROP_CACHES.write_text("1\n")
        fraction = resident_fraction(target)
    return fraction


def cold_cache_problem(workdir: Path, *, drop_caches: bool = False) -> str | None:
    """None when a file written in `workdir` can be made cold (confirmed by mincore);
    otherwise why not and the fix. Probed once on a 4 MiB file before any round."""
    probe = workdir / "cold-probe.bin"
    probe.write_bytes(os.urandom(4 << 20))
    try:
        resident_fraction(probe)  # mincore must work here at all
        fraction = drop_cache(probe, drop_caches=False)
        if fraction <= COLD_MAX_RESIDENT:
            return None
        why = (
            f"posix_fadvise(DONTNEED) left {fraction:.0%} of a probe file resident in "
            f"{workdir} ({fs_of(workdir)})"
        )
        if not drop_caches:
            return (
                f"{why}: cold restores cannot be confirmed cold, so every cold sample will be "
                "refused (not timed); put --dir on a disk filesystem, or (root) pass "
                "--drop-caches"
            )
        try:
            fraction = drop_cache(probe, drop_caches=True)
        except OSError as exc:
            return f"{why}, and {DROP_CACHES} cannot be written ({exc}): cold samples refused"
        if fraction > COLD_MAX_RESIDENT:
            return (
                f"{why}, and {fraction:.0%} still after {DROP_CACHES} (tmpfs keeps files in "
                "memory): cold samples refused; put --dir on a disk filesystem"
            )
        return None
    except OSError as exc:
        return f"mincore/fadvise failed in {workdir}: {exc}: cold samples refused"
    finally:
        probe.unlink(missing_ok=True)


def fs_of(path: Path) -> str:
    """'fstype on device (mount point)' of the mount holding `path` ('?' if unknown)."""
    best, out = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if str(path.resolve()).startswith(mnt) and len(mnt) >= len(best):
                best, out = mnt, f"{fstype} on {dev} ({mnt})"
    except OSError:
        pass
    return out


def resident_fraction(target: Path) -> float:
    pairs = [resident_pages(p) for p in files_of(target)]
    total = sum(t for _, t in pairs)
    return sum(r for r, _ in pairs) / total if total else 0.0


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_file(write: Callable[[Path], None], path: Path) -> None:
    """write(tmp); fsync; rename to path; fsync the directory: what every method pays."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_tree(directory: Path) -> None:
    """What DCP's FileSystemWriter does not: fsync the checkpoint directory itself."""
    fsync_dir(directory)
    fsync_dir(directory.parent)


def flip_byte(target: Path) -> None:
    """Damage the checkpoint: flip one byte in the middle of its largest file."""
    p = max(files_of(target), key=lambda f: f.stat().st_size)
    with open(p, "r+b") as f:
        f.seek(p.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


# ------------------------------------------------------------------------------------------
# the methods
# ------------------------------------------------------------------------------------------


@dataclass
class Saved:
    stall_s: float
    total_s: float
    target: Path  # file or directory holding the checkpoint


@dataclass
class Restored:
    open_s: float
    first_s: float | None
    all_s: float
    leaves: dict[str, Any]
    keep: Any = None  # what must stay alive while the tensors are used (mappings)


def touched(tree: Any, t0: float, t_open: float, *, keep: Any = None) -> Restored:
    """A loaded tree's restore times: its first tensor's pages touched, then all of them."""
    got = dict(leaves(tree))
    first = next(v for v in got.values() if isinstance(v, torch.Tensor))
    touch(first)
    t_first = time.perf_counter()
    for v in got.values():
        if isinstance(v, torch.Tensor):
            touch(v)
    t_all = time.perf_counter()
    return Restored(t_open - t0, t_first - t0, t_all - t0, got, keep=keep)


@dataclass
class Bench:
    state: dict[str, Any]
    workdir: Path
    template: dict[str, Any]  # dcp.load fills this in place
    memcpy_dst: list[np.ndarray]
    checkpointer: Any = None
    dcp_stager: Any = None
    seq: int = 0

    def fresh(self, name: str) -> Path:
        self.seq += 1
        return self.workdir / f"{name}-{self.seq:04d}"


def go_on_training(state: dict[str, Any]) -> None:
    """What the training thread does next: change every tensor in place (an optimizer step)."""
    with torch.no_grad():
        for _, t in tensors_of(state):
            t.add_(1)


def save(b: Bench, method: str) -> Saved:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint import FileSystemWriter

    from serwatt.profiler import many

    state = b.state
    if method == "torch.save":
        path = b.fresh("torch").with_suffix(".pt")
        t0 = time.perf_counter()
        durable_file(lambda p: torch.save(state, p), path)
        t1 = time.perf_counter()
        return Saved(t1 - t0, t1 - t0, path)
    if method == "dcp.save":
        d = b.fresh("dcp")
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=FileSystemWriter(str(d)), no_dist=True)
        fsync_tree(d)
        t1 = time.perf_counter()
        return Saved(t1 - t0, t1 - t0, d)
    if method in ("dcp.async_save", "dcp.async_save-fresh"):
        d = b.fresh("dcpasync")
        writer = FileSystemWriter(str(d))
        stager = None
        if method == "dcp.async_save":
            if b.dcp_stager is None:
                from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

                # Kept across checkpoints: its StateDictStager reuses the CPU storages it
                # staged into last time. (FileSystemWriter's own cache_staged_state_dict
                # pins memory, which needs an accelerator.)
                b.dcp_stager = DefaultStager(StagingOptions(False, False, False, False))
            stager = b.dcp_stager
        t0 = time.perf_counter()
        fut = dcp.async_save(
            state, storage_writer=writer, checkpoint_id=str(d), async_stager=stager, no_dist=True
        )
        t1 = time.perf_counter()
        go_on_training(state)
        if isinstance(fut, dcp.state_dict_saver.AsyncSaveResponse):
            fut.upload_completion.result()
        else:
            fut.result()
        fsync_tree(d)
        t2 = time.perf_counter()
        return Saved(t1 - t0, t2 - t0, d)
    if method == "safetensors":
        path = b.fresh("st").with_suffix(".safetensors")
        t0 = time.perf_counter()
        flat = dict(tensors_of(state))
        meta = {"scalars": json.dumps(scalars_of(state))}
        durable_file(lambda p: save_file(flat, str(p), metadata=meta), path)
        t1 = time.perf_counter()
        return Saved(t1 - t0, t1 - t0, path)
    if method == "many.save_state":
        path = b.fresh("state").with_suffix(".many")
        t0 = time.perf_counter()
        many.save_state(path, state)
        t1 = time.perf_counter()
        return Saved(t1 - t0, t1 - t0, path)
    if method == "many.Checkpointer":
        cp = b.checkpointer
        t0 = time.perf_counter()
        staged = cp.checkpoint(state)
        t1 = time.perf_counter()
        go_on_training(state)
        cp.wait()
        t2 = time.perf_counter()
        if staged.waited_s > 0.001:
            raise RuntimeError("the previous checkpoint was still in flight: the bench waits")
        return Saved(t1 - t0, t2 - t0, Path(staged.path))
    if method == "memcpy":
        srcs = [t.detach().reshape(-1).view(torch.uint8).numpy() for _, t in tensors_of(state)]
        t0 = time.perf_counter()
        for dst, src in zip(b.memcpy_dst, srcs, strict=True):
            np.copyto(dst, src)
        t1 = time.perf_counter()
        return Saved(t1 - t0, t1 - t0, Path())
    if method == "raw-write":
        path = b.fresh("raw").with_suffix(".raw")
        srcs = [t.detach().reshape(-1).view(torch.uint8).numpy() for _, t in tensors_of(state)]
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for src in srcs:
                view = src.data
                pos = 0
                while pos < len(view):
                    pos += os.write(fd, view[pos : pos + (1 << 30)])
            os.fsync(fd)
        finally:
            os.close(fd)
        t1 = time.perf_counter()
        return Saved(t1 - t0, t1 - t0, path)
    raise ValueError(f"unknown method {method!r}")


def reset_template(template: dict[str, Any]) -> None:
    with torch.no_grad():
        for _, t in tensors_of(template):
            t.fill_(-7)


def restore(b: Bench, method: str, target: Path) -> Restored:
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open
    from torch.distributed.checkpoint import FileSystemReader

    from serwatt.profiler import many

    if method == "torch.save":
        t0 = time.perf_counter()
        sd = torch.load(target, weights_only=True)
        t_open = time.perf_counter()
        return touched(sd, t0, t_open)
    if method.startswith("dcp."):
        reset_template(b.template)
        t0 = time.perf_counter()
        reader = FileSystemReader(str(target))
        reader.read_metadata()
        t_open = time.perf_counter()
        dcp.load(b.template, storage_reader=FileSystemReader(str(target)), no_dist=True)
        got = dict(leaves(b.template))
        for v in got.values():
            if isinstance(v, torch.Tensor):
                touch(v)
        t_all = time.perf_counter()
        return Restored(t_open - t0, None, t_all - t0, got)
    if method == "safetensors":
        t0 = time.perf_counter()
        f = safe_open(str(target), framework="pt")
        t_open = time.perf_counter()
        keys = list(f.keys())
        names = [p for p, _ in tensors_of(b.state)]
        if set(keys) != set(names):
            raise WrongLoad(f"safetensors: the file holds {len(keys)} tensors, saved {len(names)}")
        flat: dict[str, Any] = {names[0]: f.get_tensor(names[0])}
        touch(flat[names[0]])
        t_first = time.perf_counter()
        for name in names[1:]:
            flat[name] = f.get_tensor(name)
            touch(flat[name])
        t_all = time.perf_counter()
        flat.update(json.loads((f.metadata() or {}).get("scalars", "{}")))
        return Restored(t_open - t0, t_first - t0, t_all - t0, flat, keep=f)
    if method in ("many.save_state", "many.Checkpointer"):
        t0 = time.perf_counter()
        if method == "many.Checkpointer":
            tree = b.checkpointer.restore(verify=False)
        else:
            tree = many.load_state(target)
        t_open = time.perf_counter()
        return touched(tree, t0, t_open, keep=tree)
    raise ValueError(f"no restore for {method!r}")


def bytes_written(target: Path) -> int:
    return sum(p.stat().st_size for p in files_of(target)) if str(target) not in ("", ".") else 0


def remove(target: Path) -> None:
    if str(target) in ("", "."):
        return
    if target.is_dir():
        shutil.rmtree(target)
    elif target.exists():
        target.unlink()


# ------------------------------------------------------------------------------------------
# rounds
# ------------------------------------------------------------------------------------------


def snapshot_into(snapshot: dict[str, Any], state: dict[str, Any]) -> None:
    """Copy `state`'s tensors into `snapshot`'s (same structure): the state at the call."""
    with torch.no_grad():
        for (_, dst), (_, src) in zip(tensors_of(snapshot), tensors_of(state), strict=True):
            dst.copy_(src)


def one(
    b: Bench, method: str, snapshot: dict[str, Any], inject: str | None, drop_caches: bool = False
) -> dict[str, Any]:
    """Save, check and restore cold and warm with one method; the measured figures."""
    snapshot_into(snapshot, b.state)
    saved = save(b, method)
    row: dict[str, Any] = {"stall_s": saved.stall_s, "total_s": saved.total_s}
    if method in REFERENCES:
        if method == "raw-write":
            row["bytes"] = bytes_written(saved.target)
            remove(saved.target)
        return row
    if method not in ASYNC:
        go_on_training(b.state)  # the next step, after a save that blocked for all of it
    row["bytes"] = bytes_written(saved.target)
    if inject == method:
        flip_byte(saved.target)
    for temp in ("cold", "warm"):
        if temp == "cold":
            resident = drop_cache(saved.target, drop_caches=drop_caches)
            row["cold_resident"] = resident
        else:
            resident = resident_fraction(saved.target)
            row["warm_resident"] = resident
        got = restore(b, method, saved.target)
        try:
            check_same(snapshot, got.leaves, method)
        finally:
            leaves_n = len(got.leaves)
            del got.leaves
        ok = resident <= COLD_MAX_RESIDENT if temp == "cold" else resident >= WARM_MIN_RESIDENT
        if ok:
            row[f"{temp}_open_s"] = got.open_s
            row[f"{temp}_first_s"] = got.first_s
            row[f"{temp}_all_s"] = got.all_s
        else:
            row[f"{temp}_refused"] = f"{resident:.0%} of its pages resident"
        row["leaves"] = leaves_n
        del got
        gc.collect()
    if method != "many.Checkpointer":  # keep=1: the checkpointer deletes its older files
        remove(saved.target)
    return row


# ------------------------------------------------------------------------------------------
# statistics
# ------------------------------------------------------------------------------------------


# how the tables print each verdict of profiler/intervals.py
VERDICT_TEXT = {CONFIRMED: "CONFIRMED", NOT_MET: "NOT MET", UNDECIDED: "undecided"}


def verdict_text(iv: Interval, goal: float, at_most: bool) -> str:
    """The goal's verdict read off the interval of the ratio's geometric mean."""
    if not iv.has_interval:
        return "undecided (too few rounds)"
    claim = {"at_most": goal} if at_most else {"at_least": goal}
    return VERDICT_TEXT[verdict(iv, **claim)]


def fmt_t(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def fmt_ci(xs: list[float]) -> str:
    if not xs:
        return "-"
    iv = mean_interval(xs)
    if iv.lo is None or iv.hi is None:
        return fmt_t(iv.estimate)
    m, lo, hi = iv.estimate, iv.lo, iv.hi
    return f"{fmt_t(m)} ({fmt_t(max(lo, 0.0))}-{fmt_t(hi)})"


# ------------------------------------------------------------------------------------------
# the machine
# ------------------------------------------------------------------------------------------


def machine(workdir: Path) -> dict[str, Any]:
    info: dict[str, Any] = {
        "utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
    }
    try:
        import safetensors

        info["safetensors"] = safetensors.__version__
    except ImportError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_gib"] = round(int(line.split()[1]) / 2**20, 1)
        info["fs"] = fs_of(workdir)
    except OSError:
        pass
    return info


# ------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------


def run_size(
    size_mb: int,
    repeat: int,
    methods: list[str],
    base: Path,
    inject: str | None,
    drop_caches: bool = False,
) -> dict[str, Any]:
    from serwatt.profiler import many

    state, d = build_state(size_mb << 20)
    tensors = tensors_of(state)
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    snapshot = build_state(size_mb << 20, seed=5)[0]  # same structure, other values
    template = build_state(size_mb << 20, seed=9)[0]
    workdir = Path(tempfile.mkdtemp(prefix=f"ckpt-{size_mb}m-", dir=base))
    memcpy_dst = [np.empty(t.numel() * t.element_size(), dtype=np.uint8) for _, t in tensors]
    for buf in memcpy_dst:
        buf[::PAGE] = 0  # fault the pages in now, as the Checkpointer's prepare() does
    b = Bench(state, workdir, template, memcpy_dst)
    b.checkpointer = many.Checkpointer(workdir / "checkpointer", keep=1)
    b.checkpointer.prepare(state)
    print(
        f"\n== {nbytes / 2**20:.0f} MiB state: d={d}, {len(tensors)} tensors "
        f"({len(state['optimizer']['state'])} parameters x value + 2 AdamW moments + step); "
        f"{repeat} rounds + 1 warm-up in {workdir}",
        flush=True,
    )
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    failures: list[str] = []
    cold_problem = cold_cache_problem(workdir, drop_caches=drop_caches)
    if cold_problem is None:
        print(f"  cold restores: pages dropped and confirmed by mincore in {fs_of(workdir)}")
    else:
        print(f"  COLD RESTORES NOT MEASURABLE: {cold_problem}", flush=True)
    try:
        for rnd in range(repeat + 1):
            k = rnd % len(methods)
            order = methods[k:] + methods[:k]
            for method in order:
                try:
                    row = one(b, method, snapshot, inject, drop_caches)
                except WrongLoad as exc:
                    failures.append(f"round {rnd}: WRONG LOAD: {exc}")
                    print(f"  round {rnd} {method:<22} WRONG LOAD: {exc}", flush=True)
                    continue
                row["round"] = rnd
                if rnd > 0:
                    rows[method].append(row)
                print(
                    f"  {'warm-up' if rnd == 0 else f'round {rnd}':<8} {method:<22} "
                    f"stall {fmt_t(row['stall_s']):>10}  total {fmt_t(row['total_s']):>10}  "
                    f"cold all {fmt_t(row.get('cold_all_s')):>10}  "
                    f"warm all {fmt_t(row.get('warm_all_s')):>10}"
                    + "".join(
                        f"  {t.upper()} REFUSED: {row[f'{t}_refused']}"
                        for t in ("cold", "warm")
                        if f"{t}_refused" in row
                    ),
                    flush=True,
                )
    finally:
        b.checkpointer.close()
        if b.dcp_stager is not None:
            b.dcp_stager.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return {"size_mb": size_mb, "bytes": nbytes, "d": d, "tensors": len(tensors),
            "rows": rows, "failures": failures, "cold_problem": cold_problem}  # fmt: skip


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    rows = res["rows"]
    nbytes = res["bytes"]

    def col(m: str, key: str) -> list[float]:
        return [r[key] for r in rows.get(m, []) if r.get(key) is not None]

    print(
        f"\n**{nbytes / 2**20:.0f} MiB state ({res['tensors']} tensors), mean (95% t interval) "
        f"over {max((len(v) for v in rows.values()), default=0)} rounds**\n"
    )
    print(
        "| method | training stall | total (durable) | MB written | cold: open | cold: first "
        "tensor | cold: all bytes | warm: open | warm: first | warm: all bytes "
        "| refused cold/warm |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m, rs in rows.items():
        if not rs:
            continue
        written = col(m, "bytes")
        refused = "/".join(
            str(sum(1 for r in rs if f"{t}_resident" in r and f"{t}_all_s" not in r))
            for t in ("cold", "warm")
        )
        cells = [
            m,
            fmt_ci(col(m, "stall_s")),
            fmt_ci(col(m, "total_s")) if m not in REFERENCES or m == "raw-write" else "-",
            f"{np.mean(written) / 1e6:.1f}" if written else "-",
        ]
        for temp in ("cold", "warm"):
            for key in ("open_s", "first_s", "all_s"):
                cells.append(fmt_ci(col(m, f"{temp}_{key}")))
        cells.append(refused if m not in REFERENCES else "-")
        print("| " + " | ".join(cells) + " |")

    def paired(a: str, akey: str, b: str, bkey: str) -> list[float]:
        """a/b per round, for the rounds where both were measured."""
        by_round = {r["round"]: r for r in rows.get(b, [])}
        out = []
        for ra in rows.get(a, []):
            rb = by_round.get(ra["round"])
            x, y = ra.get(akey), rb.get(bkey) if rb else None
            if x is not None and y is not None and x > 0 and y > 0:
                out.append(x / y)
        return out

    if res.get("cold_problem"):
        print(f"\nCOLD RESTORES NOT MEASURED: {res['cold_problem']}")
    goals: list[dict[str, Any]] = []

    def goal(name: str, ratios: list[float], target: float, at_most: bool) -> None:
        if len(ratios) < 2:
            goals.append({"goal": name, "verdict": "not measured", "rounds": len(ratios)})
            return
        iv = geometric_mean_interval(ratios)
        lo, hi = iv.bounds()
        goals.append({"goal": name, "ratio": iv.estimate, "lo": lo, "hi": hi,
                      "rounds": len(ratios),
                      "verdict": verdict_text(iv, target, at_most)})  # fmt: skip

    dcp_async = "dcp.async_save"
    if rows.get("dcp.async_save-fresh") and rows.get(dcp_async):
        fresh = np.mean(col("dcp.async_save-fresh", "stall_s"))
        if fresh < np.mean(col(dcp_async, "stall_s")):
            dcp_async = "dcp.async_save-fresh"
    goal(f"many.Checkpointer stall <= 0.5x {dcp_async} stall",
         paired("many.Checkpointer", "stall_s", dcp_async, "stall_s"), 0.5, True)  # fmt: skip
    goal("many.Checkpointer stall <= 1.5x memcpy",
         paired("many.Checkpointer", "stall_s", "memcpy", "stall_s"), 1.5, True)  # fmt: skip
    goal("many.save_state throughput >= 0.8x raw-write (raw time / save time)",
         paired("raw-write", "total_s", "many.save_state", "total_s"), 0.8, False)  # fmt: skip
    goal("many.Checkpointer throughput (call to durable) >= 0.8x raw-write",
         paired("raw-write", "total_s", "many.Checkpointer", "total_s"), 0.8, False)  # fmt: skip
    for temp in ("cold", "warm"):
        for m in ("many.save_state", "many.Checkpointer"):
            goal(f"{m} open + first tensor <= 1/10 of dcp.load ({temp})",
                 paired(m, f"{temp}_first_s", "dcp.save", f"{temp}_all_s"), 0.1, True)  # fmt: skip
    print("\n| goal | ratio (geometric mean, 95% interval) | rounds | verdict |")
    print("|---|---:|---:|---|")
    for g in goals:
        if "ratio" in g:
            iv = f"{g['ratio']:.3f} ({g['lo']:.3f}-{g['hi']:.3f})"
        else:
            iv = "-"
        print(f"| {g['goal']} | {iv} | {g['rounds']} | {g['verdict']} |")
    return {"goals": goals}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=64, help="state size (default 64 MiB)")
    ap.add_argument("--large", action="store_true", help="also run a 1024 MiB state")
    ap.add_argument("--repeat", type=int, default=6, help="rounds after the warm-up (>= 6)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--json", type=Path, help="write every sample and the summary here")
    ap.add_argument("--methods", help=f"comma-separated subset of {','.join(METHODS)}")
    ap.add_argument("--torch-threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--inject-wrong-load", metavar="METHOD", help="damage METHOD's checkpoint")
    ap.add_argument(
        "--drop-caches",
        action="store_true",
        help="root: where posix_fadvise leaves pages resident, also write 1 to "
        "/proc/sys/vm/drop_caches (drops the whole machine's clean page cache)",
    )
    args = ap.parse_args()
    if args.repeat < 6:
        ap.error("--repeat must be at least 6 (a 95% interval from fewer rounds is too wide)")
    methods = list(METHODS)
    if args.methods:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            ap.error(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    if args.inject_wrong_load and args.inject_wrong_load not in set(methods) - set(REFERENCES):
        ap.error(f"--inject-wrong-load: {args.inject_wrong_load!r} is not a measured method")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    args.dir.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore", message=".*single process.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    info = machine(args.dir)
    print("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    sizes = [args.size_mb] + ([1024] if args.large and args.size_mb != 1024 else [])
    results = []
    failed = False
    for size in sizes:
        res = run_size(
            size, args.repeat, methods, args.dir, args.inject_wrong_load, args.drop_caches
        )
        res["summary"] = summarize(res)
        results.append(res)
        failed |= bool(res["failures"])
    info["loadavg_end"] = os.getloadavg()
    print(f"\nload average at the start {info['loadavg']}, at the end {info['loadavg_end']}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "results": results}, indent=1))
    if failed:
        for res in results:
            for f in res["failures"]:
                print(f"FAILED ({res['size_mb']} MiB): {f}", file=sys.stderr)
        print(
            "FAILED: a checkpoint loaded wrong (its timings are not in the tables)", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
