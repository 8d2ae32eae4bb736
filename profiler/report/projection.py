"""Cluster projection: what one node's measured checkpoint stall is worth on a cluster.

Every input is either measured (and names the runs it came from) or assumed (printed
with its source and a range): the cluster file's keys and defaults are in
profiler/report/cluster.py.

Model (Daly 2006, FGCS 22(3), doi 10.1016/j.future.2004.11.016; Poisson failures):
- τ, compute time between checkpoints: policy `daly` uses the higher-order optimum
  τ = √(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] − δ for δ < 2M, and τ = M otherwise (the paper's
  fallback); a fixed policy gives τ directly (interval_s, or interval_steps × step_s).
- expected wall time per unit of work, Daly's complete model: T_w/T_s =
  M·e^{R/M}·(e^{(τ+δ)/M} − 1)/τ, so the lost fraction of wall (and GPU) time is
  1 − τ / (M·e^{R/M}·(e^{(τ+δ)/M} − 1)): checkpoint stalls, rework after failures and
  restarts together. δ: the stall per checkpoint; M: MTBF; R: restart_s, which holds
  one read of the checkpoint (as its default's source, a retrieve-and-resume, does), so a
  measured restore is never added to it: when both sides measured one, the baseline's is
  taken as the read inside restart_s and each side's R = restart_s − baseline restore +
  its own restore (`restart_with_restore`); otherwise R = restart_s on both.
- GPU-hours/year lost = lost × gpus × 8760 h; IT energy = those GPU-hours × gpu_power_w
  plus measured host joules per checkpoint × nodes × checkpoints/year (checkpoints/year
  = (1 − lost) × 8760 h / τ); facility energy = IT × PUE; water = IT kWh × WUE.

Scaling to the cluster is profiler/report/checkpoint_model.py's (`scaled_delta`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from serwatt.profiler.report.checkpoint_model import (
    SideMeasurement,
    daly_interval,
    lost_fraction,
    lost_parts,
    restart_with_restore,
    restore_reference,
    scaled_delta,
)
from serwatt.profiler.report.cluster import RANGED, ClusterConfig, ClusterInput, Policy

HOURS_PER_YEAR = 8760.0
SECONDS_PER_YEAR = HOURS_PER_YEAR * 3600.0

SCALING = (
    "each side's measured stall δ is scaled to state_bytes_per_gpu (linear in bytes; a "
    "fitted line when its runs hold two or more sizes) and stands for every rank's "
    "checkpoint; a synchronous δ is at least the storage bandwidth bound, an asynchronous "
    "side's interval at least its background write; the slowest rank sets a synchronous "
    "stall, so when ranks vary the projection is a lower bound"
)
DALY_FORMULA = (
    "τ = √(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] − δ for δ < 2M, else τ = M (Daly 2006, higher order)"
)
# Said on --project (no --cluster file): the inputs below are a frontier LLM job's, whatever
# the job that was measured
CLUSTER_ASSUMED = (
    "cluster assumed (--project, no --cluster FILE.yaml): a Llama 3 405B job (arXiv 2407.21783)"
)
LOST_FORMULA = "lost = 1 − τ / (M·e^{R/M}·(e^{(τ+δ)/M} − 1))  (Daly 2006, expected wall time)"


def _assumed(cfg: ClusterConfig, name: str) -> str:
    i = cfg.inputs[name]
    shown = f"{i.value:g}" if i.value is not None else f"{i.low:g}-{i.high:g}"
    span = f"; range {i.low:g}-{i.high:g}" if i.value is not None and i.low != i.high else ""
    return f"{name} = {shown} {i.unit}".rstrip() + f" ({i.source}{span})"


def _runs(m: SideMeasurement) -> str:
    return ", ".join(m.runs)


@dataclass(frozen=True)
class _SideFigures:
    """One side's projected figures, before they are written out with their provenance."""

    scaling: dict[str, Any]  # scaled_delta's, with the binding bound
    delta_s: float
    interval_s: float
    restart_s: float
    restart_note: str
    lost: float
    gpus: float
    per_node: float
    gpu_hours: float
    checkpoints: float | None  # per year
    host_mwh: float | None
    it_mwh: float
    facility: list[float]  # [at PUE low, at PUE high]
    water: list[float]  # [at WUE low, at WUE high]


