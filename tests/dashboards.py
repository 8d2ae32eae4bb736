"""The Grafana dashboards in dashboards/, read the way Grafana reads them.

No tests here: tests/service/test_dashboards.py checks the dashboards with these helpers, and
the Prometheus integration tests import `panel_queries` to run every panel query on a
live Prometheus (or VictoriaMetrics).

Grafana cannot be installed on the development machines, so nothing here renders a
dashboard. What stands in for it:

- `schema_problems(doc)`: the structure Grafana's dashboard model requires at the
  `schemaVersion` the dashboard declares (Grafana's dashboard kind, schema v0, as of
  schemaVersion 39: Grafana 10.4 to 11.x). A version without checks here is a problem,
  so a dashboard re-exported from a newer Grafana must come with checks for it.
- `promql_problems(queries)`: each panel query, with its Grafana variables replaced,
  parsed by promtool (as recording rules of a temporary rules file; `promtool query`
  needs a server).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = REPO / "dashboards"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))
NODE_DASHBOARD = DASHBOARD_DIR / "node.json"
PROVISIONING = REPO / "configs" / "grafana" / "provisioning"

# Grafana's built-in variables and what a query gets for them here. $__rate_interval
# is max(4 x scrape interval, $__interval + scrape interval): 1m at a 10s scrape and a
# step of up to 50s.
BUILTIN_VALUES = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "__interval_ms": "60000",
}
# `$name`, `${name}`, `${name:format}` and the deprecated `[[name]]`.
VARIABLE_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
LABEL_VALUES_RE = re.compile(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def all_panels(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    for panel in doc.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(path: Path) -> list[str]:
    """The raw query strings of a dashboard: every panel target's expr, then every query
    variable's query (Grafana's `label_values(...)`), variables not replaced."""
    doc = load(path)
    queries = [t["expr"] for p in all_panels(doc) for t in p.get("targets", [])]
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]
            queries.append(q["query"] if isinstance(q, dict) else q)
    return queries


def variable_values(
    doc: Mapping[str, Any], overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What each dashboard variable stands for in a query: the override, else the
    variable's saved current value, else its All value (`.*`) or first option."""
    values = dict(BUILTIN_VALUES)
    for var in doc.get("templating", {}).get("list", []):
        name = var["name"]
        current = (var.get("current") or {}).get("value")
        if isinstance(current, list):
            current = "|".join(current)
        if current in (None, "", "$__all"):
            options = [o["value"] for o in var.get("options", [])]
            current = var.get("allValue") or (options[0] if options else ".*")
        values[name] = str(current)
    values.update(overrides or {})
    return values


def substitute(text: str, values: Mapping[str, str]) -> str:
    """`text` with every Grafana variable replaced; KeyError names an unknown one."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise KeyError(name)
        return values[name]

    return VARIABLE_RE.sub(one, text)


def panel_queries(
    path: Path,
    *,
    rate_interval: str | None = None,
    values: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel of the dashboard at `path`,
    Grafana variables replaced: `values` first, else each variable's saved value or All
    (`.*`); `rate_interval` replaces $__rate_interval (default 1m; a test with a 1 s
    scrape passes e.g. "10s")."""
    doc = load(path)
    overrides = dict(values or {})
    if rate_interval is not None:
        overrides.setdefault("__rate_interval", rate_interval)
    vals = variable_values(doc, overrides)
    return [
        (p["title"], substitute(t["expr"], vals))
        for p in all_panels(doc)
        for t in p.get("targets", [])
    ]


def variable_queries(path: Path) -> list[tuple[str, str]]:
    """(variable name, PromQL selector) of each query variable: `label_values(sel, label)`
    gives `sel`, variables replaced."""
    doc = load(path)
    vals = variable_values(doc)
    out = []
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        q = var["query"]
        q = q["query"] if isinstance(q, dict) else q
        m = LABEL_VALUES_RE.fullmatch(q)
        out.append((var["name"], substitute(m.group(1) if m else q, vals)))
    return out


# -- schema ------------------------------------------------------------------------

# Panel plugins that ship with Grafana 10.4-11 and are not Angular (graph, singlestat
# and table-old are Angular, deprecated and off by default in Grafana 11).
CORE_PANEL_TYPES = frozenset(
    "timeseries stat gauge bargauge table heatmap text row piechart state-timeline "
    "status-history histogram barchart xychart trend candlestick logs nodeGraph traces "
    "flamegraph geomap canvas news dashlist alertlist annolist datagrid".split()
)
VARIABLE_TYPES = frozenset(
    "query adhoc constant datasource interval textbox custom system groupby".split()
)
GRID_COLUMNS = 24
UID_RE = re.compile(r"[A-Za-z0-9_-]{1,40}")
PANELS_WITHOUT_QUERIES = frozenset({"row", "text", "news", "dashlist", "alertlist", "annolist"})


