"""What the daemon costs: CPU and RSS while it watches N targets, and their throughput.

    .venv/bin/python bench/daemon.py [--targets 8] [--rate 50] [--watch-s 120] [--phase-s 8]
                                     [--pairs 6] [--window-s 10] [--segment-s S]
                                     [--max-concurrent 16]
                                     [--cpu-budget CORES] [--timing-rate HZ]
                                     [--competitors K] [--json FILE]
    .venv/bin/python bench/daemon.py --recompute FILE

Part 1 (--watch-s): a real `serwatt daemon` watches N real Python targets at --rate Hz
(--window-s windows, two py-spy runs per target: on-CPU and --idle). Measured from /proc via
psutil:
  - CPU, % of one core: the daemon's own CPU + its py-spy children's (reaped children
    through cutime/cstime, live ones directly), over the whole run; and per target;
  - RSS of the daemon process, sampled every 2 s: first/last 30 s means, per 30 s, and
    the least-squares slope (MB per minute) with its 95% interval, widened for the
    samples' autocorrelation (profiler/intervals.py); py-spy children's RSS reported apart.
  - accuracy: each codepath's share of the targets' CPU (pickle, json, other) as the
    daemon attributed it, against the truth timed inside the targets (thread_time around
    each pickle and json call; `other` the rest of their CPU from /proc), error in pp;
    --competitors K runs K busy non-target processes beside them (the contention
    condition of issue 28);
  - with --cpu-budget: the rate the daemon's windows ran at (its serwatt_sample_rate_hz,
    read every 2 s), and the daemon's own account of its CPU
    (serwatt_self_cpu_seconds_total) next to the one measured from /proc.
Part 2: throughput of the same targets watched vs not watched, interleaved as
U, W, U, W, ..., U (--pairs watched phases of --phase-s); each W is compared with the
mean of the U on either side, so slow drifts of the machine's load cancel. The daemon
stays up; SIGHUP switches its config between matching the targets and matching
nothing, and a phase is measured only once the switch is done (every target has a
py-spy attached, or none has), so only the py-spy attachment differs.

Each target (tests/workloads/alternating.py) runs a fixed serialization chunk (pickle +
json, ~2 ms) then sleeps 18 ms (a host thread that serializes between GPU steps), and
publishes (chunks, wall and CPU seconds in chunks, and in pickle and json) to a file.
Throughput = chunks per wall second spent working (includes CPU contention) and chunks
per CPU second (in-process perturbation only); each ratio is watched / unwatched (1.0 =
no slowdown), with a 95% interval (Student t) over the watched phases: confirmed when
the interval's low end clears the goal, not met when its high end is below it, undecided
when it straddles it.
`--recompute FILE` recomputes those from an earlier --json output's per-pair ratios.

The watch is also cut into segments (--segment-s, default two windows), each with its
own CPU and shares: the CPU goal and the accuracy goal are read off the Student t
interval of their means over the segments. Segments follow each other, so they are not
fully independent: a slot's CPU counted at the end of one segment is missing from the
next, so neighbouring segments' errors swing apart (negatively correlated), which makes
the interval wider than it need be, not narrower.

The cost floor: py-spy's CPU per sample (its CPU over the samples the windows' rates
ask for), per target, and what the CPU goal would need at this rate (the cost per
sample) or at this cost (the rate): on a node where py-spy costs less per sample (bare
metal, a GPU node's host), the first says whether it fits.

Goals (issues 4 and 28): daemon + py-spy < 10% of one core for 8 targets at 50 Hz, RSS <
150 MB and flat (|slope| <= 1 MB/min, read off its interval), throughput ratio >= 0.99,
serialization share within 2 pp of the truth. The window rate and the RSS peak are one
measurement each (met or not met); the others are verdicts from intervals.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serwatt.profiler.intervals import SlopeInterval, mean_interval, slope_interval, verdict  # noqa: E402
from tests.daemon_support import daemon_config  # noqa: E402
from tests.ports import listening_port  # noqa: E402
from tests.workloads import alternating  # noqa: E402
from tests.workloads.alternating import Progress  # noqa: E402

# Each target: tests/workloads/alternating.py, timing its pickle and json calls in process
ALTERNATING = Path(alternating.__file__)


def bench_config(record_dir: Path, args: argparse.Namespace, pattern: str) -> str:
    """The daemon's config: one target matching `pattern`, the collectors at the
    daemon's defaults (RAPL and NVML auto, no TDP); the kernel picks the port."""
    return daemon_config(
        record_dir,
        {"bench": pattern},
        tdp_w=None,
        sample_rate_hz=args.rate,
        timing_rate_hz=args.timing_rate,
        window_s=args.window_s,
        rescan_s=5,
        max_concurrent_samplers=args.max_concurrent,
        cpu_budget_cores=args.cpu_budget,
        log_level="warning",
    )


