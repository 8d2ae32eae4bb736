"""The Grafana dashboards (dashboards/: node, fleet, A/B) and their
provisioning files.

Grafana is not installed here (tests/dashboards.py says what stands in for it): every
dashboard is checked against the structure of the schemaVersion it declares, every panel
query is parsed by promtool with the Grafana variables replaced, and names only exported
metrics, recording rules of configs/prometheus/serwatt.rules.yml and their labels. The
Prometheus integration tests run every panel query against a real Prometheus.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from serwatt.profiler.service.exporter import METRIC_NAMES, METRICS
from tests.dashboards import (
    DASHBOARD_DIR,
    DASHBOARDS,
    NODE_DASHBOARD,
    PROVISIONING,
    all_panels,
    dashboard_queries,
    load,
    panel_queries,
    promql_problems,
    schema_problems,
    variable_queries,
)
from tests.service.test_prometheus_rules import RULES, RULES_TEST, load_rules, promtool, rules_of

LABELS = {m.name: set(m.labels) for m in METRICS}
# Labels Prometheus adds at scrape time, and the static per-target labels of the daemon
# config (targets[].labels) the fleet views group by.
SCRAPE_LABELS = {"instance", "job"}
TARGET_LABELS = {"variant", "job_name"}
PER_TARGET = {m.name for m in METRICS if "target" in m.labels}
PROMQL_WORDS = {
    "sum", "count", "avg", "min", "max", "by", "without", "rate", "increase", "irate",
    "ignoring", "on", "group_left", "group_right", "label_values", "topk", "clamp_min",
}  # fmt: skip
RECORDED_RE = re.compile(r"\b[a-z_]+:serwatt_[a-z_]+:[a-z0-9_]+\b")


def recorded_labels() -> dict[str, set[str]]:
    """Each recording rule's output labels, as its promtool unit tests pin them (promtool
    compares label sets exactly, so these are the labels the rule really produces)."""
    tests = yaml.safe_load(RULES_TEST.read_text())
    out: dict[str, set[str]] = {r["record"]: set() for r in rules_of(load_rules(), "record")}
    for group in tests["tests"]:
        for t in group.get("promql_expr_test", []):
            if t["expr"] in out:
                for s in t["exp_samples"]:
                    out[t["expr"]] |= set(re.findall(r"(\w+)=", s["labels"]))
    return out


RECORDED = recorded_labels()


def all_queries() -> list[tuple[str, str]]:
    return [(p.name, q) for p in DASHBOARDS for q in dashboard_queries(p)]


def metrics_in(expr: str) -> tuple[set[str], set[str]]:
    """(recording rules, exported metrics) an expression names."""
    recorded = set(RECORDED_RE.findall(expr))
    raw = set(re.findall(r"\bserwatt_[a-z_]+\b", RECORDED_RE.sub(" ", expr)))
    return recorded, raw


def test_the_three_dashboards_are_provisioned():
    assert [p.name for p in DASHBOARDS] == ["ab.json", "fleet.json", "node.json"]
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(set(uids)) == len(uids)
    (provider_file,) = (PROVISIONING / "dashboards").glob("*.yaml")
    provider = yaml.safe_load(provider_file.read_text())
    assert provider["apiVersion"] == 1
    (p,) = provider["providers"]
    assert p["type"] == "file" and Path(p["options"]["path"]).is_absolute()
    (ds_file,) = (PROVISIONING / "datasources").glob("*.yaml")
    ds = yaml.safe_load(ds_file.read_text())
    assert ds["apiVersion"] == 1
    (d,) = ds["datasources"]
    # The dashboards select their data source by a variable of this type.
    assert d["type"] == "prometheus" and d["url"].startswith("http")
    for path in DASHBOARDS:
        (var,) = [v for v in load(path)["templating"]["list"] if v["type"] == "datasource"]
        assert var["query"] == d["type"], path.name


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_matches_its_declared_schema(path: Path):
    assert schema_problems(load(path)) == []


def _broken(mutate) -> list[str]:
    doc = copy.deepcopy(load(DASHBOARD_DIR / "fleet.json"))
    mutate(doc)
    return schema_problems(doc)


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *keys, last = path.split(".")
    node: Any = doc
    for k in keys:
        node = node[int(k)] if k.isdigit() else node[k]
    node[int(last) if last.isdigit() else last] = value


@pytest.mark.parametrize(
    "path, value, problem",
    [
        ("panels.1.id", 1, "panel ids not unique"),
        ("panels.1.gridPos", {"h": 4, "w": 4, "x": 2, "y": 0}, "overlap"),
        ("panels.1.gridPos", {"h": 4, "w": 8, "x": 20, "y": 60}, "outside the 24-column grid"),
        ("panels.1.datasource", "Prometheus", "datasource must be {type, uid}"),
        ("panels.1.targets.0.refId", "", "refIds"),
        ("panels.1.type", "graph", "not a core (non-Angular) panel"),
        ("panels.6.targets.0.expr", "topk($top_n, up)", "$top_n is no variable"),
        ("templating.list.1.type", "dropdown", "type 'dropdown' not one of"),
        ("schemaVersion", 41, "schemaVersion 41: no checks for it"),
        ("panels.2.datasource.uid", "${ds}", "data source $ds is no datasource variable"),
        ("uid", "a uid with spaces", "uid 'a uid with spaces'"),
    ],
)
def test_the_schema_check_finds_broken_dashboards(path, value, problem):
    problems = _broken(lambda d: _set(d, path, value))
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_query_parses_with_promtool(path: Path):
    queries = panel_queries(path) + variable_queries(path)
    assert queries
    assert promql_problems(queries) == []


def test_promtool_finds_a_typo_in_a_panel_query():
    queries = panel_queries(DASHBOARD_DIR / "ab.json")
    broken = [(t, q.replace("ignoring (variant)", "ignoring variant", 1)) for t, q in queries]
    broken[0] = (broken[0][0], broken[0][1].replace("ratio_rate5m{", "ratio_rate5m{{", 1))
    problems = promql_problems(broken)
    titles = [p.split(":")[0] for p in problems]
    assert titles == [
        "Serialization share of CPU",
        "Share difference (candidate - baseline)",
        "GPU-wait share difference (candidate - baseline)",
    ], problems


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_panel_queries_replace_every_variable(path: Path):
    for title, expr in panel_queries(path):
        assert "$" not in expr and "[[" not in expr, (title, expr)
    ab = dict(panel_queries(DASHBOARD_DIR / "ab.json", values={"candidate": "json"}))
    diff = ab["Share difference (candidate - baseline)"]
    assert 'variant="json"' in diff and 'variant="torch"' in diff
    node = panel_queries(NODE_DASHBOARD, rate_interval="10s")
    assert all("[1m]" not in q for _, q in node) and any("[10s]" in q for _, q in node)


def test_the_node_dashboard_has_the_required_panels():
    doc = load(NODE_DASHBOARD)
    titles = {p["title"] for p in doc["panels"]}
    assert {"CPU share per codepath", "Watts per codepath", "GPU-wait per codepath"} <= titles
    exprs = " ".join(dashboard_queries(NODE_DASHBOARD))
    # encode and decode apart (the `direction` label, docs/scaling.md)
    assert "Encode and decode CPU per codepath (cores)" in titles
    assert "sum by (codepath, direction) (rate(serwatt_cpu_seconds_total" in exprs
    # Power is always rate() of a joules counter, never a gauge.
    assert "rate(serwatt_energy_joules_total" in exprs
    assert "rate(serwatt_gpu_wait_seconds_total" in exprs


def test_the_fleet_dashboard_has_top_nodes_a_share_heatmap_and_totals():
    panels = {p["title"]: p for p in all_panels(load(DASHBOARD_DIR / "fleet.json"))}
    exprs = {t: " ".join(x["expr"] for x in p["targets"]) for t, p in panels.items()}
    heat = panels["Serialization share per instance"]
    assert heat["type"] == "heatmap" and heat["options"]["calculate"] is False
    assert exprs["Serialization share per instance"] == (
        "instance:serwatt_serialization_cpu_share:ratio_rate5m"
    )
    assert exprs["Top nodes by serialization watts"].startswith(
        "topk($topn, instance_source:serwatt_serialization_energy_joules:rate5m"
    )
    assert "instance:serwatt_serialization_gpu_wait" in exprs["Top nodes by GPU-wait share"]
    totals = [t for t in exprs if t.startswith("Fleet ")]
    assert len(totals) >= 5 and all(exprs[t].startswith("sum(") or "sum by" in exprs[t]
                                    for t in totals)  # fmt: skip


def test_the_ab_dashboard_compares_share_watts_and_gpu_wait_with_the_difference():
    doc = load(DASHBOARD_DIR / "ab.json")
    exprs = {p["title"]: p["targets"][0]["expr"] for p in all_panels(doc)}
    for measure, rule in (
        ("Share", "serialization_cpu_share"),
        ("Watts per node", "serialization_energy_joules"),
        ("GPU-wait share", "serialization_gpu_wait_share"),
    ):
        diff = exprs[f"{measure} difference (candidate - baseline)"]
        assert rule in diff and '"$candidate"' in diff and '"$baseline"' in diff, diff
        # candidate comes first: a negative difference is what the candidate removed.
        assert diff.index("$candidate") < diff.index("$baseline")
    names = {v["name"] for v in doc["templating"]["list"]}
    assert {"baseline", "candidate"} <= names
    # encode and decode apart, per node, from the direction rule
    by_direction = exprs["Serialization CPU per node by direction (cores)"]
    assert by_direction.startswith("variant_direction:serwatt_serialization_cpu_seconds:rate5m")


@pytest.mark.parametrize("name", ["fleet.json", "ab.json"])
def test_fleet_views_read_only_the_recording_rules(name: str):
    # At 10 000 nodes a panel over raw per-codepath series would touch millions of them.
    for title, expr in panel_queries(DASHBOARD_DIR / name) + variable_queries(DASHBOARD_DIR / name):
        recorded, raw = metrics_in(expr)
        assert recorded and not raw, (title, expr)


@pytest.mark.parametrize("name, expr", all_queries())
def test_query_names_only_exported_metrics_recording_rules_and_their_labels(name, expr):
    recorded, metrics = metrics_in(expr)
    assert recorded | metrics, f"{name}: query names no serwatt metric: {expr}"
    unknown = metrics - METRIC_NAMES
    assert not unknown, f"{name}: {sorted(unknown)} not exported (see profiler/exporter.METRICS)"
    unrecorded = recorded - set(RECORDED)
    assert not unrecorded, f"{name}: {sorted(unrecorded)} is no rule of {RULES.name}"
    allowed = set().union(*(LABELS[m] for m in metrics), *(RECORDED[r] for r in recorded))
    allowed |= SCRAPE_LABELS
    if metrics & PER_TARGET:
        allowed |= TARGET_LABELS
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
    bare = RECORDED_RE.sub(" ", without_strings)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\$\w+", " ", bare)
    bare = re.sub(r"\b(?:by|ignoring|on|without)\s*\([^)]*\)", " ", bare)
    words = set(re.findall(r"\b[a-zA-Z_][a-zA-Z0-9_]*\b", bare)) - metrics
    assert words <= PROMQL_WORDS, f"{name}: unexpected words {sorted(words - PROMQL_WORDS)}"


def test_every_panel_says_what_it_measures():
    for path in DASHBOARDS:
        for panel in all_panels(load(path)):
            assert panel.get("description"), f"{path.name}: panel {panel['title']!r}"
            assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]


def test_dashboards_are_stored_as_grafana_writes_them():
    for path in DASHBOARDS:
        text = path.read_text()
        assert text == json.dumps(json.loads(text), indent=2) + "\n", path.name


def _on_the_fleet_fixture(cases: list[dict[str, Any]], tmp_path: Path) -> str:
    """promtool's output for promql_expr_test `cases` evaluated at 10m on the input
    series of the rules' `fleet` unit test, with the rules loaded."""
    tests = yaml.safe_load(RULES_TEST.read_text())
    tests["rule_files"] = [str(RULES)]
    (fleet,) = [g for g in tests["tests"] if g["name"] == "fleet"]
    fleet["alert_rule_test"] = []
    fleet["promql_expr_test"] = [{"eval_time": "10m", **c} for c in cases]
    tests["tests"] = [fleet]
    path = tmp_path / "panels_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    out = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    return out.stdout + out.stderr


