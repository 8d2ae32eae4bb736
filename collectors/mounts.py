"""Which filesystem a path is on, from a process's mountinfo, without touching the path.

A FUSE filesystem is served by a process, any user's (through the setuid fusermount),
and once its server has read a request the kernel waits for the answer uninterruptibly:
a thread stuck there cannot be ended, SIGKILL included, and a process with such a thread
does not finish exiting. A `stat` or `statfs` of the path would itself be such a request,
so the question is answered from /proc/<pid>/mountinfo (procfs: never blocks) by the
longest mount point that is a prefix of the path, lexically. A path that reaches a FUSE
mount through a symbolic link is not seen here: that is left to the deadline of the
caller's worker (profiler/owned_io.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MAX_MOUNTINFO_BYTES = 16 * 1024 * 1024
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    point: str  # the mount point, as the process sees it
    fstype: str  # "ext4", "fuse.sshfs", "nfs4"


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            mounts.append(Mount(_unescape(fields[4]), fields[sep + 1]))
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


def mount_of(mounts: list[Mount], path: str) -> Mount | None:
    """The mount `path` (absolute, as the mounts' process sees it) is on, lexically."""
    path = os.path.normpath(path)
    best: Mount | None = None
    for m in mounts:
        p = m.point.rstrip("/") or "/"
        inside = path == p or path.startswith(p + "/") or p == "/"
        if inside and (best is None or len(p) >= len(best.point.rstrip("/") or "/")):
            best = m
    return best


def is_fuse(fstype: str) -> bool:
    """FUSE, whatever its server names it (`fuse`, `fuse.sshfs`, `fuseblk`)."""
    return fstype == "fuse" or fstype.startswith("fuse.") or fstype == "fuseblk"


def on_fuse(path: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether `path` (absolute as the mountinfo's process sees it) is on FUSE, lexically."""
    m = mount_of(read_mounts(mountinfo), path)
    return m is not None and is_fuse(m.fstype)