def _figures(
    cfg: ClusterConfig,
    m: SideMeasurement,
    mtbf_s: float,
    delta_node_s: float,
    restore_reference_s: float | None,
) -> _SideFigures:
    """The model run once for one side: δ scaled to the cluster, τ (Daly or the policy,
    never under the bound an asynchronous save or the storage sets), the lost fraction
    and what it costs a year."""
    restart, restart_note = restart_with_restore(cfg, m, restore_reference_s)
    scaling = scaled_delta(cfg, m, delta_node_s)
    delta = scaling["delta_s"]
    if cfg.policy.kind == "daly":
        interval = daly_interval(delta, mtbf_s)
    else:
        assert cfg.policy.interval_s is not None
        interval = cfg.policy.interval_s
    floor = scaling["min_interval_s"]
    if floor is not None and interval < floor:
        # an asynchronous save cannot begin before the last one's background write ends
        interval = floor
        write_binds = floor == scaling["background_write_s"]
        scaling["bound"] = "background write" if write_binds else "storage bandwidth"
    lost = lost_fraction(interval, delta, mtbf_s, restart)
    gpus, per_node = cfg.value("gpus"), cfg.value("gpus_per_node")
    gpu_hours = lost * gpus * HOURS_PER_YEAR
    gpu_mwh = gpu_hours * cfg.value("gpu_power_w") / 1e6
    checkpoints = (1.0 - lost) * SECONDS_PER_YEAR / interval if interval > 0 else None
    host_mwh = (
        checkpoints * (gpus / per_node) * m.host_energy_j_per_checkpoint / 3.6e9
        if checkpoints is not None and m.host_energy_j_per_checkpoint is not None
        else None
    )
    it_mwh = gpu_mwh + (host_mwh or 0.0)
    pue, wue = cfg.inputs["pue"], cfg.inputs["wue_l_per_kwh"]
    return _SideFigures(
        scaling=scaling,
        delta_s=delta,
        interval_s=interval,
        restart_s=restart,
        restart_note=restart_note,
        lost=lost,
        gpus=gpus,
        per_node=per_node,
        gpu_hours=gpu_hours,
        checkpoints=checkpoints,
        host_mwh=host_mwh,
        it_mwh=it_mwh,
        facility=[it_mwh * pue.low, it_mwh * pue.high],
        water=[it_mwh * 1000.0 * wue.low, it_mwh * 1000.0 * wue.high],
    )


def _measured_delta(m: SideMeasurement, f: _SideFigures) -> str:
    return (
        f"delta_node_s = {f.scaling['delta_node_s']:.6g} s: {m.delta_basis}, {m.episodes} "
        f"{m.codepath} episode(s) (runs {_runs(m)})"
    )


def _delta_line(cfg: ClusterConfig, m: SideMeasurement, f: _SideFigures) -> dict[str, Any]:
    scaling = f.scaling
    asynchronous = scaling["mode"] == "asynchronous"
    return {
        "name": "delta_s",
        "value": f.delta_s,
        "formula": "δ = δ_node × scaling to state_bytes_per_gpu ("
        + scaling["note"]
        + ("" if asynchronous else "), at least S × gpus / bandwidth")
        + (
            "); asynchronous: δ is the copy, and τ ≥ the background write × S / bytes, at "
            "least S × gpus / bandwidth"
            if asynchronous
            else ""
        ),
        "inputs": {
            "delta_node_s": scaling["delta_node_s"],
            "factor": scaling["factor"],
            "bandwidth_bound_s": scaling["bandwidth_bound_s"],
            "background_write_s": scaling["background_write_s"],
        },
        "measured": [_measured_delta(m, f)]
        + (
            [f"bytes per checkpoint = {scaling['bytes_measured']:.6g} B (file events)"]
            if scaling["bytes_measured"] is not None
            else []
        ),
        "assumed": [
            _assumed(cfg, "state_bytes_per_gpu"),
            _assumed(cfg, "storage_write_gb_s"),
            _assumed(cfg, "gpus"),
        ],
    }


