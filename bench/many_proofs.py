"""Non-allocation figures for the `.many` arena, measured, at sizes too large for the tests.

    .venv/bin/python bench/many_proofs.py [--dir /tmp/serwatt-proofs] [--sizes-mb 16,1024,4096]
                                          [--save-mb 64] [--hash-mb 256] [--proof-n 10000]

1. In-place update of k slots (Arena.update + commit): Python memory allocated (tracemalloc
   peak) for state sizes 16 MiB .. 4 GiB with the same 256 KiB slots; O(k), flat in size.
2. `save` of a 64 MiB state (--save-mb): tracemalloc peak, against pickle.dumps of it.
3. `load` of 1 GiB and 4 GiB files in a fresh process: RSS after load + binding every slot,
   and after touching every page (psutil).
4. Hash throughput on 256 MiB in memory (--hash-mb): BLAKE3 (one thread, and its own
   threads) against SHA-256 (hashlib), the reason FORMAT.md chose BLAKE3.
5. The allocator shim and the seccomp filter (tests/proofs/) on `Arena.update` after
   warm-up: C allocator calls per update (CPython's allocator, then PYTHONMALLOC=malloc so
   every Python object is counted), tracemalloc net and peak, and whether N updates survive
   a filter that kills on mmap/munmap/brk/mremap. `--proof-target module:factory` points the
   same runs at any other step factory (see docs/many.md, "Non-allocation proofs").

Arenas are sparse files (Arena.create lays out holes), so 4 GiB costs no disk writes; every
figure is about memory, not speed. Files are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serwatt.profiler.many import Arena, save  # noqa: E402

SLOT_ELEMS = 65536  # float32 -> 256 KiB per slot

RSS_CHILD = r"""
import json, sys, time, numpy as np, psutil
from serwatt.profiler.many import load
proc = psutil.Process()
rss0 = proc.memory_info().rss
t0 = time.perf_counter()
ckpt = load(sys.argv[1])
views = [ckpt[name] for name in ckpt]
t1 = time.perf_counter()
rss1 = proc.memory_info().rss
for v in views:
    int(v.reshape(-1).view(np.uint8)[::4096].sum())
rss2 = proc.memory_info().rss
print(json.dumps({"slots": len(views), "load_s": t1 - t0, "rss_load": rss1 - rss0,
                  "rss_touched": rss2 - rss0}))
