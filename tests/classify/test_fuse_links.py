"""Issue 45 ask 1: a source reached through a link into a FUSE mount that stalls is refused
as on FUSE, by the mount of each component the resolution reaches, before anything on the
mount is asked: a request the server has read and never answers leaves the thread that
made it unkillable, and the daemon with it (it does not finish exiting on SIGTERM).

The links are in a normal directory: a link to the file on the mount, and a link to the
mount's directory as a path component. The server logs every request that reaches it
once it stalls (tests/fuse_stall.py): none may."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from serwatt.profiler.classify import source_cache
from serwatt.profiler.classify.source_cache import SourceCache
from serwatt.profiler.classify.target_files import reaches_fuse, stat_source
from tests.classify import fuse_targets
from tests.classify.fuse_targets import NOBODY, SRC, within
from tests.fuse_stall import StallingFuse, fuse_available, stalling_fuse

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))
# the shared fixtures: a directory `nobody` can search, and real target processes
tmp_path = fuse_targets.tmp_path
sleepers = fuse_targets.sleepers

# Refusing by the mount table takes a few syscalls per component; a request to the
# stalled server would never return.
REFUSE_BOUND_S = 4.0
# configs/systemd/serwatt.service TimeoutStopSec
UNIT_STOP_TIMEOUT_S = 30.0


def _linked(tmp_path: Path, fs: StallingFuse, kind: str) -> Path:
    """The path a frame names: through a link to the file, or through a link to the
    mount's directory as a component."""
    if kind == "file":
        (tmp_path / "job.py").symlink_to(fs.mountpoint / "job.py")
        return tmp_path / "job.py"
    (tmp_path / "code").symlink_to(fs.mountpoint)
    return tmp_path / "code" / "job.py"


@pytest.mark.parametrize("kind", ["file", "directory"])
@pytest.mark.parametrize("uid", [0, NOBODY], ids=["root-target", "nobody-target"])
def test_a_link_into_a_stalled_fuse_mount_is_refused_untouched(
    tmp_path: Path, sleepers: Callable[..., int], kind: str, uid: int
) -> None:
    """uid 0: a target that may read what serwatt may (openat2 resolves alone); nobody:
    every directory checked searchable on the way (the component walk)."""
    root = f"/proc/{sleepers(uid)}/root"
    with stalling_fuse(tmp_path / "mnt", {"job.py": SRC}) as fs:
        path = _linked(tmp_path, fs, kind)
        fs.stall()  # from the first request: any stat, lookup or open would hang
        done, got = within(
            lambda: SourceCache().get(f"{root}{path}", root=root, deadline=time.monotonic() + 2),
            REFUSE_BOUND_S,
        )
        assert done, f"the load waited on the stalled mount: {fs.stalled_requests()}"
        assert got[0] is None and got[1] == source_cache.ON_FUSE, got
        # the re-stat of cached files and the host-path check refuse it the same way
        done, got = within(lambda: SourceCache._stat_key(f"{root}{path}", root), REFUSE_BOUND_S)
        assert done and got is None
        done, got = within(lambda: reaches_fuse(str(path)), REFUSE_BOUND_S)
        assert done and got is True
        assert fs.stalled_requests() == []
        assert source_cache.loads_running() == 0


def test_a_link_to_a_local_file_is_not_taken_for_fuse(
    tmp_path: Path, sleepers: Callable[..., int]
) -> None:
    """The control: the same links into a local directory beside the mount resolve."""
    root = f"/proc/{sleepers(NOBODY)}/root"
    local = tmp_path / "local"
    local.mkdir()
    (local / "job.py").write_bytes(SRC)
    (tmp_path / "job.py").symlink_to(local / "job.py")
    (tmp_path / "code").symlink_to(local)
    with stalling_fuse(tmp_path / "mnt", {"job.py": SRC}) as fs:
        fs.stall()
        for path in (tmp_path / "job.py", tmp_path / "code" / "job.py"):
            assert not reaches_fuse(str(path))
            assert stat_source(f"{root}{path}", root).st_size == len(SRC)
            index, err, _ = SourceCache().get(
                f"{root}{path}", root=root, deadline=time.monotonic() + 3
            )
            assert err is None and index is not None
        assert fs.stalled_requests() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="FUSE mounts and py-spy need root here")
def test_the_daemon_stops_on_sigterm_beside_a_job_linked_into_a_stalled_mount(
    tmp_path: Path,
) -> None:
    """Two jobs run their script through a link into the mount (one to the file, one to
    its directory); the mount stalls before the daemon starts. The daemon samples and
    classifies them, never asks the mount anything, and stops on SIGTERM within the
    unit's stop timeout (before, a loader thread was left in the kernel and the daemon
    never finished exiting)."""
    from tests.daemon_support import WORKLOAD, start_daemon, stop_process

    jobs: list[subprocess.Popen[bytes]] = []
    with stalling_fuse(tmp_path / "mnt", {"job.py": WORKLOAD.encode()}) as fs:
        try:
            for kind in ("file", "directory"):
                sub = tmp_path / kind
                sub.mkdir()
                script = _linked(sub, fs, kind)
                jobs.append(
                    subprocess.Popen(
                        [sys.executable, str(script), f"linked_{kind}_marker"],
                        stdout=subprocess.DEVNULL,
                    )
                )
            time.sleep(1.0)  # both have read their script
            fs.stall()
            targets = {f"linked_{k}": f"linked_{k}_marker" for k in ("file", "directory")}
            d = start_daemon(tmp_path, targets, window_s=2)
            try:
                for t in targets:
                    d.wait_metric("serwatt_cpu_seconds_total", 1e-9, target=t, timeout_s=90)
                asked = fs.stalled_requests()
                code, took = d.stop(timeout_s=UNIT_STOP_TIMEOUT_S + 5)
            finally:
                d.kill()
        finally:
            for p in jobs:
                stop_process(p)
    assert asked == [], asked
    assert code == 0, d.log()[-3000:]
    assert took < UNIT_STOP_TIMEOUT_S, (took, d.log()[-3000:])


def test_a_checkpoint_head_through_a_directory_link_into_a_stalled_mount_is_not_read(
    tmp_path: Path,
) -> None:
    """The checkpoint watch reports paths under the directory it was given; a link among
    that directory's components into a FUSE mount is refused the same way (its format
    is then told from its name), and a link as the file itself is not followed."""
    from serwatt.profiler.attribution.checkpoint_watch import file_head

    local = tmp_path / "local.pt"
    local.write_bytes(b"PK\x03\x04rest")
    (tmp_path / "link.pt").symlink_to(local)
    with stalling_fuse(tmp_path / "mnt", {"ckpt.pt": b"PK\x03\x04rest"}) as fs:
        (tmp_path / "ckpts").symlink_to(fs.mountpoint)
        fs.stall()
        done, got = within(lambda: file_head(str(tmp_path / "ckpts" / "ckpt.pt")), REFUSE_BOUND_S)
        assert done and got is None
        assert fs.stalled_requests() == []
    assert file_head(str(local)) == b"PK\x03\x04rest"  # the control
    assert file_head(str(tmp_path / "link.pt")) is None
