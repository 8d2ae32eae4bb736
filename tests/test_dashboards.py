"""Every Grafana dashboard query names only exported metrics and their labels.

The Prometheus integration test (tests/test_prometheus_integration.py) also runs
every query against a real Prometheus scraping a real daemon.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from profiler.service.exporter import METRIC_NAMES, METRICS

DASHBOARDS = sorted((Path(__file__).parent.parent / "dashboards").glob("*.json"))
LABELS = {m.name: set(m.labels) for m in METRICS}
# Labels Prometheus adds at scrape time.
SCRAPE_LABELS = {"instance", "job"}
PROMQL_WORDS = {
    "sum", "count", "avg", "min", "max", "by", "without", "rate", "increase", "irate",
    "ignoring", "on", "group_left", "group_right", "label_values", "topk", "clamp_min",
}  # fmt: skip


def dashboard_queries(path: Path) -> list[str]:
    doc = json.loads(path.read_text())
    queries = []
    for panel in doc.get("panels", []):
        for target in panel.get("targets", []):
            queries.append(target["expr"])
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]
            queries.append(q["query"] if isinstance(q, dict) else q)
    return queries


def all_queries() -> list[tuple[str, str]]:
    return [(p.name, q) for p in DASHBOARDS for q in dashboard_queries(p)]


def metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\bserwatt_[a-z_]+\b", expr))


def test_there_is_a_dashboard_with_the_required_panels():
    assert any(p.name == "serwatt.json" for p in DASHBOARDS)
    doc = json.loads((DASHBOARDS[0].parent / "serwatt.json").read_text())
    titles = {p["title"] for p in doc["panels"]}
    assert {"CPU share per codepath", "Watts per codepath", "GPU-wait per codepath"} <= titles
    exprs = " ".join(dashboard_queries(DASHBOARDS[0].parent / "serwatt.json"))
    # Power is always rate() of a joules counter, never a gauge.
    assert "rate(serwatt_energy_joules_total" in exprs
    assert "rate(serwatt_gpu_wait_seconds_total" in exprs


@pytest.mark.parametrize("name, expr", all_queries())
def test_query_names_only_exported_metrics_and_labels(name, expr):
    metrics = metrics_in(expr)
    assert metrics, f"{name}: query names no serwatt metric: {expr}"
    unknown = metrics - METRIC_NAMES
    assert not unknown, f"{name}: {sorted(unknown)} not exported (see profiler/exporter.METRICS)"
    allowed = set().union(*(LABELS[m] for m in metrics)) | SCRAPE_LABELS
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    # Grafana's label_values(selector, label): the label must exist on the metric.
    lv = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)", without_strings)
    if lv:
        assert lv.group(2) in allowed, f"{name}: label_values of unknown label {lv.group(2)}"
        without_strings = lv.group(1)
    # Label names in selectors and in by/ignoring/on clauses.
    used = set()
    for body in re.findall(r"\{([^}]*)\}", without_strings):
        used |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", body))
    for body in re.findall(r"\b(?:by|ignoring|on|without)\s*\(([^)]*)\)", without_strings):
        used |= {w.strip() for w in body.split(",") if w.strip()}
    assert used <= allowed, f"{name}: labels {sorted(used - allowed)} not on {sorted(metrics)}"
    # Any other identifier must be PromQL itself (catches typos like `serwat_` or `rat(`).
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\$\w+", " ", without_strings)
    bare = re.sub(r"\b(?:by|ignoring|on|without)\s*\([^)]*\)", " ", bare)
    words = set(re.findall(r"\b[a-zA-Z_][a-zA-Z0-9_]*\b", bare)) - metrics
    assert words <= PROMQL_WORDS, f"{name}: unexpected words {sorted(words - PROMQL_WORDS)}"


def test_every_panel_says_what_it_measures():
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        for panel in doc["panels"]:
            assert panel.get("description"), f"{path.name}: panel {panel['title']!r}"
            assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
