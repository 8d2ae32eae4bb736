"""How a `.many` file is read at load: through a mapping of the file, or as a private copy
read with large sequential reads.

A mapping reads a page when it is first touched. On a local disk or tmpfs that is the
cheapest way in: the page cache is the only copy, and nothing is read that is not touched.
On a filesystem whose pages come from a server (FUSE, NFS, SMB/CIFS, Lustre, GPFS, Ceph, 9p
and the others in `REMOTE`), each fault that misses the page cache waits for a request's
round trip, one readahead window at a time behind the touching thread; users of mapped
formats report 8-50x slower loads there (safetensors' issues; sglang's Qwen3-32B load went
from 4 min 18 s to 32 s without mmap). A file there is read instead with reads of
`COPY_CHUNK` bytes, `COPY_THREADS` at once, into a memfd, which is then sealed, and the
views are of that copy.

The filesystem is the one of the open descriptor, by `fstatfs(2)`'s `f_type` (what is read
is what was opened, whatever its path resolves to later). Python's `os` has no `fstatfs`,
so it is called through ctypes; `os.fstatvfs` carries no filesystem type.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from serwatt.profiler.many.format import ManyFormatError

if TYPE_CHECKING:
    from serwatt.profiler.many.reader import Parsed

# How `load(read=...)` reads a file: "auto" maps it unless its filesystem is in REMOTE,
# "mmap" always maps it, "copy" always reads it into private memory.
READ_CHOICES = ("auto", "mmap", "copy")
# Overrides "auto" for a process whose code cannot pass `read=` (a job whose torch.load is
# `torch_compat.load`, under `serwatt ab --swap torch`); an explicit "mmap" or "copy" wins.
READ_ENV = "SERWATT_MANY_READ"

# f_type magics (linux/magic.h, coreutils' stat.c) of filesystems whose pages come from a
# server: a page fault that misses the page cache waits for a request and its reply.
REMOTE: dict[int, str] = {
    0x65735546: "fuse",  # sshfs, s3fs, gcsfuse, mountpoint-s3, blobfuse, virtiofs, fuseblk
    0x6969: "nfs",
    0x517B: "smb",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x00C36400: "ceph",
    0x01021997: "9p",
    0x5346414F: "afs",
    0x6B414653: "kafs",
    0x73757245: "coda",
    0x19830326: "beegfs",
    0xAAD7AAEA: "panfs",
    0x20030528: "orangefs",
    0x564C: "ncp",
}
# Local filesystems, only to name them in `read_mode`; an unknown type is mapped.
LOCAL: dict[int, str] = {
    0xEF53: "ext4",  # ext2 and ext3 share it
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0x794C7630: "overlayfs",
    0x2FC12FC1: "zfs",
    0xF2F52010: "f2fs",
    0xCA451A4E: "bcachefs",
    0x4D44: "vfat",
}

# One read request of the copy: large enough that a network filesystem sends its maximum
# requests back to back (and readahead runs ahead of them), small enough that a file that
# shrinks mid-read is seen within one.
COPY_CHUNK = 16 << 20
# Pieces read at once by a plain copy: on a network filesystem each read waits for its
# round trips, so several side by side hide latency that one reader pays in full
# (bench/restore_fuse.py). A verified copy reads in order (it hashes as it reads).
COPY_THREADS = 4
# The verifier's one reusable buffer, when it reads without copying.
READ_CHUNK = 4 << 20

# Larger than struct statfs on every Linux ABI (120 bytes on x86-64 and arm64); f_type is
# its first field, a C long.
_STATFS_BYTES = 256


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def fs_type(fd: int) -> int:
    """The `f_type` magic of the filesystem holding open descriptor `fd` (OSError if
    fstatfs fails)."""
    buf = ctypes.create_string_buffer(_STATFS_BYTES)
    if _libc().fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fstatfs: {os.strerror(err)}")
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


def fs_name(magic: int) -> str:
    """'fuse (0x65735546)', 'ext4 (0xef53)' or 'f_type 0x12345678' for an unknown one."""
    name = REMOTE.get(magic) or LOCAL.get(magic)
    return f"{name} ({magic:#x})" if name else f"f_type {magic:#x}"


@dataclass(frozen=True)
class ReadPlan:
    """Whether to copy, and why, as `Checkpoint.read_mode` says it."""

    copy: bool
    why: str


def check_read(read: object) -> tuple[str, str]:
    """(how, who chose it): `read` itself, or READ_ENV's value when `read` is "auto" and the
    variable is set; ValueError naming the choices for anything else."""
    choices = ", ".join(repr(c) for c in READ_CHOICES)
    if not isinstance(read, str) or read not in READ_CHOICES:
        raise ValueError(
            f"read={read!r} is not one of {choices}: 'auto' maps a file on a local "
            "filesystem and copies one on a network or FUSE filesystem, 'mmap' always maps, "
            "'copy' always reads the file into private memory"
        )
    if read != "auto":
        return read, f"read={read!r}"
    env = os.environ.get(READ_ENV, "")
    if not env or env == "auto":
        return "auto", "auto"
    if env not in READ_CHOICES:
        raise ValueError(
            f"{READ_ENV}={env!r} is not one of {choices}: set it to one of them, or "
            "unset it to let load decide from the filesystem"
        )
    return env, f"{READ_ENV}={env}"


def plan(fd: int, read: tuple[str, str], *, others_can_write: bool = False) -> ReadPlan:
    """How to read the file open at `fd` under `read` (what `check_read` returned).

    `others_can_write`: the file is being verified and another user can write it, so what
    is verified must be kept in private memory whatever `read` says (reader.load).
    """
    how, chosen = read
    magic: int | None = None
    try:
        magic = fs_type(fd)
        fs = fs_name(magic)
    except OSError as exc:
        fs = f"filesystem unknown ({exc.strerror or exc})"
    if others_can_write:
        return ReadPlan(
            True,
            f"copied: {fs}; verified into private memory, since another user can write the file",
        )
    if how == "copy":
        return ReadPlan(True, f"copied: {fs}; {chosen}")
    if how == "mmap":
        return ReadPlan(False, f"mapped: {fs}; {chosen}")
    if magic in REMOTE:
        return ReadPlan(True, f"copied: {fs}: mapping faults are round trips")
    return ReadPlan(False, f"mapped: {fs}")


class Shrank(Exception):
    """The file ended at byte `at`, before the length its header promised."""

    def __init__(self, at: int) -> None:
        self.at = at


def data_extents(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The stored (not hole) ranges of [start, end): a hole reads as zeros without being
    read, so checking that a region is zero, or copying it into zeroed memory, costs what
    the file stores there, not what its header claims. Where the filesystem reports no
    holes, the whole range is data."""
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
            hole = os.lseek(fd, data, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # holes to the end (or the file shrank: the size check says so)
            yield pos, end
            return
        if data >= end:
            return
        yield data, min(hole, end)
        pos = hole


class Reads:
    """Positional reads of one file, through one reusable buffer or, with `into`, into the
    caller's image of the file at the same offsets (what is checked is what it holds)."""

    def __init__(self, fd: int, size: int, into: memoryview | None = None) -> None:
        self.fd = fd
        self.into = into
        self.chunk = READ_CHUNK if into is None else COPY_CHUNK
        self.buf = memoryview(bytearray(max(1, min(READ_CHUNK, size)))) if into is None else None

    def chunks(self, start: int, length: int) -> Iterator[memoryview]:
        """The bytes of [start, start + length) as read, a chunk at a time; Shrank when the
        file ends first."""
        pos, end = start, start + length
        while pos < end:
            n = min(self.chunk, end - pos)
            if self.buf is not None:
                target = self.buf[:n]
            else:
                assert self.into is not None
                target = self.into[pos : pos + n]
            got = os.preadv(self.fd, [target], pos)
            if got <= 0:
                raise Shrank(pos)
            yield target[:got]
            pos += got

    def zero(self, start: int, length: int) -> bool:
        """Whether [start, start + length) holds only zeros (holes are not read)."""
        for at, stop in data_extents(self.fd, start, start + length):
            for c in self.chunks(at, stop - at):
                if np.count_nonzero(np.frombuffer(c, np.uint8)):
                    return False
        return True


def sealed_copy(
    fd: int, parsed: Parsed, name: str, fill: Callable[[memoryview], list[str]]
) -> tuple[int, list[str]]:
    """(memfd, what `fill` returned): a new memfd the size of the file, holding the header,
    descriptors, name table and signature block as parsed and what `fill(image)` read into
    the rest (at the file's own offsets; what it skips stays zero), then sealed (no write,
    grow or shrink), so a view of it keeps those bytes whatever the file's owner writes
    afterwards. Costs memory the size of the file (shared memory, swappable like tmpfs)."""
    size = parsed.header.file_length
    with contextlib.suppress(OSError):  # advice only: readahead runs further ahead
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
    mfd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(mfd, size)
        image = mmap.mmap(mfd, size)
        view = memoryview(image)
        try:
            head = parsed.header_bytes + parsed.rest_bytes
            view[: len(head)] = head
            sig_at = parsed.header.signature_offset
            if sig_at is not None and parsed.signature_block is not None:
                view[sig_at : sig_at + len(parsed.signature_block)] = parsed.signature_block
            result = fill(view)
        finally:
            view.release()
            try:
                image.close()
            except BufferError:
                # only when `fill` raised and its traceback still holds a slice; the
                # mapping goes with it (and sealing below would refuse a live one)
                pass
        fcntl.fcntl(
            mfd,
            fcntl.F_ADD_SEALS,
            fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL,
        )
    except BaseException:
        os.close(mfd)
        raise
    return mfd, result


def read_copy(fd: int, parsed: Parsed, path: str) -> int:
    """A sealed memfd holding the file at `fd`, read in `COPY_CHUNK`-byte pieces, up to
    `COPY_THREADS` of them at once (holes skipped); `fd` is closed once the copy holds the
    file, and left to the caller when it raises. ManyFormatError when the file is shorter
    or longer than its header says by the end of the copy (someone wrote it in place
    meanwhile)."""
    length = parsed.header.file_length

    def fill(image: memoryview) -> list[str]:
        reads = Reads(fd, length, image)

        def piece(at: int, stop: int) -> None:
            for _ in reads.chunks(at, stop - at):
                pass

        pieces = [
            (p, min(p + COPY_CHUNK, stop))
            for at, stop in data_extents(fd, parsed.header.table_end, length)
            for p in range(at, stop, COPY_CHUNK)
        ]
        if len(pieces) < 2 or COPY_THREADS < 2:
            for at, stop in pieces:
                piece(at, stop)
            return []
        with ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="many-copy") as pool:
            futures = [pool.submit(piece, at, stop) for at, stop in pieces]
            for f in futures:  # in file order: the first piece that ended early is reported
                exc = f.exception()
                if exc is not None:
                    for g in futures:
                        g.cancel()
                    raise exc
        return []

    try:
        mfd, _ = sealed_copy(fd, parsed, "many-copy", fill)
    except Shrank as exc:
        raise ManyFormatError(
            f"truncated while being copied: the file ended at byte {exc.at}, before the "
            f"{length} bytes its header says; load it again once its writer is done",
            path,
        ) from None
    size = os.fstat(fd).st_size
    if size != length:
        os.close(mfd)
        what = "truncated" if size < length else "grew"
        raise ManyFormatError(
            f"{what} while being copied: the file is now {size} bytes, its header says "
            f"{length}; load it again once its writer is done",
            path,
        )
    os.close(fd)
    return mfd
