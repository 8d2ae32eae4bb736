"""`serwatt profile --html FILE` (alias --flamegraph): the single-run page, in one
self-contained HTML file (no network: the renderer is inlined): the table the terminal
shows, the session's classified stacks as an interactive flame graph, and the episodes
over time (plain SVG, a row per thread).

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
from collections.abc import Sequence
from typing import Any

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.flame import (
    COLOURS,
    CSP,
    MIXED,
    build_tree,
    frame_label,
    script_json,
    vendor_text,
)
from serwatt.profiler.profile.stack_profile import StackProfile

__all__ = ["COLOURS", "MIXED", "build_tree", "episodes_svg", "frame_label", "render_page"]


MAX_TIMELINE_ROWS = 40  # threads drawn in the episodes timeline (the busiest first)


def episodes_svg(episodes: Sequence[Any], *, started_at: float, duration_s: float) -> str:
    """The episodes over time: a row per thread (pid/thread), a bar per episode from its
    start to its end, in its codepath's colour. Plain SVG, no script."""
    if not episodes or duration_s <= 0:
        return "<p>No episodes (no thread stayed in a serialization codepath for 2 samples).</p>"
    busy: dict[tuple[int, int], float] = {}
    for ep in episodes:
        busy[ep.pid, ep.thread] = busy.get((ep.pid, ep.thread), 0.0) + ep.wall_s
    rows = sorted(busy, key=lambda k: -busy[k])[:MAX_TIMELINE_ROWS]
    row_of = {k: i for i, k in enumerate(rows)}
    width, label_w, row_h, top = 960, 150, 16, 6
    plot_w = width - label_w - 10
    height = top + row_h * len(rows) + 24
    parts = [
        f'<svg class="episodes" width="100%" style="max-width:{width}px;height:auto" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="serialization episodes over time">'
    ]
    for (pid, thread), n in row_of.items():
        parts.append(f'<text x="4" y="{top + n * row_h + 12}" font-size="11">{pid}/{thread}</text>')
    for ep in episodes:
        i = row_of.get((ep.pid, ep.thread))
        if i is None:
            continue
        x = label_w + max(0.0, ep.start - started_at) / duration_s * plot_w
        w = max(1.0, ep.wall_s / duration_s * plot_w)
        parts.append(
            f'<rect class="episode" data-codepath="{html.escape(ep.codepath)}" x="{x:.1f}" '
            f'y="{top + i * row_h + 2}" width="{w:.1f}" height="{row_h - 4}" '
            f'fill="{COLOURS.get(ep.codepath, COLOURS[MIXED])}"><title>'
            f"{html.escape(ep.codepath)} {html.escape(ep.direction)}: {ep.wall_s:.3f} s at "
            f"+{ep.start - started_at:.2f} s</title></rect>"
        )
    parts.append(
        f'<text x="{label_w}" y="{height - 6}" font-size="11">0 s</text>'
        f'<text x="{width - 10}" y="{height - 6}" font-size="11" text-anchor="end">'
        f"{duration_s:.1f} s since the profile started</text></svg>"
    )
    return "".join(parts)


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>serwatt profile: {title}</title>
<style>{css}
body {{ font: 14px system-ui, sans-serif; margin: 16px auto; max-width: 1200px;
  padding: 0 16px; }}
h1 {{ font-size: 18px; margin: 0 0 4px; }}
h2 {{ font-size: 16px; margin: 18px 0 6px; }}
.legend span {{ display: inline-block; margin-right: 12px; }}
.legend i {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -1px; border: 1px solid #999; }}
#chart {{ width: 100%; }}
pre.table {{ font-size: 12px; overflow-x: auto; max-width: 100%; background: #fafafa;
  border: 1px solid #eee; padding: 6px; }}
</style></head>
<body>
<h1>serwatt profile: {title}</h1>
<p>{summary}</p>
<h2 id="table">By codepath</h2>
<pre class="table">{table}</pre>
<h2 id="flame">Flame graph</h2>
<p class="legend">{legend}</p>
<div id="chart"></div>
<h2 id="episodes">Episodes over time</h2>
{episodes}
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


def render_page(
    stacks: StackProfile,
    *,
    title: str,
    summary: str,
    table: str = "",
    episodes: Sequence[Any] = (),
    started_at: float = 0.0,
    duration_s: float = 0.0,
) -> str:
    """The single-run page: the table, the flame graph, the episodes over time. `title`,
    `summary` and `table` are plain text; `episodes` the session's
    (profiler/attribution/episodes.py)."""
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
        episodes=episodes_svg(episodes, started_at=started_at, duration_s=duration_s),
        data=script_json(tree),
        colours=script_json(COLOURS),
        css=vendor_text("d3-flamegraph.css"),
        d3=vendor_text("d3.min.js"),
        flamegraph=vendor_text("d3-flamegraph.umd.min.js"),
    )
