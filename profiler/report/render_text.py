"""The report as a terminal table, readable in 100 columns.

By default the first screen only (`summary_lines`): who was compared, the headline, one
benchstat-like table (per work first, per wall-hour marked) and its footnotes; `--full`
(render_text(full=True)) adds every detail below it.

A change that is not significant (Holm-corrected p >= 0.05) prints as `~  no significant
change`, never as a percentage or a direction. Codepaths that are zero on both sides are
left out of the table (the JSON keeps them) and the table says how many.

Much of a report comes from outside the program (a record's host fields and run ids,
Prometheus labels, the cluster file): every line is printed through escape_text, so no
control character or bidi override reaches the terminal raw.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from serwatt.profiler.terminal_escape import escape_text

WIDTH = 100
METRIC_LABELS = {"cpu_s": "CPU s", "energy_j": "energy J", "gpu_wait_s": "GPU-wait s"}


def fmt(x: Any, digits: int = 3) -> str:
    """A number in at most `digits` significant digits (3: what the resampling supports);
    '-' for None. Large numbers are rounded, not cut: 64468 prints as 64500."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)):
        return "–".join(fmt(v, digits) for v in x)
    x = float(x)
    if x != 0 and (abs(x) >= 1e6 or abs(x) < 10 ** -(digits - 1)):
        return f"{x:.{digits - 1}e}"
    if abs(x) >= 10**digits:
        return f"{float(f'{x:.{digits}g}'):.0f}"
    return f"{x:.{digits}g}"


def _pct_bound(b: float | None) -> str:
    return "∞" if b is None else f"{float(f'{b:.3g}'):+g}"


def change_text(m: Mapping[str, Any], words: bool = True) -> str:
    """'-12.3% [-15, -9.1]' when significant, '~ [-20, +8.3]' when not (the interval is
    always shown where there is one; 'no CI' where the counts allow none)."""
    if m.get("p") is None:
        return str(m.get("display") or "not tested")
    ci = m.get("change_pct_ci95")
    interval = f" [{_pct_bound(ci[0])}, {_pct_bound(ci[1])}]" if ci else " no CI"
    if not m.get("significant"):
        return "~" + interval + (" no significant change" if words else "")
    if m.get("ratio") is None:
        return "new (baseline 0)"
    shown = m["display"] + interval
    if m.get("note"):  # the test says a change, the interval still holds none
        shown += " weak"
    return shown


def p_text(m: Mapping[str, Any]) -> str:
    return fmt(m.get("p_holm"), 3) if m.get("p_holm") is not None else "-"


def n_text(m: Mapping[str, Any]) -> str:
    n = m.get("n") or [0, 0]
    return f"{n[0]}+{n[1]}"


def _wrap(prefix: str, text: str) -> list[str]:
    # escaped first, so a newline or an escape in outside text wraps as what is shown
    return textwrap.wrap(
        _shown(text), WIDTH, initial_indent=prefix, subsequent_indent=" " * len(prefix)
    ) or [prefix.rstrip()]


def _shown(text: str) -> str:
    """Text for the terminal: non-printable characters escaped; backslashes pass, since
    messages quote names already escaped (repr)."""
    return escape_text(text, backslash=False)


def _host_line(side: Mapping[str, Any]) -> str:
    hosts = side.get("hosts") or []
    if not hosts:
        return "-"
    h = hosts[0]["host"]
    gpus = h.get("gpus") or []
    gpu_text = ", ".join(sorted({str(g.get("name")) for g in gpus if isinstance(g, dict)}))
    return (
        f"{h.get('hostname')}: {h.get('cpu_model')} ({h.get('sockets')} socket(s)), "
        f"GPUs: {gpu_text + f' x{len(gpus)}' if gpus else 'none'}; kernel {h.get('kernel')}"
    )


