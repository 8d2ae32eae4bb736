"""The report's power warnings: whether a family of comparisons can reach significance
at all with the observations it is tested on (windows' blocks for the codepaths; the
stall's episodes, or their blocks when a side's stalls trend), and what would suffice.
profiler.report.build puts them first among the report's warnings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from profiler.report import stats

if TYPE_CHECKING:
    from profiler.report.build import _Side


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
    sides: tuple[_Side, _Side],
    n_ckpt: list[int],
    families: Mapping[str, int],
    checkpoint: Mapping[str, Any],
) -> list[dict[str, Any]]:
    out = []
    nb, nc = (len(s.blocks) for s in sides)
    w = stats.power_warning(nb, nc, "blocks", family=max(1, families["codepaths"]))
    if w is not None:
        need = stats.windows_for_blocks(w.needed_per_side)
        out.append(
            _row(
                "windows",
                w,
                f"{w.message}; one run of {need} windows makes {stats.block_count(need)} blocks",
            )
        )
    if all(s.has_episodes for s in sides):
        # The stall is tested on what its comparison resampled: blocks of episodes when a
        # side's stalls trend or are autocorrelated, so 16 episodes in blocks of 5 are 3
        # observations, whose smallest p (0.1) no change can get below 0.05.
        stall = checkpoint.get("stall_s")
        n = stall["n"] if stall else n_ckpt
        lengths = [checkpoint[s.name]["warmup"]["block_length"] for s in sides]
        unit = "checkpoint episodes" if max(lengths) == 1 else "blocks of checkpoint episodes"
        w = stats.power_warning(n[0], n[1], unit, family=1)
        if w is not None and max(lengths) > 1:
            w = replace(
                w,
                message=f"{w.message}; episodes are resampled in blocks of "
                f"{'/'.join(str(k) for k in lengths)} (baseline/candidate), so a side needs "
                f"about {w.needed_per_side * max(lengths)} checkpoints, or --skip-warmup N "
                "to leave out the warm-up that made the blocks",
            )
        if w is not None:
            out.append(_row("checkpoint", w, w.message))
    return out
