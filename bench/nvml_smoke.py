"""Real-GPU smoke check of serwatt's NVML collector.

    .venv/bin/python bench/nvml_smoke.py [--seconds 8] [--poll-s 0.5] [--burn]

Prints, per GPU, what the driver really does: the utilisation sample period, the
clock domain of sample timestamps and its offset to host epoch time, the age of the
newest sample, busy/idle seconds and energy over the run. With --burn (needs torch
with CUDA) the GPU runs matmuls for the first half, so both busy and idle show, and the
run ends with a verdict against that schedule (`burn_verdict`):

- the burn's GPU is the one NVML lists this process on (or the only GPU);
- the schedule is what the burner measured: busy from its first synchronized matmul to
  its last, idle after; one driver sample period (1 s when unknown) at each edge is left
  out, since a sample there mixes both;
- busy span: NVML's busy fraction >= 0.9 (back-to-back 8192^2 matmuls leave the GPU no
  gap NVML can see, so anything lower means samples land at the wrong host time);
  idle span: <= 0.1; mean power in the busy span above the idle span's (when NVML has
  energy); each span covered by utilisation data for >= 80% of its length.

CONFIRMED when every check holds; NOT MET when one fails on a covered span; undecided
when a span is too short (< 2 s) or not covered enough, or another process used the GPU
while it should idle.

Exit codes: 0 ok (with --burn: confirmed), 1 NVML unavailable (no driver / no GPU /
permission / MIG only): the reason is printed, nothing is invented; 3 --burn verdict
not met; 4 --burn verdict undecided.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serwatt.collectors.nvml import GpuWindow, NvmlCollector  # noqa: E402

BUSY_MIN = 0.9
IDLE_MAX = 0.1
MIN_COVERED = 0.8
MIN_SPAN_S = 2.0
EXIT_NOT_MET = 3
EXIT_UNDECIDED = 4


@dataclass
class BurnSchedule:
    """What the burner measured, host epoch seconds: the GPU was busy from `busy_from`
    (its first matmul synchronized) to `busy_until` (the last one), idle until `end`."""

    busy_from: float | None = None
    busy_until: float | None = None
    end: float | None = None
    error: str | None = None


@dataclass
class BurnVerdict:
    gpu: int | None
    verdict: str  # "CONFIRMED" | "NOT MET" | "undecided"
    checks: list[str] = field(default_factory=list)  # one line per check, with its figure


def _burn(seconds: float, sched: BurnSchedule) -> None:
    try:
        import torch  # noqa: PLC0415

        a = torch.randn(8192, 8192, device="cuda")
        a = (a @ a).tanh_()
        torch.cuda.synchronize()
        sched.busy_from = time.time()
        end = sched.busy_from + seconds
        while time.time() < end:
            a = (a @ a).tanh_()
        torch.cuda.synchronize()
        sched.busy_until = time.time()
    except Exception as exc:  # no CUDA torch: the verdict says so
        sched.error = f"{type(exc).__name__}: {exc}"


def _span(col: NvmlCollector, index: int, t0: float, t1: float) -> GpuWindow | None:
    return next((w for w in col.window(t0, t1) if w.index == index), None)


def burn_verdict(col: NvmlCollector, sched: BurnSchedule, pid: int) -> BurnVerdict:
    """The collector's view of the burn's GPU against the schedule the burner measured."""
    if sched.error or sched.busy_from is None or sched.busy_until is None or sched.end is None:
        return BurnVerdict(None, "undecided", [f"the burn did not run: {sched.error}"])
    whole = [w for w in col.window(sched.busy_from, sched.end) if w.up]
    mine = [w for w in whole if pid in w.pids]
    if not mine and len(whole) == 1:
        mine = whole  # NVML may list no pids (containers); one GPU can only be it
    if len(mine) != 1:
        return BurnVerdict(
            None, "undecided", [f"the burn's GPU: {len(mine)} GPU(s) list pid {pid}"]
        )
    gpu = mine[0]
    margin = gpu.sample_period_s or 1.0
    busy = (sched.busy_from + margin, sched.busy_until - margin)
    idle = (sched.busy_until + margin, sched.end)
    checks: list[str] = []
    failed = undecided = False
    power: dict[str, float] = {}
    for name, (t0, t1) in (("busy", busy), ("idle", idle)):
        if t1 - t0 < MIN_SPAN_S:
            checks.append(f"{name} span {t1 - t0:.2f} s < {MIN_SPAN_S:g} s: too short to judge")
            undecided = True
            continue
        w = _span(col, gpu.index, t0, t1)
        if w is None or w.covered_s < MIN_COVERED * (t1 - t0):
            cov = 0.0 if w is None else w.covered_s
            checks.append(f"{name} span: utilisation data for {cov:.2f} of {t1 - t0:.2f} s")
            undecided = True
            continue
        frac = w.busy_s / w.covered_s
        if name == "busy":
            ok = frac >= BUSY_MIN
            checks.append(f"busy span: busy {frac:.3f} (>= {BUSY_MIN}): {'ok' if ok else 'FAIL'}")
            failed |= not ok
        else:
            others = sorted(w.pids - {pid})
            ok = frac <= IDLE_MAX
            line = f"idle span: busy {frac:.3f} (<= {IDLE_MAX}): {'ok' if ok else 'FAIL'}"
            if not ok and others:
                line += f" (other processes on the GPU: {others}: cannot tell)"
                undecided = True
            else:
                failed |= not ok
            checks.append(line)
        if w.energy_j is not None:
            power[name] = w.energy_j / (t1 - t0)
    if len(power) == 2:
        ok = power["busy"] > power["idle"]
        checks.append(
            f"power: busy span {power['busy']:.1f} W, idle span {power['idle']:.1f} W: "
            + ("ok" if ok else "FAIL (not above)")
        )
        failed |= not ok
    else:
        checks.append("power: no NVML energy for both spans (not judged)")
    verdict = "NOT MET" if failed else "undecided" if undecided else "CONFIRMED"
    return BurnVerdict(gpu.index, verdict, checks)


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
    sched = BurnSchedule()
    if args.burn:
        burner = threading.Thread(target=_burn, args=(args.seconds / 2, sched), daemon=True)
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
    code = 0
    if args.burn:
        sched.end = end
        v = burn_verdict(col, sched, os.getpid())
        print(f"burn verdict (gpu {v.gpu}): {v.verdict}")
        for line in v.checks:
            print(f"  {line}")
        code = {"CONFIRMED": 0, "NOT MET": EXIT_NOT_MET}.get(v.verdict, EXIT_UNDECIDED)
    col.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
