"""Accuracy of serwatt's CPU shares against a workload that measures itself.

The workload (a separate Python process) runs a stationary mix of pickle, json,
protobuf (upb, message type built at runtime), msgpack and plain compute on one or
two busy threads, and times every serializer call with time.thread_time() (the
calling thread's CPU time: ground truth). The bench sends it SIGUSR1 just before and
just after profiling; the workload appends its cumulative per-codepath CPU seconds at
each signal, and the difference is the ground truth over the profiled interval.

serwatt profiles it through the real pipeline (ProfileSession: py-spy windows,
procfs CPU, classification, weighting) and the bench prints, per codepath,
|serwatt share - true share| in percentage points.

    .venv/bin/python bench/accuracy.py [--rate 100] [--duration 30] [--threads 1|2]

Goal: <= 2 pp per codepath at 100 Hz over 30 s with one busy thread, <= 3 pp with two.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORKLOAD = r"""
import json, pickle, signal, sys, threading, time
import msgpack
from profiler.workloads.demo import build_record_types

thread_time = time.thread_time
truth_path, n_threads = sys.argv[1], int(sys.argv[2])
payload = {f"k{i}": {"id": i, "v": [i * 0.5, i * 1.5], "tag": "t" * 10} for i in range(1500)}
record_cls, batch_cls = build_record_types()
batch = batch_cls()
for i in range(1500):
    batch.records.append(record_cls(id=i, values=[i * 0.5, i * 1.5], tag="y" * 10))
accs = []


def busy():
    acc = {"pickle": 0.0, "json": 0.0, "protobuf": 0.0, "msgpack": 0.0, "total": 0.0}
    accs.append(acc)
    start = thread_time()
    while True:
        t0 = thread_time()
        blob = pickle.dumps(payload)
        back = pickle.loads(blob)
        t1 = thread_time()
        text = json.dumps(payload)
        t2 = thread_time()
        pb = batch.SerializeToString()
        t3 = thread_time()
        mp = msgpack.packb(payload)
        t4 = thread_time()
        x = 0
        for i in range(40000):
            x += i % 7
        t5 = thread_time()
        acc["pickle"] += t1 - t0
        acc["json"] += t2 - t1
        acc["protobuf"] += t3 - t2
        acc["msgpack"] += t4 - t3
        acc["total"] = t5 - start


def snapshot(signum, frame):
    rows = [dict(a) for a in accs]
    with open(truth_path, "a") as fh:
        fh.write(json.dumps({"t": time.time(), "threads": rows}) + "\n")


signal.signal(signal.SIGUSR1, snapshot)
for k in range(n_threads - 1):
    threading.Thread(target=busy, name=f"busy{k + 1}", daemon=True).start()
print("ready", flush=True)
busy()
"""


def truth_shares(before: dict, after: dict) -> dict[str, float]:
    keys = ("pickle", "json", "protobuf", "msgpack")
    per = {k: 0.0 for k in keys}
    total = 0.0
    for a, b in zip(before["threads"], after["threads"], strict=True):
        for k in keys:
            per[k] += b[k] - a[k]
        total += b["total"] - a["total"]
    shares = {k: v / total for k, v in per.items()}
    shares["other"] = 1.0 - sum(shares.values())
    shares["_total_cpu_s"] = total
    return shares


PHASES = r"""
import time
def phase_a():
    while int(time.time() * 2) % 2 == 0:
        pass
def phase_b():
    while int(time.time() * 2) % 2 == 1:
        pass
while True:
    phase_a()
    phase_b()
