"""`save` / `load` with torch.save / torch.load's signatures, writing `.many` state files.

A training script switches with one line:

    from serwatt.profiler.many import torch_compat as ckpt
    ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": i}, path)
    state = ckpt.load(path, map_location="cpu")

Scope (docs/many.md, "Whole checkpoints" has the full list): what `save_state` stores (dicts,
OrderedDicts, lists, tuples; tensors, numpy arrays, JSON scalars) and nothing else: no
pickled objects, so no modules, optimizers, dataclasses, torch.Size, torch.dtype or custom
classes. Paths are mapped copy-on-write (nothing read until touched); file objects are read
into memory. `weights_only` is accepted and makes no difference: the format can hold nothing
that `weights_only=True` would refuse to run, because it can hold no code at all.

Receipts chain within a directory by default: `save(obj, "ckpt/step-200.many")` names the
receipt of the newest other `.many` file in `ckpt/` as its `prev`, the newest by
`directory_chain` (modification time, then name: the order `serwatt report --checkpoints
DIR` verifies), as the training workload and `Checkpointer` continue the chain from the
newest checkpoint already there. `prev=` names another receipt; `prev=None` starts a new
chain (the file has no prev); a file object has no directory, so it chains only to `prev=`.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import struct
import tempfile
from collections.abc import Callable, Mapping
from typing import IO, Any

from serwatt.profiler.many.format import HEADER_SIZE, MAGIC, ManyFormatError
from serwatt.profiler.many.reader import load as load_many
from serwatt.profiler.many.reader import open_regular
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.state import open_state, save_state

log = logging.getLogger(__name__)

FileLike = str | os.PathLike[str] | IO[bytes]
# Reading a file object in bounded pieces: a hostile header's file_length cannot make one
# read allocate more than this before the bytes are actually there.
_READ_CHUNK = 64 << 20
_FILE_LENGTH = struct.Struct("<Q")  # header field file_length at offset 72 (FORMAT.md)
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = b"\x80"


class _ChainInDirectory:
    """save()'s default `prev`: the newest other .many file in the target's directory."""

    def __repr__(self) -> str:
        return "CHAIN_IN_DIRECTORY"


CHAIN_IN_DIRECTORY = _ChainInDirectory()


def directory_chain(directory: str | os.PathLike[str]) -> list[str]:
    """The `.many` files directly in `directory`, in chain order: oldest first by
    modification time, then by name (a directory's files have no other order that every
    writer keeps)."""
    found = []
    with os.scandir(directory) as it:
        for entry in it:
            if entry.name.endswith(".many") and entry.is_file():
                found.append((entry.stat().st_mtime_ns, entry.name, entry.path))
    return [path for _, _, path in sorted(found)]


def newest_receipt(directory: str | os.PathLike[str], *, besides: str) -> Receipt | None:
    """The receipt of the newest readable .many file in `directory` other than `besides`
    (the file about to be written, which a save replaces); None when there is none."""
    target = os.path.realpath(besides)
    for path in reversed(directory_chain(directory)):
        if os.path.realpath(path) == target:
            continue
        try:
            ckpt = load_many(path, read="mmap")  # the receipt only: no slot is read
        except (ManyFormatError, OSError) as exc:
            log.warning("many torch_compat: skipping unreadable %s for the chain: %s", path, exc)
            continue
        receipt = ckpt.receipt
        ckpt.close()
        return receipt
    return None


def save(
    obj: Any,
    f: FileLike,
    pickle_module: Any = None,
    pickle_protocol: int | None = None,
    _use_new_zipfile_serialization: bool = True,
    _disable_byteorder_record: bool = False,
    *,
    prev: Receipt | str | bytes | _ChainInDirectory | None = CHAIN_IN_DIRECTORY,
    metadata: Mapping[str, Any] | None = None,
) -> Receipt:
    """Write `obj` to `f` (a path, or a binary file object written at its position) as `.many`.

    The torch.save arguments after `f` are accepted for signature compatibility; nothing is
    pickled, so `pickle_module` must be None or the `pickle` module. To a path the write is
    atomic (temp file, fsync, rename, directory fsync). Returns the checkpoint's receipt.

    `prev` (not in torch.save): by default, to a path, the receipt of the newest other .many
    file in its directory (module docstring); a receipt to chain to; None for no prev.
    """
    _check_pickle_module(pickle_module)
    if isinstance(f, str | os.PathLike):
        if isinstance(prev, _ChainInDirectory):
            path = os.fspath(f)
            prev = newest_receipt(os.path.dirname(os.path.abspath(path)), besides=path)
        return save_state(f, obj, prev=prev, metadata=metadata)
    if not hasattr(f, "write"):
        raise TypeError(f"f must be a path or a binary file object, not {type(f).__name__}")
    if isinstance(prev, _ChainInDirectory):
        prev = None  # a file object has no directory to chain within
    # The writer lays files out on disk (holes, pwrite); a file object gets a copy of that file.
    with tempfile.TemporaryDirectory(prefix="many-save-") as tmp:
        path = os.path.join(tmp, "state.many")
        receipt = save_state(path, obj, prev=prev, metadata=metadata)
        with open(path, "rb") as src:
            shutil.copyfileobj(src, f, _READ_CHUNK)
    return receipt


def load(
    f: FileLike,
    map_location: Any = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    mmap: bool | None = None,
    verify: bool = False,
    **pickle_load_args: Any,
) -> Any:
    """Read a state saved by `save` (or `many.save_state`) from a path or binary file object.

    `map_location`: None, "cpu", a torch.device or device string (tensors are moved there
    with `.to`), a dict mapping saved locations to new ones (every tensor was saved from
    "cpu", so only its "cpu" entry matters), or a callable `(storage, location) -> storage
    or None` as in torch.load. `weights_only` and `mmap` are accepted and change nothing
    (a path is read as `many.load`'s read="auto" reads it: mapped, or copied whole when it
    is on a network or FUSE filesystem; the environment variable SERWATT_MANY_READ=mmap
    or copy overrides that; file objects are always read); `pickle_module` must be None or
    `pickle`; `pickle_load_args` may only be `encoding`, which is ignored (there is no
    pickle). `verify=True` (not in torch.load) rehashes every byte first.
    """
    del weights_only, mmap
    _check_pickle_module(pickle_module)
    unknown = set(pickle_load_args) - {"encoding"}
    if unknown:
        raise TypeError(
            f"load() got unsupported pickle_load_args {sorted(unknown)}: nothing is unpickled"
        )
    hook = _location_hook(map_location)
    if isinstance(f, str | os.PathLike):
        try:
            return open_state(f, verify=verify, tensor_hook=hook).tree
        except ManyFormatError as exc:
            raise _explain_foreign(exc, _peek(os.fspath(f))) from None
    if not hasattr(f, "read"):
        raise TypeError(f"f must be a path or a binary file object, not {type(f).__name__}")
    image = _read_image(f)
    try:
        return open_state(image, verify=verify, tensor_hook=hook).tree
    except ManyFormatError as exc:
        raise _explain_foreign(exc, bytes(image[:8])) from None


def _check_pickle_module(pickle_module: Any) -> None:
    if pickle_module is not None and pickle_module is not pickle:
        raise TypeError(
            "pickle_module is not supported: .many stores no pickles (tensors and JSON only)"
        )


def _read_image(f: IO[bytes]) -> bytearray:
    """One `.many` image from the file object's position, leaving it just past the image."""
    head = f.read(HEADER_SIZE)
    if not isinstance(head, bytes | bytearray):
        raise TypeError("f must be opened in binary mode ('rb')")
    image = bytearray(head)
    if len(head) == HEADER_SIZE and head[:8] == MAGIC:
        want = _FILE_LENGTH.unpack_from(head, 72)[0]
        while len(image) < want:
            piece = f.read(min(_READ_CHUNK, want - len(image)))
            if not piece:
                break
            image += piece
    return image


