"""The three non-allocation proofs for `Arena.update` after warm-up, each in a child process
(tests/proofs/: a trap or a seccomp kill ends the child, not pytest):

1+3. An LD_PRELOAD shim (tests/proofs/alloc_shim.c, compiled here with the system cc)
     counts every C allocator call between two markers and, in trap mode, aborts at the
     first one. With CPython's own allocator, an update reaches malloc only through its one
     blake3 hash (pyo3 boxes the Py_buffer it takes from the slot's memoryview). With
     PYTHONMALLOC=malloc every Python object goes through malloc too, so the shim also counts
     CPython's objects: an update makes what its named calls make (DEPENDENCY_CALLS in
     tests/proofs/targets.py, each measured alone on the installed numpy, blake3 and
     CPython), and nothing more, none retained.
     tracemalloc over the same loop: nothing retained, a peak of a few hundred bytes.
2.   A seccomp filter (hand-built BPF, kill on mmap/munmap/brk/mremap) installed after
     warm-up: 10 000 updates run to the end.

What each named call allocates belongs to its library and moves with its version; how many
of each call an update or a checkpoint makes is serwatt's, and that is what is asserted.
Each proof has a control that the same measurement does catch an allocation.

The same three for `Checkpointer.checkpoint` (a 40-slot model + AdamW state, 30 warm-up
checkpoints), with the caller's thread counted apart from the background writer: per
checkpoint on the caller's side, 10 integer-key matches, one condition wait and 4 dict tables
(CKPT_CALLER_CALLS below), all freed and none tensor-sized, nothing of the checkpointer's
retained, and 200 checkpoints under the seccomp filter.
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
from tests.proofs.seccomp import ARCHES, build_filter

UPDATE = "tests.proofs.targets:arena_update"
EMPTY = "tests.proofs.targets:empty"
ALLOCATING = "tests.proofs.targets:allocating"
RETAINING = "tests.proofs.targets:retaining"
N = 10_000
ALLOC_KINDS = (
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
)

needs_linux_tools = pytest.mark.skipif(
    shutil.which("cc") is None or platform.machine() not in ARCHES,
    reason="needs the system C compiler and a seccomp syscall table for this machine",
)
pytestmark = needs_linux_tools


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim(tmp_path_factory.mktemp("shim"))


def _allocs(counts: dict[str, int]) -> dict[str, int]:
    return {k: counts[k] for k in ALLOC_KINDS if counts[k]}


def test_shim_sees_nothing_in_the_empty_loop_and_every_call_of_an_allocating_one(
    shim: Path, tmp_path: Path
) -> None:
    empty = run_child(EMPTY, "count", workdir=tmp_path, n=N, shim=shim)
    assert empty.returncode == 0, empty.stderr
    assert _allocs(empty.result["counts"]) == {}  # the harness itself allocates nothing
    control = run_child(ALLOCATING, "count", workdir=tmp_path, n=1000, shim=shim)
    assert control.returncode == 0, control.stderr
    assert _allocs(control.result["counts"]) == {"malloc": 1000}
    assert control.result["events"][0]["size"] > 1 << 20
    assert any("PyByteArray" in f for f in control.result["events"][0]["stack"])


CALL = "tests.proofs.targets:dependency_call"


def _count(
    shim: Path,
    tmp_path: Path,
    target: str,
    n: int,
    python_malloc: str | None = None,
    kwargs: dict[str, str] | None = None,
    caller_thread: bool = False,
) -> dict[str, int]:
    """The shim's counts of the whole process, or of the loop's own thread alone."""
    r = run_child(
        target, "count", workdir=tmp_path, n=n, shim=shim, python_malloc=python_malloc,
        kwargs=kwargs,
    )  # fmt: skip
    assert r.returncode == 0 and r.result is not None, r.stderr[-2000:]
    return r.result["caller_counts" if caller_thread else "counts"]


def _per_call(
    shim: Path,
    tmp_path: Path,
    calls: tuple[str, ...],
    n: int,
    python_malloc: str | None = None,
    caller_thread: bool = False,
) -> dict[str, dict[str, int]]:
    """Allocator calls (by kind, frees apart) that n of each named call makes beyond the
    empty loop, each measured alone in its own child."""
    base = _count(shim, tmp_path, EMPTY, n, python_malloc, caller_thread=caller_thread)
    out = {}
    for call in calls:
        counts = _count(
            shim, tmp_path, CALL, n, python_malloc, {"call": call}, caller_thread=caller_thread
        )
        out[call] = {k: counts[k] - base[k] for k in (*ALLOC_KINDS, "free")}
    return out


def _beyond(counts: dict[str, int], base: dict[str, int]) -> dict[str, int]:
    return {k: counts[k] - base[k] for k in (*ALLOC_KINDS, "free")}


def _sum(parts: list[dict[str, int]]) -> dict[str, int]:
    return {k: sum(p[k] for p in parts) for k in (*ALLOC_KINDS, "free")}


def _owner(stack: list[str]) -> str:
    """The first library in a backtrace that is not CPython's or libc's: who asked."""
    for frame in stack:
        lib = frame.split(":")[0].split("+")[0]
        if not lib.startswith(("libpython", "libc.", "python")):
            return lib.split(".")[0]
    return "python"


@pytest.mark.long  # allocation proof at full length
@pytest.mark.parametrize("by", ["name", "handle"])
def test_update_reaches_the_c_allocator_only_in_its_one_blake3_hash(
    shim: Path, tmp_path: Path, by: str
) -> None:
    hash_only = _per_call(shim, tmp_path, ("blake3_hash",), N)["blake3_hash"]
    r = run_child(UPDATE, "count", workdir=tmp_path, n=N, shim=shim, kwargs={"by": by})
    assert r.returncode == 0, r.stderr
    # N updates reach the C allocator exactly as N blake3 hashes of a slot do: one hash per
    # update (serwatt's), and what a hash allocates is blake3's (one boxed Py_buffer in
    # blake3 1.0: pyo3's PyBuffer::get).
    assert _allocs(r.result["counts"]) == _allocs(hash_only), (r.result["counts"], hash_only)
    assert r.result["counts"]["free"] == hash_only["free"]
    for event in r.result["events"]:
        assert _owner(event["stack"]) == "blake3", event["stack"]


# The named calls one `Arena.update` of a matching array makes (arena.py `update`), once
# each: the shape and layout checks read `value.shape` and `value.flags`, the slot is hashed
# once, and the new generation's `Handle` is returned.
UPDATE_CALLS = ("ndarray_shape", "ndarray_flags", "blake3_hash", "handle")


@pytest.mark.long  # allocation proof at full length
def test_python_objects_per_update_are_its_named_calls(shim: Path, tmp_path: Path) -> None:
    """PYTHONMALLOC=malloc: each Python object is a malloc the shim sees. 1000 updates over
    16 slots after 200 warm-up updates keep every generation under 257 (cached ints).

    Counted on the loop's own thread: `Arena.update` starts no thread, and the process has
    others (numpy starts its BLAS pool at import, a thread per core), whose frees can land
    inside the loop and are not the update's."""
    n = 1000
    parts = _per_call(shim, tmp_path, UPDATE_CALLS, n, "malloc", caller_thread=True)
    base = _count(shim, tmp_path, EMPTY, n, "malloc", caller_thread=True)
    update = _beyond(_count(shim, tmp_path, UPDATE, n, "malloc", caller_thread=True), base)
    # Each named call allocates something (so each term can be told apart from nothing)...
    for call in UPDATE_CALLS:
        assert parts[call]["malloc"] >= n, (call, parts[call])
    # ... and an update allocates what its calls do, once each, and nothing of its own:
    # an allocation of its own would add n (one per update). Each count is compared to
    # within 1 per call measured: a cache that grows once (a free list, a dict's resize)
    # lands in one child's 1000 calls or another's (handle read 1001 mallocs, and an
    # update 5001 frees against its calls' 5000 once).
    calls = _sum([parts[c] for c in UPDATE_CALLS])
    slack = len(UPDATE_CALLS)
    assert all(abs(update[k] - calls[k]) <= slack for k in calls), (update, parts)
    assert update["free"] >= update["malloc"] - 1, update  # the first call's frame stays