def _interval_lines(
    cfg: ClusterConfig, m: SideMeasurement, f: _SideFigures, mtbf_s: float
) -> list[dict[str, Any]]:
    """τ, and the lost fraction it gives with δ, the MTBF and the restart."""
    daly = cfg.policy.kind == "daly"
    measured_delta = _measured_delta(m, f)
    measured_restart = (
        [f"restore_s = {m.restore_s:.6g} s: measured restore (runs {_runs(m)}); {f.restart_note}"]
        if m.restore_s is not None
        else []
    )
    return [
        {
            "name": "interval_s",
            "value": f.interval_s,
            "formula": DALY_FORMULA if daly else f"τ = {cfg.policy.text}",
            "inputs": {"delta_s": f.delta_s, "mtbf_s": mtbf_s},
            "measured": [measured_delta] if daly else [],
            "assumed": [_assumed(cfg, "mtbf_h")]
            if daly
            else [f"policy = {cfg.policy.text} ({_policy_source(cfg)})"],
        },
        {
            "name": "lost_fraction",
            "value": f.lost,
            "formula": LOST_FORMULA,
            "inputs": {
                "interval_s": f.interval_s,
                "delta_s": f.delta_s,
                "mtbf_s": mtbf_s,
                "restart_s": f.restart_s,
            },
            "measured": [measured_delta, *measured_restart],
            "assumed": [_assumed(cfg, "mtbf_h"), _assumed(cfg, "restart_s")]
            + ([] if m.restore_s is not None else [f"restore: not measured; {f.restart_note}"]),
        },
    ]


def _cost_lines(cfg: ClusterConfig, m: SideMeasurement, f: _SideFigures) -> list[dict[str, Any]]:
    """What the lost fraction costs a year: GPU-hours, IT and facility energy, water."""
    pue, wue = cfg.inputs["pue"], cfg.inputs["wue_l_per_kwh"]
    host_measured = (
        [
            f"host_energy_j_per_checkpoint = {m.host_energy_j_per_checkpoint:.6g} J "
            f"({m.energy_source}; runs {_runs(m)})"
        ]
        if m.host_energy_j_per_checkpoint is not None
        else []
    )
    return [
        {
            "name": "gpu_hours_per_year",
            "value": f.gpu_hours,
            "formula": "lost × gpus × 8760 h",
            "inputs": {"lost_fraction": f.lost, "gpus": f.gpus},
            "measured": [],
            "assumed": [_assumed(cfg, "gpus")],
        },
        {
            "name": "it_mwh_per_year",
            "value": f.it_mwh,
            "formula": "GPU-h lost × gpu_power_w / 1e6 + host J/checkpoint × gpus/gpus_per_node "
            "× checkpoints/year / 3.6e9; checkpoints/year = (1 − lost) × 8760 h / τ",
            "inputs": {
                "gpu_hours_per_year": f.gpu_hours,
                "gpu_power_w": cfg.value("gpu_power_w"),
                "host_energy_j_per_checkpoint": m.host_energy_j_per_checkpoint,
                "nodes": f.gpus / f.per_node,
                "checkpoints_per_year": f.checkpoints,
            },
            "measured": host_measured,
            "assumed": [_assumed(cfg, "gpu_power_w"), _assumed(cfg, "gpus_per_node")]
            + (
                []
                if host_measured
                else [f"host energy per checkpoint: unavailable ({m.energy_source}), not counted"]
            ),
        },
        {
            "name": "facility_mwh_per_year",
            "value": f.facility,
            "formula": "IT MWh × PUE",
            "inputs": {"it_mwh_per_year": f.it_mwh, "pue": [pue.low, pue.high]},
            "measured": [],
            "assumed": [_assumed(cfg, "pue")],
        },
        {
            "name": "water_l_per_year",
            "value": f.water,
            "formula": "IT kWh × WUE",
            "inputs": {"it_kwh_per_year": f.it_mwh * 1000.0, "wue_l_per_kwh": [wue.low, wue.high]},
            "measured": [],
            "assumed": [_assumed(cfg, "wue_l_per_kwh")],
        },
    ]


def _side(
    cfg: ClusterConfig,
    m: SideMeasurement,
    mtbf_s: float,
    delta_s: float | None = None,
    restore_reference_s: float | None = None,
) -> dict[str, Any]:
    """The side's projection; delta_s: its node's δ, when not the measured one;
    restore_reference_s: the restore taken as the read inside restart_s."""
    if m.delta_s is None:
        return {"unavailable": m.unavailable or "no checkpoint episodes"}
    f = _figures(cfg, m, mtbf_s, m.delta_s if delta_s is None else delta_s, restore_reference_s)
    return {
        "delta_s": f.delta_s,
        "delta_node_s": f.scaling["delta_node_s"],
        "scaling": f.scaling,
        "bound": f.scaling["bound"],
        "delta_basis": m.delta_basis,
        "codepath": m.codepath,
        "episodes": m.episodes,
        "runs": list(m.runs),
        "restart_s": f.restart_s,
        "restart_note": f.restart_note,
        "interval_s": f.interval_s,
        "lost_fraction": f.lost,
        "lost_parts": lost_parts(f.interval_s, f.delta_s, mtbf_s, f.restart_s),
        "lost_parts_note": "restart and rework are set by the assumed MTBF and restart_s; "
        "only the stall part is what serialization causes",
        "gpu_hours_per_year": f.gpu_hours,
        "gpu_hours_note": "mostly assumption (restart and rework); the difference between "
        "the sides is the result",
        "checkpoints_per_year": f.checkpoints,
        "it_mwh_per_year": f.it_mwh,
        "host_mwh_per_year": f.host_mwh,
        "facility_mwh_per_year": f.facility,
        "water_l_per_year": f.water,
        "lines": [
            _delta_line(cfg, m, f),
            *_interval_lines(cfg, m, f, mtbf_s),
            *_cost_lines(cfg, m, f),
        ],
    }


