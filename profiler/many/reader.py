"""`load`: map a `.many` file and rebind its descriptors to zero-copy views.

Cost is O(slots): the header, the descriptor arena and the name table are read and checked;
tensor bytes stay on disk (or in the page cache) until a view is touched. Nothing in the file
is executed: the only decoder is `json.loads` on the bounded name table.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from profiler.many.format import (
    DESCRIPTOR_DTYPE,
    DTYPES,
    HEADER_DIRTY,
    HEADER_SIZE,
    RIGHT_READ,
    SLOT_HASHED,
    ZERO_DIGEST,
    Header,
    ManyError,
    ManyFormatError,
    Table,
    check_all_shapes,
    check_descriptors,
    check_shape,
    parse_header,
    parse_table,
    rights_text,
)
from profiler.many.receipt import Receipt


class RightsError(ManyError, PermissionError):
    """The slot's descriptor does not grant the right the operation needs."""


@dataclass(frozen=True)
class SlotInfo:
    """One descriptor, decoded, with its name and shape from the table."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int  # absolute byte offset in the file
    length: int
    rights: int
    generation: int
    hashed: bool
    hash: bytes

    @property
    def rights_text(self) -> str:
        return rights_text(self.rights)


@dataclass
class Parsed:
    """A checked file: header, table and the descriptor arena as a structured array."""

    header: Header
    table: Table
    desc: np.ndarray

    def shape(self, i: int) -> tuple[int, ...]:
        """Slot i's shape, checked against its descriptor (raises ManyFormatError)."""
        d = self.desc[i]
        return check_shape(
            self.table.shapes[i],
            int(d["dtype"]),
            int(d["length"]),
            f"slot {i} {self.table.names[i]!r}",
        )

    def slot(self, i: int) -> SlotInfo:
        d = self.desc[i]
        return SlotInfo(
            index=i,
            name=self.table.names[i],
            shape=self.shape(i),
            dtype=DTYPES[int(d["dtype"])][0],
            offset=self.header.state_offset + int(d["offset"]),
            length=int(d["length"]),
            rights=int(d["rights"]),
            generation=int(d["generation"]),
            hashed=bool(int(d["flags"]) & SLOT_HASHED),
            hash=bytes(d["hash"]),
        )


def parse_mapped(
    buf: Any, file_size: int, path: str | None = None, *, all_shapes: bool = False
) -> Parsed:
    """Check header, table and descriptors of a mapped (or in-memory) file image.

    Each slot's shape is checked when the slot is first bound (`Parsed.shape`), which keeps
    `load` to a few vectorized passes; `all_shapes=True` checks them all now.
    """
    try:
        header = parse_header(bytes(buf[:HEADER_SIZE]), file_size)
        table = parse_table(
            bytes(buf[header.table_offset : header.table_offset + header.table_length]), header
        )
        desc = np.frombuffer(
            buf, dtype=DESCRIPTOR_DTYPE, count=header.slot_count, offset=HEADER_SIZE
        )
        check_descriptors(desc, header, table)
        if all_shapes:
            problems = check_all_shapes(desc, table)
            if problems:
                raise ManyFormatError(problems)
    except ManyFormatError as exc:
        if path and exc.path is None:
            raise ManyFormatError(exc.problems, path) from None
        raise
    return Parsed(header, table, desc)


def open_mapped(
    path: str | os.PathLike[str], *, writable: bool = False, all_shapes: bool = False
) -> tuple[mmap.mmap, Parsed]:
    path = os.fspath(path)
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
    if os.path.isdir(path):
        raise ManyFormatError("is a directory, not a .many file", path)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManyFormatError("not a regular file: a .many checkpoint must be mappable", path)
        size = st.st_size
        if size < HEADER_SIZE:
            raise ManyFormatError(
                f"truncated: file is {size} bytes, smaller than the {HEADER_SIZE}-byte header", path
            )
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)
    try:
        parsed = parse_mapped(mm, size, path, all_shapes=all_shapes or writable)
    except BaseException:
        try:
            mm.close()
        except BufferError:
            pass  # the failed parse's traceback still holds a view; GC unmaps it
        raise
    return mm, parsed


