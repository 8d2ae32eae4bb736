"""The fleet recording and alerting rules pass `promtool check rules` and their promtool
unit tests (tests/prometheus/rules_test.yml), and every rule has a live unit test.

"Live" is shown by mutation: each recording rule, doubled, fails its test; each alert,
made never to fire, fails a firing test, and made to fire at once (no `for`), fails a
not-firing test. So a rule added without a test, or a test that checks nothing, fails
here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "configs" / "prometheus" / "serwatt.rules.yml"
RULES_TEST = REPO / "tests" / "prometheus" / "rules_test.yml"
SCRAPE_CONFIG = REPO / "configs" / "prometheus" / "serwatt.yml"


def promtool() -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool missing: `make system-deps` installs Debian's prometheus"
    return binary


def load_rules(path: Path = RULES) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def rules_of(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """Every rule of the file with the key `kind` ("record" or "alert")."""
    return [r for g in doc["groups"] for r in g["rules"] if kind in r]


def run_unit_tests(rules: dict[str, Any], tmp: Path) -> subprocess.CompletedProcess[str]:
    """promtool test rules with the checked-in tests against `rules` (written to tmp)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    tests = yaml.safe_load(RULES_TEST.read_text())
    tests["rule_files"] = ["rules.yml"]
    (tmp / "rules_test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    return subprocess.run(
        [promtool(), "test", "rules", str(tmp / "rules_test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_promtool_check_rules_accepts_every_rule() -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc = load_rules()
    n = len(rules_of(doc, "record")) + len(rules_of(doc, "alert"))
    assert f"SUCCESS: {n} rules found" in out.stdout, out.stdout


def test_promtool_check_rules_rejects_a_broken_rule(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(
        RULES.read_text().replace("sum by (variant) (rate(", "sum by (variant (rate(", 1)
    )
    out = subprocess.run(
        [promtool(), "check", "rules", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert "variant:serwatt_cpu_seconds:rate5m" in out.stdout + out.stderr


def test_promtool_unit_tests_pass() -> None:
    out = subprocess.run(
        [promtool(), "test", "rules", str(RULES_TEST)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_the_scrape_config_loads_the_rules() -> None:
    prom = yaml.safe_load(SCRAPE_CONFIG.read_text())
    assert [(SCRAPE_CONFIG.parent / f).resolve() for f in prom["rule_files"]] == [RULES]


def test_rule_names_follow_level_metric_operations() -> None:
    doc = load_rules()
    for rule in rules_of(doc, "record"):
        level, metric, ops = rule["record"].split(":")
        assert metric.startswith("serwatt_") and not metric.endswith("_total"), rule["record"]
        # The level names the labels the result keeps (instance keeps instance and job).
        suffix = next((x for x in ("source", "direction") if level.endswith(f"_{x}")), None)
        base = level.removesuffix(f"_{suffix}") if suffix else level
        kept = {"instance": ["instance", "job"]}.get(base, [base])
        kept = kept + ([suffix] if suffix else [])
        by = re.match(r"\s*(?:sum|count) by \(([^)]*)\)", rule["expr"])
        if by:
            assert [w.strip() for w in by.group(1).split(",")] == kept, rule["record"]
        assert re.fullmatch(r"(ratio_)?rate5m|count", ops), rule["record"]


def test_every_alert_has_a_runbook_and_a_severity() -> None:
    for rule in rules_of(load_rules(), "alert"):
        ann = rule["annotations"]
        assert {"summary", "description", "runbook"} <= set(ann), rule["alert"]
        assert len(ann["runbook"].split()) >= 30, f"{rule['alert']}: runbook too thin"
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert rule.get("for"), f"{rule['alert']}: an alert without `for` pages on one blip"


def test_every_rule_has_a_unit_test() -> None:
    doc = load_rules()
    tests = yaml.safe_load(RULES_TEST.read_text())
    exprs = {t["expr"].strip() for g in tests["tests"] for t in g.get("promql_expr_test", [])}
    untested = [r["record"] for r in rules_of(doc, "record") if r["record"] not in exprs]
    assert not untested, f"recording rules without a promql_expr_test: {untested}"
    cases = [t for g in tests["tests"] for t in g.get("alert_rule_test", [])]
    for rule in rules_of(doc, "alert"):
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c.get("exp_alerts") for c in mine), f"{rule['alert']}: no firing test"
        assert any(not c.get("exp_alerts") for c in mine), f"{rule['alert']}: no quiet test"
    # promtool evaluates groups it is not told the order of in a random order, and an
    # alert may then read the previous step's recorded values: all groups are ordered.
    assert tests["group_eval_order"] == [g["name"] for g in doc["groups"]]


def _mutated(how: str) -> dict[str, Any]:
    """The rules with every recording rule doubled ("double"), every alert made never
    to fire ("never") or to fire at once, without its `for` ("at_once")."""
    doc = load_rules()
    for rule in rules_of(doc, "record") if how == "double" else rules_of(doc, "alert"):
        if how == "double":
            # A ratio of doubled rules doubled is twice the ratio: every value changes.
            rule["expr"] = f"({rule['expr']}) * 2"
        elif how == "never":
            rule["expr"] = f"({rule['expr']}) unless on () vector(1)"
        else:
            rule.pop("for")
    return doc


def _quiet_times(alert: str) -> set[str]:
    tests = yaml.safe_load(RULES_TEST.read_text())
    return {
        c["eval_time"]
        for g in tests["tests"]
        for c in g.get("alert_rule_test", [])
        if c["alertname"] == alert and not c.get("exp_alerts")
    }


@pytest.mark.parametrize("how", ["double", "never", "at_once"])
def test_every_rule_test_fails_when_its_rule_changes(tmp_path: Path, how: str) -> None:
    out = run_unit_tests(_mutated(how), tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode != 0, f"rules mutated ({how}) still pass their tests"
    doc = load_rules()
    if how == "double":
        for rule in rules_of(doc, "record"):
            assert f'expr: "{rule["record"]}"' in text, f"{rule['record']} doubled passes"
    for rule in rules_of(doc, "alert") if how != "double" else []:
        name = rule["alert"]
        if how == "never":
            assert f"alertname: {name}, time: " in text, f"{name} never firing passes"
        else:
            # It fires where a test expects it pending: a not-firing test caught it.
            times = "|".join(re.escape(t) for t in _quiet_times(name))
            assert re.search(rf"alertname: {name}, time: ({times}),", text), (name, text)


@pytest.mark.parametrize("alert", [r["alert"] for r in rules_of(load_rules(), "alert")])
def test_alert_annotations_name_the_instance(alert: str) -> None:
    rule = next(r for r in rules_of(load_rules(), "alert") if r["alert"] == alert)
    assert "{{ $labels.instance }}" in rule["annotations"]["summary"]