@pytest.mark.parametrize("name", ["fleet.json", "ab.json"])
def test_every_fleet_panel_returns_data_on_the_rules_fixture(name: str, tmp_path: Path):
    # Each query is expected to return nothing: promtool then reports every query that
    # returned something, and every one must be reported.
    queries = panel_queries(DASHBOARD_DIR / name)
    text = _on_the_fleet_fixture([{"expr": q, "exp_samples": []} for _, q in queries], tmp_path)
    empty = [(t, q) for t, q in queries if f"expr: {json.dumps(q)}, time: 10m" not in text]
    assert not empty, f"panels without data on the fixture: {empty}\n{text}"


def test_the_ab_differences_on_the_rules_fixture(tmp_path: Path):
    # The fixture (tests/prometheus/rules_test.yml, `fleet`): torch on node-a, many on
    # node-b and node-c. Share 0.125 - 0.375; watts per node (1 + 2) / 2 - 15; GPU-wait
    # share 0.015625 - 0.09375.
    queries = dict(panel_queries(DASHBOARD_DIR / "ab.json"))
    expected = {
        "Share difference (candidate - baseline)": -0.25,
        "Watts per node difference (candidate - baseline)": -13.5,
        "GPU-wait share difference (candidate - baseline)": -0.078125,
    }
    cases = [
        {"expr": queries[t], "exp_samples": [{"labels": "{}", "value": v}]}
        for t, v in expected.items()
    ]
    text = _on_the_fleet_fixture(cases, tmp_path)
    assert "SUCCESS" in text, text
