"""Accuracy of serwatt's CPU shares against a workload that measures itself.

Two workloads, each a separate Python process that times its own serializer calls
(ground truth) and appends its cumulative per-codepath CPU seconds to a file at each
SIGUSR1; the bench signals it just before and just after profiling, so truth covers
exactly the profiled interval. serwatt profiles it through the real pipeline
(ProfileSession: py-spy windows, procfs CPU, classification, weighting).

- *mix* (default): a stationary mix of pickle, json, protobuf (upb, message type built
  at runtime), msgpack and plain compute on one or two busy threads, each call timed
  with time.thread_time(); truth shares are over the busy threads' CPU.

      .venv/bin/python bench/accuracy.py [--rate 100] [--duration 30] [--threads 1|2]

  Goal: <= 2 pp per codepath with one busy thread, <= 3 pp with two.

  With `--busy N`, N busy processes (pure-Python loops) run beside the workload: two
  serializer threads sharing the GIL while waiting for a CPU as well (issue 21's case).

      .venv/bin/python bench/accuracy.py --threads 2 --busy 2 --repeats 5 --duration 20

  Goal: <= 2 pp per codepath.

- *contention* (`--contention N`): a training-like loop on the main thread, a compute
  phase (torch.exp over 4M floats for a fixed wall time) then a checkpoint phase (torch.save of a
  16 MB state and pickle.dumps of a large dict, a fixed amount of work), each timed
  with time.thread_time(); truth shares are over the process's CPU
  (time.process_time(): every thread). Run under three conditions, interleaved in
  every repeat: `quiet` (nothing else, one torch thread), `busy` (N busy processes
  beside it) and `busy+worker` (N busy processes, and torch's OpenMP worker thread,
  a thread without Python frames, sharing that compute: the main thread then waits
  for a CPU in compute far more than in the checkpoint).

      .venv/bin/python bench/accuracy.py --contention 1 --repeats 6 --duration 20

  Goal: <= 1.5 pp per codepath, with and without contention.

The verdict comes from repeats, never from one run: per repeat the worst codepath's
|error| (pp), and a 95% Student t interval (profiler/intervals.py) of its mean over the
repeats: `confirmed` when the interval lies under the goal, `not met` when it lies
over it, `undecided` otherwise. The signed error per codepath (its mean and interval:
the bias) is printed beside it.
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

from serwatt.profiler.intervals import NOT_MET, mean_interval, verdict  # noqa: E402

WORKLOAD = r"""
import json, os, pickle, signal, sys, threading, time
import msgpack
from serwatt.profiler.workloads.demo import build_record_types

thread_time = time.thread_time
truth_path, n_threads = sys.argv[1], int(sys.argv[2])
waits = len(sys.argv) > 3 and sys.argv[3] == "waits"
payload = {f"k{i}": {"id": i, "v": [i * 0.5, i * 1.5], "tag": "t" * 10} for i in range(1500)}
record_cls, batch_cls = build_record_types()
batch = batch_cls()
for i in range(1500):
    batch.records.append(record_cls(id=i, values=[i * 0.5, i * 1.5], tag="y" * 10))
accs = []


def busy():
    acc = {"pickle": 0.0, "json": 0.0, "protobuf": 0.0, "msgpack": 0.0, "total": 0.0}
    accs.append(acc)
    if waits:
        waited(acc)
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


