"""`verify`, `verify_chain` and `chain_head`: prove a `.many` file (or a run's chain of them)
is sound, and, given a public key, that it is authentic.

Structure, bounds and overlaps are checked by the parser; this module adds what costs a
pass over the data: every slot hash, the zero bytes around the slots, the receipt, the
signature and the links between receipts. Everything is read with pread into one bounded
buffer, never through a mapping: a file truncated while it is verified is a reported
problem, not a SIGBUS.

What a receipt proves: the file is consistent (its bytes, descriptors, table and previous
receipt hash to the receipt it carries). Anyone can recompute it after editing a file, so it
proves nothing about who wrote the file. A signature verified against a key you hold does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import blake3
import numpy as np

from serwatt.profiler.many.format import (
    HEADER_DIRTY,
    SLOT_HASHED,
    ZERO_DIGEST,
    ManyFormatError,
    check_all_shapes,
    receipt_digest,
)
from serwatt.profiler.many.names import show_name
from serwatt.profiler.many.reader import Parsed, open_regular, read_parsed
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.restore import Reads, Shrank, sealed_copy
from serwatt.profiler.many.signing import key_id, public_key_bytes

# Large slots are hashed with BLAKE3's own threads; small ones are not worth the hand-off.
_THREADED_MIN_BYTES = 4 << 20
# At most this many zero-region problems are listed one by one.
_MAX_LISTED = 10


class _ZeroRegions:
    """Collects the regions the format says are zero and are not."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.count = 0

    def add(self, start: int, end: int, where: str) -> None:
        self.count += 1
        if self.count <= _MAX_LISTED:
            self.problems.append(
                f"bytes [{start}, {end}) {where} are not zero (the format requires zeros there: "
                "data hidden outside every slot, or a damaged file)"
            )

    def done(self) -> list[str]:
        if self.count > _MAX_LISTED:
            self.problems.append(f"… and {self.count - _MAX_LISTED} more non-zero regions")
        return self.problems


def _hash_mismatch(i: int, name: str, stored: bytes, data: bytes) -> str | None:
    if stored == data:
        return None
    return (
        f"slot {i} {show_name(name)}: content hash mismatch "
        f"(descriptor {stored.hex()[:16]}…, data {data.hex()[:16]}…)"
    )


def check_open_file(
    fd: int, parsed: Parsed, *, key: Any = None, into: memoryview | None = None
) -> list[str]:
    """Problems with the shapes, slot hashes, zero regions, receipt, signature, dirty flag
    and state tree of an open, parsed file (`key`: the public key every file must be signed
    with, or None): every check a loader makes, plus those that need a pass over the data.

    `into`: a zeroed, writable buffer of the file's length; every byte checked past the
    name table is read into it at its own offset and checked there (holes stay zeros).
    """
    header, desc, names = parsed.header, parsed.desc, parsed.table.names
    problems = check_all_shapes(desc, parsed.table)
    if header.flags & HEADER_DIRTY:
        problems.append(
            "uncommitted in-place updates: an Arena wrote slots after the last commit "
            "(call Arena.commit(), or the writer crashed)"
        )
    lengths = desc["length"]
    reads = Reads(fd, header.file_length, into)
    zeros = _ZeroRegions()
    slot_problems: dict[int, str] = {}
    base = header.state_offset
    try:
        sig_at = header.signature_offset
        pad_end = header.state_offset if sig_at is None else sig_at
        if pad_end > header.table_end and not reads.zero(
            header.table_end, pad_end - header.table_end
        ):
            zeros.add(
                header.table_end,
                pad_end,
                "in the padding between the name table and the state region",
            )
        for i in range(header.slot_count):
            d = desc[i]
            if not int(d["flags"]) & SLOT_HASHED:
                slot_problems[i] = (
                    f"slot {i} {show_name(names[i])}: no content hash (saved with hash=False); "
                    "its bytes cannot be verified"
                )
                if any(bytes(d["hash"])):
                    slot_problems[i] += "; and its hash field is not zero"
            elif int(d["length"]) == 0:
                mismatch = _hash_mismatch(i, names[i], bytes(d["hash"]), blake3.blake3().digest())
                if mismatch:
                    slot_problems[i] = mismatch
        # One sweep in offset order: each slot's bytes are hashed, the bytes between slots
        # and after the last one must be zero. Non-empty slots do not overlap (the parser).
        nonempty = np.flatnonzero(lengths)
        order = nonempty[np.argsort(desc["offset"][nonempty], kind="stable")]
        pos, prev = 0, -1
        for i in map(int, order):
            off, length = int(desc[i]["offset"]), int(desc[i]["length"])
            if off > pos and not reads.zero(base + pos, off - pos):
                where = (
                    "before the first slot"
                    if prev < 0
                    else f"in the gap after slot {prev} {show_name(names[prev])}"
                )
                zeros.add(base + pos, base + off, where)
            if int(desc[i]["flags"]) & SLOT_HASHED:
                threads = blake3.blake3.AUTO if length >= _THREADED_MIN_BYTES else 1
                h = blake3.blake3(max_threads=threads)
                for chunk in reads.chunks(base + off, length):
                    h.update(chunk)
                mismatch = _hash_mismatch(i, names[i], bytes(desc[i]["hash"]), h.digest())
                if mismatch:
                    slot_problems[i] = mismatch
            pos, prev = off + length, i
        if pos < header.state_length and not reads.zero(base + pos, header.state_length - pos):
            where = (
                f"after the last slot, {prev} {show_name(names[prev])},"
                if prev >= 0
                else "in the state region, which no slot uses,"
            )
            zeros.add(base + pos, header.file_length, where)
    except Shrank as exc:
        problems.append(
            f"truncated while being verified: the file ended at byte {exc.at}, before the "
            f"{header.file_length} bytes its header says; the bytes past it were not checked"
        )
    problems.extend(slot_problems[i] for i in sorted(slot_problems))
    problems.extend(zeros.done())
    size = os.fstat(fd).st_size
    if size != header.file_length:
        what = "truncated" if size < header.file_length else "grew"
        problems.append(
            f"{what} while being verified: the file is now {size} bytes, its header says "
            f"{header.file_length}"
        )
    want = receipt_digest(parsed.header_bytes, desc.tobytes())
    if want != header.receipt:
        problems.append(
            f"receipt mismatch: header says {Receipt(header.receipt)} but the header and "
            f"descriptors hash to {Receipt(want)}"
        )
    problems.extend(_signature_problems(parsed, key))
    # What load_state needs too: a state tree it can build (state imports this module).
    from serwatt.profiler.many.state import tree_problems

    problems.extend(tree_problems(parsed))
    return problems


