"""collectors/mounts.py: which filesystem an fd is on, from procfs alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serwatt.collectors.mounts import MountGuard, OnFuse, fd_mount_id, is_fuse, parse_mountinfo

INFO = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "30 22 0:40 / /home/u/my\\040mnt rw,nosuid shared:9 - fuse.sshfs u@h: rw,user_id=1000\n"
    "31 22 0:41 / /scratch rw - nfs4 srv:/s rw\n"
    "32 31 0:42 / /scratch/job/ckpt rw - fuse /dev/fuse rw,user_id=1000\n"
    "garbage line\n"
)


def test_mountinfo_is_parsed_with_ids_and_escapes() -> None:
    mounts = parse_mountinfo(INFO)
    assert [(m.mount_id, m.point, m.fstype) for m in mounts] == [
        (22, "/", "ext4"),
        (30, "/home/u/my mnt", "fuse.sshfs"),  # \040 is a space
        (31, "/scratch", "nfs4"),
        (32, "/scratch/job/ckpt", "fuse"),
    ]
    assert [is_fuse(t) for t in ("fuse", "fuse.sshfs", "fuseblk", "nfs4", "fusectl")] == [
        True, True, True, False, False,
    ]  # fmt: skip


def test_an_fd_mount_is_found_in_this_process_mounts() -> None:
    fd = os.open("/proc/self", os.O_PATH | os.O_CLOEXEC)
    try:
        proc_id = fd_mount_id(fd)
        info = Path("/proc/self/mountinfo").read_text()
        assert (proc_id, "proc") in {(m.mount_id, m.fstype) for m in parse_mountinfo(info)}
        MountGuard().check(fd, "/proc/self")  # not FUSE: no error
    finally:
        os.close(fd)


def test_a_mount_the_table_does_not_list_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from serwatt.collectors import mounts

    monkeypatch.setattr(mounts, "fd_mount_id", lambda fd: 1 << 40)
    with pytest.raises(OnFuse, match="not in the mount table"):
        MountGuard().check(0, "/x")


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_an_idle_table_is_closed_without_another_resolution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's fd check: a namespace's table (an open mountinfo) must be let go once
    nothing resolves in it, even when no resolution ever comes again to sweep it."""
    from serwatt.collectors import mounts

    for table in mounts._TABLES.values():  # this worker's earlier tests' tables
        table.close()
    mounts._TABLES.clear()
    before = _open_fds()
    fd = os.open(tmp_path, os.O_PATH)
    try:
        MountGuard().check(fd, str(tmp_path))
    finally:
        os.close(fd)
    assert len(_open_fds() - before) == 1  # serwatt's own table, kept while in use
    mounts.close_idle()
    assert len(_open_fds() - before) == 1  # used just now: kept
    monkeypatch.setattr(mounts, "TABLE_IDLE_S", 0.0)
    mounts.close_idle()
    assert _open_fds() - before == set()