def _table(rows: Sequence[Sequence[str]], widths: Sequence[int]) -> list[str]:
    out = []
    for row in rows:
        cells = [
            c.ljust(w) if i < len(widths) - 1 else c
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append(" ".join(cells).rstrip())
    return out


def _side_line(name: str, s: Mapping[str, Any]) -> list[str]:
    episodes = s["episodes_note"] if s.get("episodes") is None else f"{s['episodes']} episodes"
    ck = s.get("checkpoint_codepath")
    durable = s.get("durable") or "-"
    text = (
        f"{', '.join(s['runs'])}: {s['windows']} windows in {s['blocks']} run(s), "
        f"{fmt(s['wall_s'])} s measured; {episodes}; "
        + (f"checkpoints through {ck} ({s['checkpoints']}, {durable})" if ck else "no checkpoints")
        + (
            f", identified by {s['checkpoints_identified_by']}"
            if s.get("checkpoints_identified_by")
            else ""
        )
    )
    return _wrap(f"{name:<10}", text)


def input_text(report: Mapping[str, Any]) -> str | None:
    """Where the inputs came from (the report's `source`), in one line; None if unsaid."""
    src = report.get("source")
    if not isinstance(src, Mapping):
        return None
    if src.get("kind") == "promql":
        sides = src.get("sides") or {}
        shown = "; ".join(
            f"{name} {q.get('selector')} over {fmt(q.get('end', 0) - q.get('start', 0))} s "
            f"in {fmt(q.get('step_s'))} s steps"
            for name, q in sides.items()
        )
        return f"PromQL range queries to {src.get('url')}: {shown}"
    return f"run records in {src.get('file')}"


def render_text(report: Mapping[str, Any], full: bool = False) -> str:
    """The report as text lines of at most 100 columns (long free text wraps): by default
    one benchstat-like table with its footnotes (and the projection, when one was asked
    for); full=True adds every detail below it."""
    lines = summary_lines(report)
    if full:
        lines += ["", "DETAIL", *_detail_lines(report)]
    elif report.get("projection"):
        lines += ["", *_projection_lines(report["projection"])]
    return "\n".join(_shown(line) for line in lines) + "\n"


# (section, key, label, per work): the first screen's rows, per work first
SUMMARY_ROWS = (
    ("checkpoint", "stall_s", "stall s/checkpoint", True),
    ("checkpoint", "cpu_s", "CPU s/checkpoint", True),
    ("checkpoint", "gpu_wait_s", "GPU-wait s/checkpoint", True),
    ("checkpoint", "restore_s", "restore s", True),
    ("per_run", "cpu_s", "CPU s/run", True),
    ("total", "cpu_s", "CPU s/wall-h †", False),
    ("total", "energy_j", "energy J/wall-h †", False),
    ("total", "gpu_wait_s", "GPU-wait s/wall-h †", False),
)
P_FLOOR = 0.001  # below it p prints as "< 0.001": the resampling supports no finer


def side_spread(m: Mapping[str, Any], side: str) -> str:
    """'± 4%': the order-statistic 95% interval of the side's median over runs, as % of the
    median (its larger half); '± ∞' where the runs are too few for one (under 6)."""
    med = m.get(f"{side}_run_median") or {}
    ci, mid = med.get("ci95"), med.get("median")
    if ci is None or not mid:
        return "± ∞"
    half = max(abs(ci[1] - mid), abs(mid - ci[0])) / abs(mid) * 100.0
    return f"± {float(f'{half:.2g}'):g}%"


def p_cell(m: Mapping[str, Any]) -> str:
    p = m.get("p_holm")
    if p is None:
        return "-"
    return "< 0.001" if p < P_FLOOR else f"{p:.2g}"


def _summary_row(label: str, m: Mapping[str, Any]) -> list[str]:
    mark = " ‡" if m.get("p") is not None and m.get("can_reach_significance") is False else ""
    return [
        label,
        f"{fmt(m.get('baseline'))} {side_spread(m, 'baseline')}",
        f"{fmt(m.get('candidate'))} {side_spread(m, 'candidate')}",
        change_text(m, words=False) + mark,
        p_cell(m),
        n_text(m),
    ]


def _headline(report: Mapping[str, Any]) -> list[str]:
    ck = report["checkpoint"]
    stall = ck.get("stall_s")
    if not stall:
        return _wrap("headline  ", f"stall per checkpoint not compared: {ck.get('note') or '-'}")
    out = _wrap(
        "headline  ",
        f"stall per checkpoint {change_text(stall)} (Holm p {p_cell(stall)}, "
        f"{n_text(stall)} runs; baseline {fmt(stall['baseline'])} s, candidate "
        f"{fmt(stall['candidate'])} s)",
    )
    if (warm := warmup_text(stall)) is not None:
        out += _wrap("warm-up   ", warm)
    return out


def warmup_text(stall: Mapping[str, Any]) -> str | None:
    """The stall's change with and without each run's first checkpoint, when a side's
    stalls trend or are autocorrelated (a flagged warm-up); None when none is flagged."""
    w = stall.get("warmup")
    if w is None:
        return None
    ci = w.get("change_pct_ci95")
    shown = "-" if w.get("change_pct") is None else _pct_bound(w["change_pct"]) + "%"
    interval = f" [{_pct_bound(ci[0])}, {_pct_bound(ci[1])}]" if ci else " no CI"
    return (
        f"flagged on the {' and '.join(w['flagged'])} (a trend or autocorrelation in its "
        f"stalls): with every checkpoint the change is {change_text(stall)}; without "
        f"{w['left_out']} {shown}{interval} (raw p {fmt(w.get('p'), 2)})"
    )


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The first screen: who was compared, the headline, one table and its footnotes."""
    base, cand = report["baseline"], report["candidate"]
    lines = [f"serwatt A/B report ({report['schema']})", f"receipt   {report['receipt']}"]
    if (where := input_text(report)) is not None:
        lines += _wrap("input     ", where)
    for name, s in (("baseline", base), ("candidate", cand)):
        ck = s.get("checkpoint_codepath")
        lines += _wrap(
            f"{name:<10}",
            f"{len(s['runs'])} run(s), "
            + (f"checkpoints through {ck} ({s['checkpoints']})" if ck else "no checkpoints")
            + f", {fmt(s['wall_s'])} s measured",
        )
    lines += _headline(report)
    for c in report["caveats"]:
        lines += _wrap("  ! ", c)
    rows = [["", "baseline", "candidate", "change [95% CI]", "p", "n runs"]]
    for section, key, label, _work in SUMMARY_ROWS:
        m = (report.get(section) or {}).get(key)
        if not m or (m.get("baseline") is None and m.get("candidate") is None):
            continue
        rows.append(_summary_row(label, m))
    lines += ["", *_table(rows, [22, 16, 16, 26, 8, 6])]
    lines += _footnotes(report, rows)
    return lines


def _footnotes(report: Mapping[str, Any], rows: Sequence[Sequence[str]]) -> list[str]:
    shown = " ".join(" ".join(r) for r in rows)
    notes = [
        "± the 95% order-statistic interval of the median over runs, as % of it (∞: fewer "
        "than 6 runs); the value is the mean over runs, the one compared",
        "change: candidate/baseline − 1 by a studentized permutation test of whole runs; "
        "~ no significant change (Holm p ≥ 0.05); p Holm-corrected within the stall, the "
        "checkpoint's other rows, per run and the wall-hour table"
        + ("; p < 0.001: below what the resampling resolves" if "< 0.001" in shown else ""),
    ]
    if "†" in shown:
        notes.append(
            "† per wall-hour rate, secondary: it moves with how busy the job was, not with "
            "the work done"
        )
    if "‡" in shown:
        notes.append("‡ cannot reach p < 0.05 at its runs, whatever the data (see warnings)")
    if report["warnings"]:
        notes.append(
            f"{len(report['warnings'])} warning(s); --full, the JSON and the HTML have them, "
            "the method and every detail"
        )
    out: list[str] = []
    for note in notes:
        out += _wrap("  ", note)
    return out


def _detail_lines(report: Mapping[str, Any]) -> list[str]:
    """Everything: sides, hosts, caveats, warnings, the checkpoint and codepath tables,
    encode/decode, the projection, the .many receipt chain and the method."""
    lines: list[str] = []
    base, cand = report["baseline"], report["candidate"]
    lines += _side_line("baseline", base) + _side_line("candidate", cand)
    lines += _wrap("host      ", _host_line(base))
    if _host_line(cand) != _host_line(base):
        lines += _wrap("          ", _host_line(cand))
    lines += _wrap(
        "sources   ",
        f"CPU: measured (py-spy samples weighted by procfs thread CPU); energy: baseline "
        f"{base['energy_source']}, candidate {cand['energy_source']}; GPU-wait: baseline "
        f"{base['gpu_source']}, candidate {cand['gpu_source']}",
    )
    if report["caveats"]:
        lines += ["", "CAVEATS"]
        for c in report["caveats"]:
            lines += _wrap("  ! ", c)
    if report["warnings"]:
        lines += ["", "WARNINGS"]
        for w in report["warnings"]:
            lines += _wrap("  ! ", w["message"])

    if (order := report.get("interleaving")) is not None:
        lines += _wrap("runs      ", f"started {order['order']}: {order['kind']}")
    lines += ["", *_checkpoint_lines(report)]
    lines += ["", *_codepath_lines(report)]
    if (ways := report.get("direction")) is not None:
        lines += ["", *_direction_lines(ways)]
    if report.get("projection"):
        lines += ["", *_projection_lines(report["projection"])]
    if report.get("checkpoint_files") is not None:
        lines += ["", "CHECKPOINT FILES (.many receipt chain)"]
        for k, v in report["checkpoint_files"].items():
            lines += _wrap(f"  {k}: ", fmt(v) if not isinstance(v, (dict, list)) else str(v))
    st = report["statistics"]
    lines += [""] + _wrap(
        "method    ",
        f"{st['method']}; {st['test']}; interval: {st['interval']}; {st['blocking']}; Holm "
        f"within the stall ({st['families']['checkpoint']} test), the checkpoint's secondary "
        f"figures ({st['families'].get('checkpoint_secondary', 0)} tests), the per-run "
        f"totals ({st['families'].get('per_run', 0)} test) and the codepath table "
        f"({st['families']['codepaths']} tests), significant when corrected p < "
        f"{st['alpha']:g}; smallest attainable corrected p: "
        + ", ".join(f"{k} {fmt(v)}" for k, v in (st.get("min_attainable_p") or {}).items()),
    )
    return lines


def _checkpoint_rows(ck: Mapping[str, Any]) -> list[list[str]]:
    """The checkpoint table: counts, stall quantiles, each compared figure (the wait rows
    under the stall) and durability."""
    b, c = ck["baseline"], ck["candidate"]
    head = ["", "baseline", "candidate", "change % [95% CI]", "p Holm", "n"]

    def q(side: Mapping[str, Any]) -> str:
        s = side.get("stall_s")
        return "/".join(fmt(s[k], 3) for k in ("p50", "p95", "max")) if s else "-"

    rows = [head, _untested_row("episodes", str(b["episodes"]), str(c["episodes"]))]
    if b.get("identified_by") == "file events" or c.get("identified_by") == "file events":
        rows.append(
            _untested_row("checkpoints", str(b.get("checkpoints")), str(c.get("checkpoints")))
        )
        rows.append(
            _untested_row(
                "  files written", str(b.get("files_written")), str(c.get("files_written"))
            )
        )
        rows.append(
            _untested_row(
                "  untimed (files)", str(b.get("file_event_only")), str(c.get("file_event_only"))
            )
        )
    rows.append(_untested_row("stall p50/p95/max", q(b), q(c)))
    for key, label in (
        ("stall_s", "stall mean s"),
        ("cpu_s", "CPU s"),
        ("gpu_wait_s", "GPU-wait s"),
        ("restore_s", "restore s"),
    ):
        m = ck.get(key)
        if m:
            rows.append(
                [
                    label,
                    fmt(m["baseline"]),
                    fmt(m["candidate"]),
                    change_text(m),
                    p_text(m),
                    n_text(m),
                ]
            )
        if key == "stall_s":
            rows += _wait_rows(b, c)
    d = ck["durability"]
    rows.append(
        _untested_row(
            "durable",
            fmt(d["baseline"]),
            fmt(d["candidate"]),
            "" if d["same"] else "differs: see caveats",
        )
    )
    return rows


def _checkpoint_notes(report: Mapping[str, Any]) -> list[str]:
    """Under the table: each side's warm-up, its restores, the intervals not given and
    the durations' resolution."""
    ck = report["checkpoint"]
    b, c = ck["baseline"], ck["candidate"]
    out: list[str] = []
    for name, side in (("baseline", b), ("candidate", c)):
        out += save_file_lines(name, side.get("save_files"))
    for name, side in (("baseline", b), ("candidate", c)):
        w = side.get("warmup")
        if w:
            out += _wrap(
                "  warm-up: ",
                f"{name}: {w['skipped']} skipped; trend p {fmt(w['trend_p'])}, lag-1 "
                f"autocorrelation {fmt(w['lag1_autocorrelation'])}: "
                + (
                    "detected (the test takes whole runs, so it holds)"
                    if w.get("detected")
                    else "none detected"
                ),
            )
    restore = report.get("restore") or {}
    for name in ("baseline", "candidate"):
        r = restore.get(name) or {}
        if r.get("restores"):
            out += _wrap(
                "  restore: ",
                f"{name}: {r['restores']} ({r['file_event_only']} untimed"
                + untimed_restore_bound(r)
                + ")"
                + (f"; {r['cache']}" if r.get("cache") else "")
                + (f"; {r['note']}" if r.get("note") else ""),
            )
    for key in ("stall_s", "cpu_s", "gpu_wait_s", "restore_s"):
        m = ck.get(key)
        if m and m.get("ci_note"):
            out += _wrap("  ", f"{key}: {m['ci_note']}")
    res = b.get("resolution_s") or c.get("resolution_s")
    if res:
        out.append(f"  durations timed to ± {fmt(res, 3)} s (95%; resolution_s, docs/report.md)")
    return out


def _file_time(f: Mapping[str, Any]) -> str:
    """A file's writer time over its saves, and why the rest are not timed."""
    n = f["saves"]
    parts = []
    if f["timed"]:
        parts.append(
            f"written in {fmt(f['writer_s_mean'])} s ± {fmt(f['resolution_s'], 3)} "
            f"({f['timed']} of {n} saves timed)"
        )
    if f["shared"]:
        parts.append(f"untimed in {f['shared']} of {n}: its episode wrote other files too")
    if f["file_event_only"]:
        parts.append(f"untimed in {f['file_event_only']} of {n}: no episode (file event only)")
    if "other" in f["threads"]:
        parts.append("by another thread than the training thread")
    return "; ".join(parts)


def save_file_lines(name: str, files: Mapping[str, Any] | None) -> list[str]:
    """A side's checkpoints made of several files: each file (relative to its checkpoint
    directory, escaped), its codepath, mean bytes and writer time, largest first."""
    if not files:
        return []
    out = _wrap(
        "  files per save: ",
        f"{name}: {files['saves']} checkpoint(s) of several files, per file over its saves "
        f"({files['source']})",
    )
    for f in files["per_file"]:
        size = "-" if f["bytes_mean"] is None else f"{fmt(f['bytes_mean'])} B"
        out += _wrap(
            "    ", f"{f['name']}: {f['codepath'] or 'codepath unknown'}, {size}, {_file_time(f)}"
        )
    return out


def _checkpoint_lines(report: Mapping[str, Any]) -> list[str]:
    ck = report["checkpoint"]
    b, c = ck["baseline"], ck["candidate"]
    out = ["CHECKPOINT COST (per checkpoint, training thread)"]
    if ck.get("stall_s") is None:
        out += _wrap("  ", ck.get("note") or "not compared")
    out += _wrap(
        "  ", f"through: baseline {b['codepath'] or '-'}, candidate {c['codepath'] or '-'}"
    )
    out += ["  " + line for line in _table(_checkpoint_rows(ck), [18, 11, 11, 38, 7, 7])]
    return out + _checkpoint_notes(report)


def _wait_rows(b: Mapping[str, Any], c: Mapping[str, Any]) -> list[list[str]]:
    """The training thread's wait after a checkpoint's call (an overlapped copy's wait in the
    next optimizer.step(), or a wait for the write), and stall + wait: shown when a side
    writes in the background (not tested: the stall is the comparison; the wait is part of
    its cost)."""
    if not shows_waits(b, c):
        return []

    def seen(side: Mapping[str, Any]) -> str:
        n = side.get("waits_seen")
        return "-" if n is None else f"{n} of {side['wait_checkpoints']}"

    return [
        _untested_row(
            "  + wait after s",
            fmt(b.get("wait_s_per_checkpoint")),
            fmt(c.get("wait_s_per_checkpoint")),
            f"waits seen: {seen(b)}, {seen(c)}",
        ),
        _untested_row(
            "  = stall + wait s",
            fmt(b.get("stall_and_wait_s_per_checkpoint")),
            fmt(c.get("stall_and_wait_s_per_checkpoint")),
        ),
    ]


def shows_waits(b: Mapping[str, Any], c: Mapping[str, Any]) -> bool:
    """Whether the checkpoint table has the wait rows: a side writes in the background."""
    return b.get("waits_seen") is not None or c.get("waits_seen") is not None


def _untested_row(label: str, base: str, cand: str, note: str = "") -> list[str]:
    """A row of the checkpoint table with no test behind it: no p and no n."""
    return [label, base, cand, note, "", ""]


def untimed_restore_bound(side: Mapping[str, Any]) -> str:
    """What an untimed restore's missing samples bound, its wall time (`restore.<side>.
    file_event_only_below_s`), as the text report and the ab headline say it; "" when none."""
    bound_s = side.get("file_event_only_below_s")
    if not isinstance(bound_s, int | float) or isinstance(bound_s, bool):
        return ""
    return f", each under {fmt(bound_s * 1000.0)} ms: no sample"


def _codepath_lines(report: Mapping[str, Any]) -> list[str]:
    out = ["PER CODEPATH (per measured wall-hour; totals and per-checkpoint figures in the JSON)"]
    widths = [11, 10, 13, 13, 27, 8, 7]
    rows = [["codepath", "metric", "baseline/h", "candidate/h", "change [95% CI]", "p Holm", "n"]]
    omitted = 0
    entries = list(report["codepaths"].items()) + [("total", report["total"])]
    for name, metrics in entries:
        shown = False
        for metric, m in metrics.items():
            if not (m.get("baseline") or m.get("candidate")):
                continue
            rows.append(
                [
                    name if not shown else "",
                    METRIC_LABELS[metric],
                    fmt(m["baseline"]),
                    fmt(m["candidate"]),
                    change_text(m, words=False),
                    p_text(m),
                    n_text(m),
                ]
            )
            shown = True
        if not shown:
            omitted += 1
    out += ["  " + line for line in _table(rows, widths)]
    if omitted:
        out.append(f"  ({omitted} codepath(s) zero on both sides not shown)")
    return out


DIRECTION_HEAD = ("codepath", "direction", "baseline CPU-s", "share", "candidate CPU-s", "share")


def direction_rows(ways: Mapping[str, Any]) -> list[list[str]]:
    """The encode / decode table's rows (report["direction"]), for the text and the
    HTML: a codepath's directions with CPU on either side; `-` for a side that recorded
    no directions."""
    rows = []
    for cp, parts in ways["codepaths"].items():
        first = True
        for d, sides in parts.items():
            cells = [sides.get(k) for k in ("baseline", "candidate")]
            if not any(c and c["cpu_s"] > 0 for c in cells):
                continue
            row = [cp if first else "", d]
            for c in cells:
                row += ["-", "-"] if c is None else [fmt(c["cpu_s"]), f"{c['cpu_share']:.0%}"]
            rows.append(row)
            first = False
    return rows


def _direction_lines(ways: Mapping[str, Any]) -> list[str]:
    out = ["ENCODE / DECODE (CPU-s per side over its runs; share of the codepath's CPU)"]
    rows = direction_rows(ways)
    if rows:
        out += [
            "  " + line for line in _table([list(DIRECTION_HEAD), *rows], [11, 9, 14, 6, 15, 6])
        ]
    else:
        out.append("  no serialization CPU on either side")
    for side, status in ways["sides"].items():
        if status != "measured":
            out += _wrap(f"  {side}: ", status)
    out += _wrap("  source: ", ways["source"])
    return out


_SAVED_FIGURES = ("gpu_h", "it_mwh", "facility_mwh", "water_l")


def _saving(value: float | None, ci: Any = None, no_ci: str = "") -> str:
    """A saved figure with its interval; a negative saving is a cost and reads as one,
    with the cost's interval."""
    if value is not None and value < 0:
        ci = [None if v is None else -v for v in reversed(ci)] if ci else None
        return f"costs {fmt(-value)}" + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else no_ci)
    return fmt(value) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else no_ci)


