"""Issue 45 items 2 and 3: a target's sources on a FUSE filesystem that it serves and that
stops answering cost that target its own call-site figures, never another target's and
never the sampling thread's time past its deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collectors.samples import Frame
from profiler.classify import source_cache
from profiler.classify.classifier import Classifier
from profiler.classify.source_cache import NOT_READY, SourceCache
from tests.fuse_stall import fuse_available, stalling_fuse

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))

SRC = b"import pickle\n\ndef save(x):\n    return pickle.dumps(x)\n"
# A classification of one frame whose source answers takes milliseconds; a stalled
# stat or open would take forever.
CLASSIFY_BOUND_S = 4.0


@pytest.fixture
def sleepers() -> Iterator[Callable[[], int]]:
    """Real processes whose /proc/PID/root is a target's root (same mount namespace)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        procs.append(p)
        return p.pid

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=30)


def _within(fn: Callable[[], Any], bound_s: float) -> tuple[bool, Any]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(bound_s)
    return (not t.is_alive(), out[0] if out else None)


def _frame(path: Path) -> tuple[Frame, ...]:
    return (Frame("save", str(path), 4),)


def test_a_source_that_stalls_after_answering_costs_only_its_own_target(
    tmp_path: Path, sleepers: Callable[[], int]
) -> None:
    """Item 2: the cached source's re-stat (revalidate) blocked the shared classifier."""
    hostile, honest = Path(f"/proc/{sleepers()}/root"), Path(f"/proc/{sleepers()}/root")
    honest_src = tmp_path / "honest.py"
    honest_src.write_bytes(SRC)
    c = Classifier.default(stat_ttl_s=0.0)
    with stalling_fuse(tmp_path / "mnt", {"job.py": SRC}) as fs:
        job = fs.mountpoint / "job.py"
        assert c.classify_frames(_frame(job), proc_root=hostile).codepath == "pickle"
        assert c.classify_frames(_frame(honest_src), proc_root=honest).codepath == "pickle"
        fs.stall()
        for _ in range(3):
            t0 = time.monotonic()
            done, got = _within(
                lambda: c.classify_frames(_frame(honest_src), proc_root=honest).codepath,
                CLASSIFY_BOUND_S,
            )
            assert done, "the honest target's classification waited on the stalled source"
            assert got == "pickle"
            done, got = _within(
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
    tmp_path: Path, sleepers: Callable[[], int]
) -> None:
    """Item 3: 4 processes x 4 never-answering files took all MAX_LOADS loader threads,
    and from then on no target's source loaded."""
    n_roots = source_cache.MAX_LOADS // source_cache.MAX_LOADS_PER_ROOT
    roots = [Path(f"/proc/{sleepers()}/root") for _ in range(n_roots + 1)]
    files = {f"f{i}.py": SRC for i in range(source_cache.MAX_LOADS_PER_ROOT + 2)}
    honest_src = tmp_path / "honest.py"
    honest_src.write_bytes(SRC)
    with stalling_fuse(tmp_path / "mnt", files) as fs:
        fs.stall()
        cache = SourceCache()
        for root in roots[:n_roots]:
            for name in files:
                path = f"{root}{fs.mountpoint}/{name}"
                _, err, _ = cache.get(path, root=str(root), deadline=time.monotonic() + 0.05)
                assert err == NOT_READY
        time.sleep(source_cache.SOURCE_WAIT_S + 0.2)  # every one of them is past its wait
        honest = cache.get(
            f"{roots[-1]}{honest_src}", root=str(roots[-1]), deadline=time.monotonic() + 3.0
        )
        assert honest[1] is None and honest[0] is not None, honest[1]
        # each hostile root holds at most its own loaders, stuck
        assert source_cache.loads_running() <= n_roots * source_cache.MAX_LOADS_PER_ROOT
    source_cache.wait_for_loads(10.0)  # the server is gone: the stuck loads failed


def test_exit_does_not_wait_for_stuck_loads(tmp_path: Path, sleepers: Callable[[], int]) -> None:
    """The interpreter's exit waits for loads still working (re2 would abort it), not for
    loads stuck in the kernel past their wait: the daemon stops on SIGTERM in time."""
    root = Path(f"/proc/{sleepers()}/root")
    with stalling_fuse(tmp_path / "mnt", {"job.py": SRC}) as fs:
        fs.stall()
        cache = SourceCache()
        cache.get(f"{root}{fs.mountpoint}/job.py", root=str(root), deadline=time.monotonic())
        cache.get(f"{root}{fs.mountpoint}/job.py", root=str(root), deadline=time.monotonic() + 0.05)
        time.sleep(source_cache.SOURCE_WAIT_S + 0.2)
        t0 = time.monotonic()
        assert source_cache.wait_for_loads(source_cache.EXIT_WAIT_S, stuck_too=False)
        assert time.monotonic() - t0 < 1.0
    assert os.path.ismount(fs.mountpoint) is False
