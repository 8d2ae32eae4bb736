"""Issue 47 ask 5: restore from a filesystem where a mapping's page faults are round trips.

A `.many` file on a FUSE mount (tests/fuse_latency.py: a passthrough of a local directory
served by its own process, each read request delayed) is read whole with large reads into
a sealed memfd, not mapped; on the local tmp dir it is mapped as before. `read=` and
SERWATT_MANY_READ override the choice, and `read_mode` says what happened and why.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from serwatt.profiler.many import ManyFormatError, load, save
from serwatt.profiler.many.restore import READ_ENV, REMOTE, fs_name, fs_type
from serwatt.profiler.many.state import load_state, open_state, save_state
from tests.fuse_latency import latency_fuse
from tests.fuse_stall import fuse_available

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))

REPO = Path(__file__).resolve().parents[2]
FUSE_MAGIC = 0x65735546
LATENCY_S = 0.001  # per read request: a fast network's round trip
BIG = 20 << 20  # more than one of the copy's 16 MiB reads
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL


def _state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(47)
    return {
        "big": rng.integers(0, 256, BIG, dtype=np.uint8),
        "w": rng.standard_normal((33, 17)).astype(np.float32),
        "nan": np.array([np.nan, -0.0, np.inf], dtype=np.float64),
        "step": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.int16),
    }


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(local file, the same file through the FUSE mount)."""
    backing = tmp_path / "data"
    backing.mkdir()
    save(backing / "ckpt.many", _state(), metadata={"step": 7})
    with latency_fuse(tmp_path / "mnt", backing, latency_s=LATENCY_S):
        yield backing / "ckpt.many", tmp_path / "mnt" / "ckpt.many"


