"""Why py-spy and not a cheaper sampler: CPU per window, and aliasing on a periodic loop.

    .venv/bin/python bench/sampler_choice.py [--austin PATH] [--rounds 2] [--window-s 10]
                                             [--alias-s 3] [--json FILE]

Austin (austin-dist on PyPI) is the other attach-by-pid Python sampler that needs no
code in the target. It is not a serwatt dependency: install it anywhere
(`python -m venv /tmp/austv && /tmp/austv/bin/pip install austin-dist==3.7.0`) and
pass --austin /tmp/austv/bin/austin; without it only py-spy is measured.

Part 1, cost: the daemon bench's target (pickle + json ~2 ms, then 18 ms asleep),
one 10 s window (--window-s) at 50 Hz per sampler, alternating, --rounds times; each sampler's
CPU (user + system of the reaped child) as % of one core.

Part 2, aliasing: a target that is busy in `busy()` for 4 ms at the start of every
20 ms period (a deadline loop, so the period is exact: 20% of its wall time). Each
sampler at 50 Hz for 3 s (--alias-s): the share of samples in `busy()`. A sampler on a fixed
20 ms interval sees one phase of the loop every time (0% or 100%); py-spy draws its
intervals from an exponential distribution (timer.rs) and sees every phase.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serwatt.collectors.pyspy.runner import PYSPY_FLAGS, find_pyspy, pyspy_env  # noqa: E402

COST_TARGET = REPO / "tests" / "workloads" / "alternating.py"
PERIODIC_TARGET = textwrap.dedent(
    """
    import pickle, time
    d = list(range(3000))
    def busy(until):
        while time.perf_counter() < until:
            pickle.dumps(d)
    t = time.perf_counter()
    while True:
        busy(t + 0.004)
        t += 0.020
        time.sleep(max(0.0, t - time.perf_counter()))
    """
)


def child_cpu(cmd: list[str]) -> float:
    """Run cmd to completion; its CPU seconds (user + system)."""
    before = os.times()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=pyspy_env())
    after = os.times()
    return (after.children_user + after.children_system) - (
        before.children_user + before.children_system
    )


def pyspy_cmd(pyspy: Path, pid: int, seconds: int, out: Path, fmt: str) -> list[str]:
    return [
        str(pyspy),
        "record",
        *PYSPY_FLAGS,
        "--format",
        fmt,
        "--rate",
        "50",
        "--duration",
        str(seconds),
        "--pid",
        str(pid),
        "--output",
        str(out),
    ]


def austin_cmd(austin: Path, pid: int, seconds: int, out: Path) -> list[str]:
    return [str(austin), "-i", "20ms", "-x", str(seconds), "-p", str(pid), "-o", str(out)]


def share_busy_pyspy(raw: Path) -> tuple[float, int]:
    n = b = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n += int(count)
        b += int(count) if "busy (" in stack else 0
    return (b / n if n else float("nan")), n


def share_busy_austin(out: Path) -> tuple[float, int]:
    lines = [ln for ln in out.read_text().splitlines() if ln.startswith("P")]
    b = sum(1 for ln in lines if ":busy:" in ln)
    return (b / len(lines) if lines else float("nan")), len(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--austin", type=Path, help="an austin binary (austin-dist 3.x)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window-s", type=int, default=10, help="part 1's window per sampler")
    ap.add_argument("--alias-s", type=int, default=3, help="part 2's run per sampler")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    pyspy = find_pyspy()
    tmp = Path(tempfile.mkdtemp(prefix="serwatt-bench-sampler-"))
    result: dict = {"pyspy": str(pyspy), "austin": str(args.austin) if args.austin else None}
    samplers = ["py-spy"] + (["austin"] if args.austin else [])

    target = subprocess.Popen([sys.executable, str(COST_TARGET)])
    try:
        time.sleep(1.0)
        cost: dict[str, list[float]] = {s: [] for s in samplers}
        for _ in range(args.rounds):
            for s in samplers:
                out = tmp / f"cost-{s}.out"
                cmd = (
                    pyspy_cmd(pyspy, target.pid, args.window_s, out, "speedscope")
                    if s == "py-spy"
                    else austin_cmd(args.austin, target.pid, args.window_s, out)
                )
                cost[s].append(100 * child_cpu(cmd) / args.window_s)
    finally:
        target.kill()
        target.wait()
    result["cost_pct_of_one_core"] = cost
    for s in samplers:
        print(
            f"{s:7s} {args.window_s} s at 50 Hz: "
            f"{', '.join(f'{v:.2f}%' for v in cost[s])} of one core"
        )

    (tmp / "periodic.py").write_text(PERIODIC_TARGET)
    target = subprocess.Popen([sys.executable, str(tmp / "periodic.py")])
    try:
        time.sleep(0.5)
        shares: dict[str, list[float]] = {s: [] for s in samplers}
        for _ in range(args.rounds + 1):
            for s in samplers:
                out = tmp / f"alias-{s}.out"
                if s == "py-spy":
                    subprocess.run(
                        pyspy_cmd(pyspy, target.pid, args.alias_s, out, "raw"),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        env=pyspy_env(),
                    )
                    share, n = share_busy_pyspy(out)
                else:
                    subprocess.run(
                        austin_cmd(args.austin, target.pid, args.alias_s, out),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    share, n = share_busy_austin(out)
                shares[s].append(round(share, 3))
    finally:
        target.kill()
        target.wait()
    result["periodic_busy_share"] = shares
    result["periodic_busy_share_truth"] = 0.2
    for s in samplers:
        print(f"{s:7s} share of samples in busy() (truth 0.20): {shares[s]}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