def test_trap_aborts_at_the_first_allocation(shim: Path, tmp_path: Path) -> None:
    assert run_child(EMPTY, "trap", workdir=tmp_path, n=N, shim=shim).returncode == 0
    control = run_child(ALLOCATING, "trap", workdir=tmp_path, n=10, shim=shim)
    assert control.signal == "SIGABRT" and "trapped malloc" in control.stderr
    r = run_child(UPDATE, "trap", workdir=tmp_path, n=N, shim=shim)
    assert r.signal == "SIGABRT" and "trapped malloc" in r.stderr  # blake3's one malloc


@pytest.mark.long  # allocation proof at full length
def test_tracemalloc_net_zero_and_peak_bounded(tmp_path: Path) -> None:
    empty = run_child(EMPTY, "tracemalloc", workdir=tmp_path, n=N)
    r = run_child(UPDATE, "tracemalloc", workdir=tmp_path, n=N)
    assert empty.returncode == 0 and r.returncode == 0, r.stderr
    # Nothing retained beyond what the empty loop leaves (tracemalloc's own bookkeeping).
    assert r.result["net_after_gc"] <= empty.result["net_after_gc"], (r.result, empty.result)
    assert r.result["peak"] < 1024, r.result  # a few transient objects, not a slot (256 KiB)
    control = run_child(RETAINING, "tracemalloc", workdir=tmp_path, n=N)
    assert control.result["net_after_gc"] >= 64 * N


