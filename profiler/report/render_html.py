"""The report as one self-contained HTML file: no network, numbers as text, and no
JavaScript except the differential flame graph's renderer (d3-flame-graph, inlined, under
a Content-Security-Policy that allows no network), present only when the runs recorded
stacks.

Charts are inline SVG with stable hooks for tests and users' own tooling:
- `<svg class="chart" data-chart="codepath-bars" data-metric="cpu_s">`: per codepath one
  `<rect class="bar" data-side="baseline|candidate" data-codepath=NAME>` each, per
  measured wall-hour, with a `<line class="whisker">` for each side's 95% interval;
- `<svg class="chart" data-chart="episode-durations">`: one `<circle class="point"
  data-side=...>` per checkpoint episode of each side, `<line class="median">` per side;
- `<svg class="chart" data-chart="window-timeline">`: per run a `<polyline class="series"
  data-run=...>` and one `<circle class="point">` per window (serialization CPU-seconds
  per window-second over time since the run started);
- `<div id="serwatt-flame-diff" data-chart="flame-diff">`: the differential flame graph
  (baseline -> candidate), `data-rendered="1"` once drawn, one `<g class="frame">` per frame.
Every string from the inputs (run ids, hostnames, sources, caveats) is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from serwatt.profiler.flame import CSP, renderer_scripts
from serwatt.profiler.report.html_parts import e, html_table, svg_size
from serwatt.profiler.report.render_flame_diff import FLAME_DIFF_SCRIPT, flame_diff
from serwatt.profiler.report.render_projection_html import projection_html
from serwatt.profiler.report.render_text import (
    DIRECTION_HEAD,
    METRIC_LABELS,
    change_text,
    direction_rows,
    fmt,
    input_text,
    n_text,
    p_text,
    shows_waits,
)

COLORS = {"baseline": "#4c72b0", "candidate": "#dd8452"}
# each warning's lead: a power warning (too few runs for significance)
# carries `needed_per_side`; the others by their scope
WARNING_KINDS = {"comparability": "Runs differ", "checkpoint": "Checkpoints"}
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;
max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0;max-width:100%}
td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top;
overflow-wrap:break-word}th{background:#f6f6f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
.caveat{background:#fff4e5;border-left:4px solid #e8a33d;padding:6px 10px;margin:6px 0}
.warning{background:#eef4ff;border-left:4px solid #4c72b0;padding:6px 10px;margin:6px 0}
.sig{font-weight:600}.ns{color:#666}.src{color:#555;font-size:12px}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;word-break:break-all}
svg.chart{display:block;margin:8px 0;background:#fcfcfc;border:1px solid #eee}
svg text{font:11px system-ui,sans-serif;fill:#333}
.verdict{border:1px solid #ccd;border-radius:8px;padding:8px 14px;margin:12px 0;background:#fafbff}
.verdict h2{border:0;margin:4px 0}svg text.vlabel,svg text.vtext{font-size:13px}
details{margin:10px 0;border-top:1px solid #ddd;padding-top:6px}summary{font-size:16px;
font-weight:600;cursor:pointer}details>*{max-width:100%;overflow-x:auto}
table{display:block;overflow-x:auto}.legend span{display:inline-block;width:12px;
height:12px;margin:0 4px 0 12px;vertical-align:middle}
"""


def _side_label(report: Mapping[str, Any], side: str) -> str:
    cp = report["checkpoint"][side].get("codepath")
    return f"{side} ({cp})" if cp else side


def _legend() -> str:
    return (
        '<div class="legend">'
        + "".join(
            f'<span style="background:{COLORS[s]}"></span>{s}' for s in ("baseline", "candidate")
        )
        + "</div>"
    )


# --------------------------------------------------------------------------- charts