"""


def timestamps(args: argparse.Namespace) -> int:
    """The target switches function at every multiple of 0.5 s of host time. Each
    switch seen between two consecutive samples is placed by serwatt's timestamps;
    its error is the distance to the true boundary (the nearest multiple of 0.5 s)."""
    import statistics

    from collectors.pyspy import PySpy

    spy = PySpy()
    proc = subprocess.Popen([sys.executable, "-c", PHASES])
    errors: list[float] = []
    agree = total = 0
    try:
        time.sleep(1.0)
        end = time.time() + args.duration
        while time.time() < end:
            w = spy.record_window(proc.pid, duration_s=args.window, rate_hz=args.rate)
            leaf = [(s.t, s.frames[0].name) for s in w.samples if s.frames]
            for t, name in leaf:
                if name in ("phase_a", "phase_b"):
                    total += 1
                    agree += name == ("phase_a" if int(t * 2) % 2 == 0 else "phase_b")
            for (t0, a), (t1, b) in zip(leaf, leaf[1:], strict=False):
                if a != b and {a, b} == {"phase_a", "phase_b"}:
                    mid = (t0 + t1) / 2
                    errors.append(mid - round(mid * 2) / 2)
    finally:
        proc.kill()
        proc.wait()
    abs_err = sorted(abs(e) for e in errors)
    print(
        f"timestamps: {args.rate:g} Hz, {args.window:g} s windows, {args.duration:g} s; "
        f"{agree}/{total} samples ({100 * agree / max(1, total):.1f}%) in the phase their "
        f"stack shows; {len(errors)} switches: mean error {statistics.mean(errors) * 1e3:+.1f} ms, "
        f"median |error| {abs_err[len(abs_err) // 2] * 1e3:.1f} ms, "
        f"p95 |error| {abs_err[int(0.95 * (len(abs_err) - 1))] * 1e3:.1f} ms"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=1, choices=(1, 2))
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument(
        "--no-on-cpu-run",
        dest="on_cpu_run",
        action="store_false",
        help="one py-spy per window (CPU on --idle samples)",
    )
    ap.add_argument(
        "--timestamps",
        action="store_true",
        help="instead: measure the error of per-sample host timestamps",
    )
    args = ap.parse_args()
    if args.timestamps:
        return timestamps(args)

    from profiler.classify.classifier import Classifier
    from profiler.profile.document import build_document
    from profiler.profile.session import ProfileSession

    classifier = Classifier.default()
    with tempfile.TemporaryDirectory() as tmp:
        wl = Path(tmp) / "accuracy_workload.py"
        wl.write_text(WORKLOAD)
        truth = Path(tmp) / "truth.jsonl"
        proc = subprocess.Popen(
            [sys.executable, str(wl), str(truth), str(args.threads)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("workload did not start")
            time.sleep(1.0)
            # warm the classifier's per-file caches outside the measured interval
            ProfileSession(
                proc.pid, classifier=classifier, rate_hz=args.rate, window_s=2,
                duration_s=2, follow_children=False, progress=None,
            ).run()  # fmt: skip
            os.kill(proc.pid, signal.SIGUSR1)
            session = ProfileSession(
                proc.pid,
                classifier=classifier,
                rate_hz=args.rate,
                window_s=args.window,
                duration_s=args.duration,
                follow_children=False,
                progress=sys.stderr,
                on_cpu_run=args.on_cpu_run,
            )
            result = session.run()
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(0.5)
        finally:
            proc.kill()
            proc.wait()
        lines = [json.loads(x) for x in truth.read_text().splitlines()]
    true = truth_shares(lines[0], lines[1])
    doc = build_document(result)
    print(
        f"accuracy: {args.threads} busy thread(s), {args.rate:g} Hz, {args.duration:g} s, "
        f"on-CPU run {'on' if args.on_cpu_run else 'off'}, "
        f"{doc['samples']} samples, serwatt CPU {doc['cpu_s']:.2f} s, "
        f"workload-timed CPU {true['_total_cpu_s']:.2f} s"
    )
    print(f"{'codepath':<10}{'true':>8}{'serwatt':>9}{'95% CI':>18}{'error pp':>10}")
    worst = 0.0
    for cp in ("pickle", "json", "protobuf", "msgpack", "other"):
        got = doc["codepaths"][cp]["share"]
        ci = doc["codepaths"][cp]["share_ci95"]
        err = abs(got - true[cp]) * 100
        worst = max(worst, err)
        ci_s = f"[{ci[0] * 100:.1f}, {ci[1] * 100:.1f}]" if ci else "n/a"
        print(f"{cp:<10}{true[cp] * 100:>7.2f}%{got * 100:>8.2f}%{ci_s:>18}{err:>10.2f}")
    goal = 2.0 if args.threads == 1 else 3.0
    print(
        f"max error {worst:.2f} pp (goal <= {goal:g} pp): {'MET' if worst <= goal else 'NOT MET'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