def _fd_target(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_detection_says_fuse_on_the_mount_and_not_on_the_local_dir(
    mounted: tuple[Path, Path],
) -> None:
    local, remote = mounted
    fd = os.open(remote, os.O_RDONLY)
    try:
        assert fs_type(fd) == FUSE_MAGIC
        assert fs_name(fs_type(fd)) == "fuse (0x65735546)"
    finally:
        os.close(fd)
    fd = os.open(local, os.O_RDONLY)
    try:
        assert fs_type(fd) not in REMOTE
    finally:
        os.close(fd)
    with load(remote) as ckpt:
        assert ckpt.read_mode == "copied: fuse (0x65735546): mapping faults are round trips"
    with load(local) as ckpt:
        assert ckpt.read_mode.startswith("mapped: ")
        assert "fuse" not in ckpt.read_mode
        assert _fd_target(ckpt._fd) == str(local)


def test_a_file_on_fuse_is_copied_and_bit_identical_to_the_local_load(
    mounted: tuple[Path, Path],
) -> None:
    local, remote = mounted
    want = _state()
    with load(local) as here, load(remote) as there:
        assert there.read_mode.startswith("copied: fuse")
        assert _fd_target(there._fd).startswith("/memfd:many-copy")
        assert there.receipt == here.receipt and there.metadata == here.metadata
        assert list(there) == list(here) == list(want)
        for name in want:
            assert _same_bits(there[name], here[name]), name
            assert _same_bits(there[name], want[name]), name
        assert there.torch("w").numpy().tobytes() == want["w"].tobytes()
    with load(remote, verify=True) as verified:  # verified into the copy it binds
        assert verified.read_mode.startswith("copied: fuse")
        assert _fd_target(verified._fd).startswith("/memfd:many-verified")
        assert _same_bits(verified["big"], want["big"])


def test_state_files_and_torch_compat_follow_auto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from serwatt.profiler.many import state, torch_compat

    backing = tmp_path / "data"
    backing.mkdir()
    tree = {"model": {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, "step": 3}
    save_state(backing / "s.many", tree)
    torch_compat.save({"w": torch.arange(6.0), "step": 4}, backing / "t.pt")
    copied: list[str | None] = []
    real_copy = state.read_copy

    def counted(fd: int, parsed: object, path: str) -> int:
        copied.append(path)
        return real_copy(fd, parsed, path)  # type: ignore[arg-type]

    monkeypatch.setattr(state, "read_copy", counted)
    with latency_fuse(tmp_path / "mnt", backing, latency_s=LATENCY_S):
        there = open_state(tmp_path / "mnt" / "s.many", as_numpy=True)
        assert there.read_mode.startswith("copied: fuse")
        assert there.tree["model"]["w"].tobytes() == tree["model"]["w"].tobytes()
        assert open_state(backing / "s.many", as_numpy=True).read_mode.startswith("mapped: ")
        forced = open_state(tmp_path / "mnt" / "s.many", as_numpy=True, read="mmap")
        assert forced.read_mode == "mapped: fuse (0x65735546); read='mmap'"
        assert load_state(tmp_path / "mnt" / "s.many", as_numpy=True)["step"] == 3
        copied.clear()
        got = torch_compat.load(tmp_path / "mnt" / "t.pt")
        assert copied == [str(tmp_path / "mnt" / "t.pt")]
        assert torch.equal(got["w"], torch.arange(6.0)) and got["step"] == 4


def test_read_mmap_forces_a_mapping_and_copy_forces_a_copy(
    mounted: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    local, remote = mounted
    want = _state()
    with load(remote, read="mmap") as ckpt:
        assert ckpt.read_mode == "mapped: fuse (0x65735546); read='mmap'"
        assert _fd_target(ckpt._fd) == str(remote)
        assert _same_bits(ckpt["big"], want["big"])
    with load(local, read="copy") as ckpt:
        assert ckpt.read_mode.startswith("copied: ") and ckpt.read_mode.endswith("read='copy'")
        assert _fd_target(ckpt._fd).startswith("/memfd:many-copy")
        assert _same_bits(ckpt["w"], want["w"])
    monkeypatch.setenv(READ_ENV, "mmap")
    with load(remote) as ckpt:
        assert ckpt.read_mode == f"mapped: fuse (0x65735546); {READ_ENV}=mmap"
    with load(remote, read="copy") as ckpt:  # the argument wins over the environment
        assert ckpt.read_mode.startswith("copied: fuse")
    monkeypatch.setenv(READ_ENV, "fast")
    with pytest.raises(ValueError, match=f"{READ_ENV}='fast' is not one of 'auto', 'mmap'"):
        load(local)
    monkeypatch.delenv(READ_ENV)
    with pytest.raises(ValueError, match="read='mapped' is not one of 'auto', 'mmap', 'copy'"):
        load(local, read="mapped")


CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from serwatt.profiler.many import ManyFormatError, load
    try:
        ckpt = load(sys.argv[1], verify=sys.argv[2] == "1")
        total = sum(int(np.add.reduce(ckpt[n].reshape(-1).view(np.uint8))) for n in ckpt)
    except ManyFormatError as exc:
        print("ManyFormatError:", exc)
    else:
        print("loaded", total)
    """
)


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("change", ["shrinks", "grows"])
def test_a_file_that_changes_size_while_it_is_copied_is_an_error_not_a_crash(
    tmp_path: Path, verify: bool, change: str
) -> None:
    backing = tmp_path / "data"
    backing.mkdir()
    save(backing / "ckpt.many", _state())
    size = (backing / "ckpt.many").stat().st_size
    half = size // 2 // mmap.PAGESIZE * mmap.PAGESIZE
    to = half if change == "shrinks" else size + mmap.PAGESIZE
    # the first read request at or past the middle truncates (or extends) the file
    with latency_fuse(
        tmp_path / "mnt", backing, latency_s=LATENCY_S, resize=("ckpt.many", half, to)
    ):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path / "mnt" / "ckpt.many"), str(int(verify))],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("ManyFormatError:"), done.stdout
    said = "truncated while being" if change == "shrinks" else "grew while being"
    assert said in done.stdout, done.stdout
    assert (backing / "ckpt.many").stat().st_size == to  # the server did change it


def test_the_copy_is_sealed_and_its_views_read_only(mounted: tuple[Path, Path]) -> None:
    _local, remote = mounted
    with load(remote) as ckpt:
        fd = ckpt._fd
        assert _fd_target(fd).startswith("/memfd:many-copy")
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) == SEALS
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", ckpt.header.state_offset)
        with pytest.raises(PermissionError):
            mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_WRITE)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        view = ckpt["w"]
        assert not view.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            view[0, 0] = 1.0
        t = ckpt.torch("w")  # a private mapping of the copy: writable, the copy untouched
        before = view.tobytes()
        t.add_(1.0)
        assert view.tobytes() == before


def test_a_bad_read_value_fails_before_anything_is_opened(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="read=True is not one of"):
        load(tmp_path / "missing.many", read=True)  # type: ignore[arg-type]
    with pytest.raises(ManyFormatError):
        load(tmp_path, read="copy")  # a directory is still refused as it was
