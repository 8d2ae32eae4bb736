"""`load`: map a `.many` file and rebind its descriptors to zero-copy views.

Cost is O(slots): the header, the descriptor arena and the name table are read (with pread)
and checked; tensor bytes stay on disk (or in the page cache) until a view is touched.
Nothing in the file is executed: the only decoder is `json.loads` on the bounded name table.
Only regular files are opened, without blocking: a FIFO or device path is refused.
"""

from __future__ import annotations

import mmap
import os
import stat
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from serwatt.profiler.many.format import (
    DESCRIPTOR_DTYPE,
    DTYPES,
    HEADER_DIRTY,
    HEADER_SIZE,
    RIGHT_READ,
    SIGNATURE_BLOCK_SIZE,
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
    parse_signature_block,
    parse_table,
    rights_text,
)
from serwatt.profiler.many.names import show_name
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.restore import check_read, plan, read_copy
from serwatt.profiler.many.signing import SignatureInfo, signature_valid


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
    """A checked file: header, table and the descriptor arena as a structured array.

    `header_bytes` are the 256 header bytes as read (the receipt is recomputed over them);
    `signature_block` the 128 bytes before the state region in a 1.1 file (None in 1.0).
    """

    header: Header
    table: Table
    desc: np.ndarray
    header_bytes: bytes = b""
    signature_block: bytes | None = None
    # The bytes from the descriptors to the table's end, as read (`desc` is a view of them).
    rest_bytes: bytes = b""

    def shape(self, i: int) -> tuple[int, ...]:
        """Slot i's shape, checked against its descriptor (raises ManyFormatError)."""
        d = self.desc[i]
        return check_shape(
            self.table.shapes[i],
            int(d["dtype"]),
            int(d["length"]),
            f"slot {i} {show_name(self.table.names[i])}",
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

    def signature(self) -> SignatureInfo | None:
        """The file's signature, checked against its stored receipt (None when unsigned).

        Raises ManyFormatError when the signature block is malformed.
        """
        if self.signature_block is None:
            return None
        found = parse_signature_block(self.signature_block)
        if found is None:
            return None
        public_key, signature = found
        return SignatureInfo(
            public_key, signature_valid(public_key, signature, self.header.receipt)
        )


def _kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def open_regular(path: str, *, writable: bool = False) -> tuple[int, int]:
    """(fd, size) of `path` opened for positional reads, if it is a regular file.

    A FIFO, device or socket is refused from `stat` before anything opens it, and the opened
    descriptor is checked again (the path may have been swapped in between). `O_NONBLOCK`
    keeps open(2) itself from waiting for a FIFO's writer in that window. Raises
    ManyFormatError naming the path and what it is, or OSError when it cannot be opened.
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise ManyFormatError(f"is {_kind(mode)}, not a .many file", path)
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManyFormatError(f"is {_kind(st.st_mode)}, not a .many file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def pread_exact(fd: int, length: int, offset: int) -> bytes:
    """`length` bytes at `offset`; ManyFormatError when the file ends first (it shrank)."""
    chunks = [b""]
    got = 0
    while got < length:
        chunk = os.pread(fd, min(length - got, 1 << 30), offset + got)
        if not chunk:
            raise ManyFormatError(
                f"truncated while being read: the file ends at byte {offset + got}, "
                f"before byte {offset + length} that its header promised"
            )
        chunks.append(chunk)
        got += len(chunk)
    return chunks[1] if len(chunks) == 2 else b"".join(chunks)


def check_claim(fd: int, header: Header) -> None:
    """Refuse a file that claims more bytes than its filesystem can hold.

    Such a file is sparse: its size was set, its bytes never written (8 KiB on disk can
    claim 16 TiB), and reading what it claims would take days. No writer can have filled
    it, so every reader refuses it before reading past the header. A filesystem that
    reports no capacity (a memfd's, some FUSE ones) bounds nothing here. Below the bound,
    `verify` skips the holes of the regions that must be zero, so its cost follows the
    bytes stored, except in slots, which are hashed whatever they hold.
    """
    try:
        fs = os.fstatvfs(fd)
    except OSError:
        fs = None
    capacity = fs.f_blocks * fs.f_frsize if fs is not None else 0
    if capacity and header.file_length > capacity:
        stored = os.fstat(fd).st_blocks * 512
        raise ManyFormatError(
            f"claims {header.file_length} bytes, more than its filesystem holds "
            f"({capacity} bytes; the file has {stored} on disk): a sparse file whose "
            "bytes were never written, refused before reading it; if it is a copy, copy "
            "the original again"
        )
    # The descriptors and name table are read into memory whole, so they must be stored:
    # a writer writes them in one piece, never as a hole (nor are they zeros that a copy
    # or a compressing filesystem could turn into one).
    try:
        hole = os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:
        return  # no hole reporting here: the capacity bound above is the bound
    if hole < header.table_end:
        raise ManyFormatError(
            f"its descriptors and name table claim bytes [{HEADER_SIZE}, {header.table_end}) "
            f"but the file holds nothing on disk from byte {hole}: a sparse file whose "
            "bytes were never written, refused before reading them"
        )


def read_parsed(fd: int, size: int, path: str | None = None, *, all_shapes: bool = False) -> Parsed:
    """Read (with pread, never through a mapping) and check header, table and descriptors.

    Reading never maps the file, so a file truncated meanwhile is an error, not a SIGBUS.
    A file claiming more than its filesystem holds is refused first (`check_claim`).
    Each slot's shape is checked when the slot is first bound (`Parsed.shape`), which keeps
    `load` to a few vectorized passes; `all_shapes=True` checks them all now.
    """
    try:
        head = pread_exact(fd, HEADER_SIZE, 0) if size >= HEADER_SIZE else b""
        header = parse_header(head, size)
        check_claim(fd, header)
        rest = pread_exact(fd, header.table_end - HEADER_SIZE, HEADER_SIZE)
        table = parse_table(rest[header.table_offset - HEADER_SIZE :], header)
        desc = np.frombuffer(rest, dtype=DESCRIPTOR_DTYPE, count=header.slot_count)
        check_descriptors(desc, header, table)
        if all_shapes:
            problems = check_all_shapes(desc, table)
            if problems:
                raise ManyFormatError(problems)
        sig_at = header.signature_offset
        block = None if sig_at is None else pread_exact(fd, SIGNATURE_BLOCK_SIZE, sig_at)
    except ManyFormatError as exc:
        if path and exc.path is None:
            raise ManyFormatError(exc.problems, path) from None
        raise
    return Parsed(header, table, desc, head, block, rest)


@dataclass
class OpenFile:
    """A checked `.many` file: its descriptor, its mapping and its parsed structure."""

    fd: int
    mm: mmap.mmap
    parsed: Parsed


def open_checked(
    path: str | os.PathLike[str], *, writable: bool = False, all_shapes: bool = False
) -> OpenFile:
    """Open, check and map `path`. With `writable`, the descriptor arena in `parsed.desc` is a
    view of the shared mapping (an `Arena` rewrites descriptors through it)."""
    path = os.fspath(path)
    fd, size = open_regular(path, writable=writable)
    try:
        parsed = read_parsed(fd, size, path, all_shapes=all_shapes or writable)
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    except BaseException:
        os.close(fd)
        raise
    if writable:
        parsed.desc = np.frombuffer(
            mm, dtype=DESCRIPTOR_DTYPE, count=parsed.header.slot_count, offset=HEADER_SIZE
        )
    return OpenFile(fd, mm, parsed)


def open_mapped(
    path: str | os.PathLike[str], *, writable: bool = False, all_shapes: bool = False
) -> tuple[mmap.mmap, Parsed]:
    """`open_checked` for callers that do not keep the descriptor (the mapping stays valid)."""
    opened = open_checked(path, writable=writable, all_shapes=all_shapes)
    os.close(opened.fd)
    return opened.mm, opened.parsed


def require_intact(fd: int, header: Header, path: str) -> None:
    """Refuse to touch a mapping whose file has shrunk: a page past the end is a SIGBUS."""
    size = os.fstat(fd).st_size
    if size < header.file_length:
        raise ManyFormatError(
            f"truncated to {size} bytes under this reader (its header says "
            f"{header.file_length}): touching its pages now would crash the process with "
            "SIGBUS; load the file again",
            path,
        )


class Checkpoint(Mapping[str, np.ndarray]):
    """A loaded `.many` file: a read-only mapping of names to zero-copy numpy views.

    Views are built on first access (O(1) each) and are read-only: they point into a
    read-only shared mapping of the file. `torch(name)` gives a tensor over a private
    (copy-on-write) mapping of the same open file, so writing to it never touches the file,
    and a file saved over the same path later is never mixed in. `close()` drops the mapping
    and the descriptor; views still alive keep their mapping until they are freed.

    A private copy-on-write mapping does not keep out the file's later writes: a page not
    yet written by this process shows them. So views of a file loaded without `verify` (or
    of one only this user can write) change when the file does; `load(verify=True)` of a
    file another user can write gives views of a private verified copy instead.

    The file stays open for the checkpoint's life. Binding a view first checks that the file
    has not shrunk; a view bound before someone truncates the file in place faults (SIGBUS)
    when touched (FORMAT.md, "Readers and truncation").

    `read_mode` says how the file was read and why: "mapped: ext4 (0xef53)", or "copied:
    fuse (0x65735546): mapping faults are round trips" when the views are of a private
    copy (`load`'s `read`); a copy's views never fault.
    """

    def __init__(
        self, path: str, mm: mmap.mmap, parsed: Parsed, fd: int, *, read_mode: str = "mapped"
    ) -> None:
        self.path = path
        self.read_mode = read_mode
        self._mm: mmap.mmap | None = mm
        self._cow: mmap.mmap | None = None
        self._fd = fd
        self._close_fd = weakref.finalize(self, os.close, fd)
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

    @property
    def signature(self) -> SignatureInfo | None:
        """The signature over this file's stored receipt, or None when it is unsigned.

        `valid` says the signature matches the stored receipt under the embedded key; only
        `verify(path, key=...)` also proves the receipt matches the data and the key is yours.
        """
        return self._parsed.signature()

    @property
    def signer(self) -> bytes | None:
        """The raw 32-byte Ed25519 public key this file is signed with, or None."""
        sig = self.signature
        return None if sig is None else sig.public_key

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
            raise KeyError(f"{show_name(name)} is not a slot of {self.path}") from None

    def _readable(self, name: str) -> int:
        i = self._slot_index(name)
        if not int(self._parsed.desc[i]["rights"]) & RIGHT_READ:
            raise RightsError(
                f"slot {show_name(name)} of {self.path} does not grant the read right"
            )
        return i

    def _view(self, name: str) -> np.ndarray:
        if self._mm is None:
            raise ValueError(f"{self.path} is closed")
        i = self._readable(name)
        d = self._parsed.desc[i]
        dtype = DTYPES[int(d["dtype"])][1]
        shape = self._parsed.shape(i)
        if int(d["length"]) == 0:
            arr = np.empty(shape, dtype=dtype)
            arr.flags.writeable = False
            return arr
        require_intact(self._fd, self._parsed.header, self.path)
        return np.ndarray(
            shape,
            dtype=dtype,
            buffer=self._mm,
            offset=self._parsed.header.state_offset + int(d["offset"]),
        )

    def torch(self, name: str) -> Any:
        """The slot as a torch tensor over a private copy-on-write mapping (bfloat16 restored).

        The mapping is of the file opened at load (its descriptor, not its name), so the tensor
        holds the same bytes as the numpy view even after another save over the same path.
        """
        import torch

        if self._mm is None:
            raise ValueError(f"{self.path} is closed")
        i = self._readable(name)
        d = self._parsed.desc[i]
        code = int(d["dtype"])
        tdtype = getattr(torch, DTYPES[code][0])
        shape = self._parsed.shape(i)
        length = int(d["length"])
        if length == 0:
            return torch.empty(shape, dtype=tdtype)
        require_intact(self._fd, self._parsed.header, self.path)
        if self._cow is None:
            self._cow = mmap.mmap(self._fd, len(self._mm), access=mmap.ACCESS_COPY)
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
        self._close_fd()
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


def load(path: str | os.PathLike[str], *, verify: bool = False, read: str = "auto") -> Checkpoint:
    """Map `path` (or copy it, below) and return a `Checkpoint` (O(slots) when mapped;
    tensor pages are read when touched).

    `read` says how the slots' bytes are read (restore.py says why): "auto" (the default)
    maps a file on a local filesystem and, on a network or FUSE one (NFS, SMB, Lustre,
    GPFS, Ceph, 9p, FUSE object-store mounts, ...), where each page fault waits for a round
    trip, reads the whole file now with large sequential reads into private memory the size
    of the file (a sealed memfd) and gives views of that copy; "mmap" always maps; "copy"
    always copies. The environment variable SERWATT_MANY_READ (auto, mmap or copy) stands
    in for "auto", for code that cannot pass `read`. `Checkpoint.read_mode` says which
    happened and why. A copy is checked whole: a file that shrinks or grows while it is
    copied raises ManyFormatError.

    With `verify=True` every slot is rehashed and the receipt recomputed first, reading the
    same open file with pread (so a truncation meanwhile is reported, not a crash); any
    problem raises `ManyFormatError` listing them. What is returned is what was verified:
    when another user could write the file (it is not ours, or group or others may write
    it), or `read` copies, the bytes are verified as they are copied into private memory
    the size of the file (`verify.verified_copy`), and the views are of that copy, so the
    owner's later writes cannot change them; otherwise the views map the file itself,
    which only this user (or root) can change.
    """
    path = os.fspath(path)
    read_as = check_read(read)
    fd, size = open_regular(path)
    try:
        parsed = read_parsed(fd, size, path)
        problems: list[str] = []
        if verify:
            from serwatt.profiler.many.verify import verified_fd, writable_by_others

            how = plan(fd, read_as, others_can_write=writable_by_others(os.fstat(fd)))
            fd, problems = verified_fd(fd, parsed, copy=how.copy)
        else:
            how = plan(fd, read_as)
            if how.copy:
                fd = read_copy(fd, parsed, path)
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except BaseException:
        os.close(fd)
        raise
    ckpt = Checkpoint(path, mm, parsed, fd, read_mode=how.why)
    if problems:
        ckpt.close()
        raise ManyFormatError(problems, path)
    return ckpt
