"""`serwatt profile --flamegraph FILE`: the session's classified stacks as an interactive
flame graph in one self-contained HTML file (no network: the renderer is inlined).

The renderer is d3-flame-graph with d3 (npm packages, vendored unmodified under
profiler/vendor/flamegraph/, see SOURCES.md there). Width is CPU seconds. A frame is a
function at a line, so each serialization call site is a frame of its own. Colour is the
codepath: a frame whose CPU is all one serializer's has that serializer's colour, one
whose CPU is all `other` is grey, one mixing several is pale.

Frame names, file names and the command line come from the target: they go into the page
as JSON inside a `<script type="application/json">` with `<`, `>` and `&` escaped, and
the renderer writes them with textContent, so none of them is markup. The page's
Content-Security-Policy allows no network at all; it allows inline scripts (the inlined
renderer) and eval, which the bundled d3 needs to render."""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

from profiler.classify.codepaths import CODEPATHS
from profiler.profile.stack_profile import StackProfile
from profiler.sampling.stacks import FrameKey

VENDOR = ("vendor", "flamegraph")
MIXED = "(mixed)"

# one colour per codepath (Tableau 10, colour-blind-safer order), `other` grey
COLOURS = {
    "pickle": "#4e79a7",
    "torch": "#f28e2b",
    "protobuf": "#e15759",
    "json": "#76b7b2",
    "msgpack": "#59a14f",
    "yaml": "#edc948",
    "safetensors": "#b07aa1",
    "numpy": "#ff9da7",
    "many": "#9c755f",
    "other": "#bab0ac",
    MIXED: "#e8e4e0",
}


def _vendor(name: str) -> str:
    return (
        resources.files("profiler").joinpath("/".join((*VENDOR, name))).read_text(encoding="utf-8")
    )


def frame_label(frame: FrameKey) -> str:
    name, filename, line = frame
    if not filename:
        return name
    short = "/".join(filename.split("/")[-2:])
    return f"{name} ({short}:{line})"


def build_tree(stacks: StackProfile) -> dict[str, Any]:
    """The d3-flame-graph tree (name, value, children) of the stacks' CPU, root first;
    each node with the codepath of all of its CPU (MIXED when several)."""
    root: dict[str, Any] = {"name": "all", "value": 0.0, "children": {}, "cps": {}}
    for (frames, codepath, _direction), fig in stacks:
        if fig.cpu_s <= 0:
            continue
        node = root
        node["value"] += fig.cpu_s
        node["cps"][codepath] = node["cps"].get(codepath, 0.0) + fig.cpu_s
        for frame in reversed(frames):  # stored leaf first
            label = frame_label(frame)
            child = node["children"].get(label)
            if child is None:
                child = node["children"][label] = {
                    "name": label, "value": 0.0, "children": {}, "cps": {},
                    "file": frame[1], "line": frame[2],
                }  # fmt: skip
            child["value"] += fig.cpu_s
            child["cps"][codepath] = child["cps"].get(codepath, 0.0) + fig.cpu_s
            node = child
    return _finish(root)


def _finish(node: dict[str, Any]) -> dict[str, Any]:
    cps = node.pop("cps")
    node["codepath"] = next(iter(cps)) if len(cps) == 1 else MIXED
    node["value"] = round(node["value"], 6)
    node["children"] = [_finish(c) for c in node["children"].values()]
    return node


def _json_for_script(data: Any) -> str:
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


CSP = "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'"

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>serwatt flame graph: {title}</title>
<style>{css}
body {{ font: 14px system-ui, sans-serif; margin: 16px; }}
h1 {{ font-size: 18px; margin: 0 0 4px; }}
.legend span {{ display: inline-block; margin-right: 12px; }}
.legend i {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -1px; border: 1px solid #999; }}
#chart {{ width: 100%; }}
pre {{ font-size: 12px; overflow-x: auto; }}
</style></head>
<body>
<h1>serwatt flame graph: {title}</h1>
<p>{summary}</p>
<p class="legend">{legend}</p>
<div id="chart"></div>
<details><summary>The table</summary><pre>{table}</pre></details>
<script type="application/json" id="serwatt-stacks">{data}</script>
<script type="application/json" id="serwatt-colours">{colours}</script>
<script>{d3}</script>
<script>{flamegraph}</script>
<script>
(function () {{
  var tree = JSON.parse(document.getElementById("serwatt-stacks").textContent);
  var colours = JSON.parse(document.getElementById("serwatt-colours").textContent);
  var lib = window.flamegraph;
  var make = typeof lib === "function" ? lib : (lib.flamegraph || lib.default);
  var el = document.getElementById("chart");
  var chart = make()
    .width(Math.max(400, el.clientWidth))
    .cellHeight(18)
    .minFrameSize(1)
    .transitionDuration(0)
    .setColorMapper(function (d) {{ return colours[d.data.codepath] || colours["(mixed)"]; }})
    .setLabelHandler(function (d) {{
      return d.data.name + "\\n" + d.value.toFixed(3) + " CPU-s, codepath " + d.data.codepath;
    }});
  d3.select(el).datum(tree).call(chart);
  document.body.setAttribute("data-rendered", "1");
}})();
</script>
</body></html>
"""


def render_page(stacks: StackProfile, *, title: str, summary: str, table: str = "") -> str:
    """The flame graph page. `title`, `summary` and `table` are plain text."""
    tree = build_tree(stacks)
    legend = "".join(
        f'<span><i style="background:{COLOURS[cp]}"></i>{html.escape(cp)}</span>'
        for cp in (*CODEPATHS, MIXED)
    )
    return PAGE.format(
        csp=CSP,
        title=html.escape(title),
        summary=html.escape(summary),
        legend=legend,
        table=html.escape(table),
        data=_json_for_script(tree),
        colours=_json_for_script(COLOURS),
        css=_vendor("d3-flamegraph.css"),
        d3=_vendor("d3.min.js"),
        flamegraph=_vendor("d3-flamegraph.umd.min.js"),
    )