def cpu_s(proc: psutil.Process) -> tuple[float, float]:
    """(the process's own CPU s, its children's: reaped via cutime/cstime, and live)."""
    t = proc.cpu_times()
    children = t.children_user + t.children_system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
            children += c.user + c.system
        except psutil.NoSuchProcess:
            pass  # reaped between the calls: now in children_user/system
    return t.user + t.system, children


def pyspy_records(proc: psutil.Process) -> list[psutil.Process]:
    """The daemon's live `py-spy record` children (one per sampling window)."""
    out = []
    for k in proc.children(recursive=True):
        try:
            if k.name() == "py-spy" and k.cmdline()[1:2] == ["record"]:
                out.append(k)
        except psutil.NoSuchProcess:
            pass
    return out


def read_progress(path: Path) -> Progress:
    """(chunks, wall s inside chunks, thread CPU s inside chunks, of which in pickle, in
    json) so far; all 0 before the target's first publish."""
    return alternating.read_progress(path) or (0, 0.0, 0.0, 0.0, 0.0)


THROUGHPUT_GOAL = 0.99  # watched / unwatched throughput
RSS_FLAT_MB_PER_MIN = 1.0  # |RSS slope| over the watch
ACCURACY_GOAL_PP = 2.0  # |daemon - in-process truth| of the serialization share (issue 28)
CPU_GOAL_PCT = 10.0  # daemon + its py-spy processes, % of one core


def throughput_figures(wall_ratios: list[float], cpu_ratios: list[float]) -> dict:
    """The JSON fields and verdicts of the throughput part, from the per-pair ratios."""
    fig: dict = {}
    for part, ratios in (("wall", wall_ratios), ("cpu", cpu_ratios)):
        iv = mean_interval(ratios)
        fig[f"throughput_ratio_{part}_mean"] = round(iv.estimate, 4)
        # null without an interval (fewer than 2 pairs): JSON has no nan
        fig[f"throughput_ratio_{part}_ci95"] = (
            [round(b, 4) for b in iv.bounds()] if iv.has_interval else None
        )
        fig[f"throughput_ratio_{part}_pairs"] = [round(r, 4) for r in ratios]
        fig[f"throughput_ratio_{part}_verdict"] = verdict(iv, at_least=THROUGHPUT_GOAL)
    return fig


def print_throughput(fig: dict) -> None:
    for part, unit in (("wall", "wall s"), ("cpu", "CPU s ")):
        ci = fig[f"throughput_ratio_{part}_ci95"]
        ci_text = f"95% CI {ci[0]:.4f}..{ci[1]:.4f}, Student t" if ci else "no interval"
        print(
            f"  throughput ratio watched/unwatched, per {unit}: "
            f"{fig[f'throughput_ratio_{part}_mean']:.4f} ({ci_text}, "
            f"n={len(fig[f'throughput_ratio_{part}_pairs'])}; "
            f"pairs {fig[f'throughput_ratio_{part}_pairs']}): "
            f">= {THROUGHPUT_GOAL} {fig[f'throughput_ratio_{part}_verdict']}"
        )


