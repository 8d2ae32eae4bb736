"""Coverage of `serwatt profile`'s share interval (`share_ci95`) against in-process truth.

Each run starts bench/accuracy.py's mix workload (one thread: pickle, json, protobuf,
msgpack and plain compute, every call timed with time.thread_time()), attaches
`serwatt profile --pid P --duration S --json F` at its defaults (the CPU budget's 5-8 Hz on
a 2-CPU VM) and asks the workload for its cumulative per-codepath CPU every 0.25 s
(SIGUSR1). The profiled span starts at the CLI's first progress line (`0.1 s elapsed`,
less the time it states, read as it is written) and lasts the document's duration_s;
the truth over it is interpolated between the workload's stamps. A run's interval for a
codepath *covers* when lo <= truth <= hi.

    .venv/bin/python bench/profile_coverage.py [--runs 30] [--duration 12]
                                               [--baseline-tree DIR] [-- PROFILE ARGS...]

Per codepath: the fraction of runs whose interval held the truth, its 95% Monte-Carlo
interval (Clopper-Pearson over runs) and a verdict against the goal of 0.93, read off that
interval (confirmed / not met / undecided). Runs whose document says its intervals do not
hold (`share_ci95_too_short`: too few samples; `share_ci95_contended`: the target waited
for a CPU as long as it ran) are counted apart: the goal is coverage in the runs that do
not say so; the coverage of every run is printed beside it. `--baseline-tree DIR` runs
another checkout's `serwatt` as well, interleaved run by run (the order alternating), so a
change to the interval is measured against the old one under the same load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOAL = 0.93
STAMP_S = 0.25
CODEPATHS = ("pickle", "json", "protobuf", "msgpack", "other")


def mix_workload() -> str:
    """bench/accuracy.py's mix workload (one implementation of the self-timed mix)."""
    spec = importlib.util.spec_from_file_location("bench_accuracy", REPO / "bench" / "accuracy.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.WORKLOAD)


def truth_at(stamps: list[dict[str, Any]], t: float) -> dict[str, float]:
    """The workload's cumulative CPU per codepath (and `total`) at host time t, linear
    between the two stamps around it (the nearest one outside them)."""
    rows = [(s["t"], s["threads"][0]) for s in stamps]
    keys = (*CODEPATHS[:-1], "total")
    if t <= rows[0][0]:
        return {k: rows[0][1][k] for k in keys}
    for (t0, a), (t1, b) in zip(rows, rows[1:], strict=False):
        if t0 <= t <= t1:
            f = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
            return {k: a[k] + f * (b[k] - a[k]) for k in keys}
    return {k: rows[-1][1][k] for k in keys}


def true_shares(stamps: list[dict[str, Any]], t0: float, t1: float) -> dict[str, float]:
    a, b = truth_at(stamps, t0), truth_at(stamps, t1)
    total = b["total"] - a["total"]
    shares = {cp: (b[cp] - a[cp]) / total for cp in CODEPATHS[:-1]}
    shares["other"] = 1.0 - sum(shares.values())
    return shares


def profile_once(tree: Path, workload: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One profiled run of the workload by `tree`'s serwatt: the document, the truth over
    the profiled span, and the truth over the whole attach-to-exit span (its drift)."""
    with tempfile.TemporaryDirectory() as tmp:
        truth = Path(tmp) / "truth.jsonl"
        doc_path = Path(tmp) / "doc.json"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, str(workload), str(truth), "1"],
            cwd=REPO, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        stop = threading.Event()

        def stamp() -> None:
            while not stop.wait(STAMP_S):
                os.kill(proc.pid, signal.SIGUSR1)

        try:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("bench/profile_coverage.py: the workload did not start")
            time.sleep(1.0)
            os.kill(proc.pid, signal.SIGUSR1)
            stamper = threading.Thread(target=stamp, daemon=True)
            stamper.start()
            launched = time.time()
            sched0 = schedstat(proc.pid)
            cli = subprocess.Popen(
                [sys.executable, "-m", "serwatt", "profile", "--pid", str(proc.pid),
                 "--duration", f"{args.duration:g}", "--json", str(doc_path), *args.profile_args],
                cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONPATH": str(tree)},
            )  # fmt: skip
            assert cli.stderr is not None and cli.stdout is not None
            started = None
            err: list[str] = []
            for line in cli.stderr:  # progress lines, as they are written
                m = re.match(r"serwatt: +([0-9.]+) s elapsed", line)
                if started is None and m:
                    started = time.time() - float(m.group(1))
                err.append(line)
            table = cli.stdout.read()
            code = cli.wait()
            ended = time.time()
            sched1 = schedstat(proc.pid)
            time.sleep(2 * STAMP_S)
        finally:
            stop.set()
            proc.kill()
            proc.wait()
        if code != 0 or started is None:
            raise SystemExit(f"bench/profile_coverage.py: serwatt profile failed ({code}):\n"
                             + "".join(err)[-3000:])  # fmt: skip
        stamps = [json.loads(x) for x in truth.read_text().splitlines()]
        doc = json.loads(doc_path.read_text())
    return {
        "doc": doc,
        "first_line": table.splitlines()[0] if table else "",
        "truth": true_shares(stamps, started, started + doc["duration_s"]),
        "truth_whole": true_shares(stamps, launched, ended),
        # the workload's run-queue wait per CPU-second while attached: how contended it was
        "wait_per_cpu": (sched1[1] - sched0[1]) / max(1e-9, sched1[0] - sched0[0]),
    }


def schedstat(pid: int) -> tuple[float, float]:
    """(on-CPU s, run-queue wait s) of a process's main thread."""
    fields = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """The exact 95% interval of a binomial proportion k/n."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def verdict(lo: float, hi: float, goal: float = GOAL) -> str:
    return "confirmed" if lo >= goal else "not met" if hi < goal else "undecided"


def said(doc: dict[str, Any]) -> str | None:
    """Why the profile said its intervals do not hold (too short, or contended), or None."""
    return doc.get("share_ci95_too_short") or doc.get("share_ci95_contended")


def covers(run: dict[str, Any], cp: str) -> bool | None:
    ci = run["doc"]["codepaths"][cp]["share_ci95"]
    if ci is None:
        return None
    return ci[0] <= run["truth"][cp] <= ci[1]


def summarize(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Print one tree's coverage table; return its figures."""
    from serwatt.profiler.intervals import mean_interval

    short = [r for r in runs if said(r["doc"])]
    kept = [r for r in runs if not said(r["doc"])]
    rates = sorted(
        {x for r in runs for x in (r["doc"].get("cpu_budget") or {}).get("rates_hz") or []}
    )
    print(f"\n== {label}: {len(runs)} run(s), {len(short)} said their intervals do not hold "
          f"(too short or contended); "
          f"rates {rates[0] if rates else '?'}-{rates[-1] if rates else '?'} Hz; "
          f"samples per run {min(r['doc']['samples'] for r in runs)}-"
          f"{max(r['doc']['samples'] for r in runs)}")  # fmt: skip
    print(f"{'codepath':<10}{'truth':>8}{'share':>8}{'mean width':>12}{'no CI':>7}"
          f"{'covered':>10}{'coverage [95% MC CI]':>26}  verdict (goal >= {GOAL:g})")  # fmt: skip
    fig: dict[str, Any] = {"runs": len(runs), "said": len(short), "codepaths": {}}
    fig["per_run"] = [
        {
            "samples": r["doc"]["samples"],
            "wait_per_cpu": round(r["wait_per_cpu"], 3),
            "too_short": r["doc"].get("share_ci95_too_short"),
            "contended": r["doc"].get("share_ci95_contended"),
            "truth": {cp: round(r["truth"][cp], 5) for cp in CODEPATHS},
            "share": {cp: r["doc"]["codepaths"][cp]["share"] for cp in CODEPATHS},
            "share_ci95": {cp: r["doc"]["codepaths"][cp]["share_ci95"] for cp in CODEPATHS},
        }
        for r in runs
    ]
    for cp in CODEPATHS:
        got = [covers(r, cp) for r in kept]
        k, n = sum(1 for g in got if g), len(got)
        none = sum(1 for g in got if g is None)
        widths = [
            c[1] - c[0] for r in kept if (c := r["doc"]["codepaths"][cp]["share_ci95"]) is not None
        ]
        t_mean = 100 * sum(r["truth"][cp] for r in runs) / len(runs)
        s_mean = 100 * sum(r["doc"]["codepaths"][cp]["share"] for r in runs) / len(runs)
        lo, hi = clopper_pearson(k, n) if n else (float("nan"), float("nan"))
        v = verdict(lo, hi) if n else "undecided"
        width = 100 * sum(widths) / len(widths) if widths else float("nan")
        print(f"{cp:<10}{t_mean:>7.2f}%{s_mean:>7.2f}%{width:>10.2f}pp{none:>7}{k:>6}/{n:<3}"
              f"{k / n if n else float('nan'):>10.3f} [{lo:.3f}, {hi:.3f}]  {v}")  # fmt: skip
        fig["codepaths"][cp] = {
            "truth_pct": round(t_mean, 3), "share_pct": round(s_mean, 3),
            "mean_width_pp": round(width, 3), "no_interval": none, "covered": k, "runs": n,
            "coverage": round(k / n, 4) if n else None,
            "coverage_mc_ci95": [round(lo, 4), round(hi, 4)], "verdict": v,
        }  # fmt: skip
    # every codepath of a run together: the runs are the independent unit, so the mean of
    # each run's covered fraction gets a Student t interval over runs
    per_run = [sum(1 for cp in CODEPATHS if covers(r, cp)) / len(CODEPATHS) for r in kept]
    pooled = mean_interval(per_run)
    plo, phi = pooled.bounds()
    pv = verdict(plo, phi) if pooled.has_interval else "undecided"
    print(f"{'all':<10}{'':>8}{'':>8}{'':>12}{'':>7}{'':>10}{pooled.estimate:>10.3f} "
          f"[{plo:.3f}, {phi:.3f}]  {pv} (per-run covered fraction, {pooled.method})")  # fmt: skip
    every = {cp: sum(1 for r in runs if covers(r, cp)) for cp in CODEPATHS}
    print("every run, those that said so included: "
          + ", ".join(f"{cp} {k}/{len(runs)}" for cp, k in every.items()))  # fmt: skip
    fig["covered_every_run"] = every
    drift = max(abs(r["truth"][cp] - r["truth_whole"][cp]) for r in runs for cp in CODEPATHS)
    print(f"truth's own edge error: the largest |truth over the profiled span - truth from "
          f"attach to exit| is {100 * drift:.2f} pp")  # fmt: skip
    fig.update(pooled=round(pooled.estimate, 4), pooled_ci95=[round(plo, 4), round(phi, 4)],
               pooled_verdict=pv, truth_edge_pp=round(100 * drift, 3))  # fmt: skip
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="profiled runs (per tree)")
    ap.add_argument("--duration", type=float, default=12.0, help="serwatt profile --duration")
    ap.add_argument("--baseline-tree", type=Path, default=None,
                    help="another checkout whose serwatt runs too, interleaved")  # fmt: skip
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("profile_args", nargs="*", help="after --: more serwatt profile options")
    args = ap.parse_args(argv)
    # a stopped bench stops its workload too (the `finally` of profile_once)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.runs < 2:
        ap.error("--runs must be >= 2: the coverage needs an interval")
    if args.baseline_tree is not None and not (args.baseline_tree / "profiler").is_dir():
        ap.error(f"--baseline-tree {args.baseline_tree}: no profiler/ there; give a checkout")
    trees = {"this tree": REPO}
    if args.baseline_tree is not None:
        trees["baseline"] = args.baseline_tree.resolve()
    load = os.getloadavg()
    print(f"profile coverage: {args.runs} run(s) per tree, {args.duration:g} s each, "
          f"serwatt profile defaults{''.join(' ' + a for a in args.profile_args)}; "
          f"{os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start"
          f"{' (loaded)' if load[0] > (os.cpu_count() or 1) / 2 else ''}")  # fmt: skip
    by_tree: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    with tempfile.TemporaryDirectory() as tmp:
        workload = Path(tmp) / "coverage_workload.py"
        workload.write_text(mix_workload())
        names = list(trees)
        for i in range(args.runs):
            for name in names if i % 2 == 0 else names[::-1]:
                run = profile_once(trees[name], workload, args)
                by_tree[name].append(run)
                doc = run["doc"]
                missed = [
                    f"{cp} {100 * (doc['codepaths'][cp]['share'] - run['truth'][cp]):+.1f} pp"
                    for cp in CODEPATHS if covers(run, cp) is False
                ]  # fmt: skip
                print(f"run {i + 1} {name}: {doc['samples']} samples, "
                      f"{doc['duration_s']:.1f} s, run-queue wait {run['wait_per_cpu']:.2f} s "
                      f"per CPU-s; missed: {', '.join(missed) or 'none'}"
                      f"{'; said its intervals do not hold' if said(doc) else ''}",
                      flush=True)  # fmt: skip
    figures = {name: summarize(name, runs) for name, runs in by_tree.items()}
    load = os.getloadavg()
    print(f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at end")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    mine = figures["this tree"]
    return (
        1
        if "not met"
        in [mine["pooled_verdict"]] + [c["verdict"] for c in mine["codepaths"].values()]
        else 0
    )


if __name__ == "__main__":
    raise SystemExit(main())
