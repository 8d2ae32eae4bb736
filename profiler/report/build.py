"""Build the A/B report document (schema `serwatt.report/1`) from baseline and candidate runs.

The document is plain JSON data; the renderers (render_text, render_html) read only it.
Layout, units and the statistics are written out in docs/report.md. In short:
- `codepaths.<name>.<metric>` and `total.<metric>` compare cpu_s, energy_j and
  gpu_wait_s per measured wall-hour (each run one observation, see profiler.report.stats), with
  totals and per-checkpoint figures alongside;
- `checkpoint` compares the cost of one checkpoint across the codepaths each side
  checkpoints through (episodes of the training thread);
- the checkpoint metrics are one Holm family and the codepath table (with totals) another;
  `significant` needs a corrected p < 0.05;
- every figure names its source: measured (py-spy + procfs, rapl, nvml), model, or
  unavailable with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from serwatt.profiler.classify.codepaths import CODEPATHS, SERIALIZATION_CODEPATHS
from serwatt.profiler.report import comparability, power, stats
from serwatt.profiler.report.checkpoint_model import CheckpointSize, SideMeasurement
from serwatt.profiler.report.checkpoints import (
    checkpoint_choice,
    checkpoint_count,
    checkpoint_runs,
    durability,
    file_event_fields,
    files_written,
    known_durable,
    quantiles,
    restore_section,
    save_files,
    untimed_stall_floor,
    wait_fields,
    watched_checkpoints,
)
from serwatt.profiler.report.cluster import ClusterConfig
from serwatt.profiler.report.direction import direction_section
from serwatt.profiler.report.inputs import (
    EpisodeInput,
    InputError,
    RunInput,
)
from serwatt.profiler.report.projection import project
from serwatt.profiler.report.receipt import receipt
from serwatt.profiler.report.sides import (
    SCHEMA1_NOTE,
    TOTAL,
    Side,
    energy_source,
    gpu_source,
    metric_source,
    observations,
    side_totals,
)
from serwatt.profiler.report.stack_diff import stacks_section

REPORT_SCHEMA = "serwatt.report/1"
SIDES = ("baseline", "candidate")
METRICS: tuple[tuple[str, str], ...] = (("cpu_s", "s"), ("energy_j", "J"), ("gpu_wait_s", "s"))
CHECKPOINT_METRICS = ("stall_s", "cpu_s", "gpu_wait_s", "restore_s")
PRIMARY_METRICS = ("stall_s",)
SECONDARY_METRICS = ("cpu_s", "gpu_wait_s", "restore_s")
NOT_TESTED = "not tested"
FOLLOWS_CPU = "follows CPU (model)"
SIDE_CI_NOTE = (
    "no per-side interval: no method we simulated reaches 95% coverage of one side's mean "
    "on skewed data at these counts (docs/report.md); the ratio's interval is the claim"
)


# --------------------------------------------------------------------------- episodes


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _pct(r: float | None) -> float | None:
    return None if r is None else (r - 1.0) * 100.0


def _comparison_fields(
    c: stats.Comparison, within: Sequence[float], within_unit: str
) -> dict[str, Any]:
    ci = list(c.ci95) if c.ci95 is not None else None
    return {
        "test": stats.TEST if c.p is not None else None,
        "family": None,
        "p_adjusted": None,
        "ci_note": c.ci_note,
        "ratio": _num(c.ratio),
        "change_pct": _num(_pct(c.ratio)),
        "ci95": ci,
        "change_pct_ci95": [_pct(b) for b in ci] if ci is not None else None,
        "ci_method": c.ci_method,
        "p": _num(c.p),
        "p_holm": None,
        "n": list(c.n),
        "n_unit": stats.UNIT,
        "n_within": list(within),
        "n_within_unit": within_unit,
        "significant": False,
        "display": "~" if c.p is not None else NOT_TESTED,
        "verdict": c.note if c.p is None else "no significant change",
        "note": c.note,
    }


def _window_metric(
    sides: tuple[Side, Side], codepath: str, metric: str, unit: str, checkpoints: list[int]
) -> dict[str, Any]:
    (xb, wb), (xc, wc) = (observations(s, codepath, metric) for s in sides)
    c = stats.compare(xb, xc, wb, wc)
    totals = [side_totals(s, codepath, metric) for s in sides]
    out: dict[str, Any] = {
        "unit": f"{unit}/h",
        "basis": "per measured wall-hour (Σ value / Σ window seconds × 3600)",
        "baseline": c.baseline * 3600.0 if c.n[0] else None,
        "candidate": c.candidate * 3600.0 if c.n[1] else None,
        "baseline_ci95": None,
        "candidate_ci95": None,
        "side_ci_note": SIDE_CI_NOTE,
        "total": {side.name: t for side, (t, _wall) in zip(sides, totals, strict=True)},
        "total_unit": unit,
        "per_checkpoint": {
            side.name: (t / k if t is not None and k > 0 else None)
            for side, (t, _wall), k in zip(sides, totals, checkpoints, strict=True)
        },
        "source": {s.name: metric_source(s, metric) for s in sides},
        **_side_medians((xb, wb), (xc, wc), 3600.0),
    }
    windows = [sum(len(b) for b in s.blocks) for s in sides]
    out.update(_comparison_fields(c, windows, "windows"))
    if metric == "energy_j" and all(energy_source(s) == "model" for s in sides):
        # the model's energy is a function of CPU: testing it again would test CPU twice
        out.update(p=None, test=None, display=FOLLOWS_CPU, verdict=FOLLOWS_CPU, note=FOLLOWS_CPU)
    if out["baseline"] is None or out["candidate"] is None:
        missing = [s.name for s, t in zip(sides, totals, strict=True) if t[0] is None]
        if missing:
            out["verdict"] = out["note"] = "not tested: unavailable on " + " and ".join(missing)
    return out


def _episode_metric(
    base: Sequence[Sequence[float]],
    cand: Sequence[Sequence[float]],
    unit: str,
    source: Mapping[str, str],
    within_unit: str = "checkpoint episodes",
) -> dict[str, Any]:
    """One per-checkpoint metric; base and cand hold each run's values. Each run with a
    value is one observation: (Σ its values, how many)."""
    (xb, wb), (xc, wc) = (_per_run(runs) for runs in (base, cand))
    c = stats.compare(xb, xc, wb, wc)
    out: dict[str, Any] = {
        "unit": unit,
        "basis": "per checkpoint episode (mean)",
        "baseline": c.baseline if c.n[0] else None,
        "candidate": c.candidate if c.n[1] else None,
        "baseline_ci95": None,
        "candidate_ci95": None,
        "side_ci_note": SIDE_CI_NOTE,
        "source": dict(source),
        **_side_medians((xb, wb), (xc, wc)),
    }
    out.update(_comparison_fields(c, [sum(wb), sum(wc)], within_unit))
    return out


def _side_medians(
    base: tuple[Sequence[float], Sequence[float]],
    cand: tuple[Sequence[float], Sequence[float]],
    scale: float = 1.0,
) -> dict[str, Any]:
    """Each side's median over its runs (each run's Σ value / Σ weight) with the order
    statistics' interval: the one per-side interval of known coverage (docs/report.md)."""
    out = {}
    for name, (x, w) in zip(SIDES, (base, cand), strict=True):
        per_run = [v / k * scale for v, k in zip(x, w, strict=True) if k > 0]
        out[f"{name}_run_median"] = stats.median_interval(per_run)
    return out


