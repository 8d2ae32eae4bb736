"""The report's power warnings: whether a family of comparisons can reach significance
at all with the runs it is tested on, and how many runs would suffice.
profiler.report.build puts them first among the report's warnings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from serwatt.profiler.report import stats

if TYPE_CHECKING:
    from serwatt.profiler.report.sides import Side


def min_attainable(rows: Sequence[Mapping[str, Any]], family: int) -> float | None:
    """The smallest Holm-adjusted p any outcome could give in this family (None: untested)."""
    ns = [m["n"] for m in rows if m.get("p") is not None]
    if not ns:
        return None
    return min(stats.min_attainable_p(n[0], n[1], family) for n in ns)


def _row(scope: str, w: stats.PowerWarning, message: str) -> dict[str, Any]:
    return {
        "scope": scope,
        "family": "codepaths" if scope == "windows" else "checkpoint",
        "n": list(w.n),
        "min_attainable_p": w.min_attainable_p,
        "needed_per_side": w.needed_per_side,
        "needed_baseline": w.needed_baseline,
        "needed_candidate": w.needed_candidate,
        "message": message,
    }


def power_warnings(
    sides: tuple[Side, Side],
    n_ckpt: list[int],
    families: Mapping[str, int],
    checkpoint: Mapping[str, Any],
) -> list[dict[str, Any]]:
    out = []
    nb, nc = (len(s.blocks) for s in sides)
    w = stats.power_warning(nb, nc, stats.UNIT, family=max(1, families["codepaths"]))
    if w is not None:
        out.append(_row("windows", w, f"codepath table: {w.message}"))
    if all(s.has_episodes for s in sides):
        # The stall is tested on whole runs: more checkpoints per run do not lower its p's
        # floor, only more runs do.
        stall = checkpoint.get("stall_s")
        n = stall["n"] if stall else [len(s.runs) for s in sides]
        w = stats.power_warning(n[0], n[1], stats.UNIT, family=1)
        if w is not None:
            message = (
                f"checkpoint stall: {w.message} ({n_ckpt[0]}+{n_ckpt[1]} checkpoints; more "
                "checkpoints per run do not help, more runs do)"
            )
            out.append(_row("checkpoint", w, message))
    return out
