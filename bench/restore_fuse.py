"""Restore of a large `.many` file, mapped against copied, on the local disk and on a FUSE
mount with and without added latency (issue 47 ask 5).

    .venv/bin/python bench/restore_fuse.py [--size-mib 1024] [--slots 64] [--repeats 5]
        [--latency-ms 1.0] [--dir DIR]

A restore is `many.load(path, read=...)` and then touching every byte of every slot
(`np.add.reduce` over a uint8 view of each), timed with perf_counter. Arms:

- local mmap, local auto (what `load` does by default there: it must map), local copy;
- FUSE mmap and FUSE copy (= auto there), on a passthrough of the same directory
  (tests/fuse_latency.py, a multithreaded mfusepy server in its own process) that delays
  each read request by --latency-ms, and on a second mount that adds none (the cost of
  the FUSE server alone).

Each repeat runs every arm once, in an order rotated by one each repeat. Before each arm the
file's pages are dropped from the page cache: fsync and posix_fadvise(DONTNEED) on the
local (backing) file, then mincore says what is still resident, printed as the
bench's own measure of coldness; a FUSE file's pages are dropped by the kernel when it is
opened again (the server sets no keep_cache), and advised out too.

Each ratio (copy or auto over mmap, same repeat) is printed with the 95% interval of its
geometric mean over the repeats (Student t on log ratios, profiler/intervals.py) and a
verdict: "FUSE copy no slower than FUSE mmap" is confirmed when the interval's upper end
is at most 1; "local auto unchanged from local mmap" when the interval lies within
1 +- --margin (0.10).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serwatt.profiler import intervals  # noqa: E402
from serwatt.profiler.intervals import Interval, geometric_mean_interval  # noqa: E402
from serwatt.profiler.many import load, save  # noqa: E402
from serwatt.profiler.profile.page_cache import resident_pages  # noqa: E402
from tests.fuse_latency import latency_fuse  # noqa: E402
from tests.fuse_stall import fuse_available  # noqa: E402


def drop(path: Path, *, sync: bool) -> float:
    """Drop the file's clean pages; the fraction still resident (mincore)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if sync:
            os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        resident, total = resident_pages(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return resident / total if total else 0.0


def restore(path: Path, read: str) -> tuple[float, str, int]:
    """(seconds, read_mode, checksum) of load + touching every byte of every slot."""
    t0 = time.perf_counter()
    ckpt = load(path, read=read)
    total = 0
    for name in ckpt:
        total += int(np.add.reduce(ckpt[name].reshape(-1).view(np.uint8)))
    seconds = time.perf_counter() - t0
    mode = ckpt.read_mode
    ckpt.close()
    return seconds, mode, total


def ci_text(iv: Interval) -> str:
    if not iv.has_interval:
        return f"no 95% CI: {iv.why_none}"
    lo, hi = iv.bounds()
    return f"95% CI {lo:.3f}..{hi:.3f}, {iv.method}, n {iv.n}"


def claim(text: str, iv: Interval, **bounds: float) -> str:
    v = intervals.verdict(iv, **bounds)
    return f'"{text}": {v.upper()}'


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--latency-ms", type=float, default=1.0)
    ap.add_argument("--margin", type=float, default=0.10)
    ap.add_argument("--dir", default=None, help="where the file is written (default: $TMPDIR)")
    args = ap.parse_args()
    why = fuse_available()
    if why is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="restore-fuse-", dir=args.dir) as d:
        root = Path(d)
        backing = root / "data"
        backing.mkdir()
        rng = np.random.default_rng(47)
        per = (args.size_mib << 20) // args.slots
        state = {
            f"layer{i:03d}": rng.integers(0, 256, per, dtype=np.uint8) for i in range(args.slots)
        }
        want = sum(int(np.add.reduce(v)) for v in state.values())
        local = backing / "ckpt.many"
        save(local, state)
        del state
        size = local.stat().st_size
        with (
            latency_fuse(root / "slow", backing, latency_s=args.latency_ms / 1000),
            latency_fuse(root / "fast", backing, latency_s=0.0),
        ):
            slow, fast = root / "slow" / "ckpt.many", root / "fast" / "ckpt.many"
            arms = {
                "local mmap": (local, "mmap"),
                "local auto": (local, "auto"),
                "local copy": (local, "copy"),
                "fuse+lat mmap": (slow, "mmap"),
                "fuse+lat copy": (slow, "auto"),
                "fuse+0 mmap": (fast, "mmap"),
                "fuse+0 copy": (fast, "auto"),
            }
            names = list(arms)
            times: dict[str, list[float]] = {a: [] for a in names}
            modes: dict[str, str] = {}
            resident: list[float] = []
            load1 = os.getloadavg()[0]
            for r in range(args.repeats):
                order = names[r % len(names) :] + names[: r % len(names)]
                for arm in order:
                    path, read = arms[arm]
                    resident.append(drop(local, sync=True))
                    if path != local:
                        drop(path, sync=False)
                    seconds, mode, total = restore(path, read)
                    if total != want:
                        print(f"{arm}: checksum {total}, wrote {want}", file=sys.stderr)
                        return 1
                    times[arm].append(seconds)
                    modes[arm] = mode
                    print(f"  repeat {r} {arm:14s} {seconds:7.3f} s  {mode}", flush=True)
            load2 = os.getloadavg()[0]
    print(
        f"\nrestore of {size / (1 << 20):.0f} MiB ({args.slots} slots), load + np.add.reduce "
        f"over every byte; {args.repeats} interleaved repeats; FUSE latency "
        f"{args.latency_ms:g} ms per read request; page cache dropped before each arm "
        f"(backing file resident after the drop, mincore: max {max(resident):.1%}); "
        f"load average {load1:.2f} -> {load2:.2f}"
    )
    for arm in names:
        xs = times[arm]
        print(
            f"  {arm:14s} median {statistics.median(xs):7.3f} s  "
            f"[{', '.join(f'{x:.3f}' for x in xs)}]  {modes[arm]}"
        )
    result: dict[str, object] = {
        "size_mib": round(size / (1 << 20), 1),
        "slots": args.slots,
        "repeats": args.repeats,
        "latency_ms": args.latency_ms,
        "times_s": times,
        "read_mode": modes,
    }
    no_slower = {"at_most": 1.0}
    unchanged = {"at_least": 1 - args.margin, "at_most": 1 + args.margin}
    band = f"within {1 - args.margin:g}..{1 + args.margin:g}"
    checks = [
        ("fuse+lat copy", "fuse+lat mmap", "FUSE copy no slower than FUSE mmap", no_slower),
        ("fuse+0 copy", "fuse+0 mmap", "FUSE copy no slower than FUSE mmap (0 latency)", no_slower),
        ("local auto", "local mmap", f"local auto unchanged from local mmap ({band})", unchanged),
        ("local copy", "local mmap", "local copy no slower than local mmap", no_slower),
    ]
    print()
    for num, den, text, bounds in checks:
        ratios = [a / b for a, b in zip(times[num], times[den], strict=True)]
        iv = geometric_mean_interval(ratios)
        print(f"  {num} / {den}: {iv.estimate:.3f}x ({ci_text(iv)}); {claim(text, iv, **bounds)}")
        result[f"{num} / {den}"] = {
            "ratio": iv.estimate,
            "ci95": list(iv.bounds()),
            "verdict": intervals.verdict(iv, **bounds),
        }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
