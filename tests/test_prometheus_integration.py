"""A real Prometheus (Debian's `prometheus`) scraping a real daemon profiling a real
workload, on loopback. The series Prometheus stored are checked against the
daemon's own run record, and every dashboard query runs against it."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from profiler.classify.codepaths import CODEPATHS
from tests.dashboards import NODE_DASHBOARD, dashboard_queries
from tests.test_daemon_support import (
    DaemonProc,
    config_text,
    free_port,
    start_powercap,
    start_workload,
    stop_process,
    wait_for,
)

WATTS = 30.0


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
    binary = shutil.which("prometheus")
    assert binary, "prometheus missing: `make system-deps` installs Debian's prometheus"
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: serwatt\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{daemon_port}']\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, port


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


def test_prometheus_scrapes_the_daemon_and_agrees_with_the_record(tmp_path):
    sysfs = tmp_path / "sys"
    advancer = start_powercap(sysfs, WATTS)
    work = start_workload(tmp_path, "prom_trainer")
    daemon_port = free_port()
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        config_text(
            port=daemon_port,
            record_dir=tmp_path / "runs",
            targets={"trainer": "prom_trainer", "absent": "no_such_process_anywhere"},
            sysfs=sysfs,
            window_s=2,
        )
    )
    d = DaemonProc(cfg, daemon_port, tmp_path / "daemon.log")
    prom, prom_port = _start_prometheus(tmp_path, daemon_port)
    try:
        d.wait_metric("serwatt_samples_total", 1, target="trainer")

        def scraped_windows():
            r = _query(prom_port, 'sum(serwatt_samples_total{target="trainer"})')
            return r and float(r[0]["value"][1]) > 0 and r

        wait_for(scraped_windows, 90, "Prometheus to scrape non-zero samples")
        time.sleep(8)  # several windows and scrapes more
        at = time.time()
        stored = _query(
            prom_port,
            '{__name__=~"serwatt_(samples|cpu_seconds|energy_joules)_total",target="trainer"}',
            at,
        )
        up = _query(prom_port, "serwatt_target_up", at)
        info = _query(prom_port, "serwatt_target_info", at)
        node_w = _query(prom_port, 'rate(serwatt_node_cpu_energy_joules_total{source="rapl"}[8s])')
        dashboards = {
            (p.name, q): _query(
                prom_port,
                q.replace("$__rate_interval", "10s")
                .replace("$instance", ".*")
                .replace("$target", ".*"),
            )  # fmt: skip
            for p in [NODE_DASHBOARD]
            for q in dashboard_queries(p)
            if not q.startswith("label_values")
        }
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(prom)
        stop_process(work)
        stop_process(advancer)

    # Series and labels as the contract says.
    by_name: dict[str, dict[str, float]] = {}
    for s in stored:
        m = s["metric"]
        assert m["job"] == "serwatt" and m["instance"] == f"127.0.0.1:{daemon_port}"
        by_name.setdefault(m["__name__"], {})[m["codepath"]] = float(s["value"][1])
        if m["__name__"] == "serwatt_energy_joules_total":
            assert m["source"] == "rapl"
    for name in (
        "serwatt_samples_total",
        "serwatt_cpu_seconds_total",
        "serwatt_energy_joules_total",
    ):
        assert set(by_name[name]) == set(CODEPATHS), name
    assert {s["metric"]["target"]: float(s["value"][1]) for s in up} == {
        "trainer": 1.0,
        "absent": 0.0,
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
    # -> scrape -> rate()): the advancer writes WATTS.
    assert node_w, "no node energy rate"
    watts = float(node_w[0]["value"][1])
    assert 0.6 * WATTS <= watts <= 1.4 * WATTS, watts

    # Every dashboard query is valid PromQL on real data; the main panels have data.
    for (name, q), result in dashboards.items():
        assert isinstance(result, list), (name, q)
    share = next(r for (n, q), r in dashboards.items() if "group_left" in q)
    assert share and math.isclose(sum(float(s["value"][1]) for s in share), 1.0, rel_tol=1e-6)
    watts_q = next(
        r for (n, q), r in dashboards.items() if q.startswith("sum by (codepath, source)")
    )
    assert watts_q and all(s["metric"]["source"] == "rapl" for s in watts_q)
