"""PyTorch Distributed Checkpoint (DCP) storage that writes `.many` files.

    import torch.distributed.checkpoint as dcp
    from serwatt.profiler.many.dcp import ManyStorageReader, ManyStorageWriter

    dcp.save(state_dict, storage_writer=ManyStorageWriter("ckpt/100"))
    dcp.async_save(state_dict, storage_writer=writer, checkpoint_id="ckpt/200").result()
    dcp.load(state_dict, storage_reader=ManyStorageReader("ckpt/200"))

A checkpoint directory holds one `.many` file per rank that had something to write
(`rank<N>.many`: one slot per tensor chunk or DCP byte item) and `.metadata.many`, a
`.many` file with no slots whose JSON metadata is DCP's global `Metadata` plus the receipt
of every rank file, so the one receipt of `.metadata.many` vouches for the whole checkpoint.
Every file is written by `many.save` (temp file, fsync, rename, fsync the directory); the
coordinator writes `.metadata.many` only after every rank's file is durable, so a directory
with a readable `.metadata.many` whose rank receipts match is a complete checkpoint.

Nothing here pickles: DCP's `Metadata` is stored as checked JSON (`encode_metadata`,
`decode_metadata`). DCP's own non-tensor items (BYTE_IO: values DCP serialized with
`torch.save` into an `io.BytesIO`) are stored as uint8 slots, bytes untouched. On load DCP's
planner would unpickle them (DefaultLoadPlanner calls `torch.load(weights_only=False)`), and
a pickle runs whatever code it names, so the reader hands a byte item to the planner only
when its caller passes `allow_pickle=True`, and never where the caller's state dict holds a
tensor (a checkpoint that swaps a tensor for a byte item is forged). Without the opt-in a
byte item is a `ManyFormatError` naming its key, raised before any slot is read.

Receipts chain per rank: a writer remembers, per instance, the receipt of the file it wrote
last, and the next save's file names it as `prev_receipt` (`prev=` a previous checkpoint
directory starts the chain from that one's files). The reader checks each rank file's
receipt against the one `.metadata.many` lists, and with `verify=True` rehashes every slot.

torch is imported here at module level: this module is the optional DCP integration and is
not imported by `profiler.many`.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from serwatt.profiler.many.format import (
    DTYPE_CODE_BY_NAME,
    DTYPES,
    GRAD_DTYPE_CODES,
    MAX_EXTENT_BYTES,
    ManyFormatError,
)
from serwatt.profiler.many.names import show_name
from serwatt.profiler.many.reader import Checkpoint, load
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.writer import save
from serwatt.profiler.terminal_escape import escape_text

__all__ = [
    "METADATA_FILE",
    "ManyStorageInfo",
    "ManyStorageReader",
    "ManyStorageWriter",
    "decode_metadata",
    "encode_metadata",
]

METADATA_FILE = ".metadata.many"
MANIFEST_FORMAT = "serwatt.many.dcp/1"
# Rank files are plain names in the checkpoint directory: a manifest naming anything else
# (a path, `..`) is refused before any file is opened.
_RANK_FILE_RE = re.compile(r"rank(0|[1-9][0-9]{0,8})\.many")
_METADATA_KEY = "serwatt.dcp"

_MEMORY_FORMATS = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "preserve": torch.preserve_format,
}


@dataclass(frozen=True)
class ManyStorageInfo:
    """Where one DCP item lives: rank file, slot, and the receipt that file must carry."""

    file: str
    slot: str
    receipt: str


@dataclass(frozen=True)
class _RankFile:
    file: str


def _rank_file(rank: int) -> str:
    return f"rank{rank}.many"


def _slot_name(item: WriteItem) -> str:
    """The item's fqn; a chunk of a sharded tensor adds its index ranges: `w[0:64,0:128]`."""
    fqn = item.index.fqn
    td = item.tensor_data
    if td is None:
        return fqn
    offsets, sizes = list(td.chunk.offsets), list(td.chunk.sizes)
    if all(o == 0 for o in offsets) and sizes == list(td.size):
        return fqn
    ranges = ",".join(f"{o}:{o + s}" for o, s in zip(offsets, sizes, strict=True))
    return f"{fqn}[{ranges}]"