def bar_rows(report: Mapping[str, Any], metric: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The codepaths the bar chart of `metric` shows: serialization codepaths with a
    non-zero value on either side (the test counts two bars per row)."""
    rows = []
    for name, metrics in report["codepaths"].items():
        if name == "other":
            continue
        m = metrics[metric]
        if m.get("baseline") or m.get("candidate"):
            rows.append((name, m))
    return rows


def _codepath_bars(report: Mapping[str, Any], metric: str) -> str:
    rows = bar_rows(report, metric)
    if not rows:
        return ""
    label_w, width, row_h, bar_h, top = 110, 960, 44, 15, 26
    # the change text ("~ [-20%, +8.3%] no significant change") sits right of the plot
    plot_w = width - label_w - 370
    highs = [
        v
        for _n, m in rows
        for side in ("baseline", "candidate")
        for v in [m.get(side)] + list(m.get(f"{side}_ci95") or [])
        if v is not None
    ]
    scale = max(highs) or 1.0
    height = top + row_h * len(rows) + 10
    unit = rows[0][1]["unit"]
    parts = [
        f'<svg class="chart" data-chart="codepath-bars" data-metric="{e(metric)}" '
        f'{svg_size(width, height)} role="img" '
        f'aria-label="{e(METRIC_LABELS[metric])} per wall-hour by codepath">',
        f'<text x="{label_w}" y="16">{e(METRIC_LABELS[metric])} per measured wall-hour '
        f"({e(unit)}); whiskers: each side's 95% interval</text>",
    ]
    for i, (name, m) in enumerate(rows):
        y0 = top + i * row_h
        parts.append(f'<text x="4" y="{y0 + bar_h + 4}">{e(name)}</text>')
        for j, side in enumerate(("baseline", "candidate")):
            v = m.get(side) or 0.0
            y = y0 + j * (bar_h + 2)
            w = max(0.0, v / scale * plot_w)
            parts.append(
                f'<rect class="bar" data-side="{side}" data-codepath="{e(name)}" '
                f'x="{label_w}" y="{y}" width="{w:.2f}" height="{bar_h}" '
                f'fill="{COLORS[side]}"><title>{e(side)} {e(name)}: {e(fmt(v))} '
                f"{e(unit)}</title></rect>"
            )
            ci = m.get(f"{side}_ci95")
            if ci and None not in ci:
                x1, x2 = label_w + ci[0] / scale * plot_w, label_w + ci[1] / scale * plot_w
                ym = y + bar_h / 2
                parts.append(
                    f'<line class="whisker" x1="{x1:.2f}" x2="{x2:.2f}" y1="{ym}" y2="{ym}" '
                    f'stroke="#222" stroke-width="1.2"/>'
                    f'<line x1="{x1:.2f}" x2="{x1:.2f}" y1="{ym - 4}" y2="{ym + 4}" stroke="#222"/>'
                    f'<line x1="{x2:.2f}" x2="{x2:.2f}" y1="{ym - 4}" y2="{ym + 4}" stroke="#222"/>'
                )
            parts.append(f'<text x="{label_w + w + 6:.2f}" y="{y + bar_h - 3}">{e(fmt(v))}</text>')
        parts.append(f'<text x="{width - 290}" y="{y0 + bar_h + 4}">{e(change_text(m))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _axis(x0: float, x1: float, y: float, lo: float, hi: float, unit: str) -> str:
    ticks = []
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        x = x0 + (x1 - x0) * k / 4
        ticks.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 4}" stroke="#999"/>'
            f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">{e(fmt(v, 3))}</text>'
        )
    return (
        f'<line x1="{x0}" x2="{x1}" y1="{y}" y2="{y}" stroke="#999"/>'
        + "".join(ticks)
        + f'<text x="{x1}" y="{y + 30}" text-anchor="end">{e(unit)}</text>'
    )


def _episode_durations(report: Mapping[str, Any]) -> str:
    ck = report["checkpoint"]
    values = {s: list(ck[s].get("stall_values_s") or []) for s in ("baseline", "candidate")}
    if not any(values.values()):
        return ""
    width, label_w, row_h, top = 760, 150, 56, 12
    x0, x1 = label_w, width - 30
    hi = max(v for vs in values.values() for v in vs) * 1.05 or 1.0
    height = top + row_h * 2 + 40
    parts = [
        f'<svg class="chart" data-chart="episode-durations" {svg_size(width, height)} '
        'role="img" aria-label="checkpoint stall durations">'
    ]
    for r, side in enumerate(("baseline", "candidate")):
        yc = top + r * row_h + row_h / 2
        parts.append(f'<text x="4" y="{yc + 4}">{e(_side_label(report, side))}</text>')
        vs = values[side]
        for i, v in enumerate(vs):
            # deterministic jitter so equal durations stay visible
            jitter = ((i * 7919) % 17 - 8) * 1.6
            x = x0 + v / hi * (x1 - x0)
            parts.append(
                f'<circle class="point" data-side="{side}" cx="{x:.2f}" cy="{yc + jitter:.2f}" '
                f'r="3" fill="{COLORS[side]}" fill-opacity="0.6"><title>{e(fmt(v))} s</title>'
                "</circle>"
            )
        q = ck[side].get("stall_s")
        if q:
            for key, cls, style in (
                ("p50", "median", 'stroke-width="2"'),
                ("p95", "p95", 'stroke-width="1" stroke-dasharray="3 2"'),
            ):
                x = x0 + q[key] / hi * (x1 - x0)
                parts.append(
                    f'<line class="{cls}" data-side="{side}" x1="{x:.2f}" x2="{x:.2f}" '
                    f'y1="{yc - 18}" y2="{yc + 18}" stroke="#111" {style}/>'
                )
    parts.append(_axis(x0, x1, top + row_h * 2 + 4, 0.0, hi, "stall per checkpoint, s"))
    parts.append("</svg>")
    return "".join(parts)


STALL_BINS = 24


def _stall_histogram(report: Mapping[str, Any]) -> str:
    """Both sides' stall distributions as back-to-back histograms on one axis (baseline
    above, candidate below): the shape the strip plot's points only suggest. Each bin is
    a `<rect class="bin" data-side=... data-count=N>`."""
    ck = report["checkpoint"]
    values = {s: list(ck[s].get("stall_values_s") or []) for s in ("baseline", "candidate")}
    if not all(values.values()):
        return ""
    width, label_w, half, top = 960, 150, 70, 8
    x0, x1 = label_w, width - 30
    hi = max(v for vs in values.values() for v in vs) * 1.05 or 1.0
    step = hi / STALL_BINS
    counts = {
        side: [
            sum(1 for v in vs if min(int(v / step), STALL_BINS - 1) == b) for b in range(STALL_BINS)
        ]
        for side, vs in values.items()
    }
    peak = max(max(c) for c in counts.values()) or 1
    mid = top + half
    height = top + 2 * half + 40
    bin_w = (x1 - x0) / STALL_BINS
    parts = [
        f'<svg class="chart" data-chart="stall-histogram" {svg_size(width, height)} role="img" '
        'aria-label="checkpoint stall distributions, baseline above, candidate below">',
        f'<line x1="{x0}" x2="{x1}" y1="{mid}" y2="{mid}" stroke="#999"/>',
    ]
    for r, side in enumerate(("baseline", "candidate")):
        parts.append(
            f'<text x="4" y="{mid + (-half / 2 if r == 0 else half / 2) + 4:.1f}">'
            f"{e(_side_label(report, side))}</text>"
        )
        for b, n in enumerate(counts[side]):
            if not n:
                continue
            h = n / peak * (half - 4)
            y = mid - h if r == 0 else mid
            parts.append(
                f'<rect class="bin" data-side="{side}" data-count="{n}" '
                f'x="{x0 + b * bin_w + 1:.1f}" y="{y:.1f}" width="{bin_w - 2:.1f}" '
                f'height="{h:.1f}" fill="{COLORS[side]}"><title>{e(side)}: {n} checkpoint(s) '
                f"of {e(fmt(b * step, 3))}-{e(fmt((b + 1) * step, 3))} s</title></rect>"
            )
    parts.append(_axis(x0, x1, top + 2 * half + 4, 0.0, hi, "stall per checkpoint, s"))
    parts.append("</svg>")
    return "".join(parts)


def _timeline(report: Mapping[str, Any]) -> str:
    series = [
        (side, run["run"], run["windows"])
        for side in ("baseline", "candidate")
        for run in report["timeline"][side]
        if run["windows"]
    ]
    if not series:
        return ""
    width, height, left, right, top, bottom = 760, 260, 60, 20, 14, 46
    x_hi = max(p["t_s"] + p["wall_s"] for _s, _r, ws in series for p in ws) or 1.0
    ys = [
        p["serialization_cpu_s"] / p["wall_s"] for _s, _r, ws in series for p in ws if p["wall_s"]
    ]
    y_hi = (max(ys) if ys else 0.0) * 1.1 or 1.0
    parts = [
        f'<svg class="chart" data-chart="window-timeline" {svg_size(width, height)} '
        'role="img" aria-label="serialization CPU per window">'
    ]

    def xy(p: Mapping[str, Any]) -> tuple[float, float]:
        x = left + (p["t_s"] + p["wall_s"] / 2) / x_hi * (width - left - right)
        rate = p["serialization_cpu_s"] / p["wall_s"] if p["wall_s"] else 0.0
        return x, height - bottom - rate / y_hi * (height - top - bottom)

    for k in range(5):
        v = y_hi * k / 4
        y = height - bottom - v / y_hi * (height - top - bottom)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{e(fmt(v, 2))}</text>'
        )
    for side, run, ws in series:
        pts = [xy(p) for p in ws]
        dash = "" if side == "baseline" else ' stroke-dasharray="5 3"'
        parts.append(
            f'<polyline class="series" data-side="{side}" data-run="{e(run)}" fill="none" '
            f'stroke="{COLORS[side]}" stroke-width="1.5"{dash} '
            f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}"/>'
        )
        for (x, y), p in zip(pts, ws, strict=True):
            parts.append(
                f'<circle class="point" data-side="{side}" data-run="{e(run)}" cx="{x:.1f}" '
                f'cy="{y:.1f}" r="2.5" fill="{COLORS[side]}"><title>{e(run)} t={e(fmt(p["t_s"]))}'
                f" s: {e(fmt(p['serialization_cpu_s']))} CPU-s</title></circle>"
            )
    parts.append(_axis(left, width - right, height - bottom, 0.0, x_hi, "seconds since run start"))
    parts.append(
        f'<text x="{left}" y="{top - 2}">serialization CPU-s per window-second '
        "(measured: py-spy + procfs)</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


# --------------------------------------------------------------------------- tables


def _change_cell(m: Mapping[str, Any]) -> str:
    cls = "sig" if m.get("significant") else "ns"
    return f'<td class="{cls}">{e(change_text(m))}</td>'


def _metric_table(rows: Sequence[tuple[str, str, Mapping[str, Any]]], unit_note: str) -> str:
    out = [
        "<table><tr><th>codepath</th><th>metric</th><th>baseline</th><th>candidate</th>"
        "<th>change [95% CI]</th><th>p (Holm)</th><th>n</th><th>source</th></tr>"
    ]
    for name, label, m in rows:
        src = m.get("source") or {}
        src_text = (
            src.get("baseline")
            if src.get("baseline") == src.get("candidate")
            else f"baseline {src.get('baseline')}; candidate {src.get('candidate')}"
        )
        out.append(
            f"<tr><td>{e(name)}</td><td>{e(label)}</td><td class=num>{e(fmt(m['baseline']))}</td>"
            f"<td class=num>{e(fmt(m['candidate']))}</td>{_change_cell(m)}"
            f"<td class=num>{e(p_text(m))}</td><td class=num>{e(n_text(m))}</td>"
            f'<td class="src">{e(src_text)}</td></tr>'
        )
    out.append(f'</table><p class="src">{e(unit_note)}</p>')
    return "".join(out)


def _sides(report: Mapping[str, Any]) -> str:
    rows = []
    for side in ("baseline", "candidate"):
        s = report[side]
        rows.append(
            [
                side,
                ", ".join(s["runs"]),
                s["windows"],
                s["blocks"],
                fmt(s["wall_s"]),
                s["episodes"] if s["episodes"] is not None else s["episodes_note"],
                s["checkpoint_codepath"] or "-",
                fmt(s["durable"]),
                s["energy_source"],
                s["gpu_source"],
            ]
        )
    head = [
        "side",
        "runs",
        "windows",
        "runs with windows",
        "measured s",
        "episodes",
        "checkpoints via",
        "durable",
        "energy source",
        "GPU source",
    ]
    hosts = []
    for side in ("baseline", "candidate"):
        for h in report[side]["hosts"]:
            host = h["host"]
            gpus = host.get("gpus") or []
            names = ", ".join(str(g.get("name")) for g in gpus if isinstance(g, dict)) or "none"
            hosts.append(
                [
                    side,
                    h["run"],
                    host.get("hostname"),
                    host.get("cpu_model"),
                    host.get("sockets"),
                    names,
                    host.get("kernel"),
                    ", ".join(report[side]["serwatt_version"]),
                    ", ".join(fmt(r) for r in report[side]["rate_hz"]),
                ]
            )
    return html_table(head, rows, numeric_from=2) + html_table(
        ["side", "run", "hostname", "CPU", "sockets", "GPUs", "kernel", "serwatt", "rate Hz"],
        hosts,
        numeric_from=99,
    )


def _checkpoint(report: Mapping[str, Any]) -> str:
    ck = report["checkpoint"]
    b, c = ck["baseline"], ck["candidate"]
    out = []
    if ck.get("note"):
        out.append(f'<p class="warning">{e(ck["note"])}</p>')

    def q(side: Mapping[str, Any], key: str) -> str:
        s = side.get("stall_s")
        return fmt(s[key]) if s else "-"

    rows = [
        ["checkpoints through", b["codepath"] or "-", c["codepath"] or "-"],
        ["chosen by", b["chosen_by"], c["chosen_by"]],
        ["episodes", b["episodes"], c["episodes"]],
        ["stall p50 s", q(b, "p50"), q(c, "p50")],
        ["stall p95 s", q(b, "p95"), q(c, "p95")],
        ["stall max s", q(b, "max"), q(c, "max")],
        *(
            [
                [
                    "+ wait after the call s (mean)",
                    fmt(b["wait_s_per_checkpoint"]),
                    fmt(c["wait_s_per_checkpoint"]),
                ],
                [
                    "= stall + wait s (mean)",
                    fmt(b["stall_and_wait_s_per_checkpoint"]),
                    fmt(c["stall_and_wait_s_per_checkpoint"]),
                ],
            ]
            if shows_waits(b, c)
            else []
        ),
        ["CPU s per checkpoint", fmt(b["cpu_s_per_checkpoint"]), fmt(c["cpu_s_per_checkpoint"])],
        [
            "GPU-wait s per checkpoint",
            fmt(b["gpu_wait_s_per_checkpoint"]),
            fmt(c["gpu_wait_s_per_checkpoint"]),
        ],
        ["durable", fmt(b["durable"]), fmt(c["durable"])],
        ["timed to ±", fmt(b["resolution_s"]), fmt(c["resolution_s"])],
        ["source", b["source"], c["source"]],
    ]
    out.append(html_table(["", "baseline", "candidate"], rows, numeric_from=99))
    metrics = [
        (f"{b['codepath']} → {c['codepath']}", label, ck[key])
        for key, label in (("stall_s", "stall s"), ("cpu_s", "CPU s"), ("gpu_wait_s", "GPU-wait s"))
        if ck.get(key)
    ]
    if metrics:
        out.append(_metric_table(metrics, "per checkpoint episode (mean); n = episodes"))
    out += [_save_files(name, ck[name].get("save_files")) for name in ("baseline", "candidate")]
    return "".join(out)


def _save_files(name: str, files: Mapping[str, Any] | None) -> str:
    """A side's checkpoints made of several files, per file (render_text.save_file_lines)."""
    if not files:
        return ""
    rows = [
        [
            f["name"],
            f["codepath"] or "unknown",
            fmt(f["bytes_mean"]),
            fmt(f["writer_s_mean"]),
            fmt(f["resolution_s"]),
            f"{f['timed']} of {f['saves']}",
            f"{f['shared']} shared, {f['file_event_only']} file event only",
        ]
        for f in files["per_file"]
    ]
    head = ["file", "codepath", "bytes (mean)", "written in s (mean)", "± s", "timed", "untimed"]
    return (
        f"<p>{e(name)}: {e(files['saves'])} checkpoint(s) of several files, per file over its "
        f"saves</p>{html_table(head, rows, numeric_from=2)}"
        f'<p class="src">{e(files["source"])}</p>'
    )


