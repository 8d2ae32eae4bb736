"""The report's `stacks` section: each side's classified stacks (profiler/records/
stack_rows.py), summed over its runs and divided by how many runs recorded them, so two
sides with different run counts compare; what the A/B page draws as a differential
flame graph (baseline -> candidate, profiler/flame.py diff_tree).

A stack is its frames as the flame graph labels them (function (dir/file:line)), root
first, and its codepath; directions are summed. At most MAX_REPORT_STACKS stacks, the
largest (both sides' CPU together); the rest are summed into one pseudo-stack per
codepath, so the widths still add up to each side's CPU. Runs recorded without stacks
are named, with why, and left out of the mean: `serwatt profile` records them from
schema 8 on; the daemon does not fold stacks (yet); Prometheus holds none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serwatt.profiler.flame import frame_label
from serwatt.profiler.records.stack_rows import VERSION
from serwatt.profiler.report.inputs import RunInput

MAX_REPORT_STACKS = 3000
SMALLER = "(smaller stacks, not drawn one by one)"


def _side(runs: Sequence[RunInput]) -> tuple[dict[tuple[tuple[str, ...], str], float], dict]:
    """({(labels root first, codepath): CPU-s per run}, the side's summary)."""
    recorded = [r for r in runs if r.stacks is not None]
    totals: dict[tuple[tuple[str, ...], str], float] = {}
    for r in recorded:
        for frames, cp, _d, _samples, cpu_s in r.stacks or ():
            if cpu_s > 0:
                key = (tuple(frame_label(f) for f in reversed(frames)), cp)
                totals[key] = totals.get(key, 0.0) + cpu_s
    n = len(recorded)
    per_run = {k: v / n for k, v in totals.items()} if n else {}
    summary = {
        "runs": n,
        "without": [r.run_id for r in runs if r.stacks is None],
        "merged": sum(r.stacks_merged for r in recorded),
        "cpu_s_per_run": round(sum(per_run.values()), 6),
    }
    return per_run, summary


def stacks_section(baseline: Sequence[RunInput], candidate: Sequence[RunInput]) -> dict[str, Any]:
    b, b_summary = _side(baseline)
    c, c_summary = _side(candidate)
    keys = sorted(set(b) | set(c), key=lambda k: (-(b.get(k, 0.0) + c.get(k, 0.0)), k))

    def row(frames: list[str], cp: str, in_b: float, in_c: float) -> dict[str, Any]:
        return {
            "frames": frames,
            "codepath": cp,
            "baseline": round(in_b, 6),
            "candidate": round(in_c, 6),
        }

    rows = [row(list(k[0]), k[1], b.get(k, 0.0), c.get(k, 0.0)) for k in keys[:MAX_REPORT_STACKS]]
    rest: dict[str, list[float]] = {}
    for k in keys[MAX_REPORT_STACKS:]:
        sums = rest.setdefault(k[1], [0.0, 0.0])
        sums[0] += b.get(k, 0.0)
        sums[1] += c.get(k, 0.0)
    rows += [row([SMALLER], cp, sb, sc) for cp, (sb, sc) in sorted(rest.items())]
    return {
        "unit": "CPU-s per run",
        # why a run named in `without` has none (the record does not say which)
        "without_why": f"recorded before schema {VERSION}, or by a sampler that folds none",
        "baseline": b_summary,
        "candidate": c_summary,
        "not_drawn_one_by_one": max(0, len(keys) - MAX_REPORT_STACKS),
        "stacks": rows,
    }
