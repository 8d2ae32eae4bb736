"""`verify` and `verify_chain`: prove a `.many` file (or a run's chain of them) is sound.

Structure, bounds and overlaps are checked by the parser; this module adds what costs a
pass over the data: every slot hash, the receipt, and the links between receipts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import blake3

from profiler.many.format import (
    HEADER_DIRTY,
    HEADER_SIZE,
    SLOT_HASHED,
    ZERO_DIGEST,
    ManyFormatError,
    check_all_shapes,
    receipt_digest,
)
from profiler.many.reader import Parsed, open_mapped
from profiler.many.receipt import Receipt

# Large slots are hashed with BLAKE3's own threads; small ones are not worth the hand-off.
_THREADED_MIN_BYTES = 4 << 20


def check_mapped(buf: Any, parsed: Parsed) -> list[str]:
    """Problems with the slot hashes, the receipt and the dirty flag of a parsed file."""
    header, desc, names = parsed.header, parsed.desc, parsed.table.names
    problems = check_all_shapes(desc, parsed.table)
    if header.flags & HEADER_DIRTY:
        problems.append(
            "uncommitted in-place updates: an Arena wrote slots after the last commit "
            "(call Arena.commit(), or the writer crashed)"
        )
    view = memoryview(buf)
    try:
        for i in range(header.slot_count):
            d = desc[i]
            name = names[i]
            if not int(d["flags"]) & SLOT_HASHED:
                problems.append(
                    f"slot {i} {name!r}: no content hash (saved with hash=False); "
                    "its bytes cannot be verified"
                )
                continue
            start = header.state_offset + int(d["offset"])
            data = view[start : start + int(d["length"])]
            threads = blake3.blake3.AUTO if len(data) >= _THREADED_MIN_BYTES else 1
            got = blake3.blake3(data, max_threads=threads).digest()
            del data
            if got != bytes(d["hash"]):
                problems.append(
                    f"slot {i} {name!r}: content hash mismatch "
                    f"(descriptor {bytes(d['hash']).hex()[:16]}…, data {got.hex()[:16]}…)"
                )
        want = receipt_digest(
            view[:HEADER_SIZE], view[HEADER_SIZE : HEADER_SIZE + 64 * header.slot_count]
        )
    finally:
        view.release()
    if want != header.receipt:
        problems.append(
            f"receipt mismatch: header says {Receipt(header.receipt)} but the header and "
            f"descriptors hash to {Receipt(want)}"
        )
    return problems


def verify(path: str | os.PathLike[str]) -> list[str]:
    """Every problem with the file at `path` (empty when it is sound). Never raises on bad files."""
    path = os.fspath(path)
    try:
        mm, parsed = open_mapped(path)
    except ManyFormatError as exc:
        return list(exc.problems)
    except OSError as exc:
        return [f"cannot read: {exc.strerror or exc}"]
    try:
        return check_mapped(mm, parsed)
    finally:
        parsed.desc = None  # type: ignore[assignment]  # release the buffer export first
        try:
            mm.close()
        except BufferError:
            pass


def read_receipts(path: str | os.PathLike[str]) -> tuple[Receipt, Receipt | None]:
    """(receipt, prev_receipt) of a file, checking its structure but not its data."""
    mm, parsed = open_mapped(path)
    header = parsed.header
    parsed.desc = None  # type: ignore[assignment]
    try:
        mm.close()
    except BufferError:
        pass
    prev = None if header.prev_receipt == ZERO_DIGEST else Receipt(header.prev_receipt)
    return Receipt(header.receipt), prev


def verify_chain(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Problems with each file (prefixed by its path) and with each link between them.

    Link k -> k+1 holds when file k+1's prev_receipt equals file k's receipt. The first file
    may start mid-chain (non-zero prev_receipt): that is reported nowhere, since a chain can
    be checked in pieces.
    """
    problems: list[str] = []
    receipts: list[tuple[Receipt, Receipt | None] | None] = []
    for p in paths:
        p = os.fspath(p)
        problems.extend(f"{p}: {msg}" for msg in verify(p))
        try:
            receipts.append(read_receipts(p))
        except (ManyFormatError, OSError):
            receipts.append(None)
    for k in range(1, len(paths)):
        a, b = receipts[k - 1], receipts[k]
        pa, pb = os.fspath(paths[k - 1]), os.fspath(paths[k])
        if a is None or b is None:
            problems.append(f"link {pa} -> {pb}: cannot check, a file is unreadable")
        elif b[1] != a[0]:
            problems.append(
                f"link {pa} -> {pb}: prev_receipt is {b[1] or 'empty (chain start)'} "
                f"but {pa} has receipt {a[0]}"
            )
    return problems
