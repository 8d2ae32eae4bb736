"""torch.save against `.many` on this machine, measured the way a user would: repeats of
both sides, interleaved, each profiled with `serwatt profile --record`, then compared by
`serwatt report`. Each run watches its checkpoint directory (`--checkpoints`), so the
report's checkpoints are the files written.

    .venv/bin/python bench/ab.py [--repeats 3] [--steps 40] [--every 4] [--size 64] [--rate 100]
                                 [--out DIR] [--baseline-ckpt torch] [--candidate-ckpt many]

Rounds alternate which side runs first, so drift in the machine's load falls on both.
Prints the report's checkpoint comparison (stall and CPU per checkpoint: ratio, 95%
interval over episodes, Holm-corrected Mann-Whitney p, n) and its verdict, which comes
from the interval and the test: a change, or "no significant change".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERWATT = [sys.executable, "-m", "serwatt"]


def profile_run(args: argparse.Namespace, db: Path, run_id: str, ckpt: str) -> None:
    # the watched directory makes the report's checkpoints the files written, not the
    # codepath with the most main-thread episode time
    ckpt_dir = args.out / run_id
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        *SERWATT, "profile", "--rate", f"{args.rate:g}", "--window", "2",
        "--record", str(db), "--run-id", run_id, "--checkpoints", str(ckpt_dir), "--",
        sys.executable, "-m", "serwatt.profiler.workloads.train", "--ckpt", ckpt,
        "--steps", str(args.steps), "--every", str(args.every), "--size", f"{args.size:g}",
        "--dir", str(ckpt_dir),
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench/ab.py: {run_id} failed ({r.returncode}):\n{r.stderr[-3000:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--size", type=float, default=64.0, help="checkpoint MB")
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--baseline-ckpt", default="torch")
    p.add_argument("--candidate-ckpt", default="many")
    p.add_argument("--out", type=Path, default=Path("/tmp/serwatt-ab"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "runs.sqlite"
    db.unlink(missing_ok=True)
    sides = [("baseline", args.baseline_ckpt), ("candidate", args.candidate_ckpt)]
    ids: dict[str, list[str]] = {"baseline": [], "candidate": []}
    t0 = time.time()
    for k in range(args.repeats):
        for side, ckpt in sides if k % 2 == 0 else sides[::-1]:
            run_id = f"{side}-{ckpt}-{k + 1}"
            print(f"round {k + 1}: {run_id}", file=sys.stderr, flush=True)
            profile_run(args, db, run_id, ckpt)
            ids[side].append(run_id)
    report_json = args.out / "report.json"
    r = subprocess.run(
        [*SERWATT, "report", "--db", str(db), "--baseline", *ids["baseline"],
         "--candidate", *ids["candidate"], "--json", str(report_json),
         "--html", str(args.out / "report.html")],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        sys.exit(f"bench/ab.py: serwatt report failed:\n{r.stderr}")
    doc = json.loads(report_json.read_text())
    ck = doc["checkpoint"]
    load1, load5, _ = os.getloadavg()
    print(
        f"{args.repeats} repeats per side, interleaved, {args.steps} steps, a {args.size:g} MB "
        f"checkpoint every {args.every}, {args.rate:g} Hz; {time.time() - t0:.0f} s; "
        f"load average {load1:.1f}/{load5:.1f}"
    )
    for side in ("baseline", "candidate"):
        s = ck[side]
        stall = s.get("stall_s") or {}
        print(
            f"  {side:<9} {s.get('codepath')}: {s.get('checkpoints')} checkpoints "
            f"({s.get('file_event_only')} file event only), stall p50 "
            f"{stall.get('p50')} s, p95 {stall.get('p95')} s, durable {s.get('durable')}"
        )
    for metric in ("stall_s", "cpu_s"):
        m = ck.get(metric)
        if not m:
            print(f"  {metric}: not compared ({ck.get('note')})")
            continue
        # too few episodes: the report gives no interval and says why (its ci_note)
        ci = f"95% CI {m['ci95'][0]:.3f}-{m['ci95'][1]:.3f}" if m["ci95"] else m["ci_note"]
        ratio = "-" if m["ratio"] is None else f"{m['ratio']:.3f}"
        p_holm = "-" if m["p_holm"] is None else f"{m['p_holm']:.3g}"
        print(
            f"  {metric} per checkpoint: ratio {ratio} ({ci}), "
            f"p_holm {p_holm}, n {m['n'][0]}+{m['n'][1]}: {m['verdict']}"
        )
    print(f"  report: {report_json} (HTML beside it); receipt {doc['receipt']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