def _policy_source(cfg: ClusterConfig) -> str:
    return f"given in {cfg.path}" if cfg.path else "default"


def _span(a: float, b: float) -> list[float]:
    return [min(a, b), max(a, b)]


def _saved(cfg: ClusterConfig, base: dict[str, Any], cand: dict[str, Any]) -> dict[str, Any]:
    pue, wue = cfg.inputs["pue"], cfg.inputs["wue_l_per_kwh"]
    it = base["it_mwh_per_year"] - cand["it_mwh_per_year"]
    gpu_hours = base["gpu_hours_per_year"] - cand["gpu_hours_per_year"]
    return {
        "lost_fraction": base["lost_fraction"] - cand["lost_fraction"],
        "gpu_hours_per_year": gpu_hours,
        "it_mwh_per_year": it,
        "mwh_per_year": _span(it * pue.low, it * pue.high),
        "water_l_per_year": _span(it * 1000.0 * wue.low, it * 1000.0 * wue.high),
        "formula": "baseline − candidate, line by line; facility MWh = IT MWh saved × PUE, "
        "water = IT kWh saved × WUE",
    }


def _with(cfg: ClusterConfig, name: str, value: float) -> ClusterConfig:
    """The config with one input set to `value` (a ranged input collapses to it)."""
    i = cfg.inputs[name]
    inputs = dict(cfg.inputs)
    inputs[name] = ClusterInput(value, value, value, i.unit, i.source)
    return ClusterConfig(MappingProxyType(inputs), cfg.policy, cfg.path)


def _central(cfg: ClusterConfig) -> ClusterConfig:
    """Every ranged-only input (pue, wue) at its middle, for single saved figures."""
    for name in RANGED:
        if cfg.inputs[name].value is None:
            cfg = _with(cfg, name, cfg.inputs[name].central)
    return cfg


SAVED_FIGURES = ("gpu_h", "it_mwh", "facility_mwh", "water_l")


def _saved_figures(
    cfg: ClusterConfig, base: SideMeasurement, cand: SideMeasurement, cand_delta: float | None
) -> dict[str, float]:
    """Saved GPU-h, IT MWh, facility MWh and water L per year at central inputs."""
    cfg = _central(cfg)
    mtbf_s = cfg.value("mtbf_h") * 3600.0
    ref = restore_reference(base, cand)
    b = _side(cfg, base, mtbf_s, restore_reference_s=ref)
    c = _side(cfg, cand, mtbf_s, cand_delta, ref)
    it = b["it_mwh_per_year"] - c["it_mwh_per_year"]
    return {
        "gpu_h": b["gpu_hours_per_year"] - c["gpu_hours_per_year"],
        "it_mwh": it,
        "facility_mwh": it * cfg.value("pue"),
        "water_l": it * 1000.0 * cfg.value("wue_l_per_kwh"),
    }


def _holds_one(ratio_ci: tuple[float | None, float | None] | None) -> bool:
    """Whether the stall ratio's interval allows no change (None: there is none)."""
    if ratio_ci is None:
        return True
    lo, hi = ratio_ci
    return (lo is None or lo <= 1.0) and (hi is None or hi >= 1.0)


def _envelope(
    cfg: ClusterConfig, base: SideMeasurement, cand: SideMeasurement
) -> dict[str, list[float]]:
    """Each saved figure's least and greatest value over every corner of the assumed
    inputs' ranges (each at its low or high end, δ at the measured values): the spread the
    assumptions alone allow."""
    names = [n for n, i in cfg.inputs.items() if i.low != i.high]
    lows: dict[str, float] = {}
    highs: dict[str, float] = {}
    for corner in itertools.product((0, 1), repeat=len(names)):
        at = cfg
        for name, end in zip(names, corner, strict=True):
            i = cfg.inputs[name]
            at = _with(at, name, i.high if end else i.low)
        for fig, v in _saved_figures(at, base, cand, None).items():
            lows[fig] = min(lows.get(fig, v), v)
            highs[fig] = max(highs.get(fig, v), v)
    return {fig: [lows[fig], highs[fig]] for fig in lows}