def _peek(path: str) -> bytes:
    """The first bytes of `path` for the torch.save hint, through the readers' one open: a
    FIFO or device the loader just refused must not block or be read here either."""
    try:
        fd, _size = open_regular(path)
    except (ManyFormatError, OSError):
        return b""
    try:
        return os.pread(fd, 8, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _explain_foreign(exc: ManyFormatError, head: bytes) -> ManyFormatError:
    """The error, with the likely cause added when the file is a torch.save file."""
    if head.startswith(_ZIP_MAGIC) or head.startswith(_PICKLE_PROTO):
        hint = (
            "this looks like a torch.save file (zip or pickle), not .many: read it with "
            "torch.load, then save it again with torch_compat.save to convert it"
        )
        return ManyFormatError([*exc.problems, hint], exc.path)
    return exc


def _location_hook(map_location: Any) -> Callable[[Any], Any] | None:
    """map_location as a per-slot tensor hook (None when tensors stay where they are mapped)."""
    if map_location is None:
        return None
    import torch

    if isinstance(map_location, Mapping):
        target = map_location.get("cpu", "cpu")
        return _location_hook(target)
    if isinstance(map_location, str | torch.device):
        device = torch.device(map_location)
        if device.type == "cpu":
            return None
        return lambda t: t.to(device)
    if callable(map_location):
        fn = map_location

        def hook(t: Any) -> Any:
            storage = t.untyped_storage()
            moved = fn(storage, "cpu")
            if moved is None or moved is storage:
                return t
            if not isinstance(moved, torch.UntypedStorage | torch.TypedStorage):
                raise TypeError(
                    f"map_location callable returned {type(moved).__name__}, not a storage or None"
                )
            if isinstance(moved, torch.TypedStorage):
                moved = moved.untyped()
            out = torch.empty((0,), dtype=t.dtype, device=moved.device)
            return out.set_(moved, 0, t.shape, t.stride())

        return hook
    raise TypeError(
        "map_location must be None, a device string, a torch.device, a dict or a callable, "
        f"not {type(map_location).__name__}"
    )


__all__ = ["CHAIN_IN_DIRECTORY", "directory_chain", "load", "save"]
