"""The A/B page's differential flame graph (baseline -> candidate) of the report's
`stacks` section (profiler/report/stack_diff.py): its markup, legend and notes, and the
script that draws it with the inlined d3-flame-graph (profiler/flame.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serwatt.profiler.flame import diff_tree, script_json
from serwatt.profiler.report.html_parts import e
from serwatt.profiler.report.render_text import fmt

# d3-flame-graph's differentialColorMapper: red where the candidate takes more, blue
# where it takes less, the strongest where one side has none
DIFF_LEGEND = (
    ("rgb(235,0,0)", "more CPU in the candidate"),
    ("rgb(0,0,220)", "less in the candidate (or only in the baseline)"),
    ("rgb(255,190,90)", "only in the candidate"),
    ("rgb(220,220,220)", "unchanged"),
)
FLAME_DIFF_SCRIPT = """<script>
(function () {
  var tree = JSON.parse(document.getElementById("serwatt-flame-diff-data").textContent);
  var lib = window.flamegraph;
  var make = typeof lib === "function" ? lib : (lib.flamegraph || lib.default);
  var el = document.getElementById("serwatt-flame-diff");
  var f3 = function (v) { return v.toFixed(3); };
  var chart = make()
    .width(Math.max(300, el.clientWidth))
    .cellHeight(18)
    .minFrameSize(1)
    .transitionDuration(0)
    .setColorMapper(lib.colorMapper.differentialColorMapper)
    .setLabelHandler(function (d) {
      var x = d.data, sign = x.candidate >= x.baseline ? "+" : "";
      return x.name + "\\nbaseline " + f3(x.baseline) + " → candidate " + f3(x.candidate) +
        " CPU-s per run (" + sign + f3(x.candidate - x.baseline) + "), codepath " + x.codepath;
    });
  d3.select(el).datum(tree).call(chart);
  el.setAttribute("data-rendered", "1");
})();
</script>"""


def _no_stacks_reason(report: Mapping[str, Any], why: str) -> str:
    src = report.get("source")
    if isinstance(src, Mapping) and src.get("kind") == "promql":
        return "Prometheus holds no stacks"
    return why


def flame_diff(report: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[str, bool]:
    """The differential flame graph of the report's `stacks` (profiler/report/
    stack_diff.py), and whether the page needs the renderer; the frames go in as JSON
    (script_json), never as markup. labels: each side's name as the page shows it."""
    st = report.get("stacks")
    if not st:
        return "<p>No stacks in this report (made by a serwatt that kept none).</p>", False
    notes = []
    for side in ("baseline", "candidate"):
        for run_id in st[side]["without"]:
            notes.append(
                f'<li data-side="{side}">{side} run <code>{e(run_id)}</code>: no stacks '
                f"recorded for this run ({e(_no_stacks_reason(report, st['without_why']))})</li>"
            )
        if st[side]["merged"]:
            notes.append(
                f"<li>{side}: {st[side]['merged']} distinct stacks past the record's cap are "
                "drawn as one overflow frame</li>"
            )
    if st["not_drawn_one_by_one"]:
        notes.append(
            f"<li>{st['not_drawn_one_by_one']} smallest stacks are drawn summed per codepath</li>"
        )
    listed = f'<ul class="src">{"".join(notes)}</ul>' if notes else ""
    if not st["baseline"]["runs"] or not st["candidate"]["runs"] or not st["stacks"]:
        missing = [s for s in ("baseline", "candidate") if not st[s]["runs"]]
        why = (
            f"no run of the {' and the '.join(missing)} recorded stacks"
            if missing
            else "no stack took CPU on either side"
        )
        return (
            f'<p class="flame-diff-none">No differential flame graph: {e(why)}.</p>{listed}',
            False,
        )
    legend = "".join(
        f'<span style="background:{colour}"></span>{e(text)}' for colour, text in DIFF_LEGEND
    )
    head = (
        f"<p>Baseline → candidate: <b>{e(labels['baseline'])}</b> "
        f"({st['baseline']['runs']} runs, {fmt(st['baseline']['cpu_s_per_run'])} CPU-s per run) "
        f"→ <b>{e(labels['candidate'])}</b> ({st['candidate']['runs']} runs, "
        f"{fmt(st['candidate']['cpu_s_per_run'])} CPU-s per run). A frame is a function at a "
        "line; its width is both sides' CPU-s per run added, its colour the change from "
        "baseline to candidate (each side's stacks summed over its runs and divided by them, "
        "so sides with different run counts compare). Hover a frame for its figures.</p>"
    )
    body = (
        f'{head}<div class="legend flame-diff-legend">{legend}</div>'
        '<div id="serwatt-flame-diff" class="flame-diff" data-chart="flame-diff"></div>'
        f"{listed}"
        '<script type="application/json" id="serwatt-flame-diff-data">'
        f"{script_json(diff_tree(st['stacks']))}</script>"
    )
    return body, True