def _projection_table(
    b: Mapping[str, Any], c: Mapping[str, Any], s: Mapping[str, Any]
) -> list[str]:
    """Both sides' projected figures and what the candidate saves, row by row."""

    def saved(name: str) -> str:
        f = s.get(name) or {}
        shown = _saving(f.get("value"), f.get("ci95"), " [no CI]")
        return ("~ " if f.get("display") == "~" else "") + shown

    def envelope(name: str) -> str:
        env = (s.get(name) or {}).get("envelope")
        if not env:
            return ""
        lo, hi = env
        if hi <= 0:  # a cost throughout, read as one
            return f"costs {fmt(-hi)} to {fmt(-lo)}"
        return f"costs {fmt(-lo)} to {fmt(hi)}" if lo < 0 else f"{fmt(lo)} to {fmt(hi)}"

    def parts(side: Mapping[str, Any]) -> str:
        lp = side["lost_parts"]
        return "/".join(fmt(lp[k]) for k in ("stall", "rework", "restart"))

    def row(label: str, key: str, saved_as: str) -> list[str]:
        return [label, fmt(b[key]), fmt(c[key]), saved(saved_as)]

    rows = [
        ["", "baseline", "candidate", "saved [sampling-only 95% CI]"],
        ["stall δ s (cluster)", fmt(b["delta_s"]), fmt(c["delta_s"]), ""],
        ["  measured on the node", fmt(b["delta_node_s"]), fmt(c["delta_node_s"]), ""],
        ["  δ set by", b["bound"], c["bound"], ""],
        ["interval τ s", fmt(b["interval_s"]), fmt(c["interval_s"]), ""],
        [
            "lost fraction",
            fmt(b["lost_fraction"]),
            fmt(c["lost_fraction"]),
            _saving(s["lost_fraction"]),
        ],
        ["  stall/rework/restart", parts(b), parts(c), ""],
        row("GPU-h / year *", "gpu_hours_per_year", "gpu_h"),
        row("IT MWh / year", "it_mwh_per_year", "it_mwh"),
        row("facility MWh / year", "facility_mwh_per_year", "facility_mwh"),
        row("water L / year", "water_l_per_year", "water_l"),
    ]
    out = ["  " + line for line in _table(rows, [24, 20, 20, 30])]
    out += _wrap(
        "  envelope: ",
        "saved with every assumption at the best and worst corner of its range, δ as "
        "measured: "
        + "; ".join(
            f"{label} {envelope(key)}"
            for label, key in (
                ("GPU-h", "gpu_h"),
                ("IT MWh", "it_mwh"),
                ("facility MWh", "facility_mwh"),
                ("water L", "water_l"),
            )
        ),
    )
    if s.get("no_change"):
        out += _wrap(
            "  ~ ",
            "the stall ratio's interval holds 1 (or there is none): no saving was measured; "
            "the figures are what the model gives at the measured means",
        )
    values = [s["lost_fraction"], *((s.get(n) or {}).get("value") for n in _SAVED_FIGURES)]
    if any(v is not None and v < 0 for v in values):
        out += _wrap(
            "  costs N: ",
            "a negative saving: the candidate costs N more a year than the baseline (the "
            "interval is the cost's)",
        )
    return out