VERDICT_METRICS = (("stall_s", "stall per checkpoint"), ("restore_s", "restore"))


def _verdict(report: Mapping[str, Any]) -> str:
    """The card the page opens with: the checkpoint stall's and restore's change, each
    drawn as its point and 95% interval on one axis of percent change around 0, with the
    words beside it. A metric the runs did not measure is left out, and said."""
    ck = report["checkpoint"]
    rows = [(key, label, ck[key]) for key, label in VERDICT_METRICS if ck.get(key)]
    head = (
        f'<h2 class="verdict-title">{e(_side_label(report, "candidate"))} against '
        f"{e(_side_label(report, 'baseline'))}</h2>"
    )
    if not rows:
        return (
            f'<section class="verdict" data-verdict="none">{head}'
            "<p>No checkpoint episodes on both sides: no stall or restore verdict.</p></section>"
        )
    width, label_w, text_w, row_h, top = 960, 170, 330, 46, 8
    x0, x1 = label_w, width - text_w
    bounds = [
        abs(v)
        for _k, _l, m in rows
        for v in [m.get("change_pct") or 0.0, *(m.get("change_pct_ci95") or [])]
        if v is not None
    ]
    span = max(bounds, default=10.0) * 1.15 or 10.0
    mid = (x0 + x1) / 2

    def x(pct: float) -> float:
        return mid + max(-span, min(span, pct)) / span * (x1 - x0) / 2

    height = top + row_h * len(rows) + 28
    parts = [
        f'<svg class="chart" data-chart="verdict" {svg_size(width, height)} role="img" '
        'aria-label="verdict: change with its 95% interval">',
        f'<line x1="{mid:.1f}" x2="{mid:.1f}" y1="0" y2="{height - 24}" stroke="#888"/>',
    ]
    for i, (key, label, m) in enumerate(rows):
        yc = top + i * row_h + row_h / 2
        sig = bool(m.get("significant"))
        colour = (
            "#1a7f37" if sig and (m.get("change_pct") or 0) < 0 else ("#c0392b" if sig else "#777")
        )
        parts.append(f'<text x="4" y="{yc + 4:.1f}" class="vlabel">{e(label)}</text>')
        ci = m.get("change_pct_ci95")
        if ci and None not in ci:
            parts.append(
                f'<rect class="interval" data-metric="{e(key)}" x="{x(ci[0]):.1f}" '
                f'y="{yc - 7:.1f}" width="{max(1.0, x(ci[1]) - x(ci[0])):.1f}" height="14" '
                f'fill="{colour}" fill-opacity="0.25"/>'
            )
        if m.get("change_pct") is not None:
            parts.append(
                f'<circle class="change" data-metric="{e(key)}" cx="{x(m["change_pct"]):.1f}" '
                f'cy="{yc:.1f}" r="6" fill="{colour}"/>'
            )
        parts.append(
            f'<text x="{x1 + 12}" y="{yc + 4:.1f}" class="vtext">{e(change_text(m))}</text>'
        )
    parts.append(
        f'<text x="{x0}" y="{height - 6}">-{fmt(span, 3)}%</text>'
        f'<text x="{mid:.1f}" y="{height - 6}" text-anchor="middle">0 (no change)</text>'
        f'<text x="{x1}" y="{height - 6}" text-anchor="end">+{fmt(span, 3)}%</text></svg>'
    )
    means = "".join(
        f"<li>{e(label)}: baseline {e(fmt(m['baseline']))} s, candidate "
        f"{e(fmt(m['candidate']))} s (mean; n = {e(n_text(m))})</li>"
        for _k, label, m in rows
    )
    missing = [label for key, label in VERDICT_METRICS if not ck.get(key)]
    note = (
        f'<p class="src">not measured in these runs: {e(", ".join(missing))}</p>' if missing else ""
    )
    return (
        f'<section class="verdict" data-verdict="{e(rows[0][0])}">{head}'
        + "".join(parts)
        + f"<ul>{means}</ul>{note}</section>"
    )