def _per_run(runs: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    kept = [series for series in runs if len(series)]
    return [float(sum(series)) for series in kept], [float(len(series)) for series in kept]


def _change_display(change_pct: float) -> str:
    return f"{float(f'{change_pct:.3g}'):+g}%"  # at most 3 significant digits


def _apply_holm(metrics: list[dict[str, Any]], family: str) -> int:
    adjusted = stats.holm([m["p"] for m in metrics])
    size = sum(p is not None for p in adjusted)
    for m, p in zip(metrics, adjusted, strict=True):
        m["p_holm"] = m["p_adjusted"] = p
        if p is None:
            continue
        m["family"] = family
        n0, n1 = m["n"]
        m["min_attainable_p"] = stats.min_attainable_p(n0, n1, size)
        m["can_reach_significance"] = m["min_attainable_p"] < stats.ALPHA
        m["significant"] = p < stats.ALPHA
        ci = m["ci95"]
        holds_one = (
            ci is not None and (ci[0] is None or ci[0] <= 1.0) and (ci[1] is None or ci[1] >= 1.0)
        )
        if not m["significant"]:
            m["display"], m["verdict"] = "~", "no significant change"
            if ci is not None and not holds_one:
                m["ci_note"] = (
                    f"the interval is the test's own at 95% (raw p {m['p']:.3g} < "
                    f"{stats.ALPHA:g}); Holm over the {size} tests of the {family} family "
                    f"raises p to {p:.3g}"
                )
            continue
        if m["ratio"] is None:
            m["display"], m["verdict"] = "new", "higher (the baseline is zero)"
            continue
        m["display"] = _change_display(m["change_pct"])
        m["verdict"] = "lower" if m["ratio"] < 1.0 else "higher"
        if holds_one:  # only where the test's accepted ratios have a gap at 1
            m["note"] = "the test is significant but the interval holds 1: treat as weak"
    return size


# --------------------------------------------------------------------------- the report


def _side(name: str, runs: Sequence[RunInput], no_episodes: str) -> Side:
    if not runs:
        raise InputError(f"the {name} side has no runs")
    blocks = tuple(tuple(r.windows) for r in runs if r.windows)
    return Side(name, tuple(runs), blocks, no_episodes)


def _side_section(
    side: Side, choice: tuple[str | None, str, bool], ckpt: list[EpisodeInput], skip: int
) -> dict[str, Any]:
    return {
        "runs": [r.run_id for r in side.runs],
        "hosts": [{"run": r.run_id, "host": _plain(r.host)} for r in side.runs],
        "serwatt_version": sorted({r.serwatt_version for r in side.runs}),
        "rate_hz": sorted({r.rate_hz for r in side.runs}),
        "windows": len(side.windows),
        "blocks": len(side.blocks),
        "wall_s": float(sum(w.wall_s for w in side.windows)),
        "run_wall_s": float(sum(r.wall_s for r in side.runs)),
        "energy_source": energy_source(side),
        "gpu_source": gpu_source(side),
        "episodes": len(side.episodes) if side.has_episodes else None,
        "episodes_note": None if side.has_episodes else side.no_episodes,
        "runs_without_episodes": [r.run_id for r in side.runs if r.episodes is None],
        "checkpoint_codepath": choice[0],
        "checkpoints": checkpoint_count(side, ckpt, skip),
        "checkpoints_identified_by": side.identified_by,
        "durable": durability(ckpt),
        "restore_s": [v for r in side.runs for v in r.restore_s],
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _episode_summary(sides: tuple[Side, Side]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cp in SERIALIZATION_CODEPATHS:
        entry: dict[str, Any] = {}
        for side in sides:
            if not side.has_episodes:
                entry[side.name] = {"count": None, "note": side.no_episodes}
                continue
            eps = [e for e in side.episodes if e.codepath == cp]
            entry[side.name] = {
                "count": len(eps),
                "main_thread": sum(e.main_thread for e in eps),
                "wall_s": quantiles([e.wall_s for e in eps]),
                "resolution_s": max((e.resolution_s for e in eps), default=None),
                "durable": durability(eps),
            }
        if any((entry[s.name].get("count") or 0) for s in sides):
            out[cp] = entry
    return out


def _timeline(side: Side, checkpoint_codepath: str | None) -> list[dict[str, Any]]:
    out = []
    for r in side.runs:
        points = []
        for w in r.windows:
            ser = sum(f.cpu_s for name, f in w.codepaths.items() if name != "other")
            ck = w.codepaths.get(checkpoint_codepath) if checkpoint_codepath else None
            points.append(
                {
                    "t_s": w.started_at - r.started_at,
                    "wall_s": w.wall_s,
                    "serialization_cpu_s": float(ser),
                    "checkpoint_cpu_s": ck.cpu_s if ck is not None else 0.0,
                }
            )
        out.append({"run": r.run_id, "windows": points})
    return out


def build_report(
    baseline: Sequence[RunInput],
    candidate: Sequence[RunInput],
    *,
    cluster: ClusterConfig | None = None,
    allow_mismatch: bool = False,
    checkpoints: Mapping[str, Any] | None = None,
    checkpoint_codepaths: Mapping[str, str] | None = None,
    no_episodes_note: str = SCHEMA1_NOTE,
    skip_warmup: int = 0,
) -> dict[str, Any]:
    """The `serwatt.report/1` document.

    cluster: the projection's assumptions (None: no projection section); allow_mismatch:
    report incomparable runs with each mismatch as a caveat instead of raising
    comparability.ReportRefused; checkpoints: the `.many` receipt-chain verification
    (head, length, first break), copied into the report as given; checkpoint_codepaths:
    {"baseline": "torch", "candidate": "many"} to name the codepath each side checkpoints
    through instead of taking the one with the most main-thread episode wall time;
    no_episodes_note: what a run without episodes says (records: schema 1; other input
    adapters name what their source lacks); skip_warmup: checkpoint episodes left out at
    the start of each run (page cache and allocator warm-up), printed as skipped.
    """
    sides, given = _checked_input(
        baseline, candidate, checkpoint_codepaths, no_episodes_note, skip_warmup
    )
    found = comparability.check([r for s in sides for r in s.runs], allow_mismatch=allow_mismatch)
    caveats = [f"not comparable: {m}" for m in found]

    choices = [checkpoint_choice(s, given.get(s.name)) for s in sides]
    per_run = [
        checkpoint_runs(s, cp, main_only, skip_warmup)
        for s, (cp, _how, main_only) in zip(sides, choices, strict=True)
    ]
    ckpt_eps = [[e for run in runs for e in run[1]] for runs in per_run]
    n_ckpt = [len(e) for e in ckpt_eps]

    codepaths = {
        cp: {metric: _window_metric(sides, cp, metric, unit, n_ckpt) for metric, unit in METRICS}
        for cp in CODEPATHS
    }
    total = {metric: _window_metric(sides, TOTAL, metric, unit, n_ckpt) for metric, unit in METRICS}
    tested = [row for rows in (*codepaths.values(), total) for row in rows.values()]
    per_run_rows = {"cpu_s": _per_run_metric(sides, "cpu_s", "s")}

    warnings: list[dict[str, Any]] = [
        {
            "scope": "comparability",
            "field": m.field,
            "message": f"{m}: this may move the figures; the runs are compared all the same",
        }
        for m in comparability.differences([s.runs for s in sides])
    ]
    checkpoint = _checkpoint_section(sides, choices, per_run, caveats, warnings, skip_warmup)
    # Three Holm families: the checkpoint stall is the question the report is run to
    # answer (one test, stated before looking); the checkpoint's CPU, GPU-wait and restore
    # are its secondary figures; the codepath table is the survey around it. Pooling them
    # would let 30 survey tests veto the one comparison asked for.
    family_rows = {
        "checkpoint": [m for k in PRIMARY_METRICS if (m := checkpoint.get(k))],
        "checkpoint_secondary": [m for k in SECONDARY_METRICS if (m := checkpoint.get(k))],
        "codepaths": tested,
        "per_run": list(per_run_rows.values()),
    }
    families = {name: _apply_holm(rows, name) for name, rows in family_rows.items()}
    warnings += _unreachable_warnings(checkpoint, per_run_rows)
    _durability_verdicts(checkpoint)
    min_attainable = {
        name: power.min_attainable(rows, families[name]) for name, rows in family_rows.items()
    }
    warnings[:0] = power.power_warnings(sides, n_ckpt, families, checkpoint)
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "receipt": receipt(baseline, candidate),
        "comparable": not found,
        "caveats": caveats,
        "mismatches": [m.to_json() for m in found],
        "warnings": warnings,
        "statistics": stats.description(families, min_attainable, skip_warmup),
        "interleaving": comparability.interleaving(
            [r for r in sides[0].runs], [r for r in sides[1].runs]
        ),
        "baseline": _side_section(sides[0], choices[0], ckpt_eps[0], skip_warmup),
        "candidate": _side_section(sides[1], choices[1], ckpt_eps[1], skip_warmup),
        "per_run": per_run_rows,
        "codepaths": codepaths,
        "total": total,
        "direction": direction_section({s.name: s.runs for s in sides}),
        "episodes": _episode_summary(sides),
        "checkpoint": checkpoint,
        "restore": restore_section(sides, checkpoint),
        "timeline": {s.name: _timeline(s, c[0]) for s, c in zip(sides, choices, strict=True)},
        "checkpoint_files": _plain(checkpoints) if checkpoints is not None else None,
        "stacks": stacks_section(baseline, candidate),
        "projection": None,
    }
    if cluster is not None:
        report["projection"] = _projection(
            cluster, sides, choices, ckpt_eps, checkpoint, skip_warmup
        )
    return report


def _per_run_metric(sides: tuple[Side, Side], metric: str, unit: str) -> dict[str, Any]:
    """A whole-job figure per run (Σ over the run's windows), each run one observation with
    weight 1: per work where every run does the same work, as `serwatt ab`'s do."""
    (xb, _wb), (xc, _wc) = (observations(s, TOTAL, metric) for s in sides)
    ones = [1.0] * len(xb), [1.0] * len(xc)
    c = stats.compare(xb, xc, *ones)
    out: dict[str, Any] = {
        "unit": unit,
        "basis": "per run (Σ over the run's windows): per work when every run does the same "
        "work, as serwatt ab's runs do",
        "baseline": c.baseline if c.n[0] else None,
        "candidate": c.candidate if c.n[1] else None,
        "source": {s.name: metric_source(s, metric) for s in sides},
        **_side_medians((xb, ones[0]), (xc, ones[1])),
    }
    windows = [sum(len(b) for b in s.blocks) for s in sides]
    out.update(_comparison_fields(c, windows, "windows"))
    return out


ROW_LABELS = {
    "stall_s": "stall s/checkpoint",
    "cpu_s": "CPU s/checkpoint",
    "gpu_wait_s": "GPU-wait s/checkpoint",
    "restore_s": "restore s",
}


def _unreachable_warnings(
    checkpoint: Mapping[str, Any], per_run: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """A warning per family whose tested rows cannot reach a corrected p < 0.05 at their
    runs, whatever the data (the stall's own is among the power warnings)."""
    out = []
    for family, rows in (
        ("checkpoint_secondary", [(k, checkpoint.get(k)) for k in SECONDARY_METRICS]),
        ("per_run", [(f"{k} per run", m) for k, m in per_run.items()]),
    ):
        stuck = [
            (ROW_LABELS.get(k, k), m)
            for k, m in rows
            if m and m.get("p") is not None and not m["can_reach_significance"]
        ]
        if not stuck:
            continue
        n = stuck[0][1]["n"]
        out.append(
            {
                "scope": "row",
                "family": family,
                "rows": [label for label, _m in stuck],
                "min_attainable_p": stuck[0][1]["min_attainable_p"],
                "message": f"{', '.join(label for label, _m in stuck)}: at {n[0]}+{n[1]} runs "
                f"the smallest attainable corrected p is {stuck[0][1]['min_attainable_p']:.3g}, "
                "so no result can be significant; more runs a side can",
            }
        )
    return out


def _checked_input(
    baseline: Sequence[RunInput],
    candidate: Sequence[RunInput],
    checkpoint_codepaths: Mapping[str, str] | None,
    no_episodes_note: str,
    skip_warmup: int,
) -> tuple[tuple[Side, Side], dict[str, str]]:
    """The two sides, and the codepaths named for their checkpoints; InputError for a
    bad --skip-warmup, a run on both sides or twice, or a codepath that is not a
    serializer."""
    if isinstance(skip_warmup, bool) or not isinstance(skip_warmup, int) or skip_warmup < 0:
        raise InputError(f"skip_warmup must be a whole number >= 0, got {skip_warmup!r}")
    sides = (
        _side("baseline", baseline, no_episodes_note),
        _side("candidate", candidate, no_episodes_note),
    )
    ids = [r.run_id for s in sides for r in s.runs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise InputError(f"run(s) given twice (a run belongs to one side once): {dupes}")
    given = dict(checkpoint_codepaths or {})
    for key, cp in given.items():
        if key not in SIDES or cp not in SERIALIZATION_CODEPATHS:
            raise InputError(
                f"checkpoint_codepaths: {key!r}: {cp!r}; want baseline/candidate mapped to "
                f"one of {', '.join(SERIALIZATION_CODEPATHS)}"
            )
    return sides, given


_RunEpisodes = list[tuple[str, list[EpisodeInput], int]]  # (run, its episodes, skipped)


def _warmup(side: Side, runs: _RunEpisodes, warnings: list[dict[str, Any]]) -> dict[str, Any]:
    """A side's stalls in time order, described: a trend or lag-1 autocorrelation is
    warned of (the test takes whole runs, so it holds either way), with the warm-up
    episodes skipped."""
    dep = stats.serial_dependence([e.wall_s for _run, eps, _k in runs for e in eps])
    skipped = sum(k for _run, _eps, k in runs)
    if dep.found:
        found = []
        if dep.trend_p is not None and dep.trend_p < stats.ALPHA:
            found.append(f"a trend (Kendall p = {dep.trend_p:.3g})")
        if dep.lag1_autocorrelation is not None:
            found.append(f"lag-1 autocorrelation {dep.lag1_autocorrelation:.3g}")
        warnings.append(
            {
                "scope": "checkpoint",
                "side": side.name,
                "message": f"{side.name} checkpoint stalls are not independent in time "
                f"({', '.join(found)}; {skipped} skipped as warm-up): the test takes whole "
                "runs, so this moves the mean, not the test's validity; --skip-warmup N "
                "leaves out each run's first N",
            }
        )
    return {
        "trend_p": dep.trend_p,
        "lag1_autocorrelation": dep.lag1_autocorrelation,
        "skipped": skipped,
        "skipped_per_run": {run: k for run, _eps, k in runs},
        "detected": dep.found,
    }


def _side_checkpoints(
    side: Side,
    choice: tuple[str | None, str, bool],
    eps: list[EpisodeInput],
    skip: int,
    warnings: list[dict[str, Any]],
) -> dict[str, Any]:
    """One side's checkpoint figures: what it checkpoints through, its stalls, waits, CPU,
    GPU-wait and durability, and where they come from."""
    cp, how, main_only = choice
    entry: dict[str, Any] = {
        "codepath": cp,
        "chosen_by": how,
        "main_thread_only": main_only,
        "episodes": len(eps),
        "checkpoints": checkpoint_count(side, eps, skip),
        "files_written": files_written(side, skip),
        **file_event_fields(side, skip),
        "stall_s": quantiles([e.wall_s for e in eps]),
        "stall_values_s": sorted(e.wall_s for e in eps),
        **wait_fields(side, skip),
        "save_files": save_files(side, skip),
        "resolution_s": max((e.resolution_s for e in eps), default=None),
        "cpu_s_per_checkpoint": float(np.mean([e.cpu_s for e in eps])) if eps else None,
        "gpu_wait_s_per_checkpoint": _mean_or_none([e.gpu_wait_s for e in eps]),
        "gpu_idle_j_per_checkpoint": _mean_or_none([e.gpu_idle_j for e in eps]),
        "durable": durability(eps),
        "source": (
            "measured: file events under --checkpoints, stalls from py-spy episodes of the "
            "training thread, timed to ± resolution_s"
            if side.file_events
            else "measured: py-spy episodes of the training thread, timed to ± resolution_s"
        )
        if side.has_episodes
        else f"unavailable: {side.no_episodes}",
    }
    if not side.has_episodes:
        entry["note"] = side.no_episodes
    elif not eps:
        entry["note"] = "no checkpoint episodes"
    entry["stall_mean_untimed_as_0_s"] = untimed_stall_floor(
        side, entry["file_event_only"] or 0, eps, warnings
    )
    return entry


def _compared_episodes(
    sides: tuple[Side, Side],
    per_run: list[_RunEpisodes],
    ckpt_eps: list[list[EpisodeInput]],
    sources: dict[str, str],
) -> dict[str, Any]:
    """The stall and CPU per checkpoint compared (and GPU-wait where both sides have it),
    or why not."""

    def series(runs: _RunEpisodes, key: str) -> list[list[float]]:
        return [[float(getattr(e, key)) for e in eps] for _run, eps, _k in runs]

    base, cand = ckpt_eps
    out: dict[str, Any] = {}
    if not (base and cand):
        missing = [s.name for s, e in zip(sides, ckpt_eps, strict=True) if not e]
        out["stall_s"] = None
        out["note"] = "checkpoint cost not compared: no checkpoint episodes on " + " and ".join(
            missing
        )
        return out
    b_runs, c_runs = per_run
    for key in ("stall_s", "cpu_s"):
        attr = "wall_s" if key == "stall_s" else "cpu_s"
        out[key] = _episode_metric(series(b_runs, attr), series(c_runs, attr), "s", sources)
    gb, gc = [e.gpu_wait_s for e in base], [e.gpu_wait_s for e in cand]
    if None not in gb and None not in gc:
        out["gpu_wait_s"] = _episode_metric(
            series(b_runs, "gpu_wait_s"),
            series(c_runs, "gpu_wait_s"),
            "s",
            {s.name: "measured: nvml during the episodes" for s in sides},
        )
    return out


def _without_first(per_run: list[_RunEpisodes], flagged: list[str]) -> dict[str, Any]:
    """The stall ratio with each run's first checkpoint left out: beside the ratio with it
    when a side's stalls trend or are autocorrelated (a flagged warm-up)."""
    (xb, wb), (xc, wc) = (
        _per_run([[e.wall_s for e in eps[1:]] for _run, eps, _k in runs]) for runs in per_run
    )
    c = stats.compare(xb, xc, wb, wc)
    ci = list(c.ci95) if c.ci95 is not None else None
    return {
        "flagged": flagged,
        "left_out": "each run's first checkpoint",
        "ratio": _num(c.ratio),
        "change_pct": _num(_pct(c.ratio)),
        "change_pct_ci95": [_pct(b) for b in ci] if ci is not None else None,
        "p": _num(c.p),
        "n": list(c.n),
    }


def _durability_part(
    out: dict[str, Any],
    choices: list[tuple[str | None, str, bool]],
    ckpt_eps: list[list[EpisodeInput]],
    caveats: list[str],
) -> dict[str, Any]:
    """Whether both sides' checkpoints are durable alike; a caveat when they may not be."""
    (kb, why_b), (kc, why_c) = (
        known_durable(cp, eps) for (cp, _how, _main), eps in zip(choices, ckpt_eps, strict=True)
    )
    same = kb == kc
    if all(ckpt_eps) and not same:
        caveats.append(
            f"checkpoints may differ in durability (baseline: {why_b}; candidate: {why_c}): "
            "the checkpoint comparison may not be like with like, and no side is called "
            "cheaper without saying so"
        )
    return {
        "baseline": out["baseline"]["durable"],
        "candidate": out["candidate"]["durable"],
        "baseline_durable": kb,
        "candidate_durable": kc,
        "baseline_basis": why_b,
        "candidate_basis": why_c,
        "same": same,
    }


def _checkpoint_section(
    sides: tuple[Side, Side],
    choices: list[tuple[str | None, str, bool]],
    per_run: list[_RunEpisodes],
    caveats: list[str],
    warnings: list[dict[str, Any]],
    skip: int = 0,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ckpt_eps = [[e for run in runs for e in run[1]] for runs in per_run]
    warmups = [_warmup(side, runs, warnings) for side, runs in zip(sides, per_run, strict=True)]
    for side, choice, eps, warmup in zip(sides, choices, ckpt_eps, warmups, strict=True):
        out[side.name] = {"warmup": warmup} | _side_checkpoints(side, choice, eps, skip, warnings)
    sources = {s.name: out[s.name]["source"] for s in sides}
    out |= _compared_episodes(sides, per_run, ckpt_eps, sources)
    flagged = [s.name for s, w in zip(sides, warmups, strict=True) if w["detected"]]
    if flagged and out.get("stall_s"):
        out["stall_s"]["warmup"] = _without_first(per_run, flagged)
    # a restore is compared whether or not the runs also saved (a resumed run may not)
    rb = [list(r.restore_s) for r in sides[0].runs]
    rc = [list(r.restore_s) for r in sides[1].runs]
    if any(rb) and any(rc):
        out["restore_s"] = _episode_metric(
            rb, rc, "s", {s.name: "measured: checkpoint restores" for s in sides}, "restores"
        )
        out["restore_s"]["basis"] = "per resumed run (its timed loads summed; mean)"
    out["durability"] = _durability_part(out, choices, ckpt_eps, caveats)
    return out


def _durability_verdicts(checkpoint: Mapping[str, Any]) -> None:
    d = checkpoint["durability"]
    if d["same"]:
        return
    for key in CHECKPOINT_METRICS:
        m = checkpoint.get(key)
        if m and m["significant"]:
            m["verdict"] += (
                f", but durability may differ (baseline {d['baseline']}, candidate "
                f"{d['candidate']})"
            )


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return float(np.mean([v for v in values if v is not None]))


def _projection(
    cluster: ClusterConfig,
    sides: tuple[Side, Side],
    choices: list[tuple[str | None, str, bool]],
    ckpt_eps: list[list[EpisodeInput]],
    checkpoint: Mapping[str, Any],
    skip: int = 0,
) -> dict[str, Any]:
    measured = []
    for side, (cp, _how, main_only), eps in zip(sides, choices, ckpt_eps, strict=True):
        thread = "training (main) thread" if main_only else "any thread"
        if eps and all(e.gpu_wait_s is not None for e in eps):
            delta = float(np.mean([e.gpu_wait_s for e in eps]))
            basis = f"mean GPU-wait during the {thread}'s checkpoint episodes (nvml)"
        elif eps:
            delta = float(np.mean([e.wall_s for e in eps]))
            basis = f"mean wall time of the {thread}'s checkpoint episodes (no GPU data)"
        else:
            delta, basis = None, ""
        energy_total, _wall = side_totals(side, cp, "energy_j") if cp else (None, 0.0)
        restores = [v for r in side.runs for v in r.restore_s]
        measured.append(
            SideMeasurement(
                side=side.name,
                runs=tuple(r.run_id for r in side.runs),
                delta_s=delta,
                delta_basis=basis,
                episodes=len(eps),
                codepath=cp,
                host_energy_j_per_checkpoint=(
                    energy_total / len(eps) if energy_total is not None and eps else None
                ),
                energy_source=energy_source(side),
                restore_s=float(np.mean(restores)) if restores else None,
                checkpoints=tuple(
                    CheckpointSize(
                        float(c.bytes),
                        c.stall_s,
                        c.async_tail_s,
                        c.resolution_s,
                        written_apart=(
                            c.thread_id is not None
                            and c.stall_thread is not None
                            and c.thread_id != c.stall_thread
                        ),
                    )
                    for c in watched_checkpoints(side, skip)
                    if c.bytes is not None and c.stall_s is not None and c.resolution_s is not None
                ),
                unavailable=None
                if eps
                else (side.no_episodes if not side.has_episodes else "no checkpoint episodes"),
            )
        )
    notes = []
    stall = checkpoint.get("stall_s")
    if stall and not stall["significant"]:
        p = stall["p_holm"]
        notes.append(
            "the stall change is not significant"
            + (f" (Holm p = {p:.3g})" if p is not None else "")
            + ": the saved figures may be noise"
        )
    if not checkpoint["durability"]["same"]:
        notes.append("the sides' checkpoints differ in durability (see caveats)")
    # the interval of the ratio δ is the mean of: GPU-wait when both sides have it, else wall
    gpu = all("nvml" in m.delta_basis for m in measured)
    ratio = checkpoint.get("gpu_wait_s" if gpu else "stall_s") or {}
    ci = ratio.get("ci95")
    return project(
        cluster,
        measured[0],
        measured[1],
        caveats=tuple(notes),
        ratio_ci95=(ci[0], ci[1]) if ci is not None else None,
    )
