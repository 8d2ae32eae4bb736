"""What one run-record append costs: windows appended to a real SQLite record through the
public Recorder API, as the daemon appends them.

    .venv/bin/python bench/record_append.py [--windows 2000] [--blocks 10] [--dir /var/tmp]
                                            [--json FILE]

A fresh record file in a new directory under --dir (default /var/tmp: a disk, as
record.dir is; /tmp may be tmpfs). One run is started, then --windows full windows are
appended with `Recorder.append_window`: every codepath with samples, CPU and wall seconds,
sampler errors, and energy for every codepath. Each append is one transaction (the window,
its codepath rows and the run totals), committed on return with the Recorder's own settings
(WAL, synchronous=NORMAL).

The appends are timed in --blocks consecutive blocks (time.perf_counter for wall,
time.process_time for CPU); the figure is the mean over the blocks of the mean per append,
with its 95% Student t interval over the blocks (profiler/intervals.py). Blocks rather than
single appends: a WAL checkpoint lands inside one append in a thousand, so single appends
are far from identically distributed, and the blocks' means are. The record's size per
window is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serwatt.collectors.samples import SamplerErrors  # noqa: E402
from serwatt.profiler.attribution.window_records import EnergyRecord  # noqa: E402
from serwatt.profiler.classify.codepaths import CODEPATHS  # noqa: E402
from serwatt.profiler.intervals import Interval, mean_interval  # noqa: E402
from serwatt.profiler.records.store import Recorder  # noqa: E402
from serwatt.profiler.sampling.window import CodepathWindow, WindowReport  # noqa: E402

RUN_ID = "bench-record-append"


def full_window(i: int, rng: random.Random) -> WindowReport:
    """A 10 s window of pid 1000 + i with every codepath busy, as a daemon window is."""
    cps = {
        cp: CodepathWindow(
            samples=rng.randint(1, 500),
            cpu_s=rng.random() * 3,
            wall_s=rng.random() * 10,
            low_confidence_samples=rng.randint(0, 5),
        )
        for cp in CODEPATHS
    }
    t0 = 1_800_000_000.0 + 10.0 * i
    return WindowReport(
        pid=1000 + i,
        started_at=t0,
        ended_at=t0 + 10.0,
        rate_hz=50.0,
        cpu_s=sum(c.cpu_s for c in cps.values()),
        codepaths=cps,
        errors=SamplerErrors(pyspy_samples=500, pyspy_errors=2, partial_stacks=1, behind_s=0.25),
        python="3.11.7",
    )


def measure(record: Path, windows: int, blocks: int, seed: int = 1) -> dict:
    """Append `windows` windows to a new record at `record`; per-append wall and CPU
    seconds, per block, and the record's size."""
    if blocks < 1 or windows < blocks:
        raise ValueError(f"need 1 <= --blocks <= --windows, not {blocks} and {windows}")
    rng = random.Random(seed)
    ws = [full_window(i, rng) for i in range(windows)]
    energy = EnergyRecord(source="rapl", codepaths_j={cp: 1.0 for cp in CODEPATHS})
    wall: list[float] = []
    cpu: list[float] = []
    edges = [round(k * windows / blocks) for k in range(blocks + 1)]
    with Recorder(record) as rec:
        rec.start_run(RUN_ID, "bench", host={}, config={}, sources={"energy": "rapl"})
        for a, b in zip(edges, edges[1:], strict=False):
            t, c = time.perf_counter(), time.process_time()
            for w in ws[a:b]:
                rec.append_window(RUN_ID, w, energy=energy)
            wall.append((time.perf_counter() - t) / (b - a))
            cpu.append((time.process_time() - c) / (b - a))
        stored = rec.runs(RUN_ID)[0].windows
    size = sum(p.stat().st_size for p in record.parent.glob(record.name + "*"))
    return {
        "windows": windows,
        "windows_stored": stored,
        "blocks": blocks,
        "wall_s_per_append_by_block": wall,
        "cpu_s_per_append_by_block": cpu,
        "record_bytes": size,
    }


def ms_text(iv: Interval) -> str:
    if not iv.has_interval:
        return f"{iv.estimate * 1e3:.3f} ms (no interval: {iv.why_none})"
    lo, hi = iv.bounds()
    return f"{iv.estimate * 1e3:.3f} ms (95% CI {lo * 1e3:.3f}-{hi * 1e3:.3f}, {iv.method})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--windows", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.blocks < 1 or args.windows < args.blocks:
        ap.error(f"need 1 <= --blocks <= --windows (got {args.blocks} and {args.windows})")
    workdir = Path(tempfile.mkdtemp(prefix="serwatt-record-append-", dir=args.dir))
    try:
        fig = measure(workdir / "runs.sqlite", args.windows, args.blocks)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = mean_interval(fig["wall_s_per_append_by_block"])
    cpu = mean_interval(fig["cpu_s_per_append_by_block"])
    fig |= {
        "dir": str(args.dir),
        "wall_s_per_append": wall.estimate,
        "wall_s_per_append_ci95": list(wall.bounds()) if wall.has_interval else None,
        "cpu_s_per_append": cpu.estimate,
        "cpu_s_per_append_ci95": list(cpu.bounds()) if cpu.has_interval else None,
        "bytes_per_window": fig["record_bytes"] / fig["windows"],
        "loadavg": os.getloadavg(),
    }
    print(
        f"record append: {fig['windows_stored']} windows ({len(CODEPATHS)} codepaths, energy "
        f"for each) in {fig['blocks']} blocks, a fresh record under {args.dir}"
    )
    print(f"  wall per append: {ms_text(wall)}")
    print(f"  CPU per append:  {ms_text(cpu)}")
    print(
        f"  record size: {fig['bytes_per_window'] / 1e3:.2f} KB per window; "
        f"load average {fig['loadavg'][0]:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