def waited(acc):
    # --truth-waits: the thread's run-queue wait (schedstat's second field) read around
    # every segment as well. Each read is a system call that lets go of the GIL, so this
    # mode hands the GIL over at every segment edge: a workload of its own, reported apart.
    fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def rq():
        return int(os.pread(fd, 128, 0).split()[1]) / 1e9

    for k in ("pickle", "json", "protobuf", "msgpack", "other"):
        acc["wait_" + k] = 0.0
    start = thread_time()
    while True:
        q0 = rq()
        t0 = thread_time()
        blob = pickle.dumps(payload)
        back = pickle.loads(blob)
        t1 = thread_time()
        q1 = rq()
        t1b = thread_time()
        text = json.dumps(payload)
        t2 = thread_time()
        q2 = rq()
        t2b = thread_time()
        pb = batch.SerializeToString()
        t3 = thread_time()
        q3 = rq()
        t3b = thread_time()
        mp = msgpack.packb(payload)
        t4 = thread_time()
        q4 = rq()
        x = 0
        for i in range(40000):
            x += i % 7
        q5 = rq()
        acc["pickle"] += t1 - t0
        acc["json"] += t2 - t1b
        acc["protobuf"] += t3 - t2b
        acc["msgpack"] += t4 - t3b
        acc["wait_pickle"] += q1 - q0
        acc["wait_json"] += q2 - q1
        acc["wait_protobuf"] += q3 - q2
        acc["wait_msgpack"] += q4 - q3
        acc["wait_other"] += q5 - q4
        acc["total"] = thread_time() - start


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


MIX_CODEPATHS = ("pickle", "json", "protobuf", "msgpack")

# The training-like loop: compute for COMPUTE_S of wall time (torch.exp over 4M floats; with
# torch threads 2 its OpenMP worker shares them), then a checkpoint phase of fixed
# work. Truth per codepath is the main thread's thread_time() in the call; the total
# is process_time(), every thread of the process (the OpenMP worker's CPU is `other`).
CONTENTION_WORKLOAD = r"""
import io, json, os, pickle, signal, sys, time
import torch

truth_path, torch_threads = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(torch_threads)
COMPUTE_S = 1.5
x = torch.randn(1 << 22)
y = torch.empty_like(x)
state = {f"layer{i}.weight": torch.randn(256, 256) for i in range(64)}
payload = {f"k{i}": {"id": i, "v": [i * 0.5, i * 1.5], "tag": "t" * 10} for i in range(20000)}
acc = {"torch": 0.0, "pickle": 0.0}
thread_time = time.thread_time


def snapshot(signum, frame):
    row = dict(acc, total=time.process_time())
    with open(truth_path, "a") as fh:
        fh.write(json.dumps({"t": time.time(), "threads": [row]}) + "\n")


signal.signal(signal.SIGUSR1, snapshot)
print("ready", flush=True)
while True:
    end = time.perf_counter() + COMPUTE_S
    while time.perf_counter() < end:
        torch.exp(x, out=y)  # at::parallel_for: the OpenMP worker takes half
    for _ in range(8):
        t0 = thread_time()
        torch.save(state, io.BytesIO())
        t1 = thread_time()
        blob = pickle.dumps(payload)
        t2 = thread_time()
        acc["torch"] += t1 - t0
        acc["pickle"] += t2 - t1
"""
CONTENTION_CODEPATHS = ("torch", "pickle")
BUSY = "while True:\n    pass\n"
# (name, busy processes beside the workload?, torch threads)
CONDITIONS = {"quiet": (False, 1), "busy": (True, 1), "busy+worker": (True, 2)}


def truth_shares(before: dict, after: dict, keys: tuple[str, ...]) -> dict[str, float]:
    per = {k: 0.0 for k in keys}
    total = 0.0
    for a, b in zip(before["threads"], after["threads"], strict=True):
        for k in keys:
            per[k] += b[k] - a[k]
        total += b["total"] - a["total"]
    shares = {k: v / total for k, v in per.items()}
    shares["other"] = 1.0 - sum(shares.values())
    shares["_total_cpu_s"] = total
    if after["threads"] and "wait_other" in after["threads"][0]:
        shares["_wait_s"] = {
            k: sum(
                b[f"wait_{k}"] - a[f"wait_{k}"]
                for a, b in zip(before["threads"], after["threads"], strict=True)
            )
            for k in (*keys, "other")
        }
    return shares