"""


def mib(x: float) -> str:
    return f"{x / 2**20:.1f} MiB" if abs(x) >= 2**20 else f"{x / 1024:.1f} KiB"


def update_figures(sizes_mb: list[int], workdir: Path) -> list[dict]:
    rows = []
    for size in sizes_mb:
        n = size * 4
        path = workdir / f"arena-{size}.many"
        t0 = time.perf_counter()
        arena = Arena.create(path, {f"s{i}": ((SLOT_ELEMS,), np.float32) for i in range(n)})
        create_s = time.perf_counter() - t0
        for k in (1, 2, 16, 64):
            values = [np.full(SLOT_ELEMS, j + 1, dtype=np.float32) for j in range(k)]
            arena.update("s0", values[0])
            arena.commit()
            tracemalloc.start()
            t0 = time.perf_counter()
            for j, v in enumerate(values):
                arena.update(f"s{j}", v)
            arena.commit()
            dt = time.perf_counter() - t0
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            rows.append(
                {"state_mib": size, "slots": n, "k": k, "peak_bytes": peak, "update_commit_s": dt}
            )
            print(
                f"  state {size:>5} MiB ({n:>5} slots)  k={k:>3}: tracemalloc peak {mib(peak):>10}"
                f"  ({peak / k:,.0f} B per slot; {k * SLOT_ELEMS * 4 / 2**20:.2f} MiB of slot bytes"
                f" written)  update+commit {dt * 1e3:.1f} ms",
                flush=True,
            )
        arena.close()
        print(f"    (layout of the {size} MiB sparse arena: {create_s:.2f} s)")
        path.unlink()
    return rows


def save_figures(workdir: Path, size_mb: int = 64) -> dict:
    # tensors of 4 MiB (1 Mi float32), size_mb / 4 of them
    state = {f"t{i}": np.full(1 << 20, i, dtype=np.float32) for i in range(max(1, size_mb // 4))}
    state_bytes = sum(v.nbytes for v in state.values())
    save(workdir / "warm.many", {"x": np.ones(4)})
    tracemalloc.start()
    save(workdir / "s.many", state)
    many_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    tracemalloc.start()
    pickle.dumps(state, protocol=5)
    pickle_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(
        f"  save {state_bytes >> 20} MiB state: .many tracemalloc peak {mib(many_peak)}; "
        f"pickle.dumps {mib(pickle_peak)}"
    )
    return {"state_bytes": state_bytes, "many_peak": many_peak, "pickle_peak": pickle_peak}


def load_figures(workdir: Path, sizes_mb: list[int]) -> list[dict]:
    rows = []
    for size in sizes_mb:
        n = 200
        elems = (size << 20) // 4 // n
        path = workdir / f"load-{size}.many"
        Arena.create(path, {f"s{i}": ((elems,), np.float32) for i in range(n)}).close()
        out = subprocess.run(
            [sys.executable, "-c", RSS_CHILD, str(path)],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=True,
        )
        r = json.loads(out.stdout)
        r["state_mib"] = size
        rows.append(r)
        print(
            f"  load {size:>5} MiB, {n} slots: {r['load_s'] * 1e3:.2f} ms; "
            f"RSS +{mib(r['rss_load'])} after "
            f"load+bind, +{mib(r['rss_touched'])} after touching every page"
        )
        path.unlink()
    return rows


def hash_figures(size_mb: int = 256) -> dict:
    import hashlib

    import blake3

    data = np.ones(size_mb << 20, dtype=np.uint8)
    out = {}
    for name, fn in (
        ("blake3 1 thread", lambda: blake3.blake3(data.data).digest()),
        (
            "blake3 AUTO threads",
            lambda: blake3.blake3(data.data, max_threads=blake3.blake3.AUTO).digest(),
        ),
        ("sha256 (hashlib)", lambda: hashlib.sha256(data.data).digest()),
    ):
        best = min(_timed(fn) for _ in range(3))
        out[name] = (size_mb / 1024) / best
        print(f"  {name:<20} {out[name]:.2f} GiB/s (best of 3)")
    return out


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def shim_figures(workdir: Path, target: str, n: int) -> dict:
    from tests.proofs.harness import build_shim, run_child

    shim = build_shim(workdir)
    out: dict = {"target": target, "n": n}
    for label, pm in (("CPython allocator", None), ("PYTHONMALLOC=malloc", "malloc")):
        base = run_child(
            "tests.proofs.targets:empty", "count", workdir=workdir, n=n, shim=shim, python_malloc=pm
        )
        r = run_child(target, "count", workdir=workdir, n=n, shim=shim, python_malloc=pm)
        if r.result is None or base.result is None:
            print(f"  {label}: child failed (rc {r.returncode}): {r.stderr[-500:]}")
            continue
        counts = {k: v for k, v in r.result["counts"].items() if v and k != "free"}
        base_total = sum(v for k, v in base.result["counts"].items() if k != "free")
        total = sum(counts.values())
        out[label] = {"counts": counts, "per_call": (total - base_total) / n}
        print(
            f"  {label:<20} {total:>7} allocator calls in {n} calls ({counts}); "
            f"empty loop {base_total}; per call {(total - base_total) / n:.3f}"
        )
        for e in r.result["events"][1:6]:  # event 0: the loop's own iterator
            print(f"      {e['kind']} {e['size']:>5} B  {' < '.join(e['stack'][:3])}")
    tm = run_child(target, "tracemalloc", workdir=workdir, n=n)
    if tm.result is not None:
        out["tracemalloc"] = {k: tm.result[k] for k in ("net", "net_after_gc", "peak")}
        print(
            f"  tracemalloc over {n} calls: net {tm.result['net']} B, after gc.collect "
            f"{tm.result['net_after_gc']} B, peak {tm.result['peak']} B"
        )
    sec = run_child(target, "seccomp", workdir=workdir, n=n)
    ctl = run_child("tests.proofs.targets:empty", "seccomp-control", workdir=workdir, n=1)
    out["seccomp"] = {"survived": sec.survived, "signal": sec.signal, "control": ctl.signal}
    verdict = "survived" if sec.survived else f"KILLED ({sec.signal})"
    print(
        f"  seccomp kill filter: {n} calls {verdict}; "
        f"control (one mmap after the filter): {ctl.signal or 'not killed'}"
    )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/serwatt-proofs"))
    p.add_argument("--sizes-mb", default="16,1024,4096")
    p.add_argument("--json", type=Path)
    p.add_argument("--proof-target", default="tests.proofs.targets:arena_update")
    p.add_argument("--proof-n", type=int, default=10_000)
    p.add_argument("--save-mb", type=int, default=64, help="the state of part 2")
    p.add_argument("--hash-mb", type=int, default=256, help="the buffer of part 4")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    out = {}
    try:
        print("1. in-place update of k slots (256 KiB each), Python memory (tracemalloc peak):")
        out["update"] = update_figures(sizes, args.dir)
        print("2. save without intermediate copies:")
        out["save"] = save_figures(args.dir, args.save_mb)
        print("3. load RSS (fresh process, psutil):")
        out["load"] = load_figures(args.dir, [s for s in sizes if s >= 1024] or sizes)
        print(f"4. hash throughput, {args.hash_mb} MiB in memory:")
        out["hash"] = hash_figures(args.hash_mb)
        print(f"5. allocator shim, tracemalloc and seccomp on {args.proof_target}:")
        out["proofs"] = shim_figures(args.dir, args.proof_target, args.proof_n)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
