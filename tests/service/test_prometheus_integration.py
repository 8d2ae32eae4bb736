"""A real Prometheus (Debian's `prometheus`) scraping a real daemon profiling a real
workload, on loopback. The series Prometheus stored are checked against the daemon's own
run record, the node power against the powercap advancer, and every query of the node
dashboard (dashboards/node.json) must return data from it. The daemon
runs in-process so that NVML can be the replayed H200 and the GPU panels have data."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import CODEPATH_DIRECTIONS
from serwatt.profiler.service.config import load_config
from serwatt.profiler.service.daemon import Daemon
from tests.daemon_support import (
    daemon_config,
    start_powercap,
    start_workload,
    stop_process,
    wait_for,
)
from tests.dashboards import NODE_DASHBOARD, dashboard_queries
from tests.nvml_replay import ReplayNvmlBackend, load_timeline
from tests.ports import prometheus_port
from tests.service.test_daemon import SLOT_EDGE_S

WATTS = 30.0
# Prometheus scrapes every SCRAPE_S; the node power check needs this many slot steps.
SCRAPE_S = 0.2
POWER_STEPS = 5


def _query(prom_port: int, expr: str, at: float | None = None) -> list[dict]:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def _start_prometheus(tmp_path: Path, daemon_port: int) -> tuple[subprocess.Popen, int]:
    """Prometheus scraping the daemon, on a port the kernel picks (read from its log)."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus missing: `make system-deps` installs Debian's prometheus"
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        f"global:\n  scrape_interval: {SCRAPE_S * 1000:.0f}ms\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: serwatt\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{daemon_port}']\n"
    )
    log_path = tmp_path / "prometheus.log"
    log = open(log_path, "wb")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            "--web.listen-address=127.0.0.1:0",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, prometheus_port(proc, log_path)


def _all_scrapes_succeeded(prom_port: int):
    """A predicate: the time now if every scrape of the last 12 s succeeded, else None."""

    def check() -> float | None:
        at = time.time()
        up = _query(prom_port, 'min_over_time(up{job="serwatt"}[12s])', at)
        return at if up and float(up[0]["value"][1]) == 1.0 else None

    return check


def _record_windows(db_path: Path, target: str) -> list[dict[str, dict[str, float]]]:
    """Per window (in commit order): codepath -> samples, cpu_s, energy_j."""
    db = sqlite3.connect(db_path)
    try:
        rows = db.execute(
            "SELECT w.window_id, c.codepath, c.samples, c.cpu_s, c.energy_j"
            " FROM windows w JOIN runs r ON r.run_id = w.run_id"
            " JOIN window_codepaths c ON c.window_id = w.window_id"
            " WHERE r.target = ? ORDER BY w.window_id",
            (target,),
        ).fetchall()
    finally:
        db.close()
    windows: dict[int, dict[str, dict[str, float]]] = {}
    for wid, cp, samples, cpu_s, energy_j in rows:
        windows.setdefault(wid, {})[cp] = {
            "samples": samples,
            "cpu_s": cpu_s,
            "energy_j": energy_j or 0.0,
        }
    return [windows[w] for w in sorted(windows)]


def _dashboard_query(q: str) -> str:
    """A panel query as Grafana would send it with every node and target selected; a
    variable's label_values(selector, label) as the series query that lists the values."""
    q = q.replace("$__rate_interval", "10s").replace("$instance", ".*").replace("$target", ".*")
    lv = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_]\w*)\)", q)
    return f"count by ({lv.group(2)}) ({lv.group(1)})" if lv else q


def _steps(series: list[list]) -> list[tuple[float, float]]:
    """(scrape time, value) of the first scrape after each change of a range vector."""
    points = [(float(t), float(v)) for t, v in series]
    return [b for a, b in zip(points, points[1:], strict=False) if b[1] != a[1]]


