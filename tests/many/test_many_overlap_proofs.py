"""The non-allocation proofs (tests/proofs/) on the overlapped path: a checkpoint with
`overlap=True`, the optimizer step that waits for its background copy, and the write.

What holds, and is asserted here, in a child after 30 warm-up steps:
- no tensor-sized allocation on either thread (the staging arena is reused: the background
  copy goes into it, as the synchronous one does);
- every block allocated in the loop is freed in it, on both threads together;
- the training thread's C allocator calls exceed those of the same loop through the
  synchronous copy by at most a few per checkpoint (the step pre-hook's registration and
  the overlapped slots' list; how many of them reach malloc depends on whether the caller
  also waits on a condition, so the count is a bound, not exact);
- 200 overlapped checkpoints and steps run under the seccomp filter (no mmap, munmap, brk
  or mremap) to the end.
The exact per-call counts of tests/many/test_many_proofs.py are for `checkpoint()` alone; here the
optimizer's own step is in the loop (what it allocates is torch's, the same in both loops).
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.proofs.harness import build_shim, run_child
from tests.proofs.seccomp import ARCHES

TARGET = "tests.overlap_targets:checkpoint_and_step"
WARMUP, N = 30, 40
EXTRA_PER_CHECKPOINT = 4
SMALLEST_TENSOR = 128 * 128 * 4  # a weight or momentum matrix of the target's state

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or platform.machine() not in ARCHES,
    reason="needs the system C compiler and a seccomp syscall table for this machine",
)


@pytest.fixture()
def workdir(tmp_path: Path) -> Iterator[Path]:
    """tmpfs when there is one: allocations and system calls are the same on any file
    system, and fsync there returns at once."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="serwatt-overlap-proof-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.long  # the overlap allocation proof at full length
def test_overlapped_checkpoints_allocate_nothing_tensor_sized_and_free_everything(
    tmp_path: Path, workdir: Path
) -> None:
    shim = build_shim(tmp_path)
    runs = {}
    for overlap in (False, True):
        r = run_child(
            TARGET, "count", workdir=workdir, n=N, warmup=WARMUP, shim=shim,
            kwargs={"overlap": overlap},
        )  # fmt: skip
        assert r.returncode == 0 and r.result is not None, r.stderr[-2000:]
        runs[overlap] = r.result
    for result in runs.values():
        assert result["max_size"] < SMALLEST_TENSOR, result["max_size"]
        total = result["counts"]
        allocated = total["malloc"] + total["calloc"] + total["posix_memalign"]
        assert total["free"] == allocated, total
    plain, overlapped = runs[False]["caller_counts"], runs[True]["caller_counts"]
    assert overlapped["posix_memalign"] == plain["posix_memalign"]  # torch's, in step()
    assert plain["malloc"] <= overlapped["malloc"] <= plain["malloc"] + EXTRA_PER_CHECKPOINT * N


@pytest.mark.long  # the overlap seccomp proof at full length
def test_overlapped_checkpoints_survive_seccomp(workdir: Path) -> None:
    r = run_child(TARGET, "seccomp", workdir=workdir, n=200, warmup=WARMUP)
    assert r.survived, (r.returncode, r.signal, r.trapped_call or r.stderr[-2000:])
    assert r.stdout.strip() == "SURVIVED 200"