def writable_by_others(st: os.stat_result) -> bool:
    """Whether a user other than this process's could change the file's bytes: it is not
    ours, or its mode lets a group or others write (an ACL granting a write shows there too,
    as the group class's bits). A process of our own user or root can change our memory
    anyway; no one else can."""
    return st.st_uid != os.geteuid() or bool(st.st_mode & 0o022)


def verified_copy(fd: int, parsed: Parsed) -> tuple[int, list[str]]:
    """(memfd, problems): `check_open_file` with every byte it checks read into a new
    memfd, which then holds the file as verified: header, descriptors and name table as
    parsed, signature block, zero regions and slots as read and checked. The memfd is
    sealed (no write, grow or shrink) and is this process's alone, so a view of it keeps
    the verified bytes whatever the file's owner writes afterwards. A private (copy-on-write)
    mapping of the file would not: on Linux, a page not yet copied shows the file's later
    writes. Costs memory the size of the file (shared memory, swappable like tmpfs).
    (`restore.sealed_copy` is the copier `load`'s plain copy uses too.)
    """
    return sealed_copy(
        fd, parsed, "many-verified", lambda image: check_open_file(fd, parsed, into=image)
    )


def verified_fd(fd: int, parsed: Parsed, *, copy: bool) -> tuple[int, list[str]]:
    """(descriptor to bind, problems): with `copy`, `verified_copy`'s memfd (`fd` is then
    closed); otherwise `fd` itself, checked where it is (`check_open_file`)."""
    if not copy:
        return fd, check_open_file(fd, parsed)
    memfd, problems = verified_copy(fd, parsed)
    os.close(fd)
    return memfd, problems


def _signature_problems(parsed: Parsed, key: Any) -> list[str]:
    try:
        sig = parsed.signature()
    except ManyFormatError as exc:
        return list(exc.problems)
    problems = []
    if sig is not None and not sig.valid:
        problems.append(
            f"signature does not match the receipt under its key {sig.key_id}: the file "
            "changed after it was signed, or the signature is forged"
        )
    if key is not None:
        want = public_key_bytes(key)
        if sig is None:
            problems.append(
                f"not signed (a key was given: every file must be signed by {key_id(want)})"
            )
        elif sig.public_key != want:
            problems.append(f"signed by a different key ({sig.key_id}), not {key_id(want)}")
    return problems


class _Checked(NamedTuple):
    problems: list[str]
    receipt: Receipt | None
    prev: Receipt | None