def _receipt_of(path: Path) -> Receipt | None:
    """The receipt of an existing `.many` file (structure checked, data not read), or None."""
    if not path.exists():
        return None
    with load(path, read="mmap") as ckpt:  # the header only: no slot is read
        return ckpt.receipt


class ManyStorageWriter(StorageWriter):
    """A DCP `StorageWriter` that writes each rank's items into one `.many` file.

    `path`: the checkpoint directory (created if missing; `checkpoint_id=` replaces it per
    save). `prev`: a previous checkpoint directory whose files start the receipt chains.
    `hash=False` skips slot hashes (faster; `verify` then reports the bytes as unverifiable).
    `overwrite=False` refuses a directory that already holds a checkpoint.

    Overwriting replaces each file atomically, not the directory: a crash midway leaves rank
    files whose receipts no longer match `.metadata.many`, which the reader refuses. Use a
    fresh directory per checkpoint to keep the previous one loadable.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        prev: str | os.PathLike[str] | None = None,
        hash: bool = True,
        overwrite: bool = True,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.hash = hash
        self.overwrite = overwrite
        self.save_id = str(uuid.uuid4())
        self.rank: int | None = None
        self.is_coordinator = False
        self.use_collectives = True
        self._prev_dir = Path(prev) if prev is not None else None
        # Receipts of the files this instance wrote last: the next save chains to them.
        self._lock = threading.Lock()
        self._prev_rank: Receipt | None = None
        self._prev_metadata: Receipt | None = None

    # -- DCP protocol ---------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.path), save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str | os.PathLike[str]:
        return self.path

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self.path.mkdir(parents=True, exist_ok=True)
        if (self.path / METADATA_FILE).exists() or (self.path / self._metadata_name()).exists():
            if not self.overwrite:
                raise FileExistsError(
                    f"{self.path} already holds a .many DCP checkpoint and overwrite=False; "
                    "save into a new directory (checkpoint_id=...) or pass overwrite=True"
                )
        if not self.use_collectives and self.rank is not None:
            plan = dataclasses.replace(plan, storage_data=_RankFile(_rank_file(self.rank)))
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [
            dataclasses.replace(plan, storage_data=_RankFile(_rank_file(i)))
            if plan.storage_data is None
            else plan
            for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        target = plan.storage_data
        if not isinstance(target, _RankFile):
            raise RuntimeError(
                "ManyStorageWriter.write_data got a plan without its rank file: DCP did not "
                "run prepare_global_plan/prepare_local_plan of this writer"
            )
        results: list[WriteResult] = []
        if plan.items:
            state: dict[str, Any] = {}
            slots: list[tuple[WriteItem, str, int]] = []
            for item in plan.items:
                name = _slot_name(item)
                if name in state:
                    raise ValueError(
                        f"two DCP items of rank {self.rank} map to the slot name {name!r}; "
                        "rename the state-dict key (a key that looks like a sharded chunk name)"
                    )
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    if not isinstance(data, io.BytesIO):
                        raise TypeError(f"{item.index.fqn!r}: DCP byte item is not an io.BytesIO")
                    # A view of the buffer DCP filled: written as is, never re-serialized.
                    value: Any = np.frombuffer(data.getbuffer(), dtype=np.uint8)
                else:
                    if not isinstance(data, torch.Tensor):
                        raise TypeError(f"{item.index.fqn!r}: DCP tensor item is not a tensor")
                    value = data.detach()
                    if value.device.type != "cpu":
                        value = value.cpu()
                state[name] = value
                slots.append((item, name, int(value.nbytes)))
            with self._lock:
                prev = self._prev_rank
                if prev is None and self._prev_dir is not None:
                    prev = _receipt_of(self._prev_dir / target.file)
                receipt = save(
                    self.path / target.file,
                    state,
                    prev=prev,
                    metadata={
                        _METADATA_KEY: {
                            "format": MANIFEST_FORMAT,
                            "rank": self.rank,
                            "save_id": self.save_id,
                        }
                    },
                    hash=self.hash,
                )
                self._prev_rank = receipt
            del state
            results = [
                WriteResult(
                    index=item.index,
                    size_in_bytes=nbytes,
                    storage_data=ManyStorageInfo(target.file, name, str(receipt)),
                )
                for item, name, nbytes in slots
            ]
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage: dict[MetadataIndex, ManyStorageInfo] = {}
        for rank_results in results:
            for wr in rank_results:
                if not isinstance(wr.storage_data, ManyStorageInfo):
                    raise TypeError("a write result did not come from ManyStorageWriter")
                storage[wr.index] = wr.storage_data
        metadata.storage_data = storage
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_meta = self.storage_meta()
        doc = encode_metadata(metadata)
        path = self.path / self._metadata_name()
        with self._lock:
            prev = self._prev_metadata
            if prev is None and self._prev_dir is not None:
                prev = _receipt_of(self._prev_dir / self._metadata_name())
            self._prev_metadata = save(path, {}, prev=prev, metadata={_METADATA_KEY: doc})

    def _metadata_name(self) -> str:
        if not self.use_collectives and self.rank is not None:
            return f"__{self.rank}{METADATA_FILE}"
        return METADATA_FILE

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _local_checkpoint_id(checkpoint_id)


class ManyStorageReader(StorageReader):
    """A DCP `StorageReader` for directories written by `ManyStorageWriter`.

    Each rank file is mapped (no bytes are read until a slot is copied into its target);
    its receipt must equal the one `.metadata.many` records. `verify=True` also rehashes
    every slot of each file it opens (a full read of those files).

    `allow_pickle=True` lets DCP's planner unpickle the checkpoint's byte items (its
    non-tensor values: ints, dicts, optimizer param_groups), which runs any code a forged
    file holds: pass it only for a checkpoint you trust. Without it, a plan that reads a
    byte item is refused. A byte item where the state dict being loaded holds a tensor is
    refused either way. Neither receipts nor `verify` tell a forged directory from a real
    one (anyone can recompute them); a signature verified with your key can.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify: bool = False,
        allow_pickle: bool = False,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.verify = verify
        self.allow_pickle = allow_pickle
        self.load_id = str(uuid.uuid4())
        self.storage_data: dict[MetadataIndex, ManyStorageInfo] = {}
        self._chunks: dict[tuple[str, tuple[int, ...]], tuple[torch.dtype, tuple[int, ...]]] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.storage_data = {}
        self._chunks = {}
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.load_id = str(uuid.uuid4())

    @property
    def checkpoint_id(self) -> str | os.PathLike[str]:
        return self.path

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"
        path = self.path / name
        if not path.exists():
            raise FileNotFoundError(
                f"{path} does not exist: {self.path} is not a complete .many DCP checkpoint "
                "(ManyStorageWriter writes this file last, after every rank file)"
            )
        with load(path, read="mmap") as manifest:  # its metadata only: no slot is read
            doc = manifest.metadata.get(_METADATA_KEY)
        try:
            metadata = decode_metadata(doc)
        except ManyFormatError as exc:
            raise ManyFormatError(exc.problems, str(path)) from None
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if not isinstance(metadata.storage_data, dict):
            raise ManyFormatError("DCP metadata has no storage_data", str(self.path))
        self.storage_data = metadata.storage_data
        self._chunks = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                for chunk in md.chunks:
                    key = (fqn, tuple(chunk.offsets))
                    self._chunks[key] = (md.properties.dtype, tuple(chunk.sizes))

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        self._refuse_unpickling(plan, planner)
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            info = self._info(req)
            per_file.setdefault(info.file, []).append(req)
        for file, reqs in per_file.items():
            path = self.path / file
            with load(path, verify=self.verify) as ckpt:
                want = self.storage_data[reqs[0].storage_index].receipt
                if str(ckpt.receipt) != want:
                    raise ManyFormatError(
                        f"receipt {ckpt.receipt} does not match {want} recorded in "
                        f"{METADATA_FILE}: the file was replaced after this checkpoint was "
                        "written (an overwrite that did not finish, or files mixed from two "
                        "checkpoints)",
                        str(path),
                    )
                for req in reqs:
                    self._read_one(ckpt, req, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _refuse_unpickling(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        """Every byte item the plan reads that the caller has not allowed, before any read."""
        # DefaultLoadPlanner keeps the (flattened) state dict being loaded; a custom planner
        # without one is checked by allow_pickle alone.
        held = getattr(planner, "state_dict", None)
        problems = []
        for req in plan.items:
            if req.type != LoadItemType.BYTE_IO:
                continue
            fqn = req.dest_index.fqn
            target = held.get(fqn) if isinstance(held, Mapping) else None
            if isinstance(target, torch.Tensor | ShardedTensor):
                problems.append(
                    f"{show_name(fqn)}: {METADATA_FILE} declares a byte item (a pickle DCP would "
                    "unpickle) where the state dict being loaded holds a tensor: a forged "
                    "checkpoint; refused even with allow_pickle=True"
                )
            elif not self.allow_pickle:
                problems.append(
                    f"{show_name(fqn)}: a DCP byte item (a non-tensor value), which DCP's planner "
                    "unpickles with torch.load(weights_only=False), running any code the file "
                    "holds; pass ManyStorageReader(..., allow_pickle=True) only for a "
                    "checkpoint you trust"
                )
            if len(problems) >= 10:
                break
        if problems:
            raise ManyFormatError(problems, str(self.path))

    def _info(self, req: ReadItem) -> ManyStorageInfo:
        try:
            info = self.storage_data[req.storage_index]
        except KeyError:
            raise ManyFormatError(
                f"{req.storage_index.fqn!r} (chunk at {list(req.storage_index.offset or [])}) "
                f"is not in {METADATA_FILE}'s storage table",
                str(self.path),
            ) from None
        return info

    def _read_one(self, ckpt: Checkpoint, req: ReadItem, planner: LoadPlanner) -> None:
        info = self._info(req)
        if info.slot not in ckpt:
            raise ManyFormatError(
                f"slot {info.slot!r} for {req.storage_index.fqn!r} is missing", ckpt.path
            )
        slot = ckpt.info(info.slot)
        if req.type == LoadItemType.BYTE_IO:
            if slot.dtype != "uint8" or len(slot.shape) != 1:
                raise ManyFormatError(
                    f"slot {info.slot!r} holds {slot.dtype} {list(slot.shape)}; a DCP byte item "
                    "is a 1-D uint8 slot",
                    ckpt.path,
                )
            planner.load_bytes(req, io.BytesIO(ckpt[info.slot].tobytes()))
            return
        key = (req.storage_index.fqn, tuple(req.storage_index.offset or ()))
        expected = self._chunks.get(key)
        tensor = ckpt.torch(info.slot)
        if expected is None or tensor.dtype != expected[0] or tuple(tensor.shape) != expected[1]:
            want = "nothing" if expected is None else f"{expected[0]} {list(expected[1])}"
            raise ManyFormatError(
                f"slot {info.slot!r} holds {tensor.dtype} {list(tensor.shape)} but "
                f"{METADATA_FILE} records {want} for this chunk",
                ckpt.path,
            )
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise ValueError(
                f"{req.dest_index.fqn!r}: the checkpoint region is {list(tensor.size())} but "
                f"the target region is {list(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return (
            _local_checkpoint_id(checkpoint_id) and (Path(checkpoint_id) / METADATA_FILE).exists()
        )


def _local_checkpoint_id(checkpoint_id: str | os.PathLike[str]) -> bool:
    return "://" not in str(checkpoint_id)


# -- DCP Metadata as JSON ---------------------------------------------------------
#
# DCP pickles its Metadata; here it is JSON with a fixed schema, checked field by field on
# the way back, so reading a checkpoint's metadata never runs code from the file.


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# The dtypes a rank file's slots can hold, so the only ones a chunk can be read back as:
# quantized, float8, sub-byte and other torch dtypes are refused at decode time.
_SLOT_DTYPES = ", ".join(name for name, _ in DTYPES.values())


def _dtype(name: Any, where: str) -> tuple[torch.dtype, int]:
    """(torch dtype, .many dtype code) for a dtype name a slot can hold."""
    code = DTYPE_CODE_BY_NAME.get(name) if isinstance(name, str) else None
    value = getattr(torch, name, None) if code is not None else None
    if code is None or not isinstance(value, torch.dtype):
        raise ManyFormatError(
            f"{where}: dtype {escape_text(str(name)[:40])!r} is not a torch dtype a .many slot "
            f"can hold ({_SLOT_DTYPES})"
        )
    return value, code


def _dims(value: Any, where: str) -> list[int]:
    """A list of at most 64 sizes or offsets, each a non-negative 64-bit integer."""
    if (
        type(value) is not list
        or len(value) > 64
        or not all(type(v) is int and 0 <= v <= MAX_EXTENT_BYTES for v in value)
    ):
        raise ManyFormatError(
            f"{where}: expected a list of at most 64 integers in [0, {MAX_EXTENT_BYTES}], "
            f"got {escape_text(str(value)[:80])}"
        )
    return value


def _check_extent(size: list[int], code: int, where: str) -> None:
    """Refuse a size torch cannot allocate: sizes and strides are signed 64-bit."""
    extent = DTYPES[code][1].itemsize
    for d in size:  # Python ints: no product can wrap
        extent *= max(d, 1)
    if extent > MAX_EXTENT_BYTES:
        raise ManyFormatError(
            f"{where}: {size} of {DTYPES[code][0]} spans {extent} bytes (zero dimensions "
            f"counted as 1), more than the {MAX_EXTENT_BYTES} torch can index"
        )


def _encode_value(value: Any, where: str) -> Any:
    """planner_data (DCP's flatten mapping: str -> tuple of str/int) as tagged JSON.

    Plain JSON for None/bool/int/str/list; {"tuple": [...]}, {"dict": [[k, v], ...]},
    {"float": "repr"} for the rest, so a JSON object is always a tag and never ambiguous.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, list):
        return [_encode_value(v, where) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode_value(v, where) for v in value]}
    if isinstance(value, Mapping):
        return {
            "dict": [[_encode_value(k, where), _encode_value(v, where)] for k, v in value.items()]
        }
    raise TypeError(
        f"{where}: {type(value).__name__} cannot be stored without pickling; .many DCP "
        "storage keeps planner data of None, bool, int, float, str, list, tuple and dict"
    )


def _decode_value(value: Any, where: str, depth: int = 0) -> Any:
    if depth > 64:
        raise ManyFormatError(f"{where}: nested more than 64 levels")
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, list):
        return [_decode_value(v, where, depth + 1) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        ((tag, body),) = value.items()
        if tag == "float" and isinstance(body, str):
            try:
                return float(body)
            except ValueError:
                pass
        elif tag == "tuple" and isinstance(body, list):
            return tuple(_decode_value(v, where, depth + 1) for v in body)
        elif tag == "dict" and isinstance(body, list):
            out = {}
            for pair in body:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ManyFormatError(f"{where}: a dict entry is not a [key, value] pair")
                k = _decode_value(pair[0], where, depth + 1)
                try:
                    out[k] = _decode_value(pair[1], where, depth + 1)
                except TypeError:
                    raise ManyFormatError(f"{where}: unhashable dict key") from None
            return out
    raise ManyFormatError(f"{where}: {str(value)[:60]!r} is not a tagged planner value")


def encode_metadata(metadata: Metadata) -> dict[str, Any]:
    """DCP `Metadata` (with `ManyStorageInfo` storage data) as a JSON-able dict."""
    known = {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"}
    for f in dataclasses.fields(metadata):
        if f.name not in known and getattr(metadata, f.name) is not None:
            raise TypeError(
                f"DCP Metadata field {f.name!r} is new to this version of ManyStorageWriter; "
                "it cannot be stored without pickling (update profiler/many/dcp.py)"
            )
    sdm: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            sdm[fqn] = {"kind": "bytes"}
            continue
        if not isinstance(md, TensorStorageMetadata):
            raise TypeError(f"{fqn!r}: unknown DCP storage metadata {type(md).__name__}")
        p = md.properties
        if p.layout != torch.strided:
            raise TypeError(f"{fqn!r}: layout {p.layout} is not stored (.many holds dense tensors)")
        fmt = next((k for k, v in _MEMORY_FORMATS.items() if v == p.memory_format), None)
        if fmt is None:
            raise TypeError(f"{fqn!r}: memory format {p.memory_format} is not known")
        sdm[fqn] = {
            "kind": "tensor",
            "dtype": _dtype_name(p.dtype),
            "requires_grad": bool(p.requires_grad),
            "memory_format": fmt,
            "pin_memory": bool(p.pin_memory),
            "size": list(md.size),
            "chunks": [[list(c.offsets), list(c.sizes)] for c in md.chunks],
        }
    storage = []
    for index, info in (metadata.storage_data or {}).items():
        storage.append(
            {
                "fqn": index.fqn,
                "offset": None if index.offset is None else list(index.offset),
                "index": index.index,
                "file": info.file,
                "slot": info.slot,
                "receipt": info.receipt,
            }
        )
    sm = metadata.storage_meta
    return {
        "format": MANIFEST_FORMAT,
        "version": metadata.version,
        "state_dict_metadata": sdm,
        "planner_data": _encode_value(metadata.planner_data, "planner_data"),
        "storage_data": storage,
        "storage_meta": None
        if sm is None
        else {
            "checkpoint_id": None if sm.checkpoint_id is None else str(sm.checkpoint_id),
            "save_id": sm.save_id,
            "modules": list(sm.modules),
        },
    }


def decode_metadata(doc: Any) -> Metadata:
    """The inverse of `encode_metadata`; every malformed field is a `ManyFormatError`."""
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ManyFormatError(
            f"no {MANIFEST_FORMAT} manifest in the metadata (not written by ManyStorageWriter)"
        )
    version = doc.get("version")
    if version is not None and not isinstance(version, str):
        raise ManyFormatError("manifest 'version' is not a string")
    sdm_doc = doc.get("state_dict_metadata")
    if not isinstance(sdm_doc, dict):
        raise ManyFormatError("manifest 'state_dict_metadata' is not an object")
    sdm: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    for fqn, md in sdm_doc.items():
        where = f"state_dict_metadata {fqn[:60]!r}"
        if not isinstance(md, dict) or md.get("kind") not in ("bytes", "tensor"):
            raise ManyFormatError(f"{where}: 'kind' is not 'bytes' or 'tensor'")
        if md["kind"] == "bytes":
            sdm[fqn] = BytesStorageMetadata()
            continue
        fmt = md.get("memory_format")
        if fmt not in _MEMORY_FORMATS:
            raise ManyFormatError(f"{where}: unknown memory_format {escape_text(str(fmt)[:20])!r}")
        requires_grad, pin_memory = md.get("requires_grad"), md.get("pin_memory")
        if not isinstance(requires_grad, bool) or not isinstance(pin_memory, bool):
            raise ManyFormatError(f"{where}: requires_grad and pin_memory must be booleans")
        dtype, code = _dtype(md.get("dtype"), where)
        if requires_grad and code not in GRAD_DTYPE_CODES:
            raise ManyFormatError(
                f"{where}: requires_grad is true but dtype {DTYPES[code][0]} cannot require "
                "grad (only floating point and complex tensors can)"
            )
        size = _dims(md.get("size"), where + " size")
        _check_extent(size, code, where + " size")
        if fmt == "channels_last" and len(size) != 4:
            raise ManyFormatError(
                f"{where}: memory_format channels_last needs a 4-D tensor, size is {size}"
            )
        chunks_doc = md.get("chunks")
        if not isinstance(chunks_doc, list):
            raise ManyFormatError(f"{where}: 'chunks' is not a list")
        chunks = []
        for c in chunks_doc:
            if not isinstance(c, list) or len(c) != 2:
                raise ManyFormatError(f"{where}: a chunk is not [offsets, sizes]")
            offsets, sizes = _dims(c[0], where + " chunk"), _dims(c[1], where + " chunk")
            if len(offsets) != len(size) or len(sizes) != len(size):
                raise ManyFormatError(f"{where}: chunk rank differs from the tensor's")
            if any(
                o < 0 or s < 0 or o + s > d for o, s, d in zip(offsets, sizes, size, strict=True)
            ):
                raise ManyFormatError(f"{where}: chunk {offsets}+{sizes} lies outside {size}")
            chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
        properties = TensorProperties(
            dtype=dtype,
            layout=torch.strided,
            requires_grad=requires_grad,
            memory_format=_MEMORY_FORMATS[fmt],
            pin_memory=pin_memory,
        )
        sdm[fqn] = TensorStorageMetadata(properties, torch.Size(size), chunks)
    storage_doc = doc.get("storage_data")
    if not isinstance(storage_doc, list):
        raise ManyFormatError("manifest 'storage_data' is not a list")
    storage: dict[MetadataIndex, ManyStorageInfo] = {}
    for entry in storage_doc:
        if not isinstance(entry, dict):
            raise ManyFormatError("a storage_data entry is not an object")
        fqn, file, slot, receipt = (entry.get(k) for k in ("fqn", "file", "slot", "receipt"))
        if not all(isinstance(v, str) for v in (fqn, file, slot, receipt)):
            raise ManyFormatError("a storage_data entry lacks fqn, file, slot or receipt")
        assert isinstance(fqn, str) and isinstance(file, str)
        assert isinstance(slot, str) and isinstance(receipt, str)
        where = f"storage_data {fqn[:60]!r}"
        if fqn not in sdm:
            raise ManyFormatError(f"{where}: not in state_dict_metadata")
        if not _RANK_FILE_RE.fullmatch(file):
            raise ManyFormatError(f"{where}: file {file[:60]!r} is not a rank file name")
        try:
            Receipt.parse(receipt)
        except ValueError as exc:
            raise ManyFormatError(f"{where}: {exc}") from None
        offset = entry.get("offset")
        index = entry.get("index")
        if index is not None and (type(index) is not int or not 0 <= index <= MAX_EXTENT_BYTES):
            raise ManyFormatError(f"{where}: 'index' is not a non-negative 64-bit integer")
        key = MetadataIndex(
            fqn, None if offset is None else _dims(offset, where + " offset"), index
        )
        storage[key] = ManyStorageInfo(file, slot, receipt)
    sm_doc = doc.get("storage_meta")
    storage_meta = None
    if sm_doc is not None:
        if not isinstance(sm_doc, dict):
            raise ManyFormatError("manifest 'storage_meta' is not an object")
        ckpt_id, save_id, modules = (sm_doc.get(k) for k in ("checkpoint_id", "save_id", "modules"))
        if not all(v is None or isinstance(v, str) for v in (ckpt_id, save_id)):
            raise ManyFormatError("manifest storage_meta ids are not strings")
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            raise ManyFormatError("manifest storage_meta 'modules' is not a list of strings")
        storage_meta = StorageMeta(checkpoint_id=ckpt_id, save_id=save_id, modules=modules)
    return Metadata(
        state_dict_metadata=sdm,
        planner_data=_decode_value(doc.get("planner_data"), "planner_data"),
        storage_data=storage,
        storage_meta=storage_meta,
        version=version,
    )