def _projection_basis(p: Mapping[str, Any]) -> list[str]:
    """Under the table: how δ was scaled, the saved interval's basis, the sensitivity to
    each ranged input, the formulas and every input with its kind and source."""
    b, c, s = p["baseline"], p["candidate"], p["saved"]
    out: list[str] = []
    for name, side in (("baseline", b), ("candidate", c)):
        sc = side["scaling"]
        out += _wrap(
            f"  {name} δ: ",
            f"{sc['note']} {sc.get('machine_note', '')}; {sc['mode']} ({sc['mode_source']}); "
            "bandwidth bound "
            f"{fmt(sc['bandwidth_bound_s'])} s",
        )
    out += _wrap("  * ", b.get("gpu_hours_note", ""))
    out += _wrap("  saved CI: ", s.get("interval_basis", ""))
    if (own := p.get("candidate_own_model")) is not None:
        out += _wrap(
            "  model only: ",
            f"{own['note']}: {own['scaling']['mode']}, δ set by {own['bound']}, GPU-h saved "
            f"{_saving(own['saved_gpu_h'])}",
        )
    if p.get("policy_sensitivity"):
        out += _wrap(
            "  policy: ",
            "; ".join(
                f"{e['policy']}{' (configured)' if e['configured'] else ''}: GPU-h saved "
                f"{_saving(e['saved']['gpu_h'])}, facility MWh "
                f"{_saving(e['saved']['facility_mwh'])}"
                for e in p["policy_sensitivity"]
            ),
        )
    if p["sensitivity"]:
        out.append("  sensitivity (saved figure at each input's low and high, others at defaults):")
        for sens in p["sensitivity"]:
            out += _wrap(
                "    ",
                f"{sens['input']} {fmt(sens['low'])}-{fmt(sens['high'])} {sens['unit']}: "
                f"{sens['figure']} {fmt(sens['saved_at_low'])} to {fmt(sens['saved_at_high'])}"
                f" (central {fmt(sens['saved_at_central'])})",
            )
    for line in b["lines"][:3]:
        out += _wrap("  formula: ", f"{line['name']}: {line['formula']}")
    for name, i in p["inputs"].items():
        # inputs as given (a GPU count is exact), measured ones to 3 digits
        digits = 3 if i.get("kind") != "assumed" else 6
        shown = fmt(i["value"], digits) if i["value"] is not None else fmt(i["range"], digits)
        span = f"; range {fmt(i['range'], digits)}" if i.get("range") is not None else ""
        if i.get("default_at"):
            span += f", default {i['default_at']}"
        out += _wrap(
            f"  {i.get('kind', 'assumed')}: ",
            f"{name} = {shown} {i['unit']} ({i['source']}{span})",
        )
    out += _wrap("  assumed: ", f"policy = {p['policy']['text']} ({p['policy']['source']})")
    return out


def _projection_lines(p: Mapping[str, Any]) -> list[str]:
    out = [p.get("heading") or "ESTIMATED CLUSTER PROJECTION"]
    out += _wrap("  ", "every input measured or assumed, as named")
    if p.get("cluster_assumed"):
        out += _wrap("  ", p["cluster_assumed"])
    out += _wrap("  scaling: ", p["scaling"])
    for c in p.get("caveats") or []:
        out += _wrap("  ! ", c)
    b, c = p["baseline"], p["candidate"]
    if "unavailable" in b or "unavailable" in c:
        for name, side in (("baseline", b), ("candidate", c)):
            if "unavailable" in side:
                out += _wrap("  ", f"{name}: not projected: {side['unavailable']}")
        return out
    return out + _projection_table(b, c, p["saved"]) + _projection_basis(p)
