"""The A/B page's estimated cluster projection: the saved figures with their sampling
interval and the envelope of the assumptions, the sensitivity table and its tornado chart,
the policy lines and every input with its source (profiler/report/projection.py makes the
figures; this draws them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from serwatt.profiler.report.html_parts import e, html_table, svg_size
from serwatt.profiler.report.render_text import fmt


def _tornado(sens: Sequence[Mapping[str, Any]]) -> str:
    """Bars of each input's swing, relative to the central saved figure, largest on top."""
    if not sens:
        return ""
    width, label_w, row_h = 640, 140, 20
    half = (width - label_w - 20) / 2
    scale = (
        max(
            (
                abs(x[k] / x["saved_at_central"] - 1)
                for x in sens
                for k in ("saved_at_low", "saved_at_high")
                if x["saved_at_central"]
            ),
            default=1.0,
        )
        or 1.0
    )
    mid = label_w + half
    height = row_h * len(sens) + 24
    parts = [
        f'<svg class="chart" data-chart="tornado" {svg_size(width, height)} role="img" '
        f'aria-label="sensitivity of the saved figure">',
        f'<line x1="{mid:.1f}" y1="0" x2="{mid:.1f}" y2="{height - 20}" stroke="#888"/>',
    ]
    for i, x in enumerate(sens):
        y = i * row_h + 4
        parts.append(f'<text x="4" y="{y + 12}">{e(x["input"])}</text>')
        for key, fill in (("saved_at_low", "#4c78a8"), ("saved_at_high", "#f58518")):
            rel = x[key] / x["saved_at_central"] - 1 if x["saved_at_central"] else 0.0
            w = abs(rel) / scale * half
            left = mid if rel >= 0 else mid - w
            parts.append(
                f'<rect class="bar" data-input="{e(x["input"])}" data-end="{key[9:]}" '
                f'x="{left:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{fill}">'
                f"<title>{e(x['input'])} at {key[9:]}: {e(x['figure'])} {e(fmt(x[key]))}</title>"
                "</rect>"
            )
    parts.append(
        f'<text x="{mid:.1f}" y="{height - 6}" text-anchor="middle">central saved figure '
        "(blue: input at low, orange: at high)</text></svg>"
    )
    return "".join(parts)


def _projection_table(b: Mapping[str, Any], c: Mapping[str, Any], s: Mapping[str, Any]) -> str:
    """Both sides' projected figures and what the candidate saves, with their intervals."""

    def saved(name: str) -> str:
        f = s.get(name) or {}
        ci = f.get("ci95")
        shown = fmt(f.get("value")) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else " [no CI]")
        env = f.get("envelope")
        shown += f"; assumptions' envelope {fmt(env[0])} to {fmt(env[1])}" if env else ""
        return ("~ " if f.get("display") == "~" else "") + shown

    def parts(side: Mapping[str, Any]) -> str:
        lp = side["lost_parts"]
        return " / ".join(fmt(lp[k]) for k in ("stall", "rework", "restart"))

    keys = [
        ("stall δ s (cluster)", "delta_s", None),
        ("stall δ s measured on the node", "delta_node_s", None),
        ("interval τ s", "interval_s", None),
        ("lost fraction", "lost_fraction", "lost_fraction"),
        ("GPU-hours / year (mostly assumption)", "gpu_hours_per_year", "gpu_h"),
        ("IT MWh / year", "it_mwh_per_year", "it_mwh"),
        ("facility MWh / year", "facility_mwh_per_year", "facility_mwh"),
        ("water L / year", "water_l_per_year", "water_l"),
    ]
    rows = [
        [
            label,
            fmt(b[k]),
            fmt(c[k]),
            (fmt(s[sk]) if sk == "lost_fraction" else saved(sk)) if sk else "",
        ]
        for label, k, sk in keys
    ]
    rows.insert(2, ["δ set by", b["bound"], c["bound"], ""])
    rows.insert(5, ["lost: stall / rework / restart", parts(b), parts(c), ""])
    return html_table(["", "baseline", "candidate", "saved [sampling-only 95% CI]"], rows)


def _sensitivity(sensitivity: list[Mapping[str, Any]]) -> str:
    """The tornado and its table: the saved figure at each ranged input's low and high."""
    sens = [
        [
            x["input"],
            f"{fmt(x['low'])}–{fmt(x['high'])} {x['unit']}",
            x["figure"],
            fmt(x["saved_at_low"]),
            fmt(x["saved_at_central"]),
            fmt(x["saved_at_high"]),
        ]
        for x in sensitivity
    ]
    return (
        "<h3>Sensitivity: the saved figure at each input's low and high</h3>"
        + _tornado(sensitivity)
        + html_table(["input", "range", "figure", "saved at low", "central", "saved at high"], sens)
    )


def _projection_lines(b: Mapping[str, Any], c: Mapping[str, Any]) -> str:
    """Every line of each side: its formula, inputs, and what was measured and assumed."""
    lines = [
        [
            side_name,
            line["name"],
            fmt(line["value"]),
            line["formula"],
            "; ".join(f"{k}={fmt(v)}" for k, v in line["inputs"].items()),
            "; ".join(line["measured"]) or "-",
            "; ".join(line["assumed"]) or "-",
        ]
        for side_name, side in (("baseline", b), ("candidate", c))
        for line in side["lines"]
    ]
    return "<h3>Each line: formula, inputs, measured and assumed</h3>" + html_table(
        ["side", "line", "value", "formula", "inputs", "measured", "assumed"],
        lines,
        numeric_from=99,
    )


def _projection_inputs(p: Mapping[str, Any]) -> str:
    inputs = [
        [
            name,
            i.get("kind", "assumed"),
            fmt(i["value"], 6) if i["value"] is not None else fmt(i["range"], 6),
            i["unit"],
            fmt(i["range"], 6) if i.get("range") is not None else "-",
            i["source"],
        ]
        for name, i in p["inputs"].items()
    ]
    inputs.append(["policy", "assumed", p["policy"]["text"], "", "", p["policy"]["source"]])
    return "<h3>Inputs: measured, estimated, assumed</h3>" + html_table(
        ["input", "kind", "value", "unit", "range", "source"], inputs, numeric_from=99
    )


def projection_html(p: Mapping[str, Any] | None) -> str:
    if p is None:
        return "<p>No cluster projection: an estimate, made on --cluster FILE or --project.</p>"
    out = [f'<p class="warning">Scaling assumption: {e(p["scaling"])}</p>']
    out += [f'<p class="caveat">{e(c)}</p>' for c in p.get("caveats") or []]
    b, c, s = p["baseline"], p["candidate"], p.get("saved")
    if s is None:
        for name, side in (("baseline", b), ("candidate", c)):
            if "unavailable" in side:
                out.append(f"<p>{e(name)}: not projected: {e(side['unavailable'])}</p>")
    else:
        out.append(_projection_table(b, c, s))
        out.append(f'<p class="src">{e(s.get("interval_basis", ""))}</p>')
        for name, side in (("baseline", b), ("candidate", c)):
            sc = side["scaling"]
            out.append(
                f'<p class="src">{e(name)} δ: {e(sc["note"])}; {e(sc["mode"])} '
                f"({e(sc['mode_source'])}); bandwidth bound {fmt(sc['bandwidth_bound_s'])} s</p>"
            )
        out.append(_sensitivity(p["sensitivity"]))
        out.append(_projection_lines(b, c))
    out.append(_projection_inputs(p))
    return "".join(out)