# the policies the sensitivity table sets beside the configured one: Daly's optimum and
# fixed intervals of 30 min and 3 h, common in LLM training
POLICIES = (Policy("daly"), Policy("fixed", 1800.0, "fixed: every 1800 s"),
            Policy("fixed", 10800.0, "fixed: every 10800 s"))  # fmt: skip


def _policy_sensitivity(
    cfg: ClusterConfig, base: SideMeasurement, cand: SideMeasurement
) -> list[dict[str, Any]]:
    """The saved figures under each checkpoint policy (the configured one marked)."""
    policies = list(POLICIES)
    if all(p.text != cfg.policy.text for p in policies):
        policies.insert(0, cfg.policy)
    out = []
    for policy in policies:
        at = ClusterConfig(cfg.inputs, policy, cfg.path)
        out.append(
            {
                "policy": policy.text,
                "configured": policy.text == cfg.policy.text,
                "saved": _saved_figures(at, base, cand, None),
            }
        )
    return out


def _saved_with_intervals(
    cfg: ClusterConfig,
    base: SideMeasurement,
    cand: SideMeasurement,
    ratio_ci: tuple[float | None, float | None] | None,
) -> dict[str, Any]:
    """Each saved figure with its interval: the candidate's δ at the stall ratio's bounds
    (δ_baseline × ratio bound), the baseline at its mean. Every figure is monotone in the
    candidate's δ, so the figures at the ratio's bounds bound the figure (an interval of
    the ratio mapped through the model); an unbounded or missing ratio interval leaves
    the figure without one."""
    central = _saved_figures(cfg, base, cand, None)
    bounds: list[dict[str, float]] | None = None
    if ratio_ci is not None and None not in ratio_ci and base.delta_s is not None:
        bounds = [
            _saved_figures(cfg, base, cand, base.delta_s * float(r))
            for r in ratio_ci
            if r is not None
        ]
    envelope = _envelope(cfg, base, cand)
    no_change = _holds_one(ratio_ci)
    out: dict[str, Any] = {}
    for name in SAVED_FIGURES:
        ci = None
        if bounds is not None:
            ci = _span(bounds[0][name], bounds[1][name])
        holds_zero = ci is None or ci[0] <= 0.0 <= ci[1]
        out[name] = {
            "value": central[name],
            "ci95": ci,
            "ci95_basis": "sampling only",
            "envelope": envelope[name],
            "envelope_basis": "assumptions only: best and worst corner of their ranges",
            "display": "~" if holds_zero or no_change else None,
        }
    return out


def _sensitivity(
    cfg: ClusterConfig, base: SideMeasurement, cand: SideMeasurement
) -> list[dict[str, Any]]:
    """The saved figure at each ranged input's low and high, the others at their central
    values, sorted by the swing relative to the central figure (largest first). WUE moves
    only water, so its figure is water; every other input's is facility MWh."""
    out: list[dict[str, Any]] = []
    for name, i in cfg.inputs.items():
        if i.low == i.high:
            continue
        figure = "water_l" if name == "wue_l_per_kwh" else "facility_mwh"
        at = central = _saved_figures(cfg, base, cand, None)[figure]
        low = _saved_figures(_with(cfg, name, i.low), base, cand, None)[figure]
        high = _saved_figures(_with(cfg, name, i.high), base, cand, None)[figure]
        swing = abs(high - low) / abs(at) if at else 0.0
        out.append(
            {
                "input": name,
                "unit": i.unit,
                "low": i.low,
                "high": i.high,
                "figure": figure,
                "saved_at_central": central,
                "saved_at_low": low,
                "saved_at_high": high,
                "relative_swing": swing,
            }
        )
    out.sort(key=lambda e: -e["relative_swing"])
    return out


