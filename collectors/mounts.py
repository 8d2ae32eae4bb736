"""Which filesystem an fd is on, from procfs, without asking the filesystem.

A FUSE filesystem is served by a process, any user's (through the setuid fusermount),
and once its server has read a request the kernel waits for the answer uninterruptibly:
a thread stuck there cannot be ended, SIGKILL included, and a process with such a thread
does not finish exiting. A `stat` or `statfs` would itself be such a request, and a path
can reach a FUSE mount through a link, as a whole or as one of its directories, so no
path is judged by its text: a resolution that walks components checks the mount of each
one it holds (an O_PATH fd, which asks the filesystem nothing) before it stats or opens
it (`MountGuard`, used by profiler/classify/target_files.py): the fd's mount id from
/proc/self/fdinfo, its type from the mountinfo of the namespace it was reached in
(procfs: never blocks).
"""

from __future__ import annotations

import errno
import os
import re
import select
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

MAX_MOUNTINFO_BYTES = 16 * 1024 * 1024
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    point: str  # the mount point, as the process sees it
    fstype: str  # "ext4", "fuse.sshfs", "nfs4"
    mount_id: int = -1  # the kernel's id of the mount (fdinfo's mnt_id)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            mounts.append(Mount(_unescape(fields[4]), fields[sep + 1], int(fields[0])))
        except (ValueError, IndexError):
            continue
    return mounts


def read_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[Mount]:
    """The mounts a mountinfo file lists ([] when it cannot be read)."""
    try:
        with open(mountinfo, "rb") as f:
            text = f.read(MAX_MOUNTINFO_BYTES).decode("utf-8", "surrogateescape")
    except OSError:
        return []
    return parse_mountinfo(text)


def is_fuse(fstype: str) -> bool:
    """FUSE, whatever its server names it (`fuse`, `fuse.sshfs`, `fuseblk`)."""
    return fstype == "fuse" or fstype.startswith("fuse.") or fstype == "fuseblk"


ON_FUSE = "on a FUSE filesystem (docs/classification.md)"


class OnFuse(OSError):
    """A resolution reached a FUSE mount (or a mount the table does not list) and stopped
    there, before asking it anything."""

    def __init__(self, path: str, why: str = ON_FUSE) -> None:
        super().__init__(errno.EXDEV, why, path)


def fd_mount_id(fd: int) -> int:
    """The mount id of an fd (O_PATH ones too), from procfs: asks the fd's filesystem
    nothing."""
    info = os.open(f"/proc/self/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(info, 4096)
    finally:
        os.close(info)
    for line in data.split(b"\n"):
        if line.startswith(b"mnt_id:"):
            return int(line[7:])
    raise OSError(errno.EIO, "no mnt_id in fdinfo", f"/proc/self/fdinfo/{fd}")


class _Table:
    """mount id -> fstype of one mount namespace, read again when the kernel says its
    mounts changed (poll on an open mountinfo: POLLPRI) or an id is not in it."""

    def __init__(self, mountinfo: str) -> None:
        self._fd = os.open(mountinfo, os.O_RDONLY | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLPRI | select.POLLERR)
        self._lock = threading.Lock()
        self._types: dict[int, str] = {}
        self.used = time.monotonic()
        self._read()

    def _read(self) -> None:
        self._poll.poll(0)  # takes the change event, if any: this read sees it
        os.lseek(self._fd, 0, os.SEEK_SET)
        chunks, size = [], 0
        while size < MAX_MOUNTINFO_BYTES:
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        text = b"".join(chunks).decode("utf-8", "surrogateescape")
        self._types = {m.mount_id: m.fstype for m in parse_mountinfo(text)}

    def fstype(self, mount_id: int) -> str | None:
        """The type of a mount whose fd is held now (a mount id is reused once its mount
        is gone, and that unmount and the new mount are events the poll sees, so a table
        polled after the fd was opened is not stale for it)."""
        with self._lock:
            if self._fd < 0:  # closed idle under a caller that held it that long
                raise OSError(errno.EBADF, "mount table closed; look again")
            if self._poll.poll(0) or mount_id not in self._types:
                self._read()
            return self._types.get(mount_id)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


_MAX_TABLES = 64  # mount namespaces whose tables are kept (an open fd each)
# An open mountinfo holds its namespace, and with it every mount in it, after its last
# process exits: a table unused this long is closed (a live target's files are re-stat'ed
# every 2 s, so its table stays).
TABLE_IDLE_S = 10.0
_TABLES: OrderedDict[tuple[int, int], _Table] = OrderedDict()
_TABLES_LOCK = threading.Lock()


def close_idle() -> float:
    """Close the tables unused for TABLE_IDLE_S; returns the time it judged by. The daemon
    calls it at each rescan too, so a namespace is let go when its last target has gone
    quiet, not at the next resolution (which may never come)."""
    now = time.monotonic()
    with _TABLES_LOCK:
        for old in [k for k, t in _TABLES.items() if now - t.used > TABLE_IDLE_S]:
            _TABLES.pop(old).close()
    return now


def _table(proc_dir: str) -> _Table:
    """The table of the mount namespace of the process at `proc_dir` (/proc/<pid>,
    /proc/self), one per namespace."""
    ns = os.stat(os.path.join(proc_dir, "ns", "mnt"))
    key = (ns.st_dev, ns.st_ino)
    now = close_idle()
    with _TABLES_LOCK:
        table = _TABLES.get(key)
        if table is not None:
            table.used = now
            _TABLES.move_to_end(key)
            return table
    table = _Table(os.path.join(proc_dir, "mountinfo"))
    with _TABLES_LOCK:
        if key in _TABLES:
            table.close()
            return _TABLES[key]
        _TABLES[key] = table
        while len(_TABLES) > _MAX_TABLES:
            _TABLES.popitem(last=False)[1].close()
    return table


class MountGuard:
    """Checks each fd a resolution holds before it is stat'ed or opened: `check` raises
    OnFuse when the fd is on FUSE, or on a mount that neither the namespace of
    `proc_dir` (where the path was reached: a target's /proc/<pid>) nor serwatt's own
    lists. Mount ids are unique node-wide while the mount lives (and the fd held keeps
    it alive), so an id either table lists is that mount."""

    def __init__(self, proc_dir: str = "/proc/self") -> None:
        self._proc_dir = proc_dir

    def check(self, fd: int, path: str) -> None:
        mount_id = fd_mount_id(fd)
        fstype = None
        if self._proc_dir != "/proc/self":
            try:
                fstype = _table(self._proc_dir).fstype(mount_id)
            except OSError:
                pass  # the process is gone (or `proc_dir` is no procfs): ours may list it
        if fstype is None:
            fstype = _table("/proc/self").fstype(mount_id)
        if fstype is None:
            raise OnFuse(path, "on a mount not in the mount table: not asked")
        if is_fuse(fstype):
            raise OnFuse(path)
