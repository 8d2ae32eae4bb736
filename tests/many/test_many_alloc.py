"""Non-allocation, shown by measurement: in-place updates and saves allocate O(slots touched)
Python memory, independent of state size (tracemalloc); load raises RSS by O(slots), not
O(bytes), until tensors are touched (psutil, in a fresh process).

Each proof carries a control that shows the same measurement does see O(bytes) work, so the
assertions can fail. bench/many_proofs.py prints the same figures at larger sizes.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np

from serwatt.profiler.many import Arena, save, verify

REPO = Path(__file__).resolve().parents[2]
SLOT_ELEMS = 65536  # float32: 256 KiB per slot


def update_peak(arena: Arena, values: list[np.ndarray]) -> int:
    """tracemalloc peak of updating slots s0..s(n-1) to `values` in place, then one commit."""
    arena.update("s0", values[0])  # first-call caches (numpy, blake3) are not per-update cost
    arena.commit()
    tracemalloc.start()
    try:
        for j, v in enumerate(values):
            arena.update(f"s{j}", v)
        arena.commit()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_in_place_update_allocates_o_k_independent_of_state_size(tmp_path: Path) -> None:
    """16 MiB and 1 GiB arenas (sparse files: the layout is real, the zeros are holes).

    Update + commit of k slots, with 64x more slots and bytes in the larger arena.
    """
    peaks: dict[tuple[int, int], int] = {}
    for total_mib in (16, 1024):
        n = total_mib * 4  # 256 KiB slots
        path = tmp_path / f"arena{total_mib}.many"
        with Arena.create(path, {f"s{i}": ((SLOT_ELEMS,), np.float32) for i in range(n)}) as arena:
            for k in (1, 16):
                values = [np.full(SLOT_ELEMS, j + 1, dtype=np.float32) for j in range(k)]
                peaks[(total_mib, k)] = update_peak(arena, values)
            arena.commit()
        assert verify(path) == []
        path.unlink()
    slot_bytes = SLOT_ELEMS * 4
    for (total_mib, k), peak in peaks.items():
        # No slot-sized buffer is ever allocated: far below even one slot's bytes.
        assert peak < slot_bytes // 8, (total_mib, k, peak)
    for k in (1, 16):
        # Independent of total size: 64x more state, about the same allocation.
        assert peaks[(1024, k)] <= 2 * peaks[(16, k)] + 4096, peaks
    # Control: the same measurement sees a serializer that copies the slot.
    tracemalloc.start()
    pickle.dumps(np.ones(SLOT_ELEMS, dtype=np.float32), protocol=5)
    control = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert control >= slot_bytes


def test_save_writes_from_buffers_without_copying_the_state(tmp_path: Path) -> None:
    state = {f"t{i}": np.full(1 << 20, i, dtype=np.float32) for i in range(8)}  # 32 MiB
    state_bytes = sum(a.nbytes for a in state.values())
    save(tmp_path / "warm.many", {"x": np.ones(4)})
    tracemalloc.start()
    save(tmp_path / "a.many", state)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < state_bytes // 64, peak  # no intermediate copy of the state (nor of a tensor)
    tracemalloc.start()
    pickle.dumps(state, protocol=5)
    control = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert control >= state_bytes


RSS_CHILD = r"""
import json, sys, numpy as np, psutil
from serwatt.profiler.many import load
proc = psutil.Process()
rss0 = proc.memory_info().rss
ckpt = load(sys.argv[1])
views = [ckpt[name] for name in ckpt]
rss1 = proc.memory_info().rss
for v in views:
    # One read per 4 KiB page faults every page of the slot in.
    flat = v.reshape(-1).view(np.uint8)
    int(flat[::4096].sum())
rss2 = proc.memory_info().rss
print(json.dumps({"slots": len(views), "load_delta": rss1 - rss0, "touched_delta": rss2 - rss0}))
"""


def test_load_raises_rss_by_slots_not_bytes_until_touched(tmp_path: Path) -> None:
    path = tmp_path / "big.many"
    n, elems = 512, 1 << 18  # 512 slots x 1 MiB = 512 MiB
    with Arena.create(path, {f"s{i}": ((elems,), np.float32) for i in range(n)}) as arena:
        arena.update("s7", np.ones(elems, dtype=np.float32))
        arena.commit()
    state_bytes = n * elems * 4
    out = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    figures = json.loads(out.stdout)
    assert figures["slots"] == n
    # Binding 512 views: O(slots) bookkeeping, under 1% of the bytes.
    assert figures["load_delta"] < state_bytes // 100, figures
    # Control: touching the pages is what brings the bytes in.
    assert figures["touched_delta"] > state_bytes * 0.9, figures