@pytest.mark.long  # seccomp proof at full length
def test_seccomp_update_loop_survives_10000_updates(tmp_path: Path) -> None:
    r = run_child(UPDATE, "seccomp", workdir=tmp_path, n=N)
    assert r.survived, (r.returncode, r.signal, r.trapped_call or r.stderr[-2000:])
    assert r.stdout.strip() == f"SURVIVED {N}"


def test_seccomp_filter_kills_on_mmap(tmp_path: Path) -> None:
    r = run_child(EMPTY, "seccomp-control", workdir=tmp_path, n=1)
    assert r.signal == "SIGSYS" and "NOT KILLED" not in r.stdout, (r.returncode, r.stdout)
    # The report names the call (mmap) and its length (1 MiB) and a backtrace through libc.
    mmap_nr = ARCHES[platform.machine()]["mmap"]
    assert r.trapped_call is not None, r.stderr[-2000:]
    head, *frames = r.trapped_call.splitlines()
    assert f"syscall={mmap_nr:#x} " in head and f"arg1={1 << 20:#x} " in head, head
    assert any("libc" in f for f in frames), frames
    # A fresh 64 MiB buffer: more than the heap's free top after the child's imports (a
    # request the top can serve never calls mmap or brk, so a 1 MiB one survived once), and
    # above the mmap threshold, which the harness's MALLOC_TRIM_THRESHOLD_ fixes at glibc's
    # 128 KiB: malloc must map it, and dies for it.
    r = run_child(ALLOCATING, "seccomp", workdir=tmp_path, n=10, warmup=0,
                  kwargs={"nbytes": 64 << 20})  # fmt: skip
    assert r.signal == "SIGSYS", (r.returncode, r.stdout)


def test_seccomp_filter_checks_the_architecture() -> None:
    for arch, table in ARCHES.items():
        prog = build_filter(arch)
        assert len(prog) % 8 == 0
        first_k = int.from_bytes(prog[12:16], "little")  # instruction 1: JEQ audit_arch
        assert first_k == table["audit_arch"]
        ks = {int.from_bytes(prog[i + 4 : i + 8], "little") for i in range(0, len(prog), 8)}
        assert {table[s] for s in ("mmap", "munmap", "brk", "mremap")} <= ks


