"""Issue 45 items 2 and 3: a target's sources on a FUSE filesystem that it serves and that
stops answering cost that target its own call-site figures, never another target's and
never the sampling thread's time past its deadline.

A source on a FUSE mount, or reached through a link into one, is not read at all (a
thread stuck in a FUSE request cannot be ended, and the daemon could not exit;
tests/classify/test_fuse_links.py). A network filesystem (NFS, CIFS) is read, and can
stall too: the tests of the caps on stuck loads stand one in by a FUSE mount the mount
table is made not to call FUSE (`network_standin`), reached through a link."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from serwatt.collectors import mounts
from serwatt.collectors.samples import Frame
from serwatt.profiler.classify import source_cache
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.source_cache import NOT_READY, SourceCache
from tests.classify import fuse_targets
from tests.classify.fuse_targets import NOBODY, SRC, within
from tests.fuse_stall import fuse_available, stalling_fuse

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))
# the shared fixtures: a directory `nobody` can search, and real target processes
tmp_path = fuse_targets.tmp_path
sleepers = fuse_targets.sleepers

# A classification of one frame whose source answers takes milliseconds; a stalled
# stat or open would take forever.
CLASSIFY_BOUND_S = 4.0


@pytest.fixture
def network_standin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stalling FUSE mount taken for a network filesystem (read, and able to stall):
    no FUSE type is refused, so its files are loaded and their loads get stuck."""
    monkeypatch.setattr(mounts, "is_fuse", lambda fstype: False)


def _frame(path: Path) -> tuple[Frame, ...]:
    return (Frame("save", str(path), 4),)


def test_a_source_on_fuse_is_never_opened(tmp_path: Path, sleepers: Callable[..., int]) -> None:
    root = Path(f"/proc/{sleepers(NOBODY)}/root")
    c = Classifier.default(stat_ttl_s=0.0)
    with stalling_fuse(tmp_path / "mnt", {"job.py": SRC}) as fs:
        fs.stall()  # stalled from the first request: any open would hang
        job = fs.mountpoint / "job.py"
        done, got = within(
            lambda: (
                c.classify_frames(
                    _frame(job), proc_root=root, deadline=time.monotonic() + 2
                ).codepath
            ),
            CLASSIFY_BOUND_S,
        )
        assert done and got == "other"
        index, err, _ = SourceCache().get(
            f"{root}{job}", root=str(root), deadline=time.monotonic() + 2
        )
        assert index is None and err == source_cache.ON_FUSE
        assert source_cache.loads_running() == 0  # nothing was left waiting on it


def test_a_source_that_stalls_after_answering_costs_only_its_own_target(
    tmp_path: Path, sleepers: Callable[..., int], network_standin: None
) -> None:
    """Item 2: the cached source's re-stat (revalidate) blocked the shared classifier."""
    hostile = Path(f"/proc/{sleepers(NOBODY)}/root")
    honest = Path(f"/proc/{sleepers()}/root")
    honest_src = tmp_path / "honest.py"
    honest_src.write_bytes(SRC)
    c = Classifier.default(stat_ttl_s=0.0)
    with stalling_fuse(tmp_path / "mnt", {"job.py": SRC}) as fs:
        job = tmp_path / "job.py"  # a link: the stand-in is not found lexically either
        job.symlink_to(fs.mountpoint / "job.py")
        assert c.classify_frames(_frame(job), proc_root=hostile).codepath == "pickle"
        assert c.classify_frames(_frame(honest_src), proc_root=honest).codepath == "pickle"
        fs.stall()
        for _ in range(3):
            t0 = time.monotonic()
            done, got = within(
                lambda: c.classify_frames(_frame(honest_src), proc_root=honest).codepath,
                CLASSIFY_BOUND_S,
            )
            assert done, "the honest target's classification waited on the stalled source"
            assert got == "pickle"
            done, got = within(
                lambda: (
                    c.classify_frames(
                        _frame(job), proc_root=hostile, deadline=time.monotonic() + 1.0
                    ).codepath
                ),
                CLASSIFY_BOUND_S,
            )
            assert done, "the hostile target's classification passed its deadline"
            assert got == "other"  # its own figures: the source is not there
            assert time.monotonic() - t0 < 2 * CLASSIFY_BOUND_S
        assert c.stats.sources_not_ready >= 1


def test_stalled_loads_of_one_target_do_not_take_every_loader(
    tmp_path: Path, sleepers: Callable[..., int], network_standin: None
) -> None:
    """Item 3: 4 processes x 4 never-answering files took all MAX_LOADS loader threads,
    and from then on no target's source loaded. Now a stuck load gives up its node-wide
    slot, and once MAX_STUCK_PER_USER loads of a user's processes are stuck, none more
    start for that user."""
    n_roots = source_cache.MAX_LOADS // source_cache.MAX_LOADS_PER_ROOT
    hostile = [Path(f"/proc/{sleepers(NOBODY)}/root") for _ in range(n_roots + 1)]
    honest = Path(f"/proc/{sleepers()}/root")
    names = [f"f{i}.py" for i in range(source_cache.MAX_LOADS_PER_ROOT + 2)]
    honest_src = tmp_path / "honest.py"
    honest_src.write_bytes(SRC)
    with stalling_fuse(tmp_path / "mnt", dict.fromkeys(names, SRC)) as fs:
        for name in names:
            (tmp_path / name).symlink_to(fs.mountpoint / name)
        fs.stall()
        cache = SourceCache()
        for root in hostile[:n_roots]:
            for name in names:
                path = f"{root}{tmp_path}/{name}"
                _, err, _ = cache.get(path, root=str(root), deadline=time.monotonic() + 0.05)
                assert err == NOT_READY
        held = source_cache.loads_running()
        assert held == source_cache.MAX_LOADS  # 4 per root: the node-wide cap reached
        time.sleep(source_cache.SOURCE_WAIT_S + 0.2)  # every one of them is past its wait
        got = cache.get(f"{honest}{honest_src}", root=str(honest), deadline=time.monotonic() + 3)
        assert got[1] is None and got[0] is not None, got[1]
        # the hostile user's stuck loads are past its cap: its new root starts none
        for name in names:
            path = f"{hostile[-1]}{tmp_path}/{name}"
            _, err, _ = cache.get(path, root=str(hostile[-1]), deadline=time.monotonic() + 0.05)
            assert err == NOT_READY
        assert source_cache.loads_running() == held
    source_cache.wait_for_loads(10.0)  # the server is gone: the stuck loads failed


def test_exit_does_not_wait_for_stuck_loads(
    tmp_path: Path, sleepers: Callable[..., int], network_standin: None
) -> None:
    """The interpreter's exit waits for loads still working (re2 would abort it), not for
    loads stuck in the kernel past their wait."""
    root = Path(f"/proc/{sleepers(NOBODY)}/root")
    with stalling_fuse(tmp_path / "mnt", {"job.py": SRC}) as fs:
        (tmp_path / "job.py").symlink_to(fs.mountpoint / "job.py")
        fs.stall()
        cache = SourceCache()
        cache.get(f"{root}{tmp_path}/job.py", root=str(root), deadline=time.monotonic() + 0.05)
        assert source_cache.loads_running() == 1
        time.sleep(source_cache.SOURCE_WAIT_S + 0.2)
        t0 = time.monotonic()
        assert source_cache.wait_for_loads(source_cache.EXIT_WAIT_S, stuck_too=False)
        assert time.monotonic() - t0 < 1.0
    assert os.path.ismount(fs.mountpoint) is False
