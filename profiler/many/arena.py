"""`Arena`: a live `.many` file mapped shared, updated in place slot by slot.

An update writes one slot's bytes where they already are, rehashes that slot, bumps its
generation and rewrites its 64-byte descriptor: Python-side work and memory are O(1) per
slot, independent of the arena's total size. `commit()` makes a new receipt durable.
A `Handle` remembers the generation it was taken at; updating through an older handle is
refused, so two writers cannot silently overwrite each other's newer data.
"""

from __future__ import annotations

import os
import struct
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import blake3
import numpy as np

from serwatt.profiler.many.format import (
    BFLOAT16,
    DTYPES,
    HEADER_DIRTY,
    HEADER_SIZE,
    MINOR_SIGNED,
    RIGHT_READ,
    RIGHT_WRITE,
    SIGNATURE_BLOCK_SIZE,
    SLOT_HASHED,
    ManyError,
)
from serwatt.profiler.many.reader import RightsError, SlotInfo, open_checked, require_intact
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.signing import coerce_signing_key, signature_block
from serwatt.profiler.many.writer import layout_sources, slot_source, write_file

_FLAGS_AT = 28  # byte offset of the header `flags` field (FORMAT.md)
_THREADED_MIN_BYTES = 4 << 20
_EMPTY_DIGEST = blake3.blake3().digest()


class _SlotViews(NamedTuple):
    """One slot's views into the shared mapping, made on its first update and kept."""

    typed: np.ndarray  # the slot's dtype and shape
    flat: np.ndarray  # the same bytes as uint8[length]
    bytes: memoryview  # of `flat`, for the hasher
    shape: tuple[int, ...]


class StaleHandleError(ManyError):
    """The handle was taken at an older generation than the slot now holds."""


@dataclass(frozen=True, slots=True)
class Handle:
    """A capability to one slot at one generation (from `Arena.handle` or `Arena.update`)."""

    name: str
    index: int
    generation: int


