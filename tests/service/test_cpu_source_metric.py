"""serwatt_target_info says, per process, what weighed its last window's CPU (issue 44):
kernel, estimate (the fallback), or unknown before its first window."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from serwatt.profiler.service.ledger import Ledger, TargetProcess
from serwatt.profiler.service.metrics import SnapshotCollector


def test_each_process_series_names_its_cpu_source() -> None:
    ledger = Ledger()
    ledger.set_targets(["trainer"])
    ledger.set_target_processes(
        "trainer",
        [TargetProcess(11, "3.11.7", "kernel"), TargetProcess(12, "3.11.7", "estimate"),
         TargetProcess(13, "unknown")],
    )  # fmt: skip
    ledger.publish()
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(ledger.snapshot))
    text = generate_latest(registry).decode()
    lines = sorted(line for line in text.splitlines() if line.startswith("serwatt_target_info{"))
    assert lines == sorted(
        f'serwatt_target_info{{cpu_source="{src}",pid="{pid}",python="{py}",target="trainer"}} 1.0'
        for pid, py, src in (("11", "3.11.7", "kernel"), ("12", "3.11.7", "estimate"),
                             ("13", "unknown", "unknown"))
    )  # fmt: skip
