"""The report's encode / decode breakdown: per serialization codepath, what each side's
CPU was in each direction (profiler/classify/direction.py).

Descriptive, not tested: the direction split is a survey beside the codepath table, so it
adds no test to a Holm family. A side's figures are the sums over its runs; a run
recorded without directions (a serwatt older than the record's schema 4, or a
Prometheus without the `direction` label) leaves its side's breakdown unavailable, with
the reason, rather than calling its CPU `unknown`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from serwatt.profiler.classify.codepaths import SERIALIZATION_CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS
from serwatt.profiler.report.inputs import RunInput

SOURCE = (
    "measured: each sample's direction from the functions on its stack "
    "(profiler/classify/direction.py), CPU-seconds as the codepath's"
)


def _side(runs: Sequence[RunInput]) -> tuple[dict[str, dict[str, dict[str, float]]] | None, str]:
    missing = [r.run_id for r in runs if r.directions is None]
    if missing:
        return None, (
            f"unavailable: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
            "recorded no directions (a serwatt before record schema 4, or a Prometheus "
            "without the direction label)"
        )
    out: dict[str, dict[str, dict[str, float]]] = {}
    for cp in SERIALIZATION_CODEPATHS:
        parts = {d: {"samples": 0.0, "cpu_s": 0.0} for d in DIRECTIONS}
        for r in runs:
            assert r.directions is not None
            for d, f in r.directions.get(cp, {}).items():
                parts[d]["samples"] += f.samples
                parts[d]["cpu_s"] += f.cpu_s
        total = sum(p["cpu_s"] for p in parts.values())
        for p in parts.values():
            p["cpu_share"] = p["cpu_s"] / total if total > 0 else 0.0
        out[cp] = parts
    return out, "measured"


def direction_section(sides: Mapping[str, Sequence[RunInput]]) -> dict[str, Any]:
    """`direction`: {source, sides: {name: measured | unavailable: why}, codepaths: {cp:
    {direction: {side: {samples, cpu_s, cpu_share}}}}}, the codepaths any side spent CPU
    in; cpu_share is the direction's part of that side's codepath CPU."""
    figures = {}
    status = {}
    for name, runs in sides.items():
        figures[name], status[name] = _side(runs)
    codepaths: dict[str, Any] = {}
    for cp in SERIALIZATION_CODEPATHS:
        if not any(f and sum(p["cpu_s"] for p in f[cp].values()) > 0 for f in figures.values()):
            continue
        codepaths[cp] = {
            d: {
                name: None
                if f is None
                else {
                    "samples": int(f[cp][d]["samples"]),
                    "cpu_s": round(f[cp][d]["cpu_s"], 6),
                    "cpu_share": round(f[cp][d]["cpu_share"], 6),
                }
                for name, f in figures.items()
            }
            for d in DIRECTIONS
        }
    return {"source": SOURCE, "sides": status, "codepaths": codepaths}
