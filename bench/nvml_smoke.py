"""Real-GPU smoke check of serwatt's NVML collector.

    .venv/bin/python bench/nvml_smoke.py [--seconds 8] [--poll-s 0.5] [--burn]

Prints, per GPU, what the driver really does: the utilisation sample period, the
clock domain of sample timestamps and its offset to host epoch time, the age of the
newest sample, busy/idle seconds and energy over the run. With --burn (needs torch
with CUDA) the GPU runs matmuls for the first half, so both busy and idle show.

Exit codes: 0 ok, 1 NVML unavailable (no driver / no GPU / permission / MIG only):
the reason is printed, nothing is invented.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.nvml import NvmlCollector  # noqa: E402


def _burn(seconds: float) -> None:
    import torch  # noqa: PLC0415

    a = torch.randn(8192, 8192, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        a = (a @ a).tanh_()
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--poll-s", type=float, default=0.5)
    ap.add_argument("--burn", action="store_true", help="busy the GPU for the first half")
    args = ap.parse_args(argv)

    col = NvmlCollector()
    status = col.probe()
    for g in status.gpus:
        state = "up" if g.up else f"unavailable: {g.reason}: {g.detail}"
        print(f"gpu {g.index}: {g.name} {g.uuid} {state}")
    if not status.up:
        print(f"nvml_smoke: NVML unavailable: {status.reason}: {status.detail}", file=sys.stderr)
        return 1

    burner = None
    if args.burn:
        burner = threading.Thread(target=_burn, args=(args.seconds / 2,), daemon=True)
        burner.start()
    start = time.time()
    col.poll()
    while time.time() - start < args.seconds:
        time.sleep(args.poll_s)
        col.poll()
    end = time.time()
    if burner is not None:
        burner.join()

    cal = col.clock_calibration
    if cal is None:
        print("clock: no utilisation sample seen (empty buffer the whole run)")
    else:
        print(
            f"clock: domain={cal.domain} offset_s={cal.offset_s:.6f} "
            f"newest_sample_lag_s={cal.lag_s:.3f}"
        )
    for w in col.window(start, end):
        if not w.up:
            print(f"gpu {w.index}: unavailable: {w.reason}")
            continue
        period = f"{w.sample_period_s:.4f}" if w.sample_period_s else "n/a"
        confirmed = sum(iv.t1 - iv.t0 for iv in w.intervals if iv.confirmed_idle)
        energy = f"{w.energy_j:.1f}" if w.energy_j is not None else "n/a"
        print(
            f"gpu {w.index}: sample_period_s={period} window_s={end - start:.2f} "
            f"covered_s={w.covered_s:.2f} busy_s={w.busy_s:.2f} idle_s={w.idle_s:.2f} "
            f"empty_buffer_idle_s={confirmed:.2f} energy_j={energy} ({w.energy_source}) "
            f"pids={sorted(w.pids)}"
        )
    for e in col.poll_errors:
        print(f"poll error: {e}")
    col.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