def recompute(path: Path) -> int:
    """Recompute the throughput intervals and verdicts of an earlier --json output from
    its per-pair ratios (older outputs used a normal 1.96 interval)."""
    doc = json.loads(path.read_text())
    try:
        wall, cpu = doc["throughput_ratio_wall_pairs"], doc["throughput_ratio_cpu_pairs"]
    except KeyError as exc:
        print(f"{path}: no {exc.args[0]} (not a bench/daemon.py --json output)", file=sys.stderr)
        return 2
    print_throughput(throughput_figures(wall, cpu))
    return 0


def rss_slope(rss: list[tuple[float, float]]) -> SlopeInterval:
    """The daemon's RSS slope in MB per minute over (s since start, MB) samples 2 s apart,
    with its interval widened for their autocorrelation (profiler/intervals.py)."""
    return slope_interval([t / 60 for t, _ in rss], [v for _, v in rss])


def scrape(port: int, prefix: str) -> float:
    """The sum of the daemon's series whose exposition line starts with `prefix`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


CODEPATHS = ("pickle", "json")  # what the targets run; the rest of their CPU is `other`


def attributed_cpu_s(port: int) -> dict[str, float]:
    """CPU s the daemon attributed so far: per codepath the targets run, and in all."""
    out = {cp: scrape(port, f'serwatt_cpu_seconds_total{{codepath="{cp}"') for cp in CODEPATHS}
    out["all"] = scrape(port, "serwatt_cpu_seconds_total{")
    return out


def codepath_shares(
    attributed: tuple[dict[str, float], dict[str, float]],
    truth: tuple[list[tuple], list[tuple]],
    targets_cpu: float,
) -> dict[str, dict[str, float]]:
    """Each codepath's share of the targets' CPU, the daemon's against the truth timed in
    process (pickle and json each inside thread_time; `other` the rest of their CPU from
    /proc), and the error in percentage points."""
    a0, a1 = attributed
    total = max(1e-9, a1["all"] - a0["all"])
    daemon = {cp: (a1[cp] - a0[cp]) / total for cp in CODEPATHS}
    true = {
        cp: sum(b[3 + k] - a[3 + k] for a, b in zip(*truth, strict=True)) / max(1e-9, targets_cpu)
        for k, cp in enumerate(CODEPATHS)
    }
    daemon["other"] = 1 - sum(daemon.values())
    true["other"] = 1 - sum(true.values())
    return {
        cp: {
            "daemon": round(daemon[cp], 4),
            "truth": round(true[cp], 4),
            "error_pp": round(100 * (daemon[cp] - true[cp]), 2),
        }
        for cp in (*CODEPATHS, "other")
    }


def targets_cpu_s(targets: list[subprocess.Popen]) -> float:
    total = 0.0
    for t in targets:
        c = psutil.Process(t.pid).cpu_times()
        total += c.user + c.system
    return total


def targets_run_delay_s(targets: list[subprocess.Popen]) -> float:
    """Seconds the (one-thread) targets spent runnable but waiting for a CPU."""
    return sum(int(Path(f"/proc/{t.pid}/schedstat").read_text().split()[1]) / 1e9 for t in targets)


@dataclass(frozen=True)
class Snapshot:
    """Every cumulative figure the watch compares, read at one instant."""

    t: float  # time.monotonic()
    cpu: tuple[float, float]  # cpu_s(daemon): its own, its py-spy children's
    attributed: dict[str, float]  # attributed_cpu_s
    truth: list[Progress]  # each target's read_progress
    targets_cpu: float
    run_delay: float


def snapshot(
    t: float,
    dproc: psutil.Process,
    port: int,
    progress: list[Path],
    targets: list[subprocess.Popen],
) -> Snapshot:
    return Snapshot(
        t,
        cpu_s(dproc),
        attributed_cpu_s(port),
        [read_progress(p) for p in progress],
        targets_cpu_s(targets),
        targets_run_delay_s(targets),
    )


def segment_figures(snaps: list[Snapshot]) -> list[dict]:
    """Each segment between consecutive snapshots: the daemon's CPU (% of one core), each
    codepath's share against the truth, the serialization share's error (pp) and the
    targets' run-queue wait per CPU second. The daemon's counters move at the end of its
    slots, so a segment's attributed CPU is that of the slots that ended in it; the shares
    are ratios of a steady workload, so that shift does not bias them (a segment spans
    two windows by default, so each holds at least one slot's end)."""
    out = []
    for a, b in zip(snaps, snaps[1:], strict=False):
        wall = b.t - a.t
        tcpu = b.targets_cpu - a.targets_cpu
        shares = codepath_shares((a.attributed, b.attributed), (a.truth, b.truth), tcpu)
        out.append(
            {
                "s": round(wall, 1),
                "cpu_pct_of_one_core": round(
                    100 * ((b.cpu[0] - a.cpu[0]) + (b.cpu[1] - a.cpu[1])) / wall, 3
                ),
                "serialization_cpu_share_error_pp": round(
                    sum(shares[cp]["error_pp"] for cp in CODEPATHS), 2
                ),
                "error_pp": {cp: f["error_pp"] for cp, f in shares.items()},
                "run_delay_per_cpu_s": round((b.run_delay - a.run_delay) / max(1e-9, tcpu), 4),
            }
        )
    return out


def interval_fields(values: list[float]) -> dict:
    """A mean over the segments with its Student t interval (null below 2 segments)."""
    iv = mean_interval(values)
    return {
        "mean": round(iv.estimate, 3),
        "ci95": [round(v, 3) for v in iv.bounds()] if iv.has_interval else None,
        "n": iv.n,
        "interval": iv,
    }


def cost_floor(
    *, spy_pct: float, daemon_pct: float, targets: int, runs: int, rate_hz: float, timing_hz: float
) -> dict:
    """py-spy's CPU per sample at the rate the windows ran, and what the 10%-of-a-core goal
    needs: the cost per sample that would fit it at this rate, and the rate that fits it at
    the measured cost (the daemon's own share kept as measured). `runs`: counted py-spy
    runs per target per window (the on-CPU and the --idle run); `timing_hz`: the
    stack-change run's rate (0: none)."""
    per_s = targets * (runs * rate_hz + timing_hz)
    ms = 1000 * (spy_pct / 100) / per_s if per_s else math.nan
    room = max(0.0, CPU_GOAL_PCT - daemon_pct) / 100
    return {
        "pyspy_samples_per_s": round(per_s, 1),
        "pyspy_ms_per_sample": round(ms, 4),
        "pct_of_one_core_per_target": round((spy_pct + daemon_pct) / targets, 3),
        "goal_needs_ms_per_sample": round(1000 * room / per_s, 4) if per_s else None,
        # the stack-change run scaled with the rate, as the daemon's governor scales it
        "goal_fits_rate_hz": round(room / (targets * (runs + timing_hz / rate_hz) * ms / 1000), 1)
        if ms and math.isfinite(ms)
        else None,
    }


def own_cpu_s(port: int) -> float:
    """The daemon's own account of its CPU (its process + its reaped py-spy children)."""
    return scrape(port, "serwatt_self_cpu_seconds_total{")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=8)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--watch-s", type=float, default=120.0)
    ap.add_argument("--window-s", type=float, default=10.0, help="the daemon's window_s")
    ap.add_argument(
        "--segment-s",
        type=float,
        default=None,
        help="the watch is cut into segments this long, each measured, for the intervals of "
        "the CPU and accuracy goals (default: two windows)",
    )
    ap.add_argument("--phase-s", type=float, default=8.0)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument(
        "--max-concurrent",
        type=int,
        default=16,
        help="the daemon's max_concurrent_samplers (default 16: every target sampled all the time)",
    )
    ap.add_argument(
        "--cpu-budget",
        type=float,
        default=None,
        help="the daemon's cpu_budget_cores (default: none, every window at --rate)",
    )
    ap.add_argument(
        "--timing-rate",
        type=int,
        default=0,
        help="the daemon's timing_rate_hz: a stack-change run per window (default 0: none)",
    )
    ap.add_argument(
        "--competitors",
        type=int,
        default=0,
        help="busy non-target processes (a Python spin loop each) beside the targets: the "
        "contention condition (default 0)",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument(
        "--recompute",
        type=Path,
        metavar="JSON",
        help="only recompute the throughput intervals and verdicts of an earlier --json file",
    )
    args = ap.parse_args()
    if args.recompute is not None:
        return recompute(args.recompute)

    segment_s = args.segment_s if args.segment_s is not None else 2 * args.window_s
    if not 0 < segment_s <= args.watch_s:
        ap.error(f"--segment-s must be > 0 and at most --watch-s ({args.watch_s:g}): {segment_s:g}")
    tmp = Path(tempfile.mkdtemp(prefix="serwatt-bench-daemon-"))
    marker = f"swbench_{os.getpid()}"
    progress = [tmp / f"progress{i}" for i in range(args.targets)]
    targets = [
        subprocess.Popen(
            [sys.executable, str(ALTERNATING), marker, str(p)], stdout=subprocess.DEVNULL
        )
        for p in progress
    ]
    # Not matched by the daemon's pattern (no marker in their command line): they only
    # take CPU from the targets, as a node's other processes do.
    competitors = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(args.competitors)
    ]
    cfg = tmp / "serwatt.yaml"
    # Part 2 switches between these by SIGHUP: matching the targets, and matching nothing
    watched_cfg = bench_config(tmp / "runs", args, marker)
    unwatched_cfg = bench_config(tmp / "runs", args, "nothing_matches_this_" + marker)
    cfg.write_text(watched_cfg)
    log = open(tmp / "daemon.log", "wb")  # noqa: SIM115
    daemon = subprocess.Popen(
        [sys.executable, "-m", "serwatt", "daemon", "--config", str(cfg)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    dproc = psutil.Process(daemon.pid)
    result: dict = {
        "targets": args.targets,
        "max_concurrent_samplers": args.max_concurrent,
        "rate_hz": args.rate,
        "cpu_budget_cores": args.cpu_budget,
        "timing_rate_hz": args.timing_rate,
        "competitors": args.competitors,
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    try:
        # listen port 0: the port is the daemon's listening socket (no port handed out)
        port = listening_port(daemon)
        # Part 1: watch all targets for --watch-s.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if scrape(port, "serwatt_samples_total{") > 0:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit(f"daemon produced no samples; log: {tmp / 'daemon.log'}")
        budget = "" if args.cpu_budget is None else f" (at most; budget {args.cpu_budget:g} cores)"
        print(
            f"watching {args.targets} targets at {args.rate:g} Hz{budget} "
            f"for {args.watch_s:g} s ..."
        )
        t0, own0 = time.monotonic(), own_cpu_s(port)
        snaps = [snapshot(t0, dproc, port, progress, targets)]
        rss: list[tuple[float, float]] = []
        rates: list[tuple[float, float]] = []  # (s since start, serwatt_sample_rate_hz)
        spy_rss: list[float] = []
        spies_max = 0
        while time.monotonic() - t0 < args.watch_s:
            now = time.monotonic() - t0
            rss.append((now, dproc.memory_info().rss / 2**20))
            rates.append((now, scrape(port, "serwatt_sample_rate_hz ")))
            kids = pyspy_records(dproc)
            spies_max = max(spies_max, len(kids))
            total = 0.0
            for k in kids:
                try:
                    total += k.memory_info().rss / 2**20
                except psutil.NoSuchProcess:
                    pass
            spy_rss.append(total)
            if time.monotonic() - snaps[-1].t >= segment_s:
                snaps.append(snapshot(time.monotonic(), dproc, port, progress, targets))
            time.sleep(2.0)
        t1, own1 = time.monotonic(), own_cpu_s(port)
        end_snap = snapshot(t1, dproc, port, progress, targets)
        # a tail shorter than half a segment joins the segment before it
        if len(snaps) > 1 and t1 - snaps[-1].t < segment_s / 2:
            snaps.pop()
        snaps.append(end_snap)
        c0, c1 = snaps[0].cpu, end_snap.cpu
        attributed0, attributed1 = snaps[0].attributed, end_snap.attributed
        truth0, truth1 = snaps[0].truth, end_snap.truth
        tcpu0, tcpu1 = snaps[0].targets_cpu, end_snap.targets_cpu
        delay0, delay1 = snaps[0].run_delay, end_snap.run_delay
        # Ground truth: the targets' CPU inside their serialization chunks (thread_time
        # around pickle + json, in-process) over all their CPU (/proc); the daemon's:
        # pickle + json CPU over all the CPU it attributed, over the same interval
        # (its counters lag by up to one window at either end).
        truth_share = sum(b[2] - a[2] for a, b in zip(truth0, truth1, strict=True)) / max(
            1e-9, tcpu1 - tcpu0
        )
        shares = codepath_shares((attributed0, attributed1), (truth0, truth1), tcpu1 - tcpu0)
        daemon_share = sum(shares[cp]["daemon"] for cp in CODEPATHS)
        self_pct = 100 * (c1[0] - c0[0]) / (t1 - t0)
        spy_pct = 100 * (c1[1] - c0[1]) / (t1 - t0)
        core_pct = self_pct + spy_pct
        slope = rss_slope(rss)
        first = [v for t, v in rss if t <= 30]
        last = [v for t, v in rss if t >= (t1 - t0) - 30]
        result.update(
            watch_s=round(t1 - t0, 1),
            cpu_pct_of_one_core=round(core_pct, 2),
            cpu_pct_per_target=round(core_pct / args.targets, 3),
            cpu_pct_daemon_process=round(self_pct, 2),
            cpu_pct_pyspy_children=round(spy_pct, 2),
            rss_mb_first30s=round(statistics.fmean(first), 1),
            rss_mb_last30s=round(statistics.fmean(last), 1),
            rss_mb_max=round(max(v for _, v in rss), 1),
            rss_slope_mb_per_min=round(slope.estimate, 3),
            rss_slope_ci95=[round(b, 3) for b in slope.bounds()] if slope.has_interval else None,
            pyspy_rss_mb_max_total=round(max(spy_rss), 1),
            rss_mb_by_30s=[
                round(statistics.fmean(v for t, v in rss if k * 30 <= t < (k + 1) * 30), 1)
                for k in range(int((t1 - t0) // 30))
            ],
            pyspy_concurrent_max=spies_max,
            sample_rate_hz_mean=round(statistics.fmean(r for _, r in rates), 2),
            sample_rate_hz_after_30s=sorted({r for t, r in rates if t >= 30}),
            # the daemon's own account covers whole slots only, so it lags /proc by up
            # to one slot of CPU at either end
            own_account_pct=round(100 * (own1 - own0) / (t1 - t0), 2),
            serialization_cpu_share_truth=round(truth_share, 4),
            serialization_cpu_share_daemon=round(daemon_share, 4),
            serialization_cpu_share_error_pp=round(100 * (daemon_share - truth_share), 2),
            codepath_shares=shares,
            # A thread waiting in the run queue is in state R, so py-spy's on-CPU run
            # samples it at the line it woke up on (the sleep): docs/daemon.md.
            targets_run_delay_per_cpu_s=round((delay1 - delay0) / max(1e-9, tcpu1 - tcpu0), 4),
        )
        print(
            f"  daemon + py-spy CPU: {core_pct:.2f}% of one core "
            f"({core_pct / args.targets:.3f}% per target): daemon process {self_pct:.2f}%, "
            f"py-spy children {spy_pct:.2f}%"
        )
        ci = result["rss_slope_ci95"]
        slope_ci = f"95% CI {ci[0]}..{ci[1]}" if ci else f"no interval: {slope.why_none}"
        print(
            f"  daemon RSS: {result['rss_mb_first30s']} MB (first 30 s) -> "
            f"{result['rss_mb_last30s']} MB (last 30 s), max {result['rss_mb_max']} MB, "
            f"slope {result['rss_slope_mb_per_min']} MB/min ({slope_ci}); py-spy children up to "
            f"{result['pyspy_rss_mb_max_total']} MB total ({spies_max} at once)"
        )
        print(f"  daemon RSS per 30 s: {result['rss_mb_by_30s']} MB")
        print(
            f"  serialization share of the targets' CPU: daemon {daemon_share:.3f}, "
            f"in-process truth {truth_share:.3f}; the targets waited "
            f"{result['targets_run_delay_per_cpu_s']:.3f} s in the run queue per CPU s"
        )
        print("  per codepath, share of the targets' CPU: daemon / in-process truth (error)")
        for cp, f in shares.items():
            print(f"    {cp:7} {f['daemon']:.3f} / {f['truth']:.3f} ({f['error_pp']:+.2f} pp)")
        print(
            f"  windows' rate: mean {result['sample_rate_hz_mean']:g} Hz over the watch, "
            f"{result['sample_rate_hz_after_30s']} Hz after 30 s (configured {args.rate:g}, "
            f"budget {args.cpu_budget if args.cpu_budget is not None else 'none'}); the "
            f"daemon's own account of its CPU: {result['own_account_pct']:.2f}% of one core"
        )
        # The goals' intervals: the same figures segment by segment (Student t over them)
        segments = segment_figures(snaps)
        seg_cpu = interval_fields([g["cpu_pct_of_one_core"] for g in segments])
        seg_err = interval_fields([g["serialization_cpu_share_error_pp"] for g in segments])
        seg_cp = {
            cp: interval_fields([g["error_pp"][cp] for g in segments])
            for cp in (*CODEPATHS, "other")
        }
        rate_mean = result["sample_rate_hz_mean"]
        floor = cost_floor(
            spy_pct=spy_pct,
            daemon_pct=self_pct,
            targets=args.targets,
            runs=2,
            rate_hz=rate_mean,
            timing_hz=args.timing_rate * rate_mean / args.rate,
        )
        result.update(
            segments=segments,
            segment_cpu_pct_of_one_core={k: v for k, v in seg_cpu.items() if k != "interval"},
            segment_serialization_error_pp={k: v for k, v in seg_err.items() if k != "interval"},
            segment_error_pp_by_codepath={
                cp: {k: v for k, v in f.items() if k != "interval"} for cp, f in seg_cp.items()
            },
            cost_floor=floor,
        )
        print(f"  by segment ({len(segments)} of ~{segment_s:g} s; mean, 95% CI Student t):")
        for name, f, unit, sign in (
            ("daemon + py-spy CPU", seg_cpu, "% of one core", ""),
            ("serialization share error", seg_err, " pp", "+"),
            *((f"{cp} share error", seg_cp[cp], " pp", "+") for cp in (*CODEPATHS, "other")),
        ):
            lo_hi = f["ci95"]
            ci = f"{lo_hi[0]:{sign}.2f}..{lo_hi[1]:{sign}.2f}" if lo_hi else "no interval"
            print(f"    {name:28} {f['mean']:{sign}.2f}{unit} ({ci}, n={f['n']})")
        print(
            f"  cost floor: py-spy {floor['pyspy_ms_per_sample']:.3f} ms of CPU per sample "
            f"({floor['pyspy_samples_per_s']:g} samples/s), "
            f"{floor['pct_of_one_core_per_target']:.3f}% of one core per target; "
            f"< {CPU_GOAL_PCT:g}% at this rate needs <= {floor['goal_needs_ms_per_sample']} ms "
            f"per sample, or at this cost <= {floor['goal_fits_rate_hz']} Hz"
        )

        # Part 2: interleaved watched / unwatched phases, switched by SIGHUP.
        # Two throughputs per phase: chunks per wall second inside chunks (what the
        # job sees: includes CPU contention from py-spy and from everything else on the
        # machine) and chunks per CPU second (in-process perturbation only: py-spy
        # reading the target's memory, cache effects).
        # Phases U, W, U, W, ..., U: each watched phase is compared with the mean of
        # the unwatched phases on either side, which cancels slow drifts of the load.
        phases = ["unwatched" if i % 2 == 0 else "watched" for i in range(2 * args.pairs + 1)]
        print(
            f"throughput: {args.pairs} watched phases of {args.phase_s:g} s, each between "
            "two unwatched ones ..."
        )
        measured: list[tuple[float, float]] = []
        for phase in phases:
            cfg.write_text(watched_cfg if phase == "watched" else unwatched_cfg)
            daemon.send_signal(signal.SIGHUP)
            # Measure only once the switch has happened: every target has a py-spy
            # attached (watched), or the previous phase's windows have ended (unwatched).
            # (a window is two py-spy processes: the on-CPU and the --idle run)
            want = 2 * min(args.targets, args.max_concurrent) if phase == "watched" else 0
            switch_deadline = time.monotonic() + 60
            while len(pyspy_records(dproc)) != want and time.monotonic() < switch_deadline:
                time.sleep(0.1)
            before = [read_progress(p) for p in progress]
            time.sleep(args.phase_s)
            after = [read_progress(p) for p in progress]
            chunks = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
            wall = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
            cpu = sum(a[2] - b[2] for a, b in zip(after, before, strict=True))
            measured.append((chunks / wall if wall else 0.0, chunks / cpu if cpu else 0.0))
        wall_ratios, cpu_ratios = [], []
        for i in range(1, len(phases), 2):
            w, before_u, after_u = measured[i], measured[i - 1], measured[i + 1]
            wall_ratios.append(w[0] / ((before_u[0] + after_u[0]) / 2))
            cpu_ratios.append(w[1] / ((before_u[1] + after_u[1]) / 2))
        fig = throughput_figures(wall_ratios, cpu_ratios)
        result.update(fig, loadavg_end=os.getloadavg())
        print_throughput(fig)
        # The window rate and the RSS peak are one measurement each (met or not met); the
        # CPU and the accuracy (over segments), the RSS slope and the throughput ratios
        # have an interval: confirmed, not met, or undecided.
        measured_goals = {
            f"every window at {args.rate:g} Hz": min(r for _, r in rates) >= args.rate,
            "RSS < 150 MB": result["rss_mb_max"] < 150,
        }
        goals = {
            f"cpu < {CPU_GOAL_PCT:g}% of one core": verdict(
                seg_cpu["interval"], at_most=CPU_GOAL_PCT
            ),
            **{name: "met" if ok else "not met" for name, ok in measured_goals.items()},
            f"serialization share within {ACCURACY_GOAL_PP:g} pp of the truth": verdict(
                seg_err["interval"], at_least=-ACCURACY_GOAL_PP, at_most=ACCURACY_GOAL_PP
            ),
        }
        goals[f"RSS flat (|slope| <= {RSS_FLAT_MB_PER_MIN:g} MB/min)"] = verdict(
            slope, at_least=-RSS_FLAT_MB_PER_MIN, at_most=RSS_FLAT_MB_PER_MIN
        )
        goals[f"throughput ratio >= {THROUGHPUT_GOAL} (wall)"] = fig[
            "throughput_ratio_wall_verdict"
        ]
        goals[f"throughput ratio >= {THROUGHPUT_GOAL} (CPU)"] = fig["throughput_ratio_cpu_verdict"]
        result["goals"] = goals
        for name, v in goals.items():
            print(f"  {v.upper():9} {name}")
        print(f"  load average start {result['loadavg_start']}, end {result['loadavg_end']}")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        for t in (*targets, *competitors):
            t.kill()
            t.wait()
        log.close()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
