"""Bytes per sample that Prometheus' remote_write sends for serwatt's series.

    .venv/bin/python bench/remote_write.py [--nodes 50] [--scrape-s 1] [--blocks 8]
                                           [--block-s 10] [--send-deadline-s S] [--json FILE]

A real daemon profiles a real workload (2 targets, a powercap tree at 30 W, so the node
exports the series of docs/scaling.md's formula). A real Prometheus (Debian's) scrapes it
as --nodes distinct targets (one address, --nodes `instance` labels such as
`node-0042.cluster.example:9977`), so each remote_write request is as full as a large
fleet's, and remote_writes to a second Prometheus (`--web.enable-remote-write-receiver`).
The sender's own counters give the figure:

    bytes per sample = increase(prometheus_remote_storage_bytes_total)        (after snappy)
                       / increase(prometheus_remote_storage_samples_total)

over --blocks consecutive blocks of --block-s seconds after a warm-up, with a Student t
95% interval over the blocks (profiler/intervals.py). docs/scaling.md sizes remote_write with it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serwatt.profiler.intervals import mean_interval  # noqa: E402
from tests.daemon_support import (  # noqa: E402
    start_daemon,
    start_powercap,
    start_workload,
    stop_process,
    wait_for,
)
from tests.ports import prometheus_port  # noqa: E402


def _metric(port: int, name: str) -> float:
    """The sum of `name`'s samples on a Prometheus' own /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name)] in " {"
    )


def _prometheus(tmp: Path, name: str, config: str, *extra: str) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus missing: `make system-deps` installs Debian's prometheus"
    (tmp / f"{name}.yml").write_text(config)
    log_path = tmp / f"{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / f'{name}.yml'}",
            f"--storage.tsdb.path={tmp / f'{name}-tsdb'}",
            # port 0: the kernel picks a free one and Prometheus logs it (no bind race)
            "--web.listen-address=127.0.0.1:0",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    port = prometheus_port(proc, log_path)
    wait_for(lambda: _metric(port, "prometheus_build_info"), 30, f"{name} to listen")
    return proc, port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--scrape-s", type=float, default=1.0)
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block-s", type=float, default=10.0)
    ap.add_argument(
        "--send-deadline-s",
        type=float,
        help="the sender's queue_config.batch_send_deadline (default: Prometheus' own, 5 s); "
        "shorter sends smaller batches, which compress worse",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    queue = ""
    if args.send_deadline_s is not None:
        deadline_ms = round(args.send_deadline_s * 1000)
        queue = f"    queue_config:\n      batch_send_deadline: {deadline_ms}ms\n"

    tmp = Path(tempfile.mkdtemp(prefix="serwatt-rw-"))
    advancer = start_powercap(tmp / "sys", 30.0)
    work = start_workload(tmp, "rw_trainer")
    daemon = start_daemon(
        tmp, {"trainer": "rw_trainer", "absent": "no_such_process_rw"}, sysfs=tmp / "sys"
    )
    procs: list[subprocess.Popen] = []
    try:
        daemon.wait_metric("serwatt_samples_total", 1, target="trainer")
        series = sum(1 for line in daemon.get("/metrics").splitlines() if line and line[0] != "#")
        receiver, rport = _prometheus(
            tmp, "receiver", "global: {}\n", "--web.enable-remote-write-receiver"
        )
        procs.append(receiver)
        groups = "".join(
            f"      - targets: ['127.0.0.1:{daemon.port}']\n"
            f"        labels: {{instance: 'node-{i:04d}.cluster.example:9977'}}\n"
            for i in range(args.nodes)
        )
        sender, sport = _prometheus(
            tmp,
            "sender",
            f"global:\n  scrape_interval: {round(args.scrape_s * 1000)}ms\n"
            f"  scrape_timeout: {round(min(args.scrape_s, 5.0) * 1000)}ms\n"
            f"scrape_configs:\n  - job_name: serwatt\n    static_configs:\n{groups}"
            f"remote_write:\n  - url: http://127.0.0.1:{rport}/api/v1/write\n{queue}",
        )
        procs.append(sender)
        time.sleep(args.warmup_s)
        per_block = []
        b0 = _metric(sport, "prometheus_remote_storage_bytes_total")
        s0 = _metric(sport, "prometheus_remote_storage_samples_total")
        for _ in range(args.blocks):
            time.sleep(args.block_s)
            b1 = _metric(sport, "prometheus_remote_storage_bytes_total")
            s1 = _metric(sport, "prometheus_remote_storage_samples_total")
            if s1 > s0:
                per_block.append((b1 - b0) / (s1 - s0))
            b0, s0 = b1, s1
        failed = _metric(sport, "prometheus_remote_storage_samples_failed_total")
    finally:
        for p in procs:
            stop_process(p)
        daemon.stop()
        stop_process(work)
        stop_process(advancer)
        shutil.rmtree(tmp, ignore_errors=True)

    if not per_block:
        print(
            f"remote_write: nothing sent in {args.blocks} blocks of {args.block_s:g} s: "
            "lengthen --warmup-s (the sender tails its WAL, so it starts seconds after its "
            "first scrape) or --block-s (beyond batch_send_deadline: 5 s unless "
            "--send-deadline-s)",
            file=sys.stderr,
        )
        return 1
    iv = mean_interval(per_block)
    n, mean = iv.n, iv.estimate
    lo, hi = iv.bounds()
    result = {
        "series_per_node": series,
        "nodes": args.nodes,
        "scrape_interval_s": args.scrape_s,
        "blocks": n,
        "block_s": args.block_s,
        "bytes_per_sample": mean,
        "ci95": [lo, hi] if iv.has_interval else None,
        "per_block": per_block,
        "samples_failed": failed,
        "prometheus": subprocess.run(
            ["prometheus", "--version"], capture_output=True, text=True
        ).stdout.split("\n")[0],
    }
    print(
        f"remote_write: {mean:.2f} bytes/sample (95% CI {lo:.2f}-{hi:.2f}, "
        f"{n} blocks of {args.block_s:g} s), {args.nodes} x {series} series at "
        f"{args.scrape_s:g} s scrapes, {failed:g} samples failed"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