def _fold(title: str, body: str, *, key: str) -> str:
    return f'<details data-fold="{e(key)}"><summary>{e(title)}</summary>{body}</details>'


def _per_codepath(report: Mapping[str, Any]) -> str:
    """The codepath bars (CPU, energy, GPU-wait, where measured) and the metric table."""
    out = []
    for metric in ("cpu_s", "energy_j", "gpu_wait_s"):
        chart = _codepath_bars(report, metric)
        if chart:
            rows = bar_rows(report, metric)
            src = rows[0][1]["source"]
            out.append(
                f"{_legend()}{chart}"
                f'<p class="src">source: baseline {e(src["baseline"])}; '
                f"candidate {e(src['candidate'])}</p>"
            )
    table_rows = []
    for name, metrics in [*report["codepaths"].items(), ("total", report["total"])]:
        for metric, m in metrics.items():
            if m.get("baseline") or m.get("candidate"):
                table_rows.append((name, METRIC_LABELS[metric], m))
    out.append(
        _metric_table(table_rows, "per measured wall-hour; n = runs (their windows: n_within)")
    )
    return "\n".join(out)


def _directions(ways: Mapping[str, Any]) -> str:
    way_rows = direction_rows(ways)
    table = (
        html_table(DIRECTION_HEAD, way_rows, numeric_from=2)
        if way_rows
        else "<p>no serialization CPU on either side</p>"
    )
    notes = [f"{side}: {status}" for side, status in ways["sides"].items() if status != "measured"]
    return table + "\n" + f'<p class="src">source: {e("; ".join([ways["source"], *notes]))}</p>'


