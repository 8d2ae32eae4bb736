"""Page-cache control for a restore: how much of each checkpoint file is cached
(mincore(2) over a read-only shared mapping, which reads nothing), and eviction
(fsync, then posix_fadvise DONTNEED) before a cold restore; the restore's label
(cold, warm, partly cached) from the fraction.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os
from pathlib import Path

from serwatt.profiler.profile.checkpoint_files import snapshot
from serwatt.profiler.safeio import open_regular

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(fd: int, size: int) -> tuple[int, int]:
    """(resident, total) pages of an open file of `size` bytes in the page cache, by
    mincore(2) over a shared read-only mapping: mapping a file reads nothing until a page
    is touched. bench/checkpoint.py uses it too."""
    if size == 0:
        return 0, 0
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(addr, size, vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return sum(b & 1 for b in vec), pages
    finally:
        _libc.munmap(addr, size)


def resident_fraction(fd: int, size: int) -> float:
    """The fraction of the file's pages in the page cache (1.0 for an empty file)."""
    resident, pages = resident_pages(fd, size)
    return resident / pages if pages else 1.0


def cache_state(directory: Path, *, evict: bool) -> dict[str, float]:
    """path -> fraction cached, of each checkpoint file under `directory`; with `evict`
    each is first fsynced (dirty pages cannot be dropped) and dropped with
    posix_fadvise(DONTNEED), so the fraction confirms the eviction."""
    out: dict[str, float] = {}
    for path in snapshot(directory):
        try:
            with open_regular(path) as fd:
                size = os.fstat(fd).st_size
                if evict:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                out[path] = resident_fraction(fd, size)
        except OSError:
            continue
    return out


def cache_label(fraction: float) -> str:
    if fraction <= 0.0:
        return "cold"
    if fraction >= 1.0:
        return "warm"
    # floored: a file one page short of cached is not "100%" cached
    return f"partly cached ({math.floor(fraction * 100)}%)"
