""".many files against their readers, round 3 (issue 45 items 10 and 16).

Item 10: a sparse file claims what it does not store (8 KiB on disk claiming 16 TiB). A claim
past the file's filesystem is refused by every reader before it reads past the header; a
descriptor arena that is a hole is refused before it is read into memory; below those bounds
`verify` costs what the file stores, not what it claims (a hole reads as zeros unread).
Every reader runs in a child under a timeout, so a reader that reads the claim fails the test
instead of hanging it.

Item 16: `load(verify=True)` of a file another user can write returns what it verified: the
owner's writes after the load do not reach the returned views or tensors.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from serwatt.profiler.many import load, load_state, save, save_state, torch_compat, verify
from serwatt.profiler.many.format import HEADER_SIZE, Header, parse_header

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(REPO))
HANG_S = 30  # a reader still busy after this is reading the claim, not the file
CLAIM = 16 << 40  # the probe's 16 TiB


def _child(code: str, *args: str, module: bool = False) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, *(["-m", code] if module else ["-c", code]), *args],
            capture_output=True,
            text=True,
            env=ENV,
            cwd=REPO,
            timeout=HANG_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still reading after {HANG_S} s: the reader reads what the file claims")


def _reseal(fd: int, header: Header) -> None:
    """Write `header` with its receipt recomputed, as anyone without a key can."""
    desc = os.pread(fd, 64 * header.slot_count, HEADER_SIZE)
    os.pwrite(fd, header.with_receipt(desc).pack(), 0)


def _header(fd: int) -> Header:
    return parse_header(os.pread(fd, HEADER_SIZE, 0), os.fstat(fd).st_size)


def _grow_state(path: Path, extra: int) -> None:
    """Claim `extra` more zero bytes after the last slot, as a hole, and reseal: a sound file
    (the format allows zeros after the last slot) that stores 8 KiB."""
    fd = os.open(path, os.O_RDWR)
    try:
        h = _header(fd)
        grown = dataclasses.replace(
            h, state_length=h.state_length + extra, file_length=h.file_length + extra
        )
        os.ftruncate(fd, grown.file_length)
        _reseal(fd, grown)
    finally:
        os.close(fd)


def _capacity(path: Path) -> int:
    fs = os.statvfs(path)
    return fs.f_blocks * fs.f_frsize


@pytest.fixture
def past_the_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A sound-looking state file claiming 16 TiB (or twice its filesystem, where a file
    cannot be that large), 8 KiB on disk."""
    path = tmp_path / "ckpt.many"
    save_state(path, {"w": torch.ones(2)})
    capacity = _capacity(tmp_path)
    if not capacity:
        pytest.skip("the filesystem reports no capacity")
    for extra in (max(CLAIM, 2 * capacity), 2 * capacity):
        extra -= extra % 4096
        try:
            _grow_state(path, extra)
            break
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
    else:
        pytest.skip("this filesystem's largest file is smaller than its capacity")
    assert os.stat(path).st_size > capacity
    assert os.stat(path).st_blocks * 512 < 1 << 20
    yield path


def _print_error(call: str) -> str:
    return f"try:\n    {call}\n    print('ok')\nexcept Exception as exc:\n    print(exc)"


READERS = {
    "load": _print_error("many.load(p)"),
    "load-verify": _print_error("many.load(p, verify=True)"),
    "verify": "print(many.verify(p))",
    "verify_chain": "print(many.verify_chain([p]))",
    "chain_head": "print(many.chain_head([p]))",
    "read_receipts": _print_error("read_receipts(p)"),
    "load_state": _print_error("many.load_state(p)"),
    "torch_compat": _print_error("many.torch_compat.load(p)"),
    "arena": _print_error("many.Arena(p)"),
    # `serwatt report --checkpoints DIR`'s check of the directory
    "report-checkpoints": "print(checkpoint_chain(Path(p).parent, {})['first_break'])",
}
PRELUDE = (
    "import sys\nfrom pathlib import Path\nfrom serwatt.profiler import many\n"
    "from serwatt.profiler.many.verify import read_receipts\n"
    "from serwatt.profiler.cli.report import checkpoint_chain\np = sys.argv[1]\n"
)


@pytest.mark.parametrize("reader", READERS)
def test_a_claim_past_the_filesystem_is_refused_at_once(
    past_the_filesystem: Path, reader: str
) -> None:
    out = _child(PRELUDE + READERS[reader], str(past_the_filesystem))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "more than its filesystem holds" in out.stdout, out.stdout
    assert "a sparse file whose bytes were never written" in out.stdout, out.stdout