def waits_report(runs: list[tuple[dict, dict]], keys: tuple[str, ...]) -> None:
    """--truth-waits: where the run-queue wait fell, by codepath, in the workload's own
    schedstat reads, and the shares on-CPU samples would give if every sample weighed the
    same: (CPU + run-queue wait) of the codepath over the threads' total. On-CPU samples
    stand for runnable time, so a codepath that takes more than its CPU's part of the wait
    is over-counted unless its samples weigh less than the others'."""
    cps = (*keys, "other")
    print("\nrun-queue wait by codepath (the workload's schedstat reads, all repeats):")
    print(f"{'codepath':<10}{'CPU':>8}{'wait':>8}{'wait/CPU':>10}{'(C+D) share':>13}{'serwatt':>9}")
    cpu = {cp: 0.0 for cp in cps}
    wait = {cp: 0.0 for cp in cps}
    got = {cp: 0.0 for cp in cps}
    for true, doc in runs:
        for cp in cps:
            cpu[cp] += true[cp] * true["_total_cpu_s"]
            wait[cp] += true["_wait_s"][cp]
            got[cp] += doc["codepaths"][cp]["share"] / len(runs)
    runnable = sum(cpu.values()) + sum(wait.values())
    for cp in cps:
        print(
            f"{cp:<10}{cpu[cp]:>7.3f}s{wait[cp]:>7.3f}s{wait[cp] / max(cpu[cp], 1e-9):>10.2f}"
            f"{100 * (cpu[cp] + wait[cp]) / runnable:>12.2f}%{100 * got[cp]:>8.2f}%"
        )


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

    from serwatt.collectors.pyspy import PySpy, SamplingPlan

    spy = PySpy(priority=args.sampler_priority)
    proc = subprocess.Popen([sys.executable, "-c", PHASES])
    errors: list[float] = []
    agree = total = 0
    try:
        time.sleep(1.0)
        end = time.time() + args.duration
        while time.time() < end:
            w = spy.record_window(
                proc.pid, duration_s=args.window, plan=SamplingPlan(rate_hz=args.rate)
            )
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


