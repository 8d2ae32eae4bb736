"""A FUSE filesystem that answers, then stalls: the hostile source, checkpoint directory or
pid file of a job that serves its own files (any user can mount FUSE on a directory of
theirs through the setuid fusermount).

    with stalling_fuse(tmp_path / "mnt", {"mod.py": b"import pickle\\n"}) as fs:
        ...                 # every file answers
        fs.stall()          # from now on every request blocks, never answered
        ...
        assert fs.stalled_requests() == []  # nothing asked it anything since
    # the server is killed (its blocked requests fail with ENOTCONN) and the mount
    # lazily unmounted, whatever happened inside

Run as its own process (`python tests/fuse_stall.py MOUNTPOINT FLAG FILES.json`), so a
test that hangs in the kernel on it is released when the server dies. Uses mfusepy
(ctypes over libfuse3, Debian `fuse3`); attribute and entry caching are off, so every
stat reaches the server.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve()


def fuse_available() -> str | None:
    """None when a FUSE filesystem can be mounted here, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: no libfuse
        return f"mfusepy unusable ({exc}): pip install mfusepy; apt-get install fuse3"
    if os.geteuid() != 0:
        return "mounting FUSE in tests needs root"
    return None


class StallingFuse:
    def __init__(self, mountpoint: Path, flag: Path, proc: subprocess.Popen[bytes]) -> None:
        self.mountpoint = mountpoint
        self.flag = flag
        self.proc = proc

    def stall(self) -> None:
        """Every request from now on blocks."""
        self.flag.touch()

    def stalled_requests(self) -> list[str]:
        """The requests ("op path") that reached the server since it stalled: each holds
        the thread that made it in the kernel until the server dies."""
        try:
            return self.flag.read_text().splitlines()
        except FileNotFoundError:
            return []

    def close(self) -> None:
        from tests import fuse_server  # not at the top: this file also runs as the server

        fuse_server.stop(self.proc, self.mountpoint)
        self.flag.unlink(missing_ok=True)


@contextlib.contextmanager
def stalling_fuse(
    mountpoint: Path, files: dict[str, bytes], *, dirs: tuple[str, ...] = ()
) -> Iterator[StallingFuse]:
    """A mount at `mountpoint` (made if missing) serving `files` (name -> bytes, at its
    root) and empty directories `dirs`; see the module docstring."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    flag = mountpoint.parent / f".{mountpoint.name}.stall"
    flag.unlink(missing_ok=True)
    spec = mountpoint.parent / f".{mountpoint.name}.files.json"
    spec.write_text(
        json.dumps({"files": {k: v.decode("latin-1") for k, v in files.items()}, "dirs": dirs})
    )
    from tests import fuse_server

    try:
        proc = fuse_server.start(HERE, [str(mountpoint), str(flag), str(spec)], mountpoint)
    except BaseException:
        spec.unlink(missing_ok=True)
        raise
    fs = StallingFuse(mountpoint, flag, proc)
    try:
        yield fs
    finally:
        fs.close()
        spec.unlink(missing_ok=True)


def _serve(mountpoint: str, flag: str, spec_path: str) -> None:
    import mfusepy

    spec = json.loads(Path(spec_path).read_text())
    files = {"/" + k: v.encode("latin-1") for k, v in spec["files"].items()}
    dirs = {"/"} | {"/" + d for d in spec["dirs"]}
    now = time.time()

    def gate(op: str, path: str) -> None:
        if os.path.exists(flag):
            with open(flag, "a") as log:  # the flag file is also the log of what stalled
                log.write(f"{op} {path}\n")
            while True:
                time.sleep(3600)  # stalled for good: only killing the server ends it

    class Ops(mfusepy.Operations):
        def getattr(self, path: str, fh: int | None = None) -> dict[str, float]:
            gate("getattr", path)
            common = {"st_atime": now, "st_mtime": now, "st_ctime": now, "st_uid": 0}
            if path in dirs:
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, **common}
            if path in files:
                data = files[path]
                return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": len(data),
                        **common}  # fmt: skip
            raise mfusepy.FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: int) -> list[str]:
            gate("readdir", path)
            names = [p[len(path.rstrip("/")) + 1 :] for p in (files.keys() | dirs) if p != "/"]
            return [".", ".."] + [n for n in names if n and "/" not in n]

        def open(self, path: str, flags: int) -> int:
            gate("open", path)
            if path not in files:
                raise mfusepy.FuseOSError(errno.ENOENT)
            return 0

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            gate("read", path)
            return files[path][offset : offset + size]

        def statfs(self, path: str) -> dict[str, int]:
            gate("statfs", path)
            return {"f_bsize": 4096, "f_blocks": 1, "f_namemax": 255}

    mfusepy.FUSE(
        Ops(),
        mountpoint,
        foreground=True,
        allow_other=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
    )


if __name__ == "__main__":
    _serve(*sys.argv[1:4])