@pytest.mark.parametrize("how", ["many verify", "many inspect"])
def test_the_cli_refuses_a_claim_past_the_filesystem(past_the_filesystem: Path, how: str) -> None:
    out = _child("profiler", *how.split(), str(past_the_filesystem), module=True)
    assert out.returncode == 1, out.stdout + out.stderr  # a file that fails its checks
    assert "more than its filesystem holds" in out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def test_a_sparse_claim_within_the_filesystem_costs_what_the_file_stores(tmp_path: Path) -> None:
    """Zeros after the last slot that are a hole: sound, and verified without reading them
    (the old verifier read them one byte a call, since its buffer was the largest slot's
    size: 61 s/GiB)."""
    path = tmp_path / "ckpt.many"
    save(path, {"w": np.zeros(1, np.uint8)})
    extra = min(8 << 30, _capacity(tmp_path) // 4)
    extra -= extra % 4096
    _grow_state(path, extra)
    code = (
        "import sys, time, json\nfrom serwatt.profiler import many\n"
        "t = time.perf_counter(); problems = many.verify(sys.argv[1])\n"
        "print(json.dumps([problems, time.perf_counter() - t]))"
    )
    out = _child(code, str(path))
    problems, took_s = json.loads(out.stdout)
    assert problems == []
    # a pass over the stored bytes (8 KiB) and a few lseeks; reading the claim at even
    # 10 GiB/s would take 0.8 s
    assert took_s < 0.5, took_s


def test_a_descriptor_arena_that_is_a_hole_is_not_read_into_memory(tmp_path: Path) -> None:
    """slot_count 2^24 claims 1 GiB of descriptors the file does not store: refused before
    the reader allocates them (it read them whole, then found them invalid)."""
    path = tmp_path / "ckpt.many"
    save(path, {"w": np.ones(4, np.float32)})
    fd = os.open(path, os.O_RDWR)
    try:
        h = _header(fd)
        table = os.pread(fd, h.table_length, h.table_offset)
        slots = 1 << 24
        table_offset = HEADER_SIZE + 64 * slots
        state_offset = (table_offset + len(table) + 4096 + 4095) // 4096 * 4096
        forged = dataclasses.replace(
            h,
            slot_count=slots,
            table_offset=table_offset,
            state_offset=state_offset,
            state_length=4096,
            file_length=state_offset + 4096,
        )
        os.ftruncate(fd, HEADER_SIZE)
        os.ftruncate(fd, forged.file_length)
        os.pwrite(fd, table, table_offset)
        os.pwrite(fd, forged.pack(), 0)
    finally:
        os.close(fd)
    code = (
        "import sys\nfrom serwatt.profiler import many\n"
        "def hwm():\n    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n            return int(line.split()[1])\n"
        "before = hwm()\n"
        "try:\n    many.load(sys.argv[1])\nexcept many.ManyFormatError as exc:\n    print(exc)\n"
        "print(hwm() - before)"
    )
    out = _child(code, str(path))
    message, grew_kib = out.stdout.rsplit("\n", 2)[:2]
    assert "holds nothing on disk from byte" in message, out.stdout + out.stderr
    assert int(grew_kib) < 64 << 10, out.stdout  # the arena alone is 1 GiB


# -- item 16: what load(verify=True) returns is what it verified ---------------------------


def _others_file(path: Path) -> None:
    """Make `path` one another user can write: owned by nobody when we are root, else ours
    but writable by others."""
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        os.chmod(path, 0o644)
    else:
        os.chmod(path, 0o666)


def _owner_writes(path: Path, offset: int, data: bytes) -> None:
    """The owner's write: through its own descriptor, into the page cache every mapping of
    the file shares (which uid makes it changes nothing there)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        assert os.pwrite(fd, data, offset) == len(data)
    finally:
        os.close(fd)


def _slot_offset(path: Path) -> int:
    with load(path) as ckpt:
        return ckpt.info("w").offset


LOADERS = ["load-numpy", "load-torch", "load_state", "torch_compat"]


@pytest.mark.parametrize("loader", LOADERS)
def test_verified_load_keeps_what_it_verified_when_the_owner_writes_later(
    tmp_path: Path, loader: str
) -> None:
    path = tmp_path / "ckpt.many"
    want = np.arange(1 << 12, dtype=np.float32)
    if loader.startswith("load-"):
        save(path, {"w": want})
    else:
        save_state(path, {"w": torch.from_numpy(want.copy())})
    _others_file(path)
    offset = _slot_offset(path)
    if loader == "load-numpy":
        ckpt = load(path, verify=True)
        got = ckpt["w"]
        before = got[:4].copy()  # a page touched before the write, and pages not touched
    elif loader == "load-torch":
        ckpt = load(path, verify=True)
        got = ckpt.torch("w")
        before = got[:4].clone()
    elif loader == "load_state":
        got = load_state(path, verify=True)["w"]
        before = got[:4].clone()
    else:
        got = torch_compat.load(path, verify=True)["w"]
        before = got[:4].clone()
    np.testing.assert_array_equal(np.asarray(before), want[:4])
    _owner_writes(path, offset, np.full(1 << 12, 7.0, np.float32).tobytes())
    with load(path) as fresh:  # the file did change: an unverified load sees it
        assert float(fresh["w"][100]) == 7.0
    np.testing.assert_array_equal(np.asarray(got), want)
    assert verify(path)  # and the file no longer verifies


def test_own_file_is_verified_in_place(tmp_path: Path) -> None:
    """A file only this user can write is verified and mapped in place: no copy."""
    path = tmp_path / "ckpt.many"
    save(path, {"w": np.arange(8, dtype=np.float32)})
    os.chmod(path, 0o644)
    with load(path, verify=True) as ckpt:
        assert os.fstat(ckpt._fd).st_ino == os.stat(path).st_ino
    _others_file(path)
    with load(path, verify=True) as ckpt:
        assert os.fstat(ckpt._fd).st_ino != os.stat(path).st_ino
        np.testing.assert_array_equal(ckpt["w"], np.arange(8, dtype=np.float32))