def _check_path(path: str, key: Any) -> _Checked:
    try:
        fd, size = open_regular(path)
    except ManyFormatError as exc:
        return _Checked(list(exc.problems), None, None)
    except OSError as exc:
        return _Checked([f"cannot read: {exc.strerror or exc}"], None, None)
    try:
        parsed = read_parsed(fd, size)
        problems = check_open_file(fd, parsed, key=key)
    except ManyFormatError as exc:
        return _Checked(list(exc.problems), None, None)
    except OSError as exc:
        return _Checked([f"cannot read: {exc.strerror or exc}"], None, None)
    finally:
        os.close(fd)
    h = parsed.header
    prev = None if h.prev_receipt == ZERO_DIGEST else Receipt(h.prev_receipt)
    return _Checked(problems, Receipt(h.receipt), prev)


def verify(path: str | os.PathLike[str], *, key: Any = None) -> list[str]:
    """Every problem with the file at `path` (empty when it is sound). Never raises on bad files.

    With `key` (an Ed25519 public key object or its 32 raw bytes), the file must also be
    signed by that key over its receipt. Without it, a file that is signed must carry a
    signature that matches its receipt, and an unsigned file can still be sound: soundness
    without a key means consistency, not authorship.
    """
    if key is not None:
        public_key_bytes(key)  # a bad key is the caller's error: raise before reading
    return _check_path(os.fspath(path), key).problems


def read_receipts(path: str | os.PathLike[str]) -> tuple[Receipt, Receipt | None]:
    """(receipt, prev_receipt) of a file, checking its structure but not its data."""
    path = os.fspath(path)
    fd, size = open_regular(path)
    try:
        header = read_parsed(fd, size, path).header
    finally:
        os.close(fd)
    prev = None if header.prev_receipt == ZERO_DIGEST else Receipt(header.prev_receipt)
    return Receipt(header.receipt), prev


def _link_problem(pa: str, pb: str, a: _Checked, b: _Checked) -> str | None:
    if a.receipt is None or b.receipt is None:
        return f"link {pa} -> {pb}: cannot check, a file is unreadable"
    if b.prev != a.receipt:
        return (
            f"link {pa} -> {pb}: prev_receipt is {b.prev or 'empty (chain start)'} "
            f"but {pa} has receipt {a.receipt}"
        )
    return None


def verify_chain(
    paths: Sequence[str | os.PathLike[str]],
    *,
    key: Any = None,
    head: Receipt | str | bytes | None = None,
) -> list[str]:
    """Problems with each file (prefixed by its path) and with each link between them.

    Link k -> k+1 holds when file k+1's prev_receipt equals file k's receipt. The first file
    may start mid-chain (non-zero prev_receipt): that is reported nowhere, since a chain can
    be checked in pieces. `key`: every file must be signed by it (see `verify`). `head`: a
    receipt anchored outside the files (e.g. in a run record); the last file must carry it,
    which catches files dropped from the end or a chain rolled back to an older head.
    """
    if key is not None:
        public_key_bytes(key)
    anchored = Receipt.coerce(head)
    names = [os.fspath(p) for p in paths]
    checked = [_check_path(p, key) for p in names]
    problems = [f"{p}: {msg}" for p, c in zip(names, checked, strict=True) for msg in c.problems]
    for k in range(1, len(names)):
        link = _link_problem(names[k - 1], names[k], checked[k - 1], checked[k])
        if link:
            problems.append(link)
    if anchored is not None:
        if not names:
            problems.append(f"chain head: no files, but the anchored head is {anchored}")
        elif checked[-1].receipt != anchored:
            problems.append(
                f"chain head: the last file {names[-1]} has receipt "
                f"{checked[-1].receipt or '(unreadable)'}, not the anchored head {anchored} "
                "(files missing from the end, or the chain was rolled back or replaced)"
            )
    return problems


class ChainHead(NamedTuple):
    """How far a chain is sound from its first file: the receipt of the last sound file
    (None when even the first fails), how many files that is, and what broke it (None when
    every file and link is sound)."""

    head: Receipt | None
    length: int
    first_break: str | None


def chain_head(paths: Sequence[str | os.PathLike[str]], *, key: Any = None) -> ChainHead:
    """The head of the longest sound prefix of a chain of files, to anchor outside them.

    Store `head` (e.g. in a run record) when a run ends; later,
    `verify_chain(paths, key=..., head=stored)` proves the files are still that chain. Each
    file is verified in full (with `key`, its signature too) and each link checked; the walk
    stops at the first problem.
    """
    if key is not None:
        public_key_bytes(key)
    names = [os.fspath(p) for p in paths]
    head: Receipt | None = None
    previous: _Checked | None = None
    for k, p in enumerate(names):
        c = _check_path(p, key)
        if c.problems:
            more = f" (and {len(c.problems) - 1} more)" if len(c.problems) > 1 else ""
            return ChainHead(head, k, f"{p}: {c.problems[0]}{more}")
        if previous is not None:
            link = _link_problem(names[k - 1], p, previous, c)
            if link:
                return ChainHead(head, k, link)
        head, previous = c.receipt, c
    return ChainHead(head, len(names), None)
