"""The metric contract: names, units, HELP, types and label sets, on a fully populated
ledger and on a real daemon's /metrics (`promtool check metrics`)."""

from __future__ import annotations

import re
import shutil
import subprocess

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from profiler.classify.codepaths import CODEPATHS
from profiler.service.exporter import METRIC_NAMES, METRICS, make_registry
from profiler.service.ledger import Ledger, TargetProcess
from tests.test_daemon_support import (
    PYTHON,
    REPO,
    DaemonProc,
    config_text,
    free_port,
    start_workload,
    stop_process,
)

# The contract as the issue states it, then serwatt's additions: name -> labels.
CONTRACT = {
    "serwatt_samples_total": {"target", "codepath"},
    "serwatt_cpu_seconds_total": {"target", "codepath"},
    "serwatt_energy_joules_total": {"target", "codepath", "source"},
    "serwatt_node_cpu_energy_joules_total": {"source"},
    "serwatt_unattributed_energy_joules_total": {"source"},
    "serwatt_gpu_idle_seconds_total": {"gpu"},
    "serwatt_gpu_wait_seconds_total": {"target", "codepath", "gpu"},
    "serwatt_gpu_wait_energy_joules_total": {"target", "codepath", "gpu"},
    "serwatt_target_up": {"target"},
    "serwatt_target_info": {"target", "pid", "python"},
    "serwatt_sampler_errors_total": {"target", "kind"},
    "serwatt_collector_up": {"collector"},
    "serwatt_collector_duration_seconds": {"collector"},
    "serwatt_build_info": {"version"},
    # serwatt's own additions: what the daemon costs and the rate its budget allows
    "serwatt_self_cpu_seconds_total": {"part"},
    "serwatt_sample_rate_hz": set(),
    "serwatt_cpu_budget_cores": set(),
}


def _full_ledger() -> Ledger:
    ledger = Ledger()
    ledger.set_targets(["trainer", "loader"])
    ledger.declare_energy_source("rapl")
    ledger.declare_gpu(0)
    ledger.declare_gpu(1)
    ledger.add_window(
        "trainer",
        samples={"pickle": 3, "other": 1},
        cpu_s={"pickle": 0.3, "other": 0.1},
        energy_j={"pickle": 9.0},
        energy_source="rapl",
        gpu_wait_s={("pickle", 0): 0.2},
        gpu_wait_energy_j={("pickle", 0): 14.0},
    )
    ledger.add_node_energy("rapl", node_j=100.0, unattributed_j=91.0)
    ledger.add_gpu_idle(0, 1.5)
    ledger.add_sampler_error("loader", "ptrace_denied")
    ledger.set_target_processes(
        "trainer", [TargetProcess(10, "3.11.7"), TargetProcess(11, "3.10.13")]
    )
    ledger.set_collector("rapl", up=True, duration_s=0.001)
    ledger.add_self_cpu("daemon", 1.5)
    ledger.add_self_cpu("samplers", 4.0)
    ledger.set_sampling(rate_hz=27.0, budget_cores=0.1)
    ledger.publish()
    return ledger


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_spec_is_the_issue_contract():
    assert {m.name: set(m.labels) for m in METRICS} == CONTRACT


def test_names_units_and_types_follow_prometheus_conventions():
    for m in METRICS:
        assert re.fullmatch(r"serwatt_[a-z_]+", m.name)
        assert m.name.endswith("_total") == (m.type == "counter"), m.name
        # Base units only: seconds, joules; never ms/us/watts gauges.
        assert not re.search(r"_(milli|micro|ms|us|watts?|kj|wh)(_|$)", m.name), m.name
        if "energy" in m.name:
            assert "_joules" in m.name
        if m.name.endswith(("seconds_total", "seconds")):
            assert "_seconds" in m.name
        # pid is a label only on the info metric (cardinality).
        assert ("pid" in m.labels) == (m.name == "serwatt_target_info")
        assert m.help.endswith(".") and len(m.help) > 20


def test_exposition_has_help_type_and_exact_label_sets():
    text = generate_latest(make_registry(_full_ledger().snapshot)).decode()
    for m in METRICS:
        assert f"# HELP {m.name} {m.help}" in text, m.name
        exposed_type = "gauge" if m.type == "info" else m.type
        assert f"# TYPE {m.name} {exposed_type}" in text, m.name
    seen: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert s.name in METRIC_NAMES, s.name
            assert set(s.labels) == CONTRACT[s.name], (s.name, s.labels)
            assert s.value >= 0
            seen.setdefault(s.name, set()).add(s.labels.get("codepath", ""))
    assert set(seen) == METRIC_NAMES  # every metric has samples on a populated ledger
    for name in (
        "serwatt_samples_total",
        "serwatt_cpu_seconds_total",
        "serwatt_energy_joules_total",
        "serwatt_gpu_wait_seconds_total",
        "serwatt_gpu_wait_energy_joules_total",
    ):
        assert seen[name] == set(CODEPATHS), name  # zeros included


def test_promtool_accepts_the_populated_exposition(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make system-deps` installs Debian's prometheus"
    text = generate_latest(make_registry(_full_ledger().snapshot))
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=60
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_promtool_on_a_real_daemon(tmp_path):
    port = free_port()
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        config_text(
            port=port, record_dir=tmp_path / "runs", targets={"trainer": "contract_trainer"}
        )
    )
    work = start_workload(tmp_path, "contract_trainer")
    d = DaemonProc(cfg, port, tmp_path / "daemon.log")
    try:
        d.wait_metric("serwatt_samples_total", 5, target="trainer")
        text = d.get("/metrics")
        proc = subprocess.run(
            ["promtool", "check", "metrics"],
            input=text.encode(),
            capture_output=True,
            timeout=60,
        )
        assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr
        for m in METRICS:  # HELP/TYPE even for families with no series on this node
            assert f"# HELP {m.name} " in text, m.name
        # The daemon's own process is never a labelled target.
        assert f'pid="{d.pid}"' not in text
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)


def test_python_m_profiler_is_the_entry_point():
    # The daemon tests run `python -m profiler daemon`; the console script is the same main.
    proc = subprocess.run(
        [PYTHON, "-m", "profiler", "daemon", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--config" in proc.stdout