class Arena:
    """A writable `.many` file. Open an existing one with `Arena(path)`, or lay out a new
    zero-filled one with `Arena.create(path, specs)`.

    In-place updates are detectable, not atomic: between `update` and `commit` the header
    carries the DIRTY flag and the old receipt, which `verify` reports. For an atomic
    snapshot use `save`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        opened = open_checked(self.path, writable=True)
        self._fd, self._mm, self._parsed = opened.fd, opened.mm, opened.parsed
        self._close_fd = weakref.finalize(self, os.close, opened.fd)
        self._index = {name: i for i, name in enumerate(self._parsed.table.names)}
        n = len(self._index)
        self._dirty_slots: set[int] = set()
        self._closed = False
        # The update path reuses, per arena, one single-thread hasher and, per slot, its views
        # into the mapping (typed and bytes): after a slot's first update, updating it builds
        # neither (tests/many/test_many_proofs.py counts what an update still allocates).
        self._hasher = blake3.blake3(max_threads=1)
        self._views: list[_SlotViews | None] = [None] * n
        # Rights, dtype codes and lengths never change in place; the generation, flags and
        # hash fields are written through memoryviews of the descriptor arena, which (unlike
        # numpy field access on a structured row) build no objects per store.
        desc = self._parsed.desc
        self._rights = [int(r) for r in desc["rights"]]
        self._codes = [int(c) for c in desc["dtype"]]
        self._lengths = [int(x) for x in desc["length"]]
        self._hashed_flags = [int(f) | SLOT_HASHED for f in desc["flags"]]
        arena_bytes = memoryview(self._mm)[HEADER_SIZE : HEADER_SIZE + 64 * n]
        self._desc_bytes = arena_bytes
        self._desc_u64 = arena_bytes.cast("Q")  # generation of slot i at 8*i + 3
        self._desc_u16 = arena_bytes.cast("H")  # flags of slot i at 32*i + 11
        self._hash_at = [slice(64 * i + 32, 64 * i + 64) for i in range(n)]
        self._generation_at = [8 * i + 3 for i in range(n)]
        self._flags_at = [32 * i + 11 for i in range(n)]

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        specs: Mapping[str, Any] | Iterable[tuple[str, Any]],
        *,
        prev: Receipt | str | None = None,
        metadata: Mapping[str, Any] | None = None,
        rights: Mapping[str, str | int] | None = None,
        signing_key: Any = None,
    ) -> Arena:
        """Lay out a zero-filled arena (a sparse file) and open it.

        `specs` maps names to `(shape, dtype)` pairs or to example arrays/tensors whose
        shape and dtype are used (their values are not written).
        """
        items = specs.items() if isinstance(specs, Mapping) else specs
        write_file(
            path,
            layout_sources(items),
            prev=prev,
            metadata=metadata,
            rights=rights,
            signing_key=signing_key,
        )
        return cls(path)

    # -- reading ----------------------------------------------------------
    @property
    def receipt(self) -> Receipt:
        return Receipt(self._parsed.header.receipt)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._parsed.table.names)

    def info(self, name: str) -> SlotInfo:
        return self._parsed.slot(self._slot(name))

    def handle(self, name: str) -> Handle:
        i = self._slot(name)
        return Handle(name, i, int(self._parsed.desc[i]["generation"]))

    def __getitem__(self, name: str) -> np.ndarray:
        """A read-only view of the slot's current bytes."""
        i = self._slot(name)
        self._require(i, RIGHT_READ, "read")
        view = self._view(i)
        view.flags.writeable = False
        return view

    def _slot(self, name: str) -> int:
        self._check_open()
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"{name!r} is not a slot of {self.path}") from None

    def _require(self, i: int, right: int, what: str) -> None:
        if not self._rights[i] & right:
            raise RightsError(
                f"slot {self._parsed.table.names[i]!r} of {self.path} does not grant the {what} "
                "right (rights are set at save time: save(..., rights={name: 'rw'}))"
            )

    def _view(self, i: int) -> np.ndarray:
        d = self._parsed.desc[i]
        shape = self._parsed.shape(i)
        dtype = DTYPES[int(d["dtype"])][1]
        if int(d["length"]) == 0:
            return np.empty(shape, dtype=dtype)
        require_intact(self._fd, self._parsed.header, self.path)
        start = self._parsed.header.state_offset + int(d["offset"])
        return np.ndarray(shape, dtype=dtype, buffer=self._mm, offset=start)

    # -- writing ----------------------------------------------------------
    def update(self, target: str | Handle, value: Any) -> Handle:
        """Overwrite one slot in place with `value` (same shape and dtype). Returns the new handle.

        Refused with `StaleHandleError` when `target` is a handle older than the slot, and with
        `RightsError` when the slot lacks the write right.
        """
        if isinstance(target, Handle):
            i = self._slot(target.name)
            current = self._desc_u64[self._generation_at[i]]
            if target.generation != current:
                raise StaleHandleError(
                    f"handle for {target.name!r} is at generation {target.generation} but the "
                    f"slot is at generation {current}: someone updated it since; re-read it "
                    f"and take a fresh handle with arena.handle({target.name!r})"
                )
            name = target.name
        else:
            name = target
            i = self._slot(name)
        self._require(i, RIGHT_WRITE, "write")
        views = self._views[i]
        if views is None and self._lengths[i]:
            views = self._views[i] = self._bind(i)
        if (
            views is not None
            and type(value) is np.ndarray
            and value.dtype is views.typed.dtype
            and self._codes[i] != BFLOAT16
            and value.shape == views.shape
            and value.flags.c_contiguous
        ):
            # The slot's own dtype, shape and layout: copied straight in, no byte views made.
            # Its views were bound after a size check (_bind); a truncation since then is the
            # documented hazard of every bound view (FORMAT.md "Readers and truncation"),
            # and checking again here would cost the update its allocation-free path.
            self._mark_dirty()
            np.copyto(views.typed, value)
            digest = self._digest(views, self._lengths[i])
        else:
            src = slot_source(name, value)
            if src.code != self._codes[i] or src.shape != self._parsed.shape(i):
                have = f"{DTYPES[self._codes[i]][0]} {list(self._parsed.shape(i))}"
                raise ValueError(
                    f"slot {name!r} holds {have}; "
                    f"cannot update it in place with {DTYPES[src.code][0]} {list(src.shape)} "
                    "(in-place updates keep the layout; use save() for a new layout)"
                )
            require_intact(self._fd, self._parsed.header, self.path)
            self._mark_dirty()
            if views is None or src.data is None:
                digest = _EMPTY_DIGEST
            else:
                np.copyto(views.flat, src.data)
                digest = self._digest(views, self._lengths[i])
        # The descriptor arena is mapped from the file: these stores are the in-place
        # rewrite of the slot's 64-byte descriptor line.
        self._desc_bytes[self._hash_at[i]] = digest
        self._desc_u16[self._flags_at[i]] = self._hashed_flags[i]
        at = self._generation_at[i]
        generation = self._desc_u64[at] + 1
        self._desc_u64[at] = generation
        self._dirty_slots.add(i)
        return Handle(name, i, generation)

    def _bind(self, i: int) -> _SlotViews:
        require_intact(self._fd, self._parsed.header, self.path)
        typed = self._view(i)
        flat = typed.reshape(-1).view(np.uint8)
        return _SlotViews(typed, flat, flat.data, typed.shape)

    def _digest(self, views: _SlotViews, length: int) -> bytes:
        # Hashing a memoryview made once: exporting it again costs no numpy buffer info.
        if length >= _THREADED_MIN_BYTES:
            return blake3.blake3(views.bytes, max_threads=blake3.blake3.AUTO).digest()
        hasher = self._hasher
        hasher.reset()
        hasher.update(views.bytes)
        return hasher.digest()

    def _mark_dirty(self) -> None:
        if not self._dirty_slots and not self._parsed.header.flags & HEADER_DIRTY:
            flags = self._parsed.header.flags | HEADER_DIRTY
            self._mm[_FLAGS_AT : _FLAGS_AT + 4] = struct.pack("<I", flags)
            self._parsed.header = replace(self._parsed.header, flags=flags)

    def commit(self, *, signing_key: Any = None) -> Receipt:
        """Make the updates durable and seal them with a new receipt chained to the old one.

        `signing_key` (an Ed25519 private key) signs the new receipt. Without it, a signature
        the file carried is cleared (it signed the old receipt), so the file reads as unsigned
        rather than as signed wrongly.
        """
        self._check_open()
        key = None if signing_key is None else coerce_signing_key(signing_key)
        require_intact(self._fd, self._parsed.header, self.path)
        header = self._parsed.header
        sig_at = header.state_offset - SIGNATURE_BLOCK_SIZE
        minor = header.version_minor
        if key is not None and minor < MINOR_SIGNED:
            # A 1.0 file can be signed when its padding has room for the block (every file
            # this writer lays out does); the block's bytes are padding, so they are zero.
            room = sig_at >= header.table_end and not any(self._mm[sig_at : header.state_offset])
            if not room:
                raise ManyError(
                    f"{self.path}: no room for a signature: its name table ends at "
                    f"{header.table_end}, within {SIGNATURE_BLOCK_SIZE} bytes of the state "
                    f"region at {header.state_offset} (a writer before format 1.1 laid it out); "
                    "save it again with save(..., signing_key=key)"
                )
            minor = MINOR_SIGNED
        # Data and descriptors reach the disk before the header that vouches for them.
        for i in sorted(self._dirty_slots):
            d = self._parsed.desc[i]
            start = header.state_offset + int(d["offset"])
            if int(d["length"]):
                self._mm.flush(start, int(d["length"]))
        n = header.slot_count
        desc_end = HEADER_SIZE + 64 * n
        self._mm.flush(0, desc_end)
        # A memoryview, not a slice: hashing the descriptor arena must not copy it (O(slots)).
        descriptors = memoryview(self._mm)[HEADER_SIZE:desc_end]
        try:
            new = replace(
                header,
                flags=header.flags & ~HEADER_DIRTY,
                commit_seq=header.commit_seq + 1,
                prev_receipt=header.receipt,
                version_minor=minor,
            ).with_receipt(descriptors)
        finally:
            descriptors.release()
        self._mm[0:HEADER_SIZE] = new.pack()
        # A crash between the header and the block leaves a signature over the old receipt:
        # `verify` reports it as not matching, never as sound.
        if key is not None:
            self._mm[sig_at : header.state_offset] = signature_block(key, new.receipt)
        elif minor >= MINOR_SIGNED and any(self._mm[sig_at : header.state_offset]):
            self._mm[sig_at : header.state_offset] = bytes(SIGNATURE_BLOCK_SIZE)
        self._mm.flush(0, header.state_offset)
        self._parsed.header = new
        self._dirty_slots.clear()
        return Receipt(new.receipt)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"arena {self.path} is closed")

    def close(self) -> None:
        """Unmap. Uncommitted updates stay in the file, flagged DIRTY, until a commit."""
        if self._closed:
            return
        self._closed = True
        for views in self._views:  # the cached slot views export the mapping's buffer
            if views is not None:
                views.bytes.release()
        self._views = []
        for view in (self._desc_u64, self._desc_u16, self._desc_bytes):
            view.release()
        self._parsed.desc = None  # type: ignore[assignment]
        self._mm.flush()
        self._close_fd()
        try:
            self._mm.close()
        except BufferError:
            pass  # a read view is still alive; the mapping goes with it

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Arena {self.path} slots={len(self._index)} {self.receipt}>"