def _receipts(report: Mapping[str, Any]) -> str:
    out = [
        f"<p>Report receipt: <code>{e(report['receipt'])}</code> — BLAKE3 over the canonical "
        "form of every run, window and episode used; it proves the inputs are unchanged, "
        "not who wrote them.</p>"
    ]
    files = report.get("checkpoint_files")
    if files is not None:
        out.append(
            html_table(
                ["checkpoint files", "value"],
                [
                    [k, fmt(v) if not isinstance(v, (dict, list)) else str(v)]
                    for k, v in files.items()
                ],
                numeric_from=99,
            )
        )
    return "\n".join(out)


def _method(st: Mapping[str, Any]) -> str:
    return (
        "<p>"
        + e(
            f"{st['blocking']}; {st['bootstrap']}; {st['test']}; Holm within the checkpoint "
            f"comparison ({st['families']['checkpoint']} tests) and within the codepath table "
            f"({st['families']['codepaths']} tests), significant when the corrected p < "
            f"{st['alpha']:g}. "
            "A change that is not significant shows as ~ (no significant change)."
        )
        + "</p>"
    )


def page_title(report: Mapping[str, Any]) -> str:
    """What is compared, not the run ids (they are in the folded runs table)."""
    nb, nc = len(report["baseline"]["runs"]), len(report["candidate"]["runs"])
    return (
        f"serwatt A/B: {_side_label(report, 'baseline')} → {_side_label(report, 'candidate')}"
        f" ({nb} + {nc} runs)"
    )