def _is_datasource_ref(ref: Any) -> bool:
    # Since schemaVersion 33 a data source is an object {type, uid}, never a name string.
    return (
        isinstance(ref, dict)
        and isinstance(ref.get("type"), str)
        and isinstance(ref.get("uid"), str)
        and bool(ref["uid"])
    )


def _schema_v39(doc: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for key, kind in (
        ("title", str),
        ("uid", str),
        ("panels", list),
        ("templating", dict),
        ("time", dict),
        ("tags", list),
        ("version", int),
    ):
        if not isinstance(doc.get(key), kind):
            problems.append(f"{key}: missing or not a {kind.__name__}")
    if problems:
        return problems
    if not UID_RE.fullmatch(doc["uid"]):
        problems.append(f"uid {doc['uid']!r}: 1-40 of A-Z a-z 0-9 _ -")
    if not all(isinstance(doc["time"].get(k), str) for k in ("from", "to")):
        problems.append("time: needs from and to strings")
    if not all(isinstance(t, str) for t in doc["tags"]):
        problems.append("tags: strings only")

    variables = doc["templating"].get("list")
    if not isinstance(variables, list):
        return problems + ["templating.list: missing"]
    names = [v.get("name") for v in variables]
    if len(set(names)) != len(names):
        problems.append(f"templating: duplicate variable names {names}")
    for var in variables:
        where = f"variable {var.get('name')!r}"
        if not isinstance(var.get("name"), str) or not re.fullmatch(r"\w+", var["name"]):
            problems.append(f"{where}: name must be a word")
        if var.get("type") not in VARIABLE_TYPES:
            problems.append(
                f"{where}: type {var.get('type')!r} not one of {sorted(VARIABLE_TYPES)}"
            )
        if var.get("type") == "query":
            if not _is_datasource_ref(var.get("datasource")):
                problems.append(f"{where}: datasource must be {{type, uid}}")
            q = var.get("query")
            if not (
                isinstance(q, str) or (isinstance(q, dict) and isinstance(q.get("query"), str))
            ):
                problems.append(f"{where}: query must be a string or {{query, refId}}")
            if var.get("refresh") not in (0, 1, 2):
                problems.append(f"{where}: refresh must be 0, 1 or 2")
        if var.get("type") == "custom" and not isinstance(var.get("query"), str):
            problems.append(f"{where}: a custom variable's query is its comma-separated values")
        if var.get("type") == "datasource" and not isinstance(var.get("query"), str):
            problems.append(f"{where}: a datasource variable's query is the plugin id")

    ids: list[Any] = []
    boxes: list[tuple[str, int, int, int, int]] = []
    for panel in doc["panels"]:
        problems += _panel_v39(panel, ids, boxes)
        for inner in panel.get("panels", []):
            if panel.get("type") != "row":
                problems.append(f"panel {panel.get('title')!r}: only rows hold panels")
            problems += _panel_v39(inner, ids, [])  # collapsed: laid out when expanded
    if len(set(ids)) != len(ids):
        problems.append(f"panel ids not unique: {sorted(ids)}")
    for i, (t1, x1, y1, w1, h1) in enumerate(boxes):
        for t2, x2, y2, w2, h2 in boxes[i + 1 :]:
            if x1 < x2 + w2 and x2 < x1 + w1 and y1 < y2 + h2 and y2 < y1 + h1:
                problems.append(f"panels {t1!r} and {t2!r} overlap")

    known = {n for n in names if isinstance(n, str)} | set(BUILTIN_VALUES)
    ds_vars = {v.get("name") for v in variables if v.get("type") == "datasource"}
    refs = [(f"variable {v.get('name')!r}", v.get("datasource")) for v in variables]
    for panel in all_panels(doc):
        refs.append((f"panel {panel.get('title')!r}", panel.get("datasource")))
        refs += [
            (f"panel {panel.get('title')!r}", t.get("datasource")) for t in panel.get("targets", [])
        ]
    for where, ref in refs:
        uid = ref.get("uid", "") if isinstance(ref, dict) else ""
        for m in VARIABLE_RE.finditer(uid):
            name = m.group(1) or m.group(2) or m.group(3)
            if name not in ds_vars:
                problems.append(f"{where}: data source ${name} is no datasource variable")
    for panel in all_panels(doc):
        texts = [panel.get("title", ""), panel.get("description", "")]
        texts += [t.get("expr", "") for t in panel.get("targets", [])]
        texts += [t.get("legendFormat", "") for t in panel.get("targets", [])]
        for text in texts:
            for m in VARIABLE_RE.finditer(text):
                name = m.group(1) or m.group(2) or m.group(3)
                if name not in known:
                    problems.append(f"panel {panel.get('title')!r}: ${name} is no variable")
    for var in variables:
        q = var.get("query")
        q = q.get("query", "") if isinstance(q, dict) else q or ""
        for m in VARIABLE_RE.finditer(q):
            name = m.group(1) or m.group(2) or m.group(3)
            if name not in known or name == var.get("name"):
                problems.append(f"variable {var.get('name')!r}: ${name} is no other variable")
    return problems


def _panel_v39(
    panel: Mapping[str, Any], ids: list[Any], boxes: list[tuple[str, int, int, int, int]]
) -> list[str]:
    title = panel.get("title")
    where = f"panel {title!r}"
    problems = []
    if not isinstance(title, str) or not title:
        problems.append(f"{where}: needs a title")
    if not isinstance(panel.get("id"), int) or isinstance(panel.get("id"), bool):
        problems.append(f"{where}: id must be an integer")
    ids.append(panel.get("id"))
    ptype = panel.get("type")
    if ptype not in CORE_PANEL_TYPES:
        problems.append(f"{where}: type {ptype!r} is not a core (non-Angular) panel")
    grid = panel.get("gridPos")
    if not isinstance(grid, dict) or not all(
        isinstance(grid.get(k), int) and grid[k] >= 0 for k in "hwxy"
    ):
        problems.append(f"{where}: gridPos needs integer h, w, x, y >= 0")
    else:
        if not (1 <= grid["w"] and grid["x"] + grid["w"] <= GRID_COLUMNS and grid["h"] >= 1):
            problems.append(f"{where}: gridPos {grid} outside the {GRID_COLUMNS}-column grid")
        if ptype == "row" and (grid["w"] != GRID_COLUMNS or grid["h"] != 1):
            problems.append(f"{where}: a row spans the grid (w 24, h 1)")
        boxes.append((str(title), grid["x"], grid["y"], grid["w"], grid["h"]))
    if ptype in PANELS_WITHOUT_QUERIES:
        return problems
    if not _is_datasource_ref(panel.get("datasource")):
        problems.append(f"{where}: datasource must be {{type, uid}}")
    fc = panel.get("fieldConfig")
    if not (
        isinstance(fc, dict)
        and isinstance(fc.get("defaults"), dict)
        and isinstance(fc.get("overrides"), list)
    ):
        problems.append(f"{where}: fieldConfig needs defaults {{}} and overrides []")
    targets = panel.get("targets")
    if not isinstance(targets, list) or not targets:
        return problems + [f"{where}: no targets"]
    ref_ids = [t.get("refId") for t in targets]
    if len(set(ref_ids)) != len(ref_ids) or not all(isinstance(r, str) and r for r in ref_ids):
        problems.append(f"{where}: refIds {ref_ids} must be unique non-empty strings")
    for t in targets:
        if not _is_datasource_ref(t.get("datasource")):
            problems.append(f"{where} target {t.get('refId')}: datasource must be {{type, uid}}")
        elif t["datasource"] != panel.get("datasource"):
            problems.append(f"{where} target {t.get('refId')}: another datasource than its panel")
        if not isinstance(t.get("expr"), str) or not t["expr"].strip():
            problems.append(f"{where} target {t.get('refId')}: no expr")
    if ptype == "heatmap" and not isinstance(panel.get("options", {}).get("calculate"), bool):
        problems.append(f"{where}: heatmap options.calculate must be true or false")
    return problems


SCHEMA_CHECKS: dict[int, Callable[[Mapping[str, Any]], list[str]]] = {39: _schema_v39}


def schema_problems(doc: Mapping[str, Any]) -> list[str]:
    """What is wrong with `doc` for the schemaVersion it declares ([] when nothing)."""
    version = doc.get("schemaVersion")
    check = SCHEMA_CHECKS.get(version) if isinstance(version, int) else None
    if check is None:
        return [
            f"schemaVersion {version!r}: no checks for it here (known: {sorted(SCHEMA_CHECKS)})"
        ]
    return check(doc)


# -- PromQL ------------------------------------------------------------------------


def promql_problems(queries: list[tuple[str, str]]) -> list[str]:
    """Each (name, expr) that promtool cannot parse, with promtool's message ([] when all
    parse). The exprs become recording rules of a temporary rules file, checked with
    `promtool check rules`, which parses every expr offline."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make system-deps` installs Debian's prometheus"
    rules = [{"record": f"dashboard_query_{i}", "expr": e} for i, (_, e) in enumerate(queries)]
    doc = {"groups": [{"name": "dashboard-queries", "rules": rules}]}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "queries.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
    if out.returncode == 0:
        return []
    text = out.stdout + out.stderr
    bad = [
        f"{queries[i][0]}: {queries[i][1]}\n  {line.strip()}"
        for i in range(len(queries))
        for line in text.splitlines()
        if re.search(rf"\bdashboard_query_{i}\b", line)
    ]
    return bad or [text]