# -- Checkpointer.checkpoint ------------------------------------------------------------------
#
# The step (tests/proofs/targets.py `checkpointer`) checkpoints the usual nested dict of a
# 4-layer model and its AdamW state (40 slots, 0.8 MiB) after 30 warm-up checkpoints; the
# background write of each checkpoint runs inside the measured loop. The caller's thread and
# the background thread are counted apart (the shim's begin-thread counters).

CHECKPOINT = "tests.proofs.targets:checkpointer"
CKPT_WARMUP = 30
CKPT_N = 200
CKPT_SLOTS = 40
CKPT_WEIGHT_BYTES = 128 * 128 * 4  # the smallest weight or moment matrix of the state


@pytest.fixture()
def ckpt_dir(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs directory when there is one: the proofs count allocations and system calls,
    which are the same on any file system, and on tmpfs fsync returns at once, so 200
    checkpoints take seconds instead of minutes."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="serwatt-proof-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# The caller's side of one checkpoint (CPython's allocator, so these are the C allocator
# calls: objects above 512 bytes and C buffers), by the call that makes them:
# - `threading.Condition.wait`, once: `Checkpointer.wait` for the background write;
# - 4 dict tables above the small-object threshold, the flattener's (2 presized, 2 grown
#   past 21 entries): these are serwatt's dicts, counted as tables.
# (The dtype table of writer.py `_torch_code`, once rebuilt per tensor, is built once; the
# `_INT_RE.fullmatch` of state.py `_escape`, once per path segment that starts like an
# integer, runs once per key: its results are kept, the keys repeat every checkpoint.)
CKPT_CALLER_CALLS = {"condition_wait": 1}
CKPT_CALLER_DICT_TABLES = 4


def _ckpt_caller_mallocs(shim: Path, tmp_path: Path) -> tuple[int, int]:
    """C allocator calls the caller's side of one checkpoint makes, from its named calls,
    and how many of them are the wait's (made only when the write is still in flight)."""
    per = _per_call(shim, tmp_path, tuple(CKPT_CALLER_CALLS), 100)
    for call in CKPT_CALLER_CALLS:
        assert per[call]["malloc"] > 0 and per[call]["free"] == per[call]["malloc"], per
    for call in CKPT_CALLER_CALLS:
        assert _allocs(per[call]) == {"malloc": per[call]["malloc"]}, per  # malloc alone
    named = sum(times * per[c]["malloc"] // 100 for c, times in CKPT_CALLER_CALLS.items())
    wait = CKPT_CALLER_CALLS["condition_wait"] * per["condition_wait"]["malloc"] // 100
    return named + CKPT_CALLER_DICT_TABLES, wait


def _waits_skipped(caller_mallocs: int, expected: int, wait: int, n: int) -> int:
    """How many of n checkpoints' waits found the write already done, from the caller's
    malloc count; fails unless the count is the named calls' with some waits left out.

    `Checkpointer.wait` calls `Condition.wait` (whose waiter lock is the wait's malloc)
    only while the write is in flight; on a loaded machine the caller is sometimes
    descheduled until the background write has finished (a CI run counted 1248 of 1250).
    Any other allocation added to a checkpoint makes the count exceed n x expected, or
    leaves a remainder, unless as many waits were skipped as it added mallocs."""
    missing = expected * n - caller_mallocs
    assert missing >= 0 and missing % wait == 0 and missing // wait <= n, (
        caller_mallocs, expected, wait, n,
    )  # fmt: skip
    return missing // wait


@pytest.mark.long  # allocation proof at full length
def test_checkpoint_caller_allocations_are_its_named_calls(shim: Path, ckpt_dir: Path) -> None:
    expected, wait = _ckpt_caller_mallocs(shim, ckpt_dir)
    r = run_child(
        CHECKPOINT,
        "count",
        workdir=ckpt_dir,
        n=1,
        warmup=CKPT_WARMUP,
        shim=shim,
        kwargs={"wait": True},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    caller = [e for e in r.result["events"] if e["caller_thread"]]
    background = [e for e in r.result["events"] if not e["caller_thread"]]
    assert len(r.result["events"]) < 512  # every event of the checkpoint was recorded
    malloc = r.result["caller_counts"]["malloc"]
    assert _allocs(r.result["caller_counts"]) == {"malloc": malloc}, r.result["caller_counts"]
    skipped = _waits_skipped(malloc, expected, wait, 1)
    assert len(caller) == expected - skipped * wait
    # The background write hashes each slot there: blake3's allocations, one or more a slot.
    assert sum(1 for e in background if _owner(e["stack"]) == "blake3") >= CKPT_SLOTS
    # No tensor-sized allocation on either thread: the staging arena is reused and the
    # bytes go from it to pwrite.
    assert r.result["max_size"] < CKPT_WEIGHT_BYTES, r.result["max_size"]


@pytest.mark.long  # allocation proof at full length
def test_checkpoint_allocations_are_the_same_every_checkpoint_and_all_freed(
    shim: Path, ckpt_dir: Path
) -> None:
    n = 50
    expected, wait = _ckpt_caller_mallocs(shim, ckpt_dir)
    r = run_child(
        CHECKPOINT,
        "count",
        workdir=ckpt_dir,
        n=n,
        warmup=CKPT_WARMUP,
        shim=shim,
        kwargs={"wait": True},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    caller, total = r.result["caller_counts"], r.result["counts"]
    assert _allocs(caller) == {"malloc": caller["malloc"]}, caller
    _waits_skipped(caller["malloc"], expected, wait, n)
    assert caller["free"] == caller["malloc"]
    # Both threads together: every block allocated in the loop is freed in it.
    assert total["free"] == total["malloc"] + total["calloc"], total
    assert r.result["max_size"] < CKPT_WEIGHT_BYTES


@pytest.mark.long  # allocation proof at full length
def test_checkpoint_tracemalloc_retains_nothing_of_the_checkpointers(ckpt_dir: Path) -> None:
    r = run_child(
        CHECKPOINT, "tracemalloc", workdir=ckpt_dir, n=100, warmup=CKPT_WARMUP,
        kwargs={"wait": True},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    # What stays after a full collection is numpy's small-block cache (writer.py's descriptor
    # field stores), a few KiB and levelling off, not one checkpoint's objects per call: a
    # kept job alone (its flattened tree and slot views) is about 20 KiB.
    assert r.result["net_after_gc"] < 32 * 1024, r.result
    # Of the checkpointer's own objects only the newest `Written` stays (`wait()` returns
    # it: 3 objects, 136 bytes); a kept job would show here as kilobytes at state.py and
    # checkpointer.py lines.
    kept = [t for t in r.result["top"] if "/profiler/many/" in t["where"]]
    kept = [t for t in kept if "writer.py" not in t["where"]]
    assert sum(t["size_diff"] for t in kept) <= 256, r.result["top"]
    # Transient Python memory is objects (tree, names, JSON table), not tensor bytes: the
    # staging arena is an anonymous mapping that tracemalloc does not see, and nothing else
    # holds a copy of the 0.8 MiB state.
    assert r.result["peak"] < 512 * 1024, r.result


@pytest.mark.long  # seccomp proof at full length
def test_checkpoint_survives_seccomp_for_200_checkpoints(ckpt_dir: Path) -> None:
    # The background write of each checkpoint overlaps the next one's copy, as in training.
    r = run_child(CHECKPOINT, "seccomp", workdir=ckpt_dir, n=CKPT_N, warmup=CKPT_WARMUP)
    assert r.survived, (r.returncode, r.signal, r.trapped_call or r.stderr[-2000:])
    assert r.stdout.strip() == f"SURVIVED {CKPT_N}"
    # The checkpoints were written (keep=2): the newest is the last one, or the one before it
    # when the last write was still in flight at the child's _exit.
    names = sorted(p.name for p in (ckpt_dir / "ckpts").glob("ckpt-*.many"))
    last = CKPT_WARMUP + CKPT_N - 1
    assert names[-1] in (f"ckpt-{last:08d}.many", f"ckpt-{last - 1:08d}.many"), names