def profile_once(
    args: argparse.Namespace,
    classifier: object,
    *,
    script: str,
    script_args: list[str],
    keys: tuple[str, ...],
    busy: int = 0,
    kernel: bool = False,
) -> tuple[dict[str, float], dict]:
    """One profiled run: (true shares, serwatt's profile document). `kernel`: CPU
    weighed by the scheduler timeline (SamplingPlan.kernel_timeline)."""
    from serwatt.collectors.pyspy import PySpy, SamplingPlan
    from serwatt.profiler.profile.document import build_document
    from serwatt.profiler.profile.session import ProfileSession

    spy = PySpy(priority=args.sampler_priority)

    with tempfile.TemporaryDirectory() as tmp:
        wl = Path(tmp) / "accuracy_workload.py"
        wl.write_text(script)
        truth = Path(tmp) / "truth.jsonl"
        hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
        proc = subprocess.Popen(
            [sys.executable, str(wl), str(truth), *script_args],
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
            warm = SamplingPlan(rate_hz=args.rate, on_cpu_run=True)
            ProfileSession(
                proc.pid, classifier=classifier, plan=warm, window_s=2, duration_s=2,
                follow_children=False, progress=None, pyspy=spy,
            ).run()  # fmt: skip
            os.kill(proc.pid, signal.SIGUSR1)
            session = ProfileSession(
                proc.pid,
                classifier=classifier,
                plan=SamplingPlan(
                    rate_hz=args.rate,
                    on_cpu_run=args.on_cpu_run,
                    timing_rate_hz=timing_rate_hz(args),
                    kernel_timeline=kernel,
                ),
                window_s=args.window,
                duration_s=args.duration,
                follow_children=False,
                progress=None,
                pyspy=spy,
            )
            result = session.run()
            os.kill(proc.pid, signal.SIGUSR1)
            # the workload writes its second truth line from its signal handler: on a
            # loaded node that took more than 0.5 s
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and len(truth.read_text().splitlines()) < 2:
                time.sleep(0.1)
        finally:
            for p in (proc, *hogs):
                p.kill()
                p.wait()
        lines = [json.loads(x) for x in truth.read_text().splitlines()]
    return truth_shares(lines[0], lines[1], keys), build_document(result)


def timing_rate_hz(args: argparse.Namespace) -> float | None:
    """The stack-change run's rate, as `serwatt profile` chooses it (0: none)."""
    from serwatt.profiler.sampling.collect import timing_rate_hz as rule

    return rule(args.timing_rate, args.rate)


def report(label: str, runs: list[tuple[dict, dict]], keys: tuple[str, ...], goal: float) -> str:
    """Print one condition's repeats and return its verdict."""
    cps = (*keys, "other")
    print(f"\n== {label}: {len(runs)} repeat(s)")
    print(f"{'codepath':<10}{'true':>8}{'serwatt':>9}{'mean error pp [95% CI]':>30}")
    worst: list[float] = []
    for true, doc in runs:
        worst.append(max(abs(doc["codepaths"][cp]["share"] - true[cp]) * 100 for cp in cps))
    for cp in cps:
        errs = [(doc["codepaths"][cp]["share"] - true[cp]) * 100 for true, doc in runs]
        bias = mean_interval(errs)
        lo, hi = bias.bounds()
        t_mean = 100 * sum(true[cp] for true, _ in runs) / len(runs)
        s_mean = 100 * sum(doc["codepaths"][cp]["share"] for _, doc in runs) / len(runs)
        print(
            f"{cp:<10}{t_mean:>7.2f}%{s_mean:>8.2f}%{bias.estimate:>+12.2f} [{lo:+.2f}, {hi:+.2f}]"
        )
    error = mean_interval(worst)
    v = verdict(error, at_most=goal)
    lo, hi = error.bounds()
    per_run = ", ".join(f"{w:.2f}" for w in worst)
    print(
        f"worst codepath |error| per repeat: {per_run} pp; mean {error.estimate:.2f} pp "
        f"(95% CI {lo:.2f}-{hi:.2f}, {error.method}); goal <= {goal:g} pp: {v}"
    )
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=1, choices=(1, 2))
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=5, help="profiled runs per condition")
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="mix: N busy processes beside the workload (goal 2 pp)",
    )
    ap.add_argument(
        "--contention",
        type=int,
        default=None,
        metavar="N",
        help="the training-like workload quiet, beside N busy processes, and beside them "
        "with torch's OpenMP worker thread",
    )
    ap.add_argument(
        "--conditions",
        default=",".join(CONDITIONS),
        help=f"with --contention: which of {', '.join(CONDITIONS)} to run",
    )
    ap.add_argument(
        "--no-on-cpu-run",
        dest="on_cpu_run",
        action="store_false",
        help="one py-spy per window (CPU on --idle samples)",
    )
    ap.add_argument(
        "--timing-rate",
        type=float,
        default=None,
        metavar="HZ",
        help="the stack-change run (default: `serwatt profile`'s, 4x --rate up to 400 Hz; "
        "0: none, so on-CPU samples are placed without the phase timeline)",
    )
    ap.add_argument(
        "--sampler-priority",
        choices=("auto", "required", "off"),
        default="auto",
        help="py-spy's scheduling (collectors/sched.py); off shows what it is worth",
    )
    ap.add_argument(
        "--kernel-timeline",
        choices=("off", "on", "both"),
        default="off",
        help="mix: weigh CPU by the kernel's scheduler timeline (on), by the estimates "
        "(off), or both, interleaved in every repeat (before/after)",
    )
    ap.add_argument(
        "--truth-waits",
        action="store_true",
        help="mix: the workload also reads its threads' run-queue wait around every "
        "segment and the bench prints where the wait fell (a GIL hand-over at every edge)",
    )
    ap.add_argument(
        "--timestamps",
        action="store_true",
        help="instead: measure the error of per-sample host timestamps",
    )
    args = ap.parse_args()
    if args.timestamps:
        return timestamps(args)
    if args.repeats < 2:
        ap.error("--repeats must be >= 2: the verdict needs an interval")
    if args.busy < 0 or (args.busy and args.contention is not None):
        ap.error("--busy N (N >= 0) is for the mix workload; --contention N has its own")

    from serwatt.profiler.classify.classifier import Classifier

    classifier = Classifier.default()
    load = os.getloadavg()
    print(
        f"accuracy: {args.rate:g} Hz, {args.duration:g} s per run, {args.window:g} s windows, "
        f"on-CPU run {'on' if args.on_cpu_run else 'off'}, stack-change run "
        f"{timing_rate_hz(args) or 0:g} Hz, sampler priority "
        f"{args.sampler_priority}, {args.repeats} repeats, "
        f"{os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start"
    )
    if args.contention is None:
        sides = {"off": [False], "on": [True], "both": [False, True]}[args.kernel_timeline]
        by_side: dict[bool, list[tuple[dict, dict]]] = {k: [] for k in sides}
        for r in range(args.repeats):
            for kernel in sides if r % 2 == 0 else sides[::-1]:
                by_side[kernel].append(
                    profile_once(
                        args,
                        classifier,
                        script=WORKLOAD,
                        script_args=[str(args.threads), *(["waits"] if args.truth_waits else [])],
                        keys=MIX_CODEPATHS,
                        busy=args.busy,
                        kernel=kernel,
                    )
                )
        goal = 2.0 if args.threads == 1 or args.busy else 3.0
        label = f"mix, {args.threads} busy thread(s)" + (
            f", {args.busy} busy process(es)" if args.busy else ""
        )
        for kernel, runs in by_side.items():
            used = [
                any("cpu_source kernel" in n for n in doc["sampler"]["notes"]) for _, doc in runs
            ]
            print(
                f"\ncpu_source {'kernel' if kernel else 'estimate'} asked; kernel used in "
                f"{sum(used)} of {len(runs)} run(s); load {os.getloadavg()[0]:.2f}"
            )
            v = report(f"{label}, cpu_source {'kernel' if kernel else 'estimate'}", runs,
                       MIX_CODEPATHS, goal)  # fmt: skip
        if args.truth_waits:
            waits_report(runs, MIX_CODEPATHS)
        print(f"load {os.getloadavg()[0]:.2f} at end")
        return 0 if v != NOT_MET else 1
    names = [c for c in args.conditions.split(",") if c]
    unknown = set(names) - set(CONDITIONS)
    if unknown:
        ap.error(f"unknown --conditions {sorted(unknown)}: choose from {', '.join(CONDITIONS)}")
    by_cond: dict[str, list[tuple[dict, dict]]] = {c: [] for c in names}
    for r in range(args.repeats):
        # interleaved, the order rotated each repeat, so drifting load hits all alike
        order = names[r % len(names) :] + names[: r % len(names)]
        for c in order:
            busy, threads = CONDITIONS[c]
            true, doc = profile_once(
                args, classifier, script=CONTENTION_WORKLOAD, script_args=[str(threads)],
                keys=CONTENTION_CODEPATHS, busy=args.contention if busy else 0,
            )  # fmt: skip
            by_cond[c].append((true, doc))
            err = max(
                abs(doc["codepaths"][cp]["share"] - true[cp]) * 100
                for cp in (*CONTENTION_CODEPATHS, "other")
            )
            print(
                f"repeat {r + 1} {c}: torch true {true['torch'] * 100:.2f}% serwatt "
                f"{doc['codepaths']['torch']['share'] * 100:.2f}%, worst error {err:.2f} pp",
                flush=True,
            )
    verdicts = []
    for c in names:
        busy, threads = CONDITIONS[c]
        label = f"{c} ({args.contention if busy else 0} busy processes, torch threads {threads})"
        verdicts.append(report(label, by_cond[c], CONTENTION_CODEPATHS, 1.5))
    print(f"load {os.getloadavg()[0]:.2f} at end")
    return 0 if NOT_MET not in verdicts else 1


if __name__ == "__main__":
    raise SystemExit(main())
