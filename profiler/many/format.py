"""Byte layout of the `.many` arena (see FORMAT.md): header, descriptors, name table, receipts,
signature block.

Pure parsing and packing: nothing here opens files. Every check on untrusted bytes raises
`ManyFormatError` naming the field, and never allocates more than O(slot count) memory,
where the slot count is itself bounded by the file size. Text from the file (slot names)
reaches messages only through `show_name` (names.py), which escapes and bounds it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import blake3
import numpy as np

from serwatt.profiler.many.names import show_name
from serwatt.profiler.terminal_escape import escape_text

MAGIC = b"\x89MANY\r\n\x1a"
VERSION_MAJOR = 1
# The newest minor version this code knows. 1.1 gives meaning to the last
# SIGNATURE_BLOCK_SIZE bytes before the state region; a writer marks a file 1.1 only when it
# signs it, so unsigned files stay plain 1.0 files.
VERSION_MINOR = 1
MINOR_SIGNED = 1
HEADER_SIZE = 256
HASHED_HEADER_SIZE = 192  # header bytes covered by the receipt (everything before `receipt`)
DESCRIPTOR_SIZE = 64
PAGE_SIZE = 4096
MAX_NDIM = 32
RECEIPT_DOMAIN = b"serwatt.many.receipt.v1\0"
ZERO_DIGEST = bytes(32)

# Signature block (version 1.1): the last 128 bytes before `state_offset`.
SIGNATURE_BLOCK_SIZE = 128
SIGNATURE_MAGIC = b"MANYSIG1"
SIGNATURE_DOMAIN = b"serwatt.many.signature.v1\0"
SIG_ED25519 = 1
_SIGNATURE = struct.Struct("<8sH6s32s64s16s")
assert _SIGNATURE.size == SIGNATURE_BLOCK_SIZE

# header flags
HEADER_DIRTY = 1
# descriptor rights
RIGHT_READ = 1
RIGHT_WRITE = 2
ALL_RIGHTS = RIGHT_READ | RIGHT_WRITE
# descriptor flags
SLOT_HASHED = 1

_HEADER = struct.Struct("<8sHHIIIIIQQQQQQQ32s32s40s32s32s")
assert _HEADER.size == HEADER_SIZE

DESCRIPTOR_DTYPE = np.dtype(
    [
        ("offset", "<u8"),
        ("length", "<u8"),
        ("rights", "<u4"),
        ("dtype", "<u2"),
        ("flags", "<u2"),
        ("generation", "<u8"),
        ("hash", "V32"),
    ]
)
assert DESCRIPTOR_DTYPE.itemsize == DESCRIPTOR_SIZE

# code -> (name, numpy dtype used for views). bfloat16 has no numpy dtype: raw uint16 bits.
DTYPES: dict[int, tuple[str, np.dtype]] = {
    1: ("bool", np.dtype("bool")),
    2: ("uint8", np.dtype("<u1")),
    3: ("int8", np.dtype("<i1")),
    4: ("uint16", np.dtype("<u2")),
    5: ("int16", np.dtype("<i2")),
    6: ("uint32", np.dtype("<u4")),
    7: ("int32", np.dtype("<i4")),
    8: ("uint64", np.dtype("<u8")),
    9: ("int64", np.dtype("<i8")),
    10: ("float16", np.dtype("<f2")),
    11: ("float32", np.dtype("<f4")),
    12: ("float64", np.dtype("<f8")),
    13: ("bfloat16", np.dtype("<u2")),
    14: ("complex64", np.dtype("<c8")),
    15: ("complex128", np.dtype("<c16")),
}
DTYPE_CODE_BY_NAME: dict[str, int] = {name: code for code, (name, _) in DTYPES.items()}
BFLOAT16 = 13
# The dtypes a tensor that requires grad may have (torch refuses requires_grad on the rest).
GRAD_DTYPE_CODES = frozenset(
    DTYPE_CODE_BY_NAME[n]
    for n in ("float16", "float32", "float64", "bfloat16", "complex64", "complex128")
)
# numpy and torch index arrays with signed 64-bit sizes and strides: a shape whose extent
# (every dimension, zeros counted as 1, times the item size) passes this cannot be built,
# even when a zero dimension makes it hold no bytes.
MAX_EXTENT_BYTES = 2**63 - 1


class ManyError(Exception):
    """Base class of every error the `.many` package raises on purpose."""


class ManyFormatError(ManyError, ValueError):
    """A file is not a sound `.many` checkpoint. `problems` lists every defect found."""

    def __init__(self, problems: str | Sequence[str], path: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.path = path
        where = f"{path}: " if path else ""
        super().__init__(where + "; ".join(self.problems))


def round_up(n: int, to: int = PAGE_SIZE) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Header:
    """The 256-byte file header, decoded. Field meanings: FORMAT.md."""

    slot_count: int
    table_offset: int
    table_length: int
    state_offset: int
    state_length: int
    file_length: int
    table_hash: bytes
    prev_receipt: bytes = ZERO_DIGEST
    commit_seq: int = 0
    flags: int = 0
    receipt: bytes = ZERO_DIGEST
    version_minor: int = 0

    @property
    def table_end(self) -> int:
        return self.table_offset + self.table_length

    @property
    def signature_offset(self) -> int | None:
        """Where the signature block lies, or None in a 1.0 file (which has none)."""
        if self.version_minor >= MINOR_SIGNED:
            return self.state_offset - SIGNATURE_BLOCK_SIZE
        return None

    def pack(self) -> bytes:
        return _HEADER.pack(
            MAGIC,
            VERSION_MAJOR,
            self.version_minor,
            HEADER_SIZE,
            DESCRIPTOR_SIZE,
            self.slot_count,
            PAGE_SIZE,
            self.flags,
            HEADER_SIZE,
            self.table_offset,
            self.table_length,
            self.state_offset,
            self.state_length,
            self.file_length,
            self.commit_seq,
            self.table_hash,
            self.prev_receipt,
            bytes(40),
            self.receipt,
            bytes(32),
        )

    def with_receipt(self, descriptor_bytes: bytes | memoryview) -> Header:
        """This header with `receipt` computed over itself and the descriptor arena."""
        return replace(self, receipt=receipt_digest(self.pack(), descriptor_bytes))


def receipt_digest(header_bytes: bytes | memoryview, descriptor_bytes: bytes | memoryview) -> bytes:
    """BLAKE3(domain || prev_receipt || header[0:192] || descriptors); see FORMAT.md."""
    prev = bytes(header_bytes[120:152])
    h = blake3.blake3(RECEIPT_DOMAIN)
    h.update(prev)
    h.update(header_bytes[:HASHED_HEADER_SIZE])
    h.update(descriptor_bytes)
    return h.digest()


def parse_header(raw: bytes, file_size: int) -> Header:
    """Decode and check the header against the real file size. Raises ManyFormatError."""
    if file_size < HEADER_SIZE or len(raw) < HEADER_SIZE:
        raise ManyFormatError(
            f"truncated: file is {file_size} bytes, smaller than the {HEADER_SIZE}-byte header"
        )
    (
        magic,
        major,
        minor,
        header_size,
        descriptor_size,
        slot_count,
        page_size,
        flags,
        descriptors_offset,
        table_offset,
        table_length,
        state_offset,
        state_length,
        file_length,
        commit_seq,
        table_hash,
        prev_receipt,
        reserved1,
        receipt,
        reserved2,
    ) = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        # The file's own bytes are not echoed: they are the attacker's text.
        raise ManyFormatError(
            f"bad magic: not a .many file (the first 8 bytes are not {MAGIC.hex(' ')})"
        )
    if major != VERSION_MAJOR:
        raise ManyFormatError(
            f"unsupported format version {major}.{minor}: this reader reads {VERSION_MAJOR}.x"
        )
    problems: list[str] = []
    for name, got, want in (
        ("header_size", header_size, HEADER_SIZE),
        ("descriptor_size", descriptor_size, DESCRIPTOR_SIZE),
        ("page_size", page_size, PAGE_SIZE),
        ("descriptors_offset", descriptors_offset, HEADER_SIZE),
    ):
        if got != want:
            problems.append(f"header {name} is {got}, must be {want}")
    if flags & ~HEADER_DIRTY:
        problems.append(f"header flags 0x{flags:x} has unknown bits")
    if any(reserved1) or any(reserved2):
        problems.append("header reserved bytes are not zero")
    if file_length != file_size:
        what = "truncated" if file_size < file_length else "trailing bytes"
        problems.append(
            f"{what}: header file_length is {file_length} but the file is {file_size} bytes"
        )
    desc_end = HEADER_SIZE + DESCRIPTOR_SIZE * slot_count
    if desc_end > file_size:
        problems.append(
            f"slot_count {slot_count} needs {desc_end} bytes of descriptors, "
            f"past the end of the {file_size}-byte file"
        )
    if table_offset != desc_end:
        problems.append(f"table_offset {table_offset} must follow the descriptors at {desc_end}")
    if state_offset % PAGE_SIZE or state_length % PAGE_SIZE:
        problems.append(
            f"state region (offset {state_offset}, length {state_length}) is not page-aligned"
        )
    if table_offset + table_length > state_offset:
        problems.append(
            f"name table [{table_offset}, {table_offset + table_length}) runs into the state "
            f"region at {state_offset}"
        )
    if state_offset + state_length != file_length:
        problems.append(
            f"state region ends at {state_offset + state_length}, not at file_length {file_length}"
        )
    if minor >= MINOR_SIGNED and table_offset + table_length > state_offset - SIGNATURE_BLOCK_SIZE:
        problems.append(
            f"version 1.{minor} file: the name table ends at {table_offset + table_length}, "
            f"inside the {SIGNATURE_BLOCK_SIZE}-byte signature block before {state_offset}"
        )
    if problems:
        raise ManyFormatError(problems)
    return Header(
        slot_count=slot_count,
        table_offset=table_offset,
        table_length=table_length,
        state_offset=state_offset,
        state_length=state_length,
        file_length=file_length,
        table_hash=table_hash,
        prev_receipt=prev_receipt,
        commit_seq=commit_seq,
        flags=flags,
        receipt=receipt,
        version_minor=minor,
    )


@dataclass(frozen=True)
class Table:
    """The decoded name table: slot names and shapes in descriptor order, plus user metadata.

    `shapes` are as decoded from JSON; `check_shape` is the strict test of one of them.
    """

    names: list[str]
    shapes: list[Any]
    metadata: dict[str, Any]


def encode_table(
    names: Sequence[str], shapes: Sequence[tuple[int, ...]], metadata: dict[str, Any]
) -> bytes:
    doc = {"names": list(names), "shapes": [list(s) for s in shapes], "metadata": metadata}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def parse_table(raw: bytes, header: Header) -> Table:
    """Decode the table; names are checked here, shapes by `check_shape` (per slot)."""
    if blake3.blake3(raw).digest() != header.table_hash:
        raise ManyFormatError("name table hash does not match header table_hash (table corrupt)")
    try:
        # Decoded here, strictly: json.loads(bytes) would also accept UTF-16 and UTF-32.
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManyFormatError(
            f"name table is not UTF-8 (the format requires UTF-8 JSON): {exc.reason} "
            f"at byte {exc.start}"
        ) from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ManyFormatError(f"name table is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ManyFormatError("name table must be a JSON object")
    names, shapes, metadata = doc.get("names"), doc.get("shapes"), doc.get("metadata", {})
    if not isinstance(names, list) or not isinstance(shapes, list):
        raise ManyFormatError("name table must hold 'names' and 'shapes' lists")
    if not isinstance(metadata, dict):
        raise ManyFormatError("name table 'metadata' must be a JSON object")
    n = header.slot_count
    if len(names) != n or len(shapes) != n:
        raise ManyFormatError(
            f"name table lists {len(names)} names and {len(shapes)} shapes but the header "
            f"says {n} slots"
        )
    # set(map(type, ...)) keeps this check in C: it runs on every load.
    if set(map(type, names)) - {str} or "" in names:
        i = next(i for i, x in enumerate(names) if type(x) is not str or not x)
        raise ManyFormatError(f"name table slot {i} has no name (got {show_name(names[i])})")
    if len(set(names)) != n:
        seen: set[str] = set()
        for x in names:
            if x in seen:
                raise ManyFormatError(f"name table has duplicate slot name {show_name(x)}")
            seen.add(x)
    return Table(names, shapes, metadata)


def check_shape(shape: Any, code: int, length: int, where: str) -> tuple[int, ...]:
    """The slot's shape as a tuple, if it is sound and matches the descriptor's length."""
    if (
        type(shape) is not list
        or len(shape) > MAX_NDIM
        or not all(type(d) is int and 0 <= d < 2**63 for d in shape)
    ):
        raise ManyFormatError(
            f"{where}: shape {escape_text(str(shape)[:80])} is not a list of at most {MAX_NDIM} "
            "non-negative integers"
        )
    itemsize = DTYPES[code][1].itemsize
    count, extent = 1, itemsize
    for d in shape:  # Python ints: no product can wrap
        count *= d
        extent *= max(d, 1)
    if extent > MAX_EXTENT_BYTES:
        raise ManyFormatError(
            f"{where}: shape {shape} of {DTYPES[code][0]} spans {extent} bytes counting its "
            f"zero dimensions as 1, more than the {MAX_EXTENT_BYTES} that numpy and torch "
            "can index: no array can have it"
        )
    want = count * itemsize
    if want != length:
        raise ManyFormatError(
            f"{where}: shape {shape} of {DTYPES[code][0]} needs {want} bytes, "
            f"descriptor says {length}"
        )
    return tuple(shape)


# Lookup tables make the per-slot checks one vectorized gather each.
_KNOWN_CODE = np.zeros(1 << 16, dtype=bool)
_KNOWN_CODE[list(DTYPES)] = True
_ITEMSIZE = np.zeros(1 << 16, dtype=np.uint64)
for _code, (_, _dt) in DTYPES.items():
    _ITEMSIZE[_code] = _dt.itemsize


def check_descriptors(desc: np.ndarray, header: Header, table: Table) -> None:
    """Bounds, alignment, dtype, rights, flag, size and overlap rules of FORMAT.md, vectorized.

    The fast path is a handful of array operations over all slots; only when one fails is
    each failing slot named.
    """
    names = table.names
    offsets = desc["offset"]
    lengths = desc["length"]
    codes = desc["dtype"]
    state_len = np.uint64(header.state_length)
    # Written as two comparisons so a huge offset cannot wrap the uint64 sum.
    out = (offsets > state_len) | (lengths > state_len - np.minimum(offsets, state_len))
    bad_code = ~_KNOWN_CODE[codes]
    bad = (
        bad_code
        | (desc["rights"] & ~np.uint32(ALL_RIGHTS)).astype(bool)
        | (desc["flags"] & ~np.uint16(SLOT_HASHED)).astype(bool)
        | (offsets % np.uint64(PAGE_SIZE)).astype(bool)
        | out
        | (lengths % np.maximum(_ITEMSIZE[codes], np.uint64(1))).astype(bool)
    )
    problems: list[str] = []
    if bad.any():
        for i in np.flatnonzero(bad)[:10]:
            d, where = desc[i], f"slot {i} {show_name(names[i])}"
            if bad_code[i]:
                problems.append(f"{where}: unknown dtype code {int(d['dtype'])}")
                continue
            if int(d["rights"]) & ~ALL_RIGHTS:
                problems.append(f"{where}: unknown rights bits 0x{int(d['rights']):x}")
            if int(d["flags"]) & ~SLOT_HASHED:
                problems.append(f"{where}: unknown flag bits 0x{int(d['flags']):x}")
            if int(d["offset"]) % PAGE_SIZE:
                problems.append(f"{where}: offset {int(d['offset'])} is not page-aligned")
            if out[i]:
                problems.append(
                    f"{where}: bytes [{int(d['offset'])}, +{int(d['length'])}) lie past the end "
                    f"of the {header.state_length}-byte state region"
                )
            elif int(d["length"]) % DTYPES[int(d["dtype"])][1].itemsize:
                problems.append(
                    f"{where}: length {int(d['length'])} is not a whole number of "
                    f"{DTYPES[int(d['dtype'])][0]} items"
                )
        raise ManyFormatError(problems)
    # Empty slots own no bytes, so they cannot overlap anything; leave them out of the sweep.
    nonempty = np.flatnonzero(lengths)
    starts = offsets[nonempty]
    if len(starts) > 1 and (starts[1:] < starts[:-1]).any():
        nonempty = nonempty[np.argsort(starts, kind="stable")]
        starts = offsets[nonempty]
    ends = starts + lengths[nonempty]
    overlapping = np.flatnonzero(ends[:-1] > starts[1:])
    for k in overlapping[:10]:
        a, b = int(nonempty[k]), int(nonempty[k + 1])
        problems.append(
            f"slot {a} {show_name(names[a])} and slot {b} {show_name(names[b])} overlap in the "
            "state region"
        )
    if problems:
        raise ManyFormatError(problems)


def check_all_shapes(desc: np.ndarray, table: Table) -> list[str]:
    problems = []
    for i, shape in enumerate(table.shapes):
        try:
            check_shape(
                shape,
                int(desc[i]["dtype"]),
                int(desc[i]["length"]),
                f"slot {i} {show_name(table.names[i])}",
            )
        except ManyFormatError as exc:
            problems.extend(exc.problems)
    return problems


def pack_signature_block(public_key: bytes, signature: bytes) -> bytes:
    """The 128-byte signature block of FORMAT.md for an Ed25519 key and signature."""
    return _SIGNATURE.pack(SIGNATURE_MAGIC, SIG_ED25519, bytes(6), public_key, signature, bytes(16))


def parse_signature_block(raw: bytes) -> tuple[bytes, bytes] | None:
    """(public key, signature) from a signature block; None when the block is all zero."""
    if not any(raw):
        return None
    magic, algorithm, reserved1, public_key, signature, reserved2 = _SIGNATURE.unpack(raw)
    if magic != SIGNATURE_MAGIC:
        raise ManyFormatError(
            "signature block is neither zero nor a signature (its first 8 bytes are not "
            f"{SIGNATURE_MAGIC.decode()!r})"
        )
    problems = []
    if algorithm != SIG_ED25519:
        problems.append(f"signature block: unknown algorithm {algorithm} (1 = Ed25519)")
    if any(reserved1) or any(reserved2):
        problems.append("signature block: reserved bytes are not zero")
    if problems:
        raise ManyFormatError(problems)
    return public_key, signature


def signed_message(receipt: bytes) -> bytes:
    """What an Ed25519 signature of a checkpoint signs: a domain tag and the receipt digest."""
    return SIGNATURE_DOMAIN + receipt


def rights_from(value: str | int) -> int:
    """'r', 'w', 'rw' (or the bit mask) -> rights bits."""
    if isinstance(value, int):
        if value & ~ALL_RIGHTS:
            raise ValueError(f"rights 0x{value:x} has unknown bits; use RIGHT_READ|RIGHT_WRITE")
        return value
    bits = 0
    for ch in value:
        if ch == "r":
            bits |= RIGHT_READ
        elif ch == "w":
            bits |= RIGHT_WRITE
        else:
            raise ValueError(f"rights {value!r}: use a string of 'r' (read) and 'w' (write)")
    return bits


def rights_text(bits: int) -> str:
    return ("r" if bits & RIGHT_READ else "-") + ("w" if bits & RIGHT_WRITE else "-")
