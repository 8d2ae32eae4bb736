"""`save`: write a `.many` checkpoint atomically, straight from the tensors' own buffers.

No pickle and no intermediate copy of the state: each tensor's memory is handed to `pwrite`
as a byte view, while a second thread hashes the same memory (BLAKE3 releases the GIL), so
hashing overlaps the write instead of adding to it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np

from serwatt.profiler.many.format import (
    ALL_RIGHTS,
    BFLOAT16,
    DESCRIPTOR_DTYPE,
    DTYPES,
    HEADER_SIZE,
    MINOR_SIGNED,
    PAGE_SIZE,
    SIGNATURE_BLOCK_SIZE,
    SLOT_HASHED,
    ZERO_DIGEST,
    Header,
    encode_table,
    rights_from,
    round_up,
)
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.signing import coerce_signing_key, signature_block

# Linux moves at most 0x7ffff000 bytes per write call; stay well under it.
_WRITE_CHUNK = 1 << 30
# Below this, a hashing thread costs more than it saves.
_THREAD_HASH_MIN_BYTES = 8 << 20

_NUMPY_CODES: dict[np.dtype, int] = {
    dt: code for code, (_, dt) in DTYPES.items() if code != BFLOAT16
}


@dataclass(frozen=True)
class SlotSource:
    """One slot to write: its layout, and its bytes (None = zeros, for `Arena.create`)."""

    name: str
    shape: tuple[int, ...]
    code: int
    length: int
    data: np.ndarray | None  # 1-D uint8 view of the tensor's memory, C-contiguous


_TORCH_CODES: dict[Any, int] = {}  # torch dtype -> code, built on first use (torch is optional)


def _torch_code(dtype: Any) -> int:
    if not _TORCH_CODES:
        import torch

        _TORCH_CODES.update(
            {
                torch.bool: 1,
                torch.uint8: 2,
                torch.int8: 3,
                torch.int16: 5,
                torch.int32: 7,
                torch.int64: 9,
                torch.float16: 10,
                torch.float32: 11,
                torch.float64: 12,
                torch.bfloat16: BFLOAT16,
                torch.complex64: 14,
                torch.complex128: 15,
            }
        )
        for name, code in (("uint16", 4), ("uint32", 6), ("uint64", 8)):
            if hasattr(torch, name):
                _TORCH_CODES[getattr(torch, name)] = code
    if dtype not in _TORCH_CODES:
        raise TypeError(f"torch dtype {dtype} has no .many dtype code (see FORMAT.md dtype table)")
    return _TORCH_CODES[dtype]


def slot_source(name: str, value: Any) -> SlotSource:
    """A byte view of one numpy array or CPU torch tensor, without copying when it is contiguous."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"state keys must be non-empty strings, got {name!r}")
    if type(value).__module__.startswith("torch"):
        import torch

        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name!r}: {type(value).__name__} is not a tensor")
        if value.device.type != "cpu":
            raise ValueError(
                f"{name!r} is on {value.device}; move it to the CPU first (tensor.cpu())"
            )
        t = value.detach().resolve_conj().resolve_neg()
        code = _torch_code(t.dtype)
        shape = tuple(int(d) for d in t.shape)
        # A non-contiguous tensor has no single byte range to write: one copy of that tensor.
        t = t.contiguous()
        if code == BFLOAT16:
            t = t.view(torch.int16)
        arr = t.numpy()
    elif isinstance(value, np.ndarray | np.generic):
        arr = np.asarray(value)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        code = _NUMPY_CODES.get(arr.dtype, 0)
        if not code:
            raise TypeError(
                f"{name!r}: numpy dtype {arr.dtype} has no .many dtype code (see FORMAT.md)"
            )
        shape = tuple(int(d) for d in arr.shape)
        arr = np.ascontiguousarray(arr)
    else:
        raise TypeError(
            f"{name!r}: {type(value).__name__} is not a numpy array or torch tensor; "
            ".many stores tensors (put other values in metadata=)"
        )
    data = arr.reshape(-1).view(np.uint8)
    return SlotSource(name, shape, code, int(data.nbytes), data)


def _pwrite_all(fd: int, buf: np.ndarray | bytes | memoryview, offset: int) -> None:
    view = buf.data if isinstance(buf, np.ndarray) else memoryview(buf)
    pos = 0
    while pos < len(view):
        n = os.pwrite(fd, view[pos : pos + _WRITE_CHUNK], offset + pos)
        if n <= 0:
            raise OSError(f"pwrite wrote {n} bytes")
        pos += n


def _hash_slots(sources: list[SlotSource], out: list[bytes]) -> None:
    zero_cache: dict[int, bytes] = {}
    for s in sources:
        if s.data is not None:
            out.append(blake3.blake3(s.data.data).digest())
        else:
            if s.length not in zero_cache:
                zero_cache[s.length] = _zeros_digest(s.length)
            out.append(zero_cache[s.length])


def _zeros_digest(length: int) -> bytes:
    h = blake3.blake3()
    zeros = bytes(min(length, 1 << 20))
    left = length
    while left:
        n = min(left, len(zeros))
        h.update(memoryview(zeros)[:n])
        left -= n
    return h.digest()


def fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(
    path: str | os.PathLike[str],
    sources: list[SlotSource],
    *,
    prev: Receipt | str | bytes | None = None,
    metadata: Mapping[str, Any] | None = None,
    rights: Mapping[str, str | int] | None = None,
    hash: bool = True,
    signing_key: Any = None,
) -> Receipt:
    """Lay out `sources` and write them to `path` atomically. Returns the new receipt."""
    path = os.fspath(path)
    prev_r = Receipt.coerce(prev)
    key = None if signing_key is None else coerce_signing_key(signing_key)
    meta = dict(metadata or {})
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata must be JSON-serializable: {exc}") from None
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError("state has duplicate names")
    unknown = set(rights or {}) - set(names)
    if unknown:
        raise KeyError(f"rights= names slots that are not in the state: {sorted(unknown)}")

    n = len(sources)
    desc = np.zeros(n, dtype=DESCRIPTOR_DTYPE)
    offset = 0
    for i, s in enumerate(sources):
        desc[i]["offset"] = offset
        desc[i]["length"] = s.length
        desc[i]["rights"] = rights_from((rights or {}).get(s.name, ALL_RIGHTS))
        desc[i]["dtype"] = s.code
        offset += round_up(s.length)
    state_length = offset
    table = encode_table(names, [s.shape for s in sources], meta)
    table_offset = HEADER_SIZE + 64 * n
    # Room for a signature block is always left, so an Arena can sign a later commit.
    state_offset = round_up(table_offset + len(table) + SIGNATURE_BLOCK_SIZE, PAGE_SIZE)
    file_length = state_offset + state_length

    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(
        directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        # Sets the size once; the gaps between slots stay holes and read as zeros.
        os.ftruncate(fd, file_length)
        digests: list[bytes] = []
        total = sum(s.length for s in sources)
        hasher: threading.Thread | None = None
        if hash and total >= _THREAD_HASH_MIN_BYTES:
            hasher = threading.Thread(target=_hash_slots, args=(sources, digests), daemon=True)
            hasher.start()
        try:
            for i, s in enumerate(sources):
                if s.data is not None and s.length:
                    _pwrite_all(fd, s.data, state_offset + int(desc[i]["offset"]))
        finally:
            if hasher is not None:
                hasher.join()
        if hash and hasher is None:
            _hash_slots(sources, digests)
        if hash:
            if len(digests) != n:
                raise RuntimeError("hashing thread failed; see the traceback above")
            desc["hash"] = np.frombuffer(b"".join(digests), dtype="V32") if n else desc["hash"]
            desc["flags"] = SLOT_HASHED
        header = Header(
            slot_count=n,
            table_offset=table_offset,
            table_length=len(table),
            state_offset=state_offset,
            state_length=state_length,
            file_length=file_length,
            table_hash=blake3.blake3(table).digest(),
            prev_receipt=prev_r.digest if prev_r else ZERO_DIGEST,
            # An unsigned file is a plain 1.0 file; signing gives the block its 1.1 meaning.
            version_minor=MINOR_SIGNED if key is not None else 0,
        )
        desc_bytes = desc.tobytes()
        header = header.with_receipt(desc_bytes)
        _pwrite_all(fd, header.pack() + desc_bytes + table, 0)
        if key is not None:
            _pwrite_all(
                fd, signature_block(key, header.receipt), state_offset - SIGNATURE_BLOCK_SIZE
            )
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path)
    return Receipt(header.receipt)


def save(
    path: str | os.PathLike[str],
    state: Mapping[str, Any],
    *,
    prev: Receipt | str | bytes | None = None,
    metadata: Mapping[str, Any] | None = None,
    rights: Mapping[str, str | int] | None = None,
    hash: bool = True,
    signing_key: Any = None,
) -> Receipt:
    """Write `state` (names -> numpy arrays or CPU torch tensors) to `path` as a `.many` file.

    Atomic: after a crash at any point `path` holds the old file or the new one (temp file in
    the same directory, fsync, rename, fsync the directory). `prev` links this checkpoint to
    the previous one's receipt; `metadata` is any JSON object; `rights` maps names to "r",
    "rw" (default) or "w"; `hash=False` skips the slot hashes (the receipt still covers the
    descriptors, but `verify` will report the bytes as unverifiable). `signing_key` (an
    Ed25519 private key, see `load_signing_key`) signs the receipt: `verify(path, key=pub)`
    then proves the file was written by the key's holder, not only that it is consistent.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of names to tensors, not {type(state).__name__}")
    sources = [slot_source(name, value) for name, value in state.items()]
    return write_file(
        path,
        sources,
        prev=prev,
        metadata=metadata,
        rights=rights,
        hash=hash,
        signing_key=signing_key,
    )


def layout_sources(specs: Iterable[tuple[str, Any]]) -> list[SlotSource]:
    """Zero-filled slots from (name, (shape, dtype)) or (name, example array) pairs."""
    out = []
    for name, spec in specs:
        if isinstance(spec, tuple) and len(spec) == 2:
            shape, dtype = spec
            shape = tuple(int(d) for d in (shape if isinstance(shape, tuple | list) else (shape,)))
            if isinstance(dtype, str) and dtype == "bfloat16":
                code = BFLOAT16
            else:
                code = _NUMPY_CODES.get(np.dtype(dtype), 0)
                if not code:
                    raise TypeError(f"{name!r}: dtype {dtype} has no .many dtype code")
            count = 1
            for d in shape:
                if d < 0:
                    raise ValueError(f"{name!r}: negative dimension in shape {shape}")
                count *= d
            length = count * DTYPES[code][1].itemsize
            out.append(SlotSource(name, shape, code, length, None))
        else:
            src = slot_source(name, spec)
            out.append(SlotSource(name, src.shape, src.code, src.length, None))
    return out
