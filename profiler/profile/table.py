"""The terminal table of a profile document (serwatt.profile/1).

A target's command line, its Python's version, GPU names and error texts come from
outside the program: every line is printed through escape_text, so an argv of
`exec -a $'\\x1b]0;...'` shows as that text and does not retitle the terminal."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.terminal_escape import escape_text


def _pct(v: float) -> str:
    return f"{100 * v:5.1f}%"


# --by process: at most this many process rows under a codepath (the most CPU first)
MAX_PROCESS_ROWS = 10
COMMAND_SHOWN = 60


def sampled_nothing(doc: Mapping[str, Any]) -> bool:
    """No sample and no CPU: every figure of the table would be a zero, and a share n/a."""
    return not doc["samples"] and not doc["cpu_s"]


def _zero_row(row: Mapping[str, Any]) -> bool:
    return not any(row.get(k) for k in ("samples", "cpu_s", "wall_s", "energy_j", "gpu_wait_s"))


def render_table(
    doc: Mapping[str, Any], *, by_process: bool = False, hide_zero: bool = False
) -> str:
    """The human table: one row per codepath (with `by_process`, a row per process under
    each; with `hide_zero`, none for a codepath whose every figure is zero), then the
    sampler's own failures. A run that sampled nothing, too little for its share
    intervals, or on a node so contended that its shares may be biased beyond them, says
    so in its first lines."""
    cps = doc["codepaths"]
    no_cpu = not doc["cpu_s"]  # a share of 0 CPU-s is n/a, not other's 100%
    show_energy = any(cps[cp].get("energy_j") is not None for cp in cps)
    show_wait = any(cps[cp].get("gpu_wait_s") is not None for cp in cps)
    show_gpu_j = any(cps[cp].get("gpu_idle_j") is not None for cp in cps)
    energy_src = (doc.get("energy") or {}).get("source") or "?"
    # wall time summed over threads can exceed the run's length: thread-s says so, and the
    # main thread's wall stands beside it
    head = f"{'codepath':<12}{'samples':>9}{'CPU-s':>10}  {'share [95% CI]':<24}{'thread-s':>9}"
    head += f"{'main s':>9}{'low-conf':>10}"
    if show_energy:
        head += f"{'J (' + energy_src + ')':>12}"
    if show_wait:
        head += f"{'GPU-wait s':>12}"
    if show_gpu_j:
        head += f"{'GPU idle J':>12}"
    head += f"{'encode CPU-s':>14}{'decode CPU-s':>14}"
    lines = []
    if sampled_nothing(doc):
        why = [t["error"] for t in doc.get("targets", []) if t.get("error")]
        lines.append(
            f"serwatt profile: NOTHING WAS SAMPLED: 0 samples in {doc['duration_s']:.1f} s"
            + (f" ({why[0]})" if why else "")
            + "; the figures below are empty"
        )
    else:
        if doc.get("share_ci95_too_short"):
            lines.append(
                f"serwatt profile: TOO SHORT FOR ITS SHARE INTERVALS: {doc['share_ci95_too_short']}"
            )
        if doc.get("share_ci95_contended"):
            lines.append(
                f"serwatt profile: CONTENDED, SHARES MAY BE OFF BEYOND THEIR INTERVALS: "
                f"{doc['share_ci95_contended']}"
            )
    lines += [
        f"serwatt profile: pid {doc['target']['pid']} ({doc['target']['command'][:60]}), "
        f"python {doc['target']['python'] or '?'}, {doc['duration_s']:.1f} s at "
        f"{_rates(doc)}, {len(doc.get('targets', []))} process(es)",
        head,
    ]
    hidden = [cp for cp in CODEPATHS if hide_zero and _zero_row(cps[cp])]
    for cp in CODEPATHS:
        if cp in hidden:
            continue
        row = cps[cp]
        ci = row["share_ci95"]
        ci_s = f"[{_pct(ci[0]).strip()}, {_pct(ci[1]).strip()}]" if ci else "[n/a]"
        share = "  n/a" if no_cpu or row["share"] is None else _pct(row["share"])
        line = (
            f"{cp:<12}{row['samples']:>9}{row['cpu_s']:>10.2f}  "
            f"{share + ' ' + ci_s:<24}{row['wall_s']:>9.2f}"
            f"{row.get('main_thread_wall_s', 0.0):>9.2f}{_pct(row['low_confidence_share']):>10}"
        )
        if show_energy:
            e = row.get("energy_j")
            line += f"{e:>12.1f}" if e is not None else f"{'-':>12}"
        if show_wait:
            w = row.get("gpu_wait_s")
            line += f"{w:>12.2f}" if w is not None else f"{'-':>12}"
        if show_gpu_j:
            gj = row.get("gpu_idle_j")
            line += f"{gj:>12.1f}" if gj is not None else f"{'-':>12}"
        way = row.get("direction") or {}
        for d in ("encode", "decode"):
            cpu = (way.get(d) or {}).get("cpu_s")
            line += f"{cpu:>14.2f}" if cpu is not None else f"{'-':>14}"
        lines.append(line)
        if by_process:
            lines.extend(process_lines(row, doc["cpu_s"]))
    if hidden:
        lines.append(f"  (all-zero codepaths not shown: {', '.join(hidden)})")
    lines.extend(unmapped_lines(doc))
    total_share = "n/a" if no_cpu else "100.0%"
    lines.append(f"{'total':<12}{doc['samples']:>9}{doc['cpu_s']:>10.2f}  {total_share:<24}")
    lines.extend(episode_lines(doc))
    s = doc["sampler"]
    lines.append(
        f"CPU-s: measured per-thread CPU (procfs) spread over each thread's samples; "
        f"thread-s: wall time summed over threads; main s: the main process's main thread; "
        f"share 95% CI: exact on the samples' effective count (batch means over time); "
        f"encode / decode CPU-s: the codepath's CPU "
        f"whose stack names the direction (the rest is unknown); low-confidence CPU: "
        f"{_pct(doc['low_confidence_cpu_share']).strip()} of total"
    )
    fails = ", ".join(f"{k}={v}" for k, v in s["window_failures"].items()) or "none"
    lines.append(
        f"sampler: py-spy samples {s['pyspy_samples']}, errors {s['pyspy_errors']}, "
        f"partial stacks {s['partial_stacks']}, max lag {s['behind_s']:.2f} s, "
        f"windows {s['windows']}, window failures: {fails}"
    )
    lines.append(_budget_line(doc.get("cpu_budget") or {}))
    energy = doc.get("energy") or {}
    if energy.get("source") == "unavailable":
        lines.append(f"energy: unavailable ({energy.get('reason')})")
    else:
        lines.extend(energy_lines(doc))
    for t in doc.get("targets", []):
        if t.get("windows_lost"):
            # sampled, then a window's samples lost as it exited: not "never sampled"
            lines.append(f"target {t['pid']}: {t['windows_lost']} window(s) lost: {t['error']}")
        elif t.get("error"):
            lines.append(f"target {t['pid']}: not sampled: {t['error']}")
    return "\n".join(escape_text(line, backslash=False) for line in lines)


def process_lines(row: Mapping[str, Any], total_cpu_s: float) -> list[str]:
    """A codepath's process rows: pid and role, figures, then the command (escaped here, so
    a backslash in an argv shows doubled and cannot pose as an escape)."""
    procs = row.get("processes") or []
    out = []
    for p in procs[:MAX_PROCESS_ROWS]:
        share = p["cpu_s"] / total_cpu_s if total_cpu_s > 0 else 0.0
        cmd = escape_text(p["command"][: COMMAND_SHOWN + 1])  # a huge argv is not escaped whole
        cmd = cmd if len(cmd) <= COMMAND_SHOWN else cmd[: COMMAND_SHOWN - 3] + "..."
        # the pid where the codepath's name is, the role and command after the figures
        out.append(
            f"  {p['pid']:<10}{p['samples']:>9}{p['cpu_s']:>10.2f}  {_pct(share):<24}"
            f"{p['wall_s']:>9.2f}{p['main_thread_wall_s']:>9.2f}  {p['role']} {cmd}"
        )
    if len(procs) > MAX_PROCESS_ROWS:
        out.append(f"  (+{len(procs) - MAX_PROCESS_ROWS} more process(es) in this codepath)")
    return out


def unmapped_lines(doc: Mapping[str, Any], shown: int = 5) -> list[str]:
    """The `unmapped threads` row under `other` (its CPU is in other's) and its threads."""
    u = doc.get("unmapped_threads") or {}
    if not u.get("cpu_s"):
        return []
    out = [f"{' unmapped':<12}{'-':>9}{u['cpu_s']:>10.2f}  {_pct(u['share']) + ' (in other)':<24}"]
    threads = u.get("threads") or []
    named = ", ".join(f"{t['tid']} {t['name']} {t['cpu_s']:.2f}" for t in threads[:shown])
    more = u.get("threads_total", len(threads)) - min(len(threads), shown)
    if named:
        out.append(f"  unmapped threads (tid name CPU-s): {named}" + (f", +{more}" if more else ""))
    if u.get("exited_cpu_s"):
        out.append(f"  exited threads without samples: {u['exited_cpu_s']:.2f} CPU-s")
    return out


def episode_lines(doc: Mapping[str, Any]) -> list[str]:
    """Per codepath with episodes: how many, and how long the thread was blocked in them."""
    rows = [(cp, doc["codepaths"][cp]) for cp in CODEPATHS]
    rows = [(cp, r) for cp, r in rows if r.get("episodes")]
    if not rows:
        return ["episodes: none (no thread stayed in a serialization codepath for 2 samples)"]
    out = [f"{'episodes':<12}{'count':>9}{'p50 s':>10}{'p95 s':>10}{'max s':>10}  durable"]
    by_cp: dict[str, list[bool]] = {}
    for ep in doc.get("episodes", []):
        by_cp.setdefault(ep["codepath"], []).append(bool(ep["durable"]))
    for cp, r in rows:
        w = r["episode_wall_s"]
        durable = by_cp.get(cp, [])
        out.append(
            f"{cp:<12}{r['episodes']:>9}{w['p50']:>10.3f}{w['p95']:>10.3f}{w['max']:>10.3f}  "
            f"{sum(durable)}/{len(durable)}"
        )
    summary = doc.get("episodes_summary") or {}
    if summary.get("dropped"):
        out.append(
            f"  ({summary['dropped']} episode(s) beyond the first {summary['bound']} not listed)"
        )
    return out


def energy_lines(doc: Mapping[str, Any]) -> list[str]:
    """The energy and GPU footer of the table: totals, source, residual, GPUs."""
    e = doc.get("energy") or {}
    out: list[str] = []
    if e.get("package_j") is not None:
        label = "measured (RAPL)" if e["source"] == "rapl" else "ESTIMATED (model, not measured)"
        out.append(
            f"energy: {label}: package {e['package_j']:.1f} J, to codepaths "
            f"{e.get('attributed_j') or 0.0:.1f} J, "
            f"unattributed {e.get('unattributed_j') or 0.0:.1f} J"
        )
        parts = e.get("unattributed_parts_j")
        if parts:
            out.append(
                "  unattributed = "
                + ", ".join(f"{k.replace('_', ' ')} {v:.1f} J" for k, v in parts.items())
            )
        if e["source"] == "model":
            out.append(f"  model: {e.get('model')}; why: {e.get('reason')}")
        for note in e.get("notes") or []:
            out.append(f"  note: {note}")
    nv = doc.get("nvml")
    if nv and not nv.get("up"):
        out.append(f"gpus: unavailable ({nv.get('reason')}: {nv.get('detail')})")
    for g in doc.get("gpus") or []:
        if not g.get("up") and not g.get("covered_s"):
            out.append(f"gpu {g['index']} {g.get('name')}: unavailable ({g.get('reason')})")
            continue
        used = "used by target" if g.get("used_by_target") else "not used by target"
        wait = g.get("gpu_wait_s")
        wait_s = f", GPU-wait {sum(wait.values()):.2f} s" if wait else ""
        ej = g.get("energy_j")
        e_s = f", energy {ej:.1f} J ({g.get('energy_source')})" if ej is not None else ""
        lost = f" [{g.get('reason')}]" if not g.get("up") else ""
        out.append(
            f"gpu {g['index']} {g.get('name')}{lost}: {used}, idle {g.get('idle_s') or 0:.2f} s "
            f"of {g.get('covered_s') or 0:.2f} s with NVML data{e_s}{wait_s}"
        )
    return out


def _budget_line(b: Mapping[str, Any]) -> str:
    """The CPU budget, the rates it set, and serwatt's own CPU with its source."""
    own = b.get("own_cpu_cores")
    used = (
        f"serwatt used {own:.3f} cores ({b.get('own_cpu_source')})"
        if own is not None
        else f"serwatt's own CPU {b.get('own_cpu_source')}"
    )
    if b.get("budget_cores") is None:
        return f"cpu budget: none (--cpu-budget off); {used}"
    rates = b.get("rates_hz") or []
    ran = f"windows at {_span(rates)} Hz" if rates else "no slot observed"
    line = f"cpu budget: {b['budget_cores']:g} cores (--cpu-budget), {ran}; {used}"
    if b.get("over_budget"):
        line += f"; not met: {b['over_budget']}"
    return line


def _rates(doc: Mapping[str, Any]) -> str:
    """The rate the windows ran at: --rate, or the range the CPU budget set."""
    rates = (doc.get("cpu_budget") or {}).get("rates_hz") or []
    if not rates or rates == [doc["rate_hz"]]:
        return f"{doc['rate_hz']:g} Hz"
    return f"{_span(rates)} Hz (the CPU budget's; --rate {doc['rate_hz']:g})"


def _span(rates: list[float]) -> str:
    """Sorted rates as `lo-hi`, or the one rate."""
    return f"{rates[0]:g}-{rates[-1]:g}" if len(rates) > 1 else f"{rates[0]:g}"
