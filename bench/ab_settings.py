"""The lightest `serwatt profile` settings that still time a Trainer's save (issue 47).

For each setting, `--runs` profiled runs of tests/workloads/trainer_job.py (a stock
transformers Trainer, a checkpoint directory every `--save-steps`) under
`serwatt profile --cpu-budget off --checkpoints DIR`, as `serwatt ab` runs its sides, and
per checkpoint directory the recorded stall against the job's own timing of
`Trainer._save_checkpoint`: the error, the stated resolution, whether the truth is within
it, and serwatt's own CPU (cores, from the profile document).

    python -m bench.ab_settings [--runs 3] [--steps 20] [--save-steps 10] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS: dict[str, list[str]] = {
    "rate 50, timing 200 (ab's)": ["--rate", "50"],
    "rate 20, timing 80": ["--rate", "20"],
    "rate 10, timing 40": ["--rate", "10"],
    "rate 10, timing 40, one py-spy": ["--rate", "10", "--no-on-cpu-run"],
}


def one_run(tmp: Path, name: str, flags: list[str], k: int, steps: int, every: int) -> dict:
    d = tmp / f"{abs(hash(name))}-{k}"
    d.mkdir()
    doc, db = tmp / f"{d.name}.json", tmp / "r.sqlite"
    run_id = f"s{abs(hash(name))}-{k}"
    job = [sys.executable, "-m", "tests.workloads.trainer_job", str(d), "--steps", str(steps)]
    job += ["--save-steps", str(every), "--timing", str(d / ".timing.jsonl")]
    subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", "--cpu-budget", "off", *flags,
         "--record", str(db), "--run-id", run_id, "--checkpoints", str(d), "--json", str(doc),
         "--", *job],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900,
    )  # fmt: skip
    truth = {
        f"checkpoint-{t['step']}": t["save_s"]
        for t in map(json.loads, (d / ".timing.jsonl").open())
    }
    rows = sqlite3.connect(db).execute(
        "SELECT path, stall_s, resolution_s FROM checkpoints WHERE run_id = ?"
        " AND timed_by NOT LIKE 'part of the save of%'",
        (run_id,),
    )
    saves = []
    for path, stall, res in rows:
        name_ = Path(path).name
        if name_ in truth:
            err = None if stall is None else stall - truth[name_]
            saves.append({"dir": name_, "truth_s": truth[name_], "stall_s": stall,
                          "resolution_s": res, "error_s": err,
                          "within": err is not None and abs(err) <= res})  # fmt: skip
    own = json.loads(doc.read_text()).get("cpu_budget", {}).get("own_cpu_cores")
    return {"setting": name, "run": k, "own_cpu_cores": own, "saves": saves}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-steps", type=int, default=10)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ab-settings-") as tmp:
        for k in range(a.runs):  # interleaved, so a load drift spreads over every setting
            for name, flags in SETTINGS.items():
                out.append(one_run(Path(tmp), name, flags, k, a.steps, a.save_steps))
    ncpu = os.cpu_count() or 1
    print(f"{'setting':34} {'own CPU (node %)':>16} {'saves timed':>11} {'within':>7} "
          f"{'median |err| ms':>15} {'median res ms':>13}")  # fmt: skip
    for name in SETTINGS:
        runs = [r for r in out if r["setting"] == name]
        own = [r["own_cpu_cores"] for r in runs if r["own_cpu_cores"] is not None]
        saves = [s for r in runs for s in r["saves"]]
        timed = [s for s in saves if s["stall_s"] is not None]
        within = sum(1 for s in timed if s["within"])
        err = [abs(s["error_s"]) * 1e3 for s in timed]
        res = [s["resolution_s"] * 1e3 for s in timed]
        own_txt = f"{statistics.mean(own) / ncpu:.1%}" if own else "n/a"
        print(f"{name:34} {own_txt:>16} {len(timed):>5}/{len(saves):<5} "
              f"{within:>3}/{len(timed):<3} {statistics.median(err) if err else 0:>15.1f} "
              f"{statistics.median(res) if res else 0:>13.1f}")  # fmt: skip
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