def _measured_inputs(base: SideMeasurement, cand: SideMeasurement) -> dict[str, Any]:
    """The measured and estimated inputs, labelled like the assumed ones."""
    out: dict[str, Any] = {}
    for m in (base, cand):
        runs = f"runs {_runs(m)}"
        if m.delta_s is not None:
            out[f"{m.side}_delta_s"] = {
                "value": m.delta_s,
                "range": None,
                "unit": "s",
                "source": f"{m.delta_basis}, {m.episodes} {m.codepath} episode(s) ({runs})",
                "kind": "measured",
            }
        if m.restore_s is not None:
            out[f"{m.side}_restore_s"] = {
                "value": m.restore_s,
                "range": None,
                "unit": "s",
                "source": f"measured restores ({runs})",
                "kind": "measured",
            }
        if m.host_energy_j_per_checkpoint is not None:
            model = m.energy_source.startswith("model")
            out[f"{m.side}_host_energy_j_per_checkpoint"] = {
                "value": m.host_energy_j_per_checkpoint,
                "range": None,
                "unit": "J",
                "source": f"{m.energy_source} ({runs})"
                + (": the CPU power model, a function of CPU time" if model else ""),
                "kind": "estimated" if model else "measured",
            }
    return out


def _default_at(i: ClusterInput) -> dict[str, Any]:
    """Where an assumed input's default sits in its range: the figures at defaults are not
    central when it sits at an end."""
    if i.low == i.high:
        return {"default_at": None}
    if i.value is None:
        return {"default_at": "a range, used at its middle"}
    at = (
        "at the low end"
        if i.value == i.low
        else "at the high end"
        if i.value == i.high
        else "inside"
    )
    return {"default_at": at}


def project(
    cluster: ClusterConfig,
    baseline: SideMeasurement,
    candidate: SideMeasurement,
    *,
    caveats: tuple[str, ...] = (),
    ratio_ci95: tuple[float | None, float | None] | None = None,
) -> dict[str, Any]:
    """The projection section of the report (JSON-ready). ratio_ci95: the 95% interval of
    the candidate's δ over the baseline's, carried to every saved figure."""
    mtbf_s = cluster.value("mtbf_h") * 3600.0
    ref = restore_reference(baseline, candidate)
    # The candidate is projected through the baseline's checkpoint sizes and write mode:
    # only its measured stall (and restore and host energy) differ, so the saving follows
    # the measured ratio. Its own files' sizes and mode (a background write that hides the
    # storage bound) are a model's difference, shown apart and never in the saving.
    measured_only = replace(candidate, checkpoints=baseline.checkpoints)
    base = _side(cluster, baseline, mtbf_s, restore_reference_s=ref)
    cand = _side(cluster, measured_only, mtbf_s, restore_reference_s=ref)
    both = "unavailable" not in base and "unavailable" not in cand
    saved = None
    own_model = None
    if both:
        saved = _saved(cluster, base, cand) | _saved_with_intervals(
            cluster, baseline, measured_only, ratio_ci95
        )
        saved["interval_basis"] = (
            "sampling only: the candidate's δ at the bounds of the stall ratio's 95% "
            "interval (the baseline's δ at its mean), through the same model, every "
            "assumption at its default (pue and wue at their range's middle)"
        )
        saved["envelope_basis"] = (
            "assumptions only: the least and greatest saving over every corner of the "
            "assumed inputs' ranges, δ as measured"
        )
        saved["no_change"] = _holds_one(ratio_ci95)
        own = _side(cluster, candidate, mtbf_s, restore_reference_s=ref)
        own_model = own | {
            "saved_gpu_h": base["gpu_hours_per_year"] - own["gpu_hours_per_year"],
            "note": "the candidate with its own files' sizes and write mode: a model's "
            "difference, not measured, and not in the saving",
        }
    inputs = {name: i.to_json() | _default_at(i) for name, i in cluster.inputs.items()}
    inputs.update(_measured_inputs(baseline, candidate))
    return {
        "estimated": True,
        "heading": "ESTIMATED CLUSTER PROJECTION (a model of a cluster run, not a measurement)",
        "candidate_own_model": own_model,
        "policy_sensitivity": _policy_sensitivity(cluster, baseline, measured_only) if both else [],
        "inputs": inputs,
        "policy": {
            "kind": cluster.policy.kind,
            "interval_s": cluster.policy.interval_s,
            "text": cluster.policy.text,
            "source": _policy_source(cluster),
        },
        "cluster_file": cluster.path,
        "cluster_assumed": CLUSTER_ASSUMED if cluster.path is None else None,
        "scaling": SCALING,
        "hours_per_year": HOURS_PER_YEAR,
        "baseline": base,
        "candidate": cand,
        "saved": saved,
        "sensitivity": _sensitivity(cluster, baseline, measured_only) if both else [],
        "caveats": list(caveats),
    }
