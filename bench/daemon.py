"""What the daemon costs: CPU and RSS while it watches N targets, and their throughput.

    .venv/bin/python bench/daemon.py [--targets 8] [--rate 50] [--watch-s 120] [--phase-s 10]
                                     [--pairs 6] [--json FILE]

Part 1 (--watch-s): a real `serwatt daemon` watches N real Python targets at --rate Hz
(10 s windows, one py-spy per target). Measured from /proc via psutil:
  - CPU, % of one core: the daemon's own CPU + its py-spy children's (reaped children
    through cutime/cstime, live ones directly), over the whole run; and per target;
  - RSS of the daemon process, sampled every 2 s: first/last 30 s means and the
    least-squares slope (MB per minute); py-spy children's RSS reported apart.
Part 2 (--pairs x 2 phases of --phase-s): throughput of the same targets watched vs
not watched, interleaved (watched, unwatched, watched, ...) so machine noise hits
both sides alike. The daemon stays up; SIGHUP switches its config between matching
the targets and matching nothing, so only the py-spy attachment differs.

Each target runs a fixed serialization chunk (pickle + json, ~2 ms) then sleeps
18 ms (a host thread that serializes between GPU steps), and publishes (chunks,
seconds spent in chunks) to a file. Throughput = chunks per second spent working;
the ratio is watched / unwatched (1.0 = no slowdown).

Goals (issue 4): daemon + py-spy < 10% of one core for 8 targets at 50 Hz, RSS <
150 MB and flat, throughput ratio >= 0.99.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent

TARGET = textwrap.dedent(
    """
    import json, os, pickle, sys, time
    out = sys.argv[1]
    data = {"k%d" % i: list(range(30)) for i in range(60)}
    chunks, busy_s, last_pub = 0, 0.0, time.monotonic()
    while True:
        t0 = time.perf_counter()
        for _ in range(4):
            pickle.loads(pickle.dumps(data))
            json.loads(json.dumps(data))
        busy_s += time.perf_counter() - t0
        chunks += 1
        if time.monotonic() - last_pub > 0.25:
            with open(out + ".tmp", "w") as f:
                f.write(f"{chunks} {busy_s!r}")
            os.replace(out + ".tmp", out)
            last_pub = time.monotonic()
        time.sleep(0.018)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, port: int, record_dir: Path, rate: float, pattern: str) -> None:
    path.write_text(
        f'listen: "127.0.0.1:{port}"\n'
        f"sample_rate_hz: {rate}\n"
        "window_s: 10\n"
        "rescan_s: 5\n"
        "max_concurrent_samplers: 16\n"
        "log_level: warning\n"
        "targets:\n"
        "  - name: bench\n"
        "    match:\n"
        f"      cmdline: '{pattern}'\n"
        f"record:\n  dir: {record_dir}\n"
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


def read_progress(path: Path) -> tuple[int, float]:
    try:
        chunks, busy = path.read_text().split()
        return int(chunks), float(busy)
    except (OSError, ValueError):
        return 0, 0.0


def slope_mb_per_min(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    ts = [t for t, _ in points]
    vs = [v for _, v in points]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    den = sum((t - mt) ** 2 for t in ts)
    return 0.0 if den == 0 else sum((t - mt) * (v - mv) for t, v in points) / den * 60


def windows_done(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("serwatt_samples_total{")
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=8)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--watch-s", type=float, default=120.0)
    ap.add_argument("--phase-s", type=float, default=10.0)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="serwatt-bench-daemon-"))
    marker = f"swbench_{os.getpid()}"
    script = tmp / f"{marker}.py"
    script.write_text(TARGET)
    progress = [tmp / f"progress{i}" for i in range(args.targets)]
    targets = [
        subprocess.Popen([sys.executable, str(script), str(p)], stdout=subprocess.DEVNULL)
        for p in progress
    ]
    port = free_port()
    cfg = tmp / "serwatt.yaml"
    write_config(cfg, port, tmp / "runs", args.rate, marker)
    log = open(tmp / "daemon.log", "wb")  # noqa: SIM115
    daemon = subprocess.Popen(
        [sys.executable, "-m", "profiler", "daemon", "--config", str(cfg)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    dproc = psutil.Process(daemon.pid)
    result: dict = {
        "targets": args.targets,
        "rate_hz": args.rate,
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    try:
        # Part 1: watch all targets for --watch-s.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if windows_done(port) > 0:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit(f"daemon produced no samples; log: {tmp / 'daemon.log'}")
        print(f"watching {args.targets} targets at {args.rate:g} Hz for {args.watch_s:g} s ...")
        c0, t0 = cpu_s(dproc), time.monotonic()
        rss: list[tuple[float, float]] = []
        spy_rss: list[float] = []
        spies_max = 0
        while time.monotonic() - t0 < args.watch_s:
            now = time.monotonic() - t0
            rss.append((now, dproc.memory_info().rss / 2**20))
            kids = [k for k in dproc.children(recursive=True) if k.name() == "py-spy"]
            spies_max = max(spies_max, len(kids))
            total = 0.0
            for k in kids:
                try:
                    total += k.memory_info().rss / 2**20
                except psutil.NoSuchProcess:
                    pass
            spy_rss.append(total)
            time.sleep(2.0)
        c1, t1 = cpu_s(dproc), time.monotonic()
        self_pct = 100 * (c1[0] - c0[0]) / (t1 - t0)
        spy_pct = 100 * (c1[1] - c0[1]) / (t1 - t0)
        core_pct = self_pct + spy_pct
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
            rss_slope_mb_per_min=round(slope_mb_per_min(rss), 2),
            pyspy_rss_mb_max_total=round(max(spy_rss), 1),
            pyspy_concurrent_max=spies_max,
        )
        print(
            f"  daemon + py-spy CPU: {core_pct:.2f}% of one core "
            f"({core_pct / args.targets:.3f}% per target): daemon process {self_pct:.2f}%, "
            f"py-spy children {spy_pct:.2f}%"
        )
        print(
            f"  daemon RSS: {result['rss_mb_first30s']} MB (first 30 s) -> "
            f"{result['rss_mb_last30s']} MB (last 30 s), max {result['rss_mb_max']} MB, "
            f"slope {result['rss_slope_mb_per_min']} MB/min; py-spy children up to "
            f"{result['pyspy_rss_mb_max_total']} MB total ({spies_max} at once)"
        )

        # Part 2: interleaved watched / unwatched phases, switched by SIGHUP.
        unwatched_cfg = cfg.read_text().replace(marker, "nothing_matches_this_" + marker)
        watched_cfg = cfg.read_text()
        rates: dict[str, list[float]] = {"watched": [], "unwatched": []}
        print(f"throughput: {args.pairs} x (watched, unwatched) phases of {args.phase_s:g} s ...")
        for i in range(args.pairs * 2):
            phase = "watched" if i % 2 == 0 else "unwatched"
            cfg.write_text(watched_cfg if phase == "watched" else unwatched_cfg)
            daemon.send_signal(signal.SIGHUP)
            time.sleep(1.5)  # the reload re-scans; windows of the other phase wind down
            before = [read_progress(p) for p in progress]
            time.sleep(args.phase_s)
            after = [read_progress(p) for p in progress]
            chunks = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
            busy = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
            rates[phase].append(chunks / busy if busy > 0 else 0.0)
        ratios = [w / u for w, u in zip(rates["watched"], rates["unwatched"], strict=True) if u]
        result.update(
            throughput_watched=[round(r, 1) for r in rates["watched"]],
            throughput_unwatched=[round(r, 1) for r in rates["unwatched"]],
            throughput_ratio_mean=round(statistics.fmean(ratios), 4),
            throughput_ratio_median=round(statistics.median(ratios), 4),
            throughput_ratio_pairs=[round(r, 4) for r in ratios],
            loadavg_end=os.getloadavg(),
        )
        print(
            f"  throughput ratio watched/unwatched: mean {result['throughput_ratio_mean']}, "
            f"median {result['throughput_ratio_median']} "
            f"(pairs: {result['throughput_ratio_pairs']})"
        )
        goals = {
            "cpu < 10% of one core": core_pct < 10,
            "RSS < 150 MB": result["rss_mb_max"] < 150,
            "RSS flat (|slope| < 1 MB/min)": abs(result["rss_slope_mb_per_min"]) < 1,
            "throughput ratio >= 0.99": result["throughput_ratio_median"] >= 0.99,
        }
        result["goals"] = goals
        for name, ok in goals.items():
            print(f"  {'MET ' if ok else 'MISS'} {name}")
        print(f"  load average start {result['loadavg_start']}, end {result['loadavg_end']}")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        for t in targets:
            t.kill()
            t.wait()
        log.close()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