@pytest.mark.long  # a real Prometheus scraping a daemon for 12 s of clean scrapes
def test_prometheus_scrapes_the_daemon_and_agrees_with_the_record(tmp_path):
    sysfs = tmp_path / "sys"
    advancer = start_powercap(sysfs, WATTS)
    work = start_workload(tmp_path, "prom_trainer")
    # A process discovery takes for Python that py-spy refuses: the sampler-errors panel.
    (tmp_path / "prom_impostor").mkdir()
    fake_python = tmp_path / "prom_impostor" / "python3"
    shutil.copy("/bin/sleep", fake_python)
    impostor = subprocess.Popen([str(fake_python), "600"])
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        daemon_config(
            tmp_path / "runs",
            {
                "trainer": "prom_trainer",
                "absent": "no_such_process_anywhere",
                "impostor": "prom_impostor",
            },
            sysfs=sysfs,
            window_s=2,
            # a budget the daemon stays under (the rate stays at 50 Hz): its panel has data
            cpu_budget_cores=1.5,
        )
    )
    # In-process, so NVML can be the replayed H200 (tests/nvml_replay.py): the GPU panels
    # then have data too. This VM has no GPU.
    gpu = ReplayNvmlBackend(load_timeline("h200_checkpoint_stall"), target_pids=[work.pid])
    daemon = Daemon(load_config(cfg), nvml_backend=gpu)
    seen: dict = {}
    failure: list[BaseException] = []
    started: list[subprocess.Popen] = []

    def watch() -> None:
        try:
            # the daemon listens on port 0: Prometheus' scrape target is the port it bound
            address = wait_for(lambda: daemon.address, 60, "the daemon to listen")
            seen["daemon_port"] = int(address.rsplit(":", 1)[1])
            prom, prom_port = _start_prometheus(tmp_path, seen["daemon_port"])
            started.append(prom)
            node = 'serwatt_node_cpu_energy_joules_total{source="rapl"}'

            def ready():
                errs = _query(prom_port, 'serwatt_sampler_errors_total{target="impostor"}')
                samples = _query(prom_port, 'sum(serwatt_samples_total{target="trainer"})')
                steps = _query(prom_port, f"changes({node}[60s])")
                return (
                    errs
                    and samples
                    and float(samples[0]["value"][1]) > 0
                    and steps
                    and float(steps[0]["value"][1]) >= POWER_STEPS
                )

            wait_for(ready, 120, f"Prometheus to hold errors, samples, {POWER_STEPS} slots")
            time.sleep(2)  # every rate() over 10 s has two points of every series
            # A scrape that overruns SCRAPE_S (a loaded machine) fails, and Prometheus
            # marks every series of the target stale until the next one: an instant
            # query then finds none. The snapshot is taken at a moment when every
            # scrape of the last rate() window succeeded.
            at = wait_for(_all_scrapes_succeeded(prom_port), 60, "12 s of clean scrapes")
            seen["stored"] = _query(
                prom_port,
                '{__name__=~"serwatt_(samples|cpu_seconds|energy_joules)_total",target="trainer"}',
                at,
            )
            seen["up"] = _query(prom_port, "serwatt_target_up", at)
            seen["info"] = _query(prom_port, "serwatt_target_info", at)
            seen["node"] = _query(prom_port, f"{node}[60s]", at)
            seen["dashboards"] = {
                (p.name, q): _query(prom_port, _dashboard_query(q), at)
                for p in [NODE_DASHBOARD]
                for q in dashboard_queries(p)
            }
        except BaseException as exc:
            failure.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        watcher.start()
        assert daemon.run() == 0
        watcher.join(timeout=30)
    finally:
        for prom in started:
            stop_process(prom)
        stop_process(work)
        stop_process(impostor)
        stop_process(advancer)
    if failure:
        log = tmp_path / "prometheus.log"
        raise AssertionError(f"{failure[0]}\n{log.read_text() if log.exists() else ''}")
    stored, up, info = seen["stored"], seen["up"], seen["info"]

    # Series and labels as the contract says.
    by_name: dict[str, dict[str, float]] = {}
    directions: dict[str, set[tuple[str, str]]] = {}
    for s in stored:
        m = s["metric"]
        assert m["job"] == "serwatt" and m["instance"] == f"127.0.0.1:{seen['daemon_port']}"
        # a codepath's series, one per direction, summed (the record keeps codepaths)
        per_cp = by_name.setdefault(m["__name__"], {})
        per_cp[m["codepath"]] = per_cp.get(m["codepath"], 0.0) + float(s["value"][1])
        directions.setdefault(m["__name__"], set()).add((m["codepath"], m["direction"]))
        if m["__name__"] == "serwatt_energy_joules_total":
            assert m["source"] == "rapl"
    for name in (
        "serwatt_samples_total",
        "serwatt_cpu_seconds_total",
        "serwatt_energy_joules_total",
    ):
        assert set(by_name[name]) == set(CODEPATHS), name
        assert directions[name] == set(CODEPATH_DIRECTIONS), name
    assert {s["metric"]["target"]: float(s["value"][1]) for s in up} == {
        "trainer": 1.0,
        "absent": 0.0,
        "impostor": 0.0,
    }
    assert [(s["metric"]["target"], s["metric"]["pid"]) for s in info] == [
        ("trainer", str(work.pid))
    ]

    # What Prometheus stored equals the record's windows up to some window k: the
    # daemon commits a window to the record before the counters that include it.
    windows = _record_windows(tmp_path / "runs" / "runs.sqlite", "trainer")
    assert len(windows) >= 3
    prefix = {cp: {"samples": 0.0, "cpu_s": 0.0, "energy_j": 0.0} for cp in CODEPATHS}
    matched_at = None
    for k, w in enumerate([{}] + windows):
        for cp, vals in w.items():
            for key, v in vals.items():
                prefix[cp][key] += v
        if all(
            math.isclose(by_name["serwatt_samples_total"][cp], prefix[cp]["samples"])
            and math.isclose(
                by_name["serwatt_cpu_seconds_total"][cp], prefix[cp]["cpu_s"], abs_tol=1e-9
            )
            and math.isclose(
                by_name["serwatt_energy_joules_total"][cp], prefix[cp]["energy_j"], abs_tol=1e-9
            )
            for cp in CODEPATHS
        ):
            matched_at = k
            break
    assert matched_at is not None and matched_at >= 2, (by_name, windows)
    assert by_name["serwatt_samples_total"]["pickle"] > 0
    assert by_name["serwatt_energy_joules_total"]["json"] > 0

    # Measured node power through the whole chain (powercap -> tracker -> slot -> counter
    # -> scrape -> Prometheus): the advancer writes WATTS. The counter steps once per slot,
    # by the slot's energy, and slots are back to back; each step is stored by the first
    # scrape after it, at most one scrape interval plus the slot-apply latency late
    # (SLOT_EDGE_S, tests/service/test_daemon.py), so between the first and last step Prometheus
    # saw, the energy over the time is WATTS within that lateness over the span.
    (node,) = seen["node"]
    steps = _steps(node["values"])
    assert len(steps) >= POWER_STEPS, steps
    (t0, j0), (t1, j1) = steps[0], steps[-1]
    late_s = SCRAPE_S + SLOT_EDGE_S
    assert abs((j1 - j0) - WATTS * (t1 - t0)) <= WATTS * late_s, (j1 - j0, WATTS * (t1 - t0))

    # Every panel and variable query of the node dashboard returns data from this
    # Prometheus, and the figures the panels show are the right ones.
    dashboards = seen["dashboards"]
    assert dashboards
    empty = [q for (_, q), r in dashboards.items() if not r]
    assert not empty, empty

    def panel(prefix: str) -> list[dict]:
        (r,) = [r for (_, q), r in dashboards.items() if _dashboard_query(q).startswith(prefix)]
        return r

    share = next(r for (_, q), r in dashboards.items() if "group_left" in q)
    assert {s["metric"]["codepath"] for s in share} == set(CODEPATHS)
    assert math.isclose(sum(float(s["value"][1]) for s in share), 1.0, rel_tol=1e-6)
    assert all(s["metric"]["source"] == "rapl" for s in panel("sum by (codepath, source)"))
    assert {s["metric"]["gpu"] for s in panel("sum by (codepath, gpu)")} == {"0"}
    errors = panel("sum by (target, kind) (increase(serwatt_sampler_errors_total")
    assert {(s["metric"]["target"], s["metric"]["kind"]) for s in errors} >= {
        ("impostor", "not_python")
    }
    (budget,) = panel("sum(serwatt_cpu_budget_cores")
    assert float(budget["value"][1]) == 1.5
    (rate_hz,) = panel("max by (instance) (serwatt_sample_rate_hz")
    assert float(rate_hz["value"][1]) == 50
    collectors = {
        s["metric"]["collector"]: float(s["value"][1]) for s in panel("serwatt_collector_up")
    }
    assert collectors.get("rapl") == 1 and collectors.get("nvml") == 1, collectors
    (version,) = panel("count by (version) (serwatt_build_info")
    assert float(version["value"][1]) == 1
    targets = panel("count by (target) (serwatt_target_up")
    assert {s["metric"]["target"] for s in targets} == {"trainer", "absent", "impostor"}
