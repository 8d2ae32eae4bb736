"""The cluster projection against Daly's worked values and hand-computed cases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy.optimize import minimize_scalar

from profiler.report.projection import (
    DEFAULTS,
    SideMeasurement,
    daly_interval,
    default_cluster,
    load_cluster,
    lost_fraction,
    parse_cluster,
    project,
)
from profiler.yamlcheck import ConfigError

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(
    ("mtbf_s", "expected_min"),
    [(24 * HOUR, 117.0), (6 * HOUR, 57.0), (15 * MIN, 9.1)],
)
def test_daly_higher_order_interval_reproduces_the_papers_worked_values(
    mtbf_s: float, expected_min: float
) -> None:
    # Daly 2006 figs. 3-5: δ = 5 min, R = 10 min; the model predicts 117, 57 and 9.1 min
    got = daly_interval(5 * MIN, mtbf_s) / MIN
    assert got == pytest.approx(expected_min, abs=0.5 if expected_min > 10 else 0.05)


def test_daly_falls_back_to_mtbf_when_the_checkpoint_is_at_least_2m() -> None:
    assert daly_interval(2000.0, 1000.0) == 1000.0
    assert daly_interval(5000.0, 1000.0) == 1000.0
    assert daly_interval(1999.0, 1000.0) != 1000.0


def test_daly_interval_is_close_to_the_complete_models_optimum() -> None:
    # eq. 37 is a perturbation solution for the minimum of the complete model's wall time
    for delta, mtbf in ((300.0, 86400.0), (300.0, 21600.0), (6.3, 11135.0), (148.8, 11135.0)):
        best = minimize_scalar(
            lambda tau, d=delta, m=mtbf: lost_fraction(tau, d, m, 600.0),
            bounds=(1e-3, 10 * mtbf),
            method="bounded",
            options={"xatol": 1e-6},
        )
        assert daly_interval(delta, mtbf) == pytest.approx(best.x, rel=2e-3)


def test_lost_fraction_hand_computed() -> None:
    # M = 1000 s, δ = 10 s, τ = 100 s: e^0.11 = 1.1162781, 1 − 100/116.27807 = 0.139991
    assert lost_fraction(100.0, 10.0, 1000.0, 0.0) == pytest.approx(0.139991, abs=2e-6)
    # with R = 100 s the wall time gains e^0.1 = 1.1051709: 1 − 100/128.50713 = 0.221833
    assert lost_fraction(100.0, 10.0, 1000.0, 100.0) == pytest.approx(0.221833, abs=2e-6)
    # first order agrees when δ, τ << M: δ/τ + τ/2M = 0.01 + 0.005
    assert lost_fraction(100.0, 1.0, 10_000.0, 0.0) == pytest.approx(0.015, abs=5e-4)


def test_research_note_example_at_llama3_mtbf() -> None:
    # M = 11,135 s: δ = 148.8 s wastes about 16% (first order), δ = 6.3 s about 3.4%
    m = 11_135.0
    big = lost_fraction(daly_interval(148.8, m), 148.8, m, 0.0)
    small = lost_fraction(daly_interval(6.3, m), 6.3, m, 0.0)
    assert big == pytest.approx(0.155, abs=0.01)
    assert small == pytest.approx(0.034, abs=0.002)


def _side(name: str, delta: float | None, energy: float | None = 100.0) -> SideMeasurement:
    return SideMeasurement(
        side=name,
        runs=(f"{name}-1", f"{name}-2"),
        delta_s=delta,
        delta_basis="wall time of main-thread checkpoint episodes",
        episodes=12,
        codepath="torch" if name == "baseline" else "many",
        host_energy_j_per_checkpoint=energy,
        energy_source="rapl",
        restore_s=None,
        unavailable=None if delta is not None else "no episodes recorded (schema 1)",
    )


def test_projection_hand_computed_with_a_fixed_interval(tmp_path: Path) -> None:
    f = tmp_path / "cluster.yaml"
    f.write_text(
        "gpus: 1000\ngpus_per_node: 10\nmtbf_h: 10\nrestart_s: 0\ngpu_power_w: 500\n"
        "pue: [1.2, 1.5]\nwue_l_per_kwh: 2\npolicy: {interval_s: 360}\n"
    )
    cfg = load_cluster(f)
    out = project(cfg, _side("baseline", 36.0, energy=3600.0), _side("candidate", 3.6, None))
    m = 36_000.0
    lost_b = 1 - 360 / (m * math.expm1(396 / m))
    lost_c = 1 - 360 / (m * math.expm1(363.6 / m))
    b, c = out["baseline"], out["candidate"]
    assert b["interval_s"] == 360.0
    assert b["lost_fraction"] == pytest.approx(lost_b, rel=1e-12)
    assert b["gpu_hours_per_year"] == pytest.approx(lost_b * 1000 * 8760, rel=1e-12)
    # host energy: 3600 J per checkpoint per node, 100 nodes, (1 − lost) × 8760 h / 360 s
    checkpoints = (1 - lost_b) * 8760 * 3600 / 360
    host_mwh = checkpoints * 100 * 3600 / 3.6e9
    it_b = lost_b * 1000 * 8760 * 500 / 1e6 + host_mwh
    assert b["it_mwh_per_year"] == pytest.approx(it_b, rel=1e-12)
    assert b["facility_mwh_per_year"] == pytest.approx([it_b * 1.2, it_b * 1.5])
    assert b["water_l_per_year"] == pytest.approx([it_b * 2000, it_b * 2000])
    it_c = lost_c * 1000 * 8760 * 500 / 1e6  # the candidate's host energy is unavailable
    assert c["it_mwh_per_year"] == pytest.approx(it_c, rel=1e-12)
    saved = out["saved"]
    assert saved["gpu_hours_per_year"] == pytest.approx((lost_b - lost_c) * 8_760_000)
    assert saved["mwh_per_year"] == pytest.approx([(it_b - it_c) * 1.2, (it_b - it_c) * 1.5])
    assert any("unavailable" in a for a in c["lines"][3]["assumed"])
    assert out["inputs"]["mtbf_h"]["source"] == "assumed (given in cluster.yaml:3)"


def test_every_line_names_its_formula_and_what_was_measured_and_assumed() -> None:
    out = project(default_cluster(), _side("baseline", 60.0), _side("candidate", 6.0))
    for side in ("baseline", "candidate"):
        for line in out["candidate"]["lines"]:
            assert line["formula"] and isinstance(line["inputs"], dict)
        interval = out[side]["lines"][0]
        assert "Daly 2006" in interval["formula"]
        assert any(f"runs {side}-1, {side}-2" in m for m in interval["measured"])
        assert any(a.startswith("mtbf_h = 3.093 h (assumed default") for a in interval["assumed"])
    assert "lower bound" in out["scaling"]
    for name in DEFAULTS:
        assert out["inputs"][name]["source"].startswith("assumed default")


def test_sensitivity_covers_every_ranged_input_sorted_by_swing() -> None:
    out = project(default_cluster(), _side("baseline", 60.0), _side("candidate", 6.0))
    sens = {e["input"]: e for e in out["sensitivity"]}
    assert set(sens) == {"mtbf_h", "restart_s", "gpu_power_w", "pue", "wue_l_per_kwh"}
    swings = [e["relative_swing"] for e in out["sensitivity"]]
    assert swings == sorted(swings, reverse=True)
    mtbf = sens["mtbf_h"]
    assert (mtbf["low"], mtbf["high"]) == (1.547, 6.186)
    # a shorter MTBF makes every checkpoint stall costlier: more saved
    assert mtbf["saved_at_low"] > mtbf["saved_at_central"] > mtbf["saved_at_high"]
    pue = sens["pue"]  # facility MWh is IT MWh x PUE
    assert pue["saved_at_high"] / pue["saved_at_low"] == pytest.approx(1.58 / 1.1)
    assert sens["wue_l_per_kwh"]["figure"] == "water_l"


def test_lost_parts_sum_to_the_lost_fraction_and_restart_is_1_minus_e_to_minus_r_over_m() -> None:
    out = project(default_cluster(), _side("baseline", 60.0), _side("candidate", 6.0))
    for side in ("baseline", "candidate"):
        p = out[side]
        parts = p["lost_parts"]
        assert sum(parts.values()) == pytest.approx(p["lost_fraction"], rel=1e-12)
        assert parts["restart"] == pytest.approx(1 - math.exp(-600.0 / (3.093 * 3600)))
        assert min(parts.values()) > 0
    assert out["baseline"]["lost_parts"]["stall"] > out["candidate"]["lost_parts"]["stall"]


def test_saved_figures_carry_the_ratio_interval() -> None:
    base, cand = _side("baseline", 60.0), _side("candidate", 6.0)
    out = project(default_cluster(), base, cand, ratio_ci95=(0.05, 0.2))
    gpu = out["saved"]["gpu_h"]
    lo, hi = gpu["ci95"]
    assert lo < gpu["value"] < hi and gpu["display"] is None
    # the bounds are the saved figure with the candidate's δ at 60 s x 0.2 and x 0.05
    at = project(default_cluster(), base, _side("candidate", 12.0))["saved"]["gpu_h"]["value"]
    assert lo == pytest.approx(at)
    holds = project(default_cluster(), base, cand, ratio_ci95=(0.05, 1.5))["saved"]
    assert all(holds[k]["display"] == "~" for k in ("gpu_h", "it_mwh", "facility_mwh", "water_l"))
    none = project(default_cluster(), base, cand)["saved"]["gpu_h"]
    assert none["ci95"] is None and none["display"] == "~"


def test_a_side_without_episodes_has_no_projection() -> None:
    out = project(default_cluster(), _side("baseline", None), _side("candidate", 6.0))
    assert out["baseline"] == {"unavailable": "no episodes recorded (schema 1)"}
    assert out["saved"] is None and out["sensitivity"] == []


def test_defaults_and_policies(tmp_path: Path) -> None:
    empty = parse_cluster("", tmp_path / "c.yaml")
    assert empty.value("gpus") == 16384 and empty.policy.kind == "daly"
    steps = parse_cluster("policy: {interval_steps: 500, step_s: 3.6}\n", tmp_path / "c.yaml")
    assert steps.policy.kind == "fixed" and steps.policy.interval_s == pytest.approx(1800.0)
    single = parse_cluster("pue: 1.3\n", tmp_path / "c.yaml")
    assert (single.inputs["pue"].low, single.inputs["pue"].high) == (1.3, 1.3)


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("gpus: 8\nmtbf: 3\n", 2, "unknown key 'mtbf' (did you mean 'mtbf_h'?)"),
        ("gpus: 8\npue: 0.5\n", 2, "pue: must be at least 1"),
        ("pue: [1.6, 1.2]\n", 1, "low 1.6 is above its high 1.2"),
        ("wue_l_per_kwh: [1]\n", 1, "two numbers"),
        ("gpus: 8.5\n", 1, "gpus: must be an integer"),
        ("\n\nmtbf_h: -1\n", 3, "mtbf_h: must be greater than 0"),
        ("policy: young\n", 1, "policy: must be daly"),
        ("policy: {interval_s: 60, step_s: 1}\n", 1, "give either interval_s"),
        ("gpus: 4\ngpus_per_node: 8\n", 2, "is more than gpus"),
        ("gpus: [\n", None, "not valid YAML"),
    ],
)
def test_bad_cluster_files_name_the_key_and_line(
    tmp_path: Path, text: str, line: int | None, needle: str
) -> None:
    f = tmp_path / "cluster.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_cluster(f)
    message = str(info.value)
    assert needle in message
    if line is not None:
        assert f"cluster.yaml:{line}:" in message


def test_a_missing_cluster_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_cluster(tmp_path / "nope.yaml")
