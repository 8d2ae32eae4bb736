"""docs/scaling.md: the series-per-node formula equals what the exporter really exports
(a real daemon's /metrics, and the exporter over a ledger with GPUs), and the sizing
figures in the doc are the ones the formula and the doc's stated inputs give."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

from serwatt.profiler.service.exporter import make_registry
from serwatt.profiler.service.ledger import Ledger, TargetProcess
from tests.conftest import DaemonScrape
from tests.service.test_prometheus_rules import load_rules, rules_of

DOC = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"

# Collectors a daemon exports with RAPL and NVML on `auto`: discovery, pyspy, recorder,
# rapl (or cpu_model), cpustat, nvml (docs/daemon.md, collectors); nvml only where a GPU
# driver is (auto without one: not present, not exported).
COLLECTORS = 6
# Series Prometheus adds per scrape target: up, scrape_duration_seconds,
# scrape_samples_scraped, scrape_samples_post_metric_relabeling, scrape_series_added.
SCRAPE_SERIES = 5
# (codepath, direction) pairs with series: 9 serializer codepaths x encode / decode /
# unknown, and `other` x unknown (docs/scaling.md's D)
CODEPATH_DIRECTIONS = 9 * 3 + 1


def series_per_node(
    targets: int,
    gpus: int,
    *,
    processes: int,
    energy_sources: int = 1,
    collectors: int = COLLECTORS,
    error_series: int = 0,
    budget: bool = False,
    codepath_directions: int = CODEPATH_DIRECTIONS,
) -> int:
    """docs/scaling.md's formula: the series one node's /metrics has."""
    per_target = codepath_directions * (2 + energy_sources + 2 * gpus) + 1
    node = 2 * energy_sources + gpus + 2 * collectors + 2 + 1 + int(budget) + 1
    return targets * per_target + processes + error_series + node


def exposition_series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def test_the_formula_is_a_real_daemons_series_count(daemon_scrape: DaemonScrape) -> None:
    # Two targets (one with a process, one absent), RAPL, no GPU driver: NVML on `auto` is
    # not present, so not exported (it was exported as down, and SerwattCollectorDown fired
    # on every node without a GPU).
    text = daemon_scrape.text
    assert daemon_scrape.exit_code == 0, daemon_scrape.log
    assert 'serwatt_collector_up{collector="nvml"}' not in text
    assert 'serwatt_collector_up{collector="rapl"} 1.0' in text
    assert exposition_series(text) == series_per_node(
        2, 0, processes=1, collectors=COLLECTORS - 1
    ), text


def test_the_formula_holds_with_gpus_budget_and_errors():
    # The exporter over a ledger shaped like a GPU node: 3 targets, 4 GPUs, 5 processes.
    ledger = Ledger(version="test")
    ledger.set_targets(["rank0", "rank1", "eval"])
    ledger.declare_energy_source("rapl")
    for gpu in range(4):
        ledger.declare_gpu(gpu)
    ledger.set_target_processes("rank0", [TargetProcess(10, "3.11.7"), TargetProcess(11, "3.11.7")])
    ledger.set_target_processes("rank1", [TargetProcess(20, "3.11.7"), TargetProcess(21, "3.11.7")])
    ledger.set_target_processes("eval", [TargetProcess(30, "3.12.1")])
    for name in ("discovery", "pyspy", "recorder", "rapl", "cpustat", "nvml"):
        ledger.set_collector(name, up=True, duration_s=0.01)
    ledger.set_sampling(rate_hz=50, budget_cores=0.5)
    ledger.add_self_cpu("daemon", 1.0)
    ledger.add_self_cpu("samplers", 2.0)
    ledger.add_sampler_error("eval", "ptrace_denied")
    ledger.add_sampler_error("eval", "target_gone")
    snap = ledger.publish()
    text = generate_latest(make_registry(lambda: snap)).decode()
    want = series_per_node(3, 4, processes=5, error_series=2, budget=True)
    assert exposition_series(text) == want


def _doc_inputs() -> dict[str, dict[str, float]]:
    """The node shapes of the doc's inputs table: | shape | targets | processes | GPUs |."""
    rows = re.findall(
        r"^\| ([^|]+?) \| (\d+) \| (\d+) \| (\d+) \| [^|]+ \|$", DOC.read_text(), re.M
    )
    assert rows, "docs/scaling.md has no node-shape table"
    return {s: {"targets": int(t), "processes": int(p), "gpus": int(g)} for s, t, p, g in rows}


def _instance_rule_series(gpus: int) -> int:
    """Series the instance-level rules add per node: one per rule (instance_source keeps
    the node's one source); the GPU rules give none on a node without GPUs."""
    names = [r["record"] for r in rules_of(load_rules(), "record")]
    return sum(1 for n in names if n.startswith("instance") and (gpus or "gpu" not in n))


def test_the_doc_sizing_is_computed_from_the_formula():
    text = DOC.read_text().replace("\u202f", " ")
    shapes = _doc_inputs()
    assert len(shapes) == 3, shapes  # GPU node per rank, per job, CPU-only
    bytes_per_sample_disk = float(re.search(r"disk: (\d+(?:\.\d+)?) bytes per sample", text)[1])
    bytes_per_sample_wire = float(re.search(r"wire: (\d+(?:\.\d+)?) bytes per sample", text)[1])
    scrape_s = float(re.search(r"scrape interval: (\d+) s", text)[1])
    retention_days = float(re.search(r"retention: (\d+) days", text)[1])
    for shape, s in shapes.items():
        exported = series_per_node(s["targets"], s["gpus"], processes=s["processes"], budget=True)
        stored = exported + SCRAPE_SERIES + _instance_rule_series(s["gpus"])
        assert f"| {shape} | {exported:,} | {stored:,} |" in text, (shape, exported, stored)
        for nodes in (1_000, 10_000):
            series = stored * nodes
            samples_s = series / scrape_s
            disk_gb = samples_s * retention_days * 86400 * bytes_per_sample_disk / 1e9
            wire_mbit = samples_s * bytes_per_sample_wire * 8 / 1e6
            row = (
                f"| {shape} | {nodes:,} | {series / 1e6:.2f} M | {samples_s / 1e3:,.0f} k/s "
                f"| {disk_gb:,.0f} GB | {wire_mbit:,.0f} Mbit/s |"
            )
            assert row in text, row
