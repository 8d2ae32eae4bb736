"""A real daemon with the example config's collectors (rapl and nvml on `auto`) on a node
without powercap or a GPU driver (this VM, an empty sysfs): its /metrics, fed to promtool
with the shipped rules, fires no SerwattCollectorDown. Both collectors were exported as
down (serwatt_collector_up 0) and the alert fired on every such node."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from tests.daemon_support import parse_metrics, start_daemon, start_workload, stop_process
from tests.service.test_prometheus_rules import RULES, promtool


def test_absent_hardware_is_not_present_and_no_alert_fires(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"  # a sysfs without class/powercap: RAPL absent
    (sysfs / "class").mkdir(parents=True)
    marker = f"not_present_trainer_{os.getpid()}"
    work = start_workload(tmp_path, marker)
    d = start_daemon(tmp_path, {"trainer": marker}, sysfs=sysfs, rapl="auto", nvml="auto")
    try:
        d.wait_metric("serwatt_samples_total", 1, target="trainer")
        text = d.get("/metrics")
        code, _ = d.stop()
    finally:
        d.kill()
        stop_process(work)
    assert code == 0, d.log()
    up = {
        dict(labels)["collector"]: value
        for (name, labels), value in parse_metrics(text).items()
        if name == "serwatt_collector_up"
    }
    assert "nvml" not in up and "rapl" not in up, up
    assert up.get("cpu_model") == 1 and up.get("pyspy") == 1, up
    assert "collector nvml not present (no_driver)" in d.log()

    # the scrape as promtool input series, held for 40 minutes
    labels = 'instance="vm:9977",job="serwatt"'
    series = [
        {"series": f'serwatt_collector_up{{{labels},collector="{c}"}}', "values": f"{v:g}x40"}
        for c, v in sorted(up.items())
    ]
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "40m", "alertname": "SerwattCollectorDown", "exp_alerts": []}
            ],
        }],
    }  # fmt: skip
    test_file = tmp_path / "not_present_test.yml"
    test_file.write_text(yaml.safe_dump(tests))
    r = subprocess.run([promtool(), "test", "rules", str(test_file)], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