class Checkpoint(Mapping[str, np.ndarray]):
    """A loaded `.many` file: a read-only mapping of names to zero-copy numpy views.

    Views are built on first access (O(1) each) and are read-only: they point into a
    read-only shared mapping of the file. `torch(name)` gives a tensor over a private
    (copy-on-write) mapping, so writing to it never touches the file. `close()` drops the
    mapping; views still alive keep it mapped until they are freed.
    """

    def __init__(self, path: str, mm: mmap.mmap, parsed: Parsed) -> None:
        self.path = path
        self._mm: mmap.mmap | None = mm
        self._cow: mmap.mmap | None = None
        self._parsed = parsed
        self._index = dict(zip(parsed.table.names, range(len(parsed.table.names)), strict=True))
        self._views: dict[str, np.ndarray] = {}

    # -- identity ---------------------------------------------------------
    @property
    def receipt(self) -> Receipt:
        return Receipt(self._parsed.header.receipt)

    @property
    def prev_receipt(self) -> Receipt | None:
        prev = self._parsed.header.prev_receipt
        return None if prev == ZERO_DIGEST else Receipt(prev)

    @property
    def metadata(self) -> dict[str, Any]:
        return self._parsed.table.metadata

    @property
    def header(self) -> Header:
        return self._parsed.header

    @property
    def dirty(self) -> bool:
        return bool(self._parsed.header.flags & HEADER_DIRTY)

    def slots(self) -> list[SlotInfo]:
        return [self._parsed.slot(i) for i in range(len(self._index))]

    def info(self, name: str) -> SlotInfo:
        return self._parsed.slot(self._slot_index(name))

    # -- mapping ----------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> np.ndarray:
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = self._view(name)
        return view

    def _slot_index(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"{name!r} is not a slot of {self.path}") from None

    def _view(self, name: str) -> np.ndarray:
        if self._mm is None:
            raise ValueError(f"{self.path} is closed")
        i = self._slot_index(name)
        d = self._parsed.desc[i]
        if not int(d["rights"]) & RIGHT_READ:
            raise RightsError(f"slot {name!r} of {self.path} does not grant the read right")
        dtype = DTYPES[int(d["dtype"])][1]
        shape = self._parsed.shape(i)
        if int(d["length"]) == 0:
            arr = np.empty(shape, dtype=dtype)
            arr.flags.writeable = False
            return arr
        return np.ndarray(
            shape,
            dtype=dtype,
            buffer=self._mm,
            offset=self._parsed.header.state_offset + int(d["offset"]),
        )

    def torch(self, name: str) -> Any:
        """The slot as a torch tensor over a private copy-on-write mapping (bfloat16 restored)."""
        import torch

        i = self._slot_index(name)
        d = self._parsed.desc[i]
        if not int(d["rights"]) & RIGHT_READ:
            raise RightsError(f"slot {name!r} of {self.path} does not grant the read right")
        code = int(d["dtype"])
        tdtype = getattr(torch, DTYPES[code][0])
        shape = self._parsed.shape(i)
        length = int(d["length"])
        if length == 0:
            return torch.empty(shape, dtype=tdtype)
        if self._cow is None:
            if self._mm is None:
                raise ValueError(f"{self.path} is closed")
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._cow = mmap.mmap(fd, len(self._mm), access=mmap.ACCESS_COPY)
            finally:
                os.close(fd)
        raw = torch.frombuffer(
            self._cow,
            dtype=torch.uint8,
            count=length,
            offset=self._parsed.header.state_offset + int(d["offset"]),
        )
        return raw.view(tdtype).reshape(shape)

    def to_torch(self) -> dict[str, Any]:
        return {name: self.torch(name) for name in self._index}

    def prefetch(self) -> None:
        """Ask the kernel to read the whole file ahead (MADV_WILLNEED); returns at once."""
        if self._mm is not None:
            self._mm.madvise(mmap.MADV_WILLNEED)

    def close(self) -> None:
        self._views.clear()
        for attr in ("_mm", "_cow"):
            m = getattr(self, attr)
            setattr(self, attr, None)
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass  # a caller still holds a view; the mapping goes when the view does

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Checkpoint {self.path} slots={len(self)} {self.receipt}>"


def load(path: str | os.PathLike[str], *, verify: bool = False) -> Checkpoint:
    """Map `path` and return a `Checkpoint` (O(slots); tensor pages are read when touched).

    With `verify=True` every slot is rehashed and the receipt recomputed first; any problem
    raises `ManyFormatError` listing them.
    """
    path = os.fspath(path)
    mm, parsed = open_mapped(path)
    ckpt = Checkpoint(path, mm, parsed)
    if verify:
        from profiler.many.verify import check_mapped

        problems = check_mapped(mm, parsed)
        if problems:
            ckpt.close()
            raise ManyFormatError(problems, path)
    return ckpt