def render_html(report: Mapping[str, Any]) -> str:
    """The whole report as one HTML document (a string): the verdict first, then the
    figures, then what backs them folded."""
    title = page_title(report)
    body = [f"<h1>{e(title)}</h1>", _verdict(report)]
    if (where := input_text(report)) is not None:
        body.append(f'<p class="input">Input: {e(where)}</p>')
    warnings = []
    for w in report["warnings"]:
        kind = (
            "Too few samples"
            if "needed_per_side" in w
            else WARNING_KINDS.get(w.get("scope"), "Warning")
        )
        warnings.append(f'<p class="warning">{kind}: {e(w["message"])}</p>')
    body += warnings

    body.append("<h2>Per codepath</h2>")
    body.append(_per_codepath(report))
    ways = report.get("direction")
    if ways is not None:
        body.append("<h2>Encode and decode per codepath</h2>")
        body.append(_directions(ways))

    body.append(
        f"<h2>Stall per checkpoint, both sides</h2>{_legend()}{_episode_durations(report)}"
        '<p class="src">each point is one checkpoint episode of the training thread '
        "(measured: py-spy); solid line p50, dashed p95</p>"
        f"{_stall_histogram(report)}"
    )
    labels = {side: _side_label(report, side) for side in ("baseline", "candidate")}
    flame, scripted = flame_diff(report, labels)
    body.append(f"<h2>Where the CPU went: differential flame graph</h2>{flame}")
    body.append("<h2>Checkpoint cost</h2>")
    body.append(_checkpoint(report))
    body.append(f"<h2>Serialization CPU per window, over time</h2>{_legend()}{_timeline(report)}")

    caveats = "".join(f'<p class="caveat">Caveat: {e(c)}</p>' for c in report["caveats"])
    body.append(
        _fold(f"Caveats ({len(report['caveats'])})", caveats or "<p>None.</p>", key="caveats")
    )
    body.append(_fold("Runs, hosts and sources", _sides(report), key="runs"))
    body.append(
        _fold(
            "Estimated cluster projection",
            projection_html(report.get("projection")),
            key="projection",
        )
    )
    body.append(_fold("Receipts", _receipts(report), key="receipts"))
    method = (
        f'<p class="mono">schema {e(report["schema"])} · receipt {e(report["receipt"])}</p>'
        + _method(report["statistics"])
    )
    body.append(_fold("Method", method, key="method"))
    # the page is script-free unless it draws the flame graph; then the renderer is
    # inlined and the CSP allows it and nothing from the network
    csp = f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' if scripted else ""
    scripts = renderer_scripts() + FLAME_DIFF_SCRIPT if scripted else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{csp}'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + scripts
        + "</body></html>\n"
    )
