"""collectors/mounts.py: which filesystem a path is on, from mountinfo alone."""

from __future__ import annotations

from serwatt.collectors.mounts import is_fuse, mount_of, parse_mountinfo, read_mounts

INFO = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "30 22 0:40 / /home/u/my\\040mnt rw,nosuid shared:9 - fuse.sshfs u@h: rw,user_id=1000\n"
    "31 22 0:41 / /scratch rw - nfs4 srv:/s rw\n"
    "32 31 0:42 / /scratch/job/ckpt rw - fuse /dev/fuse rw,user_id=1000\n"
    "garbage line\n"
)


def test_the_longest_mount_point_prefix_wins_lexically() -> None:
    mounts = parse_mountinfo(INFO)
    assert [m.fstype for m in mounts] == ["ext4", "fuse.sshfs", "nfs4", "fuse"]
    assert mount_of(mounts, "/home/u/my mnt/x.py").fstype == "fuse.sshfs"  # \040 is a space
    assert mount_of(mounts, "/home/u/my mntx/x.py").fstype == "ext4"
    assert mount_of(mounts, "/scratch/job/ckpt").fstype == "fuse"
    assert mount_of(mounts, "/scratch/job/ckpt/../x").fstype == "nfs4"
    assert mount_of(mounts, "/etc/passwd").fstype == "ext4"
    assert [is_fuse(t) for t in ("fuse", "fuse.sshfs", "fuseblk", "nfs4", "fusectl")] == [
        True, True, True, False, False,
    ]  # fmt: skip


def test_this_process_mounts_are_read() -> None:
    mounts = read_mounts()
    assert mount_of(mounts, "/proc/self").fstype == "proc"
