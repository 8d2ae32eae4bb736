"""A read-only FUSE passthrough of a directory that adds a fixed latency to every read
request: a network or object-store filesystem as a reader sees it, where each request
waits for a round trip (tests/many/test_many_restore.py, bench/restore_fuse.py).

    with latency_fuse(tmp_path / "mnt", backing_dir, latency_s=0.002) as fs:
        ...  # fs.mountpoint / "x.many" reads backing_dir / "x.many"

`resize=(name, at, to)`: the first read request of `name` at or past byte `at` first
truncates (or extends) its backing file to `to` bytes, and is then answered from what it
holds (a writer rewriting the file in place while it is restored).

Run as its own process (`python tests/fuse_latency.py SPEC.json`), as tests/fuse_stall.py
is, so a reader stuck in the kernel on it is released when the server is killed. Uses
mfusepy (ctypes over libfuse3, Debian `fuse3`), multithreaded, so the kernel's concurrent
readahead requests wait their latency side by side as they would on a network. Attribute and
entry caching are off (every fstat reaches the server and sees the backing file's size);
the kernel's page cache of a file is dropped when the file is opened again (no keep_cache),
so each load reads through the server.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve()


class LatencyFuse:
    def __init__(self, mountpoint: Path, backing: Path, proc: subprocess.Popen[bytes]) -> None:
        self.mountpoint = mountpoint
        self.backing = backing
        self.proc = proc

    def close(self) -> None:
        from tests import fuse_server  # not at the top: this file also runs as the server

        fuse_server.stop(self.proc, self.mountpoint)


@contextlib.contextmanager
def latency_fuse(
    mountpoint: Path,
    backing: Path,
    *,
    latency_s: float,
    resize: tuple[str, int, int] | None = None,
) -> Iterator[LatencyFuse]:
    """A mount at `mountpoint` (made if missing) of directory `backing`, each read request
    answered after `latency_s` seconds; see the module docstring."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    spec = mountpoint.parent / f".{mountpoint.name}.latency.json"
    spec.write_text(
        json.dumps(
            {
                "mountpoint": str(mountpoint),
                "backing": str(backing),
                "latency_s": latency_s,
                "resize": list(resize) if resize else None,
            }
        )
    )
    from tests import fuse_server

    try:
        fs = LatencyFuse(mountpoint, backing, fuse_server.start(HERE, [str(spec)], mountpoint))
    except BaseException:
        spec.unlink(missing_ok=True)
        raise
    try:
        yield fs
    finally:
        fs.close()
        spec.unlink(missing_ok=True)


def _serve(spec_path: str) -> None:
    import threading

    import mfusepy

    spec = json.loads(Path(spec_path).read_text())
    root = spec["backing"]
    latency = float(spec["latency_s"])
    resize = spec["resize"]
    resized = threading.Event()

    def real(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    class Ops(mfusepy.Operations):
        use_ns = True

        def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
            try:
                st = os.lstat(real(path))
            except FileNotFoundError:
                raise mfusepy.FuseOSError(errno.ENOENT) from None
            keys = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_blocks")
            times = ("st_atime", "st_mtime", "st_ctime")
            return {k: getattr(st, k) for k in keys} | {k: getattr(st, k + "_ns") for k in times}

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(real(path))]

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise mfusepy.FuseOSError(errno.EROFS)
            return os.open(real(path), os.O_RDONLY)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            if resize and not resized.is_set() and path == "/" + resize[0] and offset >= resize[1]:
                resized.set()
                os.truncate(real(path), resize[2])
            if latency:
                time.sleep(latency)
            return os.pread(fh, size, offset)

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            # the backing filesystem's capacity, so a reader's sparse-file bound holds here too
            sv = os.statvfs(real(path))
            keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files")
            return {k: getattr(sv, k) for k in (*keys, "f_ffree", "f_favail", "f_namemax")}

    mfusepy.FUSE(
        Ops(),
        spec["mountpoint"],
        foreground=True,
        allow_other=True,
        ro=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
    )


if __name__ == "__main__":
    _serve(sys.argv[1])
