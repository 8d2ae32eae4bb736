"""The cluster projection against Daly's worked values and hand-computed cases."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from scipy.optimize import minimize_scalar

from serwatt.profiler.report.checkpoint_model import (
    CheckpointSize,
    SideMeasurement,
    daly_interval,
    lost_fraction,
)
from serwatt.profiler.report.cluster import (
    DEFAULTS,
    default_cluster,
    load_cluster,
    parse_cluster,
    projection_cluster,
)
from serwatt.profiler.report.projection import project
from serwatt.profiler.yamlcheck import ConfigError

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


def _line(side: dict, name: str) -> dict:
    return next(line for line in side["lines"] if line["name"] == name)


def _side(
    name: str,
    delta: float | None,
    energy: float | None = 100.0,
    checkpoints: tuple[CheckpointSize, ...] = (),
) -> SideMeasurement:
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
        checkpoints=checkpoints,
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
    assert any("unavailable" in a for a in _line(c, "it_mwh_per_year")["assumed"])
    assert out["inputs"]["mtbf_h"]["source"] == "assumed (given in cluster.yaml:3)"


def test_every_line_names_its_formula_and_what_was_measured_and_assumed() -> None:
    out = project(default_cluster(), _side("baseline", 60.0), _side("candidate", 6.0))
    for side in ("baseline", "candidate"):
        for line in out["candidate"]["lines"]:
            assert line["formula"] and isinstance(line["inputs"], dict)
        interval = _line(out[side], "interval_s")
        assert "Daly 2006" in interval["formula"]
        assert any(f"runs {side}-1, {side}-2" in m for m in interval["measured"])
        assert any(a.startswith("mtbf_h = 3.093 h (assumed default") for a in interval["assumed"])
    assert "lower bound" in out["scaling"]
    for name in DEFAULTS:
        assert out["inputs"][name]["source"].startswith("assumed default")


def test_sensitivity_covers_every_ranged_input_sorted_by_swing() -> None:
    out = project(default_cluster(), _side("baseline", 60.0), _side("candidate", 6.0))
    sens = {e["input"]: e for e in out["sensitivity"]}
    assert set(sens) == {
        "mtbf_h", "restart_s", "gpu_power_w", "pue", "wue_l_per_kwh", "state_bytes_per_gpu",
        "storage_write_gb_s", "machine_stall_factor",
    }  # fmt: skip
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


MB = 1e6


def _sync(nbytes: float, stall_s: float, n: int = 4) -> tuple[CheckpointSize, ...]:
    return tuple(CheckpointSize(nbytes, stall_s, 0.0, 0.01) for _ in range(n))


def test_a_synchronous_stall_is_scaled_to_the_state_per_gpu_linearly_in_bytes(
    tmp_path: Path,
) -> None:
    cfg = parse_cluster(
        "gpus: 1024\nstate_bytes_per_gpu: 640000000\nstorage_write_gb_s: 1000000\n",
        tmp_path / "c.yaml",
    )
    base = _side("baseline", 0.3, checkpoints=_sync(64 * MB, 0.3))
    out = project(cfg, base, _side("candidate", 0.03, checkpoints=_sync(64 * MB, 0.03)))
    b = out["baseline"]
    assert b["delta_node_s"] == 0.3 and b["delta_s"] == pytest.approx(3.0, rel=1e-12)
    assert b["scaling"]["method"] == "proportional" and b["bound"] == "measured stall"
    assert b["scaling"]["bytes_measured"] == 64 * MB
    assert b["interval_s"] == pytest.approx(daly_interval(3.0, 3.093 * HOUR), rel=1e-12)
    delta_line = _line(b, "delta_s")
    assert any("bytes per checkpoint = 6.4e+07 B" in m for m in delta_line["measured"])
    assert any(a.startswith("state_bytes_per_gpu = 6.4e+08 B") for a in delta_line["assumed"])
    # without file sizes δ stays the node's, and the report says so
    plain = project(cfg, _side("baseline", 0.3), _side("candidate", 0.03))["baseline"]
    assert plain["delta_s"] == 0.3 and plain["scaling"]["method"] == "unscaled"
    assert "sizes not measured" in plain["scaling"]["note"]
    assert plain["scaling"]["mode_source"].startswith("assumed")


def test_a_synchronous_stall_is_at_least_the_storage_bandwidth_bound(tmp_path: Path) -> None:
    # 1024 GPUs x 640 MB over 100 GB/s: 6.5536 s, above the 3 s the node's stall scales to
    cfg = parse_cluster(
        "gpus: 1024\nstate_bytes_per_gpu: 640000000\nstorage_write_gb_s: 100\n", tmp_path / "c.yaml"
    )
    base = _side("baseline", 0.3, checkpoints=_sync(64 * MB, 0.3))
    b = project(cfg, base, _side("candidate", 0.03, checkpoints=_sync(64 * MB, 0.03)))["baseline"]
    assert b["scaling"]["bandwidth_bound_s"] == pytest.approx(1024 * 640e6 / 100e9, rel=1e-12)
    assert b["delta_s"] == pytest.approx(6.5536, rel=1e-12)
    assert b["scaling"]["delta_scaled_s"] == pytest.approx(3.0, rel=1e-12)
    assert b["bound"] == "storage bandwidth"


def test_two_sizes_are_fitted_with_an_intercept(tmp_path: Path) -> None:
    # stall = 0.1 s + 2.5e-9 s/B: 0.18 s at 32 MB, 0.42 s at 128 MB; at 400 MB: 1.1 s
    cfg = parse_cluster(
        "state_bytes_per_gpu: 400000000\nstorage_write_gb_s: 1000000\n", tmp_path / "c.yaml"
    )
    sizes = _sync(32 * MB, 0.18, 3) + _sync(128 * MB, 0.42, 3)
    b = project(cfg, _side("baseline", 0.3, checkpoints=sizes), _side("candidate", 0.03))
    sc = b["baseline"]["scaling"]
    assert sc["method"] == "fit" and sc["sizes"] == 2
    assert sc["intercept_s"] == pytest.approx(0.1, rel=1e-9)
    assert sc["slope_s_per_byte"] == pytest.approx(2.5e-9, rel=1e-9)
    # the node's δ (0.3 s, the mean stall) becomes the line's value at 400 MB
    assert b["baseline"]["delta_s"] == pytest.approx(1.1, rel=1e-9)
    # sizes within SIZE_SPREAD of each other are not fitted
    close = _sync(60 * MB, 0.28, 3) + _sync(80 * MB, 0.32, 3)
    near = project(cfg, _side("baseline", 0.3, checkpoints=close), _side("candidate", 0.03))
    assert near["baseline"]["scaling"]["method"] == "proportional"


def test_an_asynchronous_side_keeps_its_copy_and_waits_for_its_background_write(
    tmp_path: Path,
) -> None:
    # the stall (the copy) ends 2 s before the file is durable: asynchronous. Scaled by
    # 10x bytes, the write takes 20 s, longer than the 5 s fixed interval: τ = 20 s.
    cfg = parse_cluster(
        "gpus: 1024\nstate_bytes_per_gpu: 640000000\nstorage_write_gb_s: 100\n"
        "policy: {interval_s: 5}\n",
        tmp_path / "c.yaml",
    )
    copy = tuple(CheckpointSize(64 * MB, 0.05, 2.0, 0.01) for _ in range(4))
    out = project(cfg, _side("baseline", 0.3, checkpoints=_sync(64 * MB, 0.3)),
                  _side("candidate", 0.05, checkpoints=copy))  # fmt: skip
    # the saving takes the baseline's sizes and mode: the candidate's own is a model's
    assert out["candidate"]["scaling"]["mode"] == "synchronous"
    c = out["candidate_own_model"]
    assert c["scaling"]["mode"] == "asynchronous"
    assert c["delta_s"] == pytest.approx(0.5, rel=1e-12)  # the copy, not the bandwidth bound
    assert c["scaling"]["background_write_s"] == pytest.approx(20.0, rel=1e-12)
    assert c["interval_s"] == pytest.approx(20.0, rel=1e-12) and c["bound"] == "background write"
    # with a long interval nothing waits: the measured copy binds
    slow = parse_cluster(
        "gpus: 1024\nstate_bytes_per_gpu: 640000000\nstorage_write_gb_s: 100\n"
        "policy: {interval_s: 600}\n",
        tmp_path / "c.yaml",
    )
    c = project(slow, _side("baseline", 0.3), _side("candidate", 0.05, checkpoints=copy))
    own = c["candidate_own_model"]
    assert own["interval_s"] == 600 and own["bound"] == "measured stall"
    # a tail within the checkpoints' resolution is no background write
    late = tuple(CheckpointSize(64 * MB, 0.3, 0.04, 0.01) for _ in range(4))
    c = project(cfg, _side("baseline", 0.3, checkpoints=late), _side("candidate", 0.05))
    assert c["baseline"]["scaling"]["mode"] == "synchronous"
    # unless the files were seen written by another thread than the stalled one: the
    # demo's many.Checkpointer, a 64 MB write and fsync 40-70 ms after a 15 ms copy,
    # resolution 15 ms. Most of the files, not one: a stray match does not make it so.
    quick = tuple(CheckpointSize(64 * MB, 0.015, 0.05, 0.015, written_apart=True) for _ in range(4))
    c = project(cfg, _side("baseline", 0.3), _side("candidate", 0.015, checkpoints=quick))
    scaling = c["candidate_own_model"]["scaling"]
    assert scaling["mode"] == "asynchronous", scaling
    assert scaling["mode_source"].startswith("measured: 4 of 4 files written by another thread")
    assert c["candidate_own_model"]["delta_s"] == pytest.approx(0.15, rel=1e-12)  # the copy
    assert scaling["background_write_s"] == pytest.approx(0.5, rel=1e-12)
    stray = (*late[:3], dataclasses.replace(late[3], written_apart=True))
    c = project(cfg, _side("baseline", 0.3, checkpoints=stray), _side("candidate", 0.05))
    assert c["baseline"]["scaling"]["mode"] == "synchronous"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("state_bytes_per_gpu: 0\n", "state_bytes_per_gpu: must be greater than 0"),
        ("storage_write_gb_s: -5\n", "storage_write_gb_s: must be greater than 0"),
    ],
)
def test_the_cluster_scale_inputs_are_checked(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_cluster(text, tmp_path / "c.yaml")


def test_a_measured_restore_replaces_the_read_restart_s_holds_never_adds_to_it(
    tmp_path: Path,
) -> None:
    # restart_s (its default's source retrieves the checkpoint) holds one read: the
    # baseline's 30 s restore is that read, so the baseline's R stays 600 s and the
    # candidate's is 600 - 30 + 5 = 575 s.
    cfg = parse_cluster("restart_s: 600\nmtbf_h: 3\n", tmp_path / "c.yaml")
    base = dataclasses.replace(_side("baseline", 6.0), restore_s=30.0)
    cand = dataclasses.replace(_side("candidate", 6.0), restore_s=5.0)
    out = project(cfg, base, cand)
    assert out["baseline"]["restart_s"] == 600.0 and out["candidate"]["restart_s"] == 575.0
    m = 3 * HOUR
    tau = daly_interval(6.0, m)
    assert out["candidate"]["lost_fraction"] == pytest.approx(
        lost_fraction(tau, 6.0, m, 575.0), rel=1e-12
    )
    assert "not counted twice" in out["candidate"]["restart_note"]
    # equal stalls: the whole saving is the 25 s of restore per failure
    saved = out["saved"]["lost_fraction"]
    assert saved == pytest.approx(
        lost_fraction(tau, 6.0, m, 600.0) - lost_fraction(tau, 6.0, m, 575.0), rel=1e-12
    )
    # a restore measured on one side only moves neither side's R
    one = project(cfg, base, _side("candidate", 6.0))
    assert one["baseline"]["restart_s"] == one["candidate"]["restart_s"] == 600.0
    assert "one side only" in one["baseline"]["restart_note"]
    assert one["saved"]["lost_fraction"] == 0.0


SAVED = ("gpu_h", "it_mwh", "facility_mwh", "water_l")
# a background writer: the stall (the copy) ends 2 s before the file is durable, and the
# file is written by another thread. The projection used to model such a candidate with
# no storage bound on its δ, so an equal or slower stall still "saved".
ASYNC_COPY = tuple(CheckpointSize(64 * MB, 0.3, 2.0, 0.01, written_apart=True) for _ in range(4))


@pytest.mark.parametrize(
    "cluster",
    ["", "storage_write_gb_s: 1000000\n", "policy: {interval_s: 1800}\n"],
    ids=["defaults", "fast-storage", "fixed-30-min"],
)
def test_two_equal_sides_save_nothing(cluster: str, tmp_path: Path) -> None:
    cfg = parse_cluster(cluster, tmp_path / "c.yaml")
    base = _side("baseline", 0.3, checkpoints=_sync(64 * MB, 0.3))
    cand = _side("candidate", 0.3, checkpoints=ASYNC_COPY)
    saved = project(cfg, base, cand, ratio_ci95=(0.8, 1.25))["saved"]
    for name in SAVED:
        assert saved[name]["value"] == 0.0 and saved[name]["display"] == "~", (name, saved[name])
    assert saved["lost_fraction"] == 0.0 and saved["gpu_hours_per_year"] == 0.0
    assert saved["no_change"] is True


@pytest.mark.parametrize(
    "cluster",
    ["", "storage_write_gb_s: 1000000\n", "policy: {interval_s: 1800}\n"],
    ids=["defaults", "fast-storage", "fixed-30-min"],
)
@pytest.mark.parametrize("slower", [1.2, 2.8])
def test_a_slower_candidate_never_saves(cluster: str, slower: float, tmp_path: Path) -> None:
    cfg = parse_cluster(cluster, tmp_path / "c.yaml")
    base = _side("baseline", 0.3, checkpoints=_sync(64 * MB, 0.3))
    cand = dataclasses.replace(
        _side("candidate", 0.3 * slower, checkpoints=ASYNC_COPY), host_energy_j_per_checkpoint=100.0
    )
    out = project(cfg, base, cand, ratio_ci95=(slower * 0.9, slower * 1.1))
    saved = out["saved"]
    for name in SAVED:
        assert saved[name]["value"] <= 0.0, (name, saved[name])
        assert saved[name]["ci95"][1] <= 0.0, (name, saved[name])
    assert saved["lost_fraction"] <= 0.0 and saved["gpu_hours_per_year"] <= 0.0
    for e in out["policy_sensitivity"]:
        assert e["saved"]["gpu_h"] <= 0.0, e


def test_the_envelope_and_the_sampling_interval_are_each_labelled() -> None:
    base, cand = _side("baseline", 60.0), _side("candidate", 6.0)
    out = project(default_cluster(), base, cand, ratio_ci95=(0.05, 0.2))
    gpu = out["saved"]["gpu_h"]
    assert gpu["ci95_basis"] == "sampling only" and gpu["envelope_basis"].startswith("assumptions")
    lo, hi = gpu["envelope"]
    assert lo <= gpu["value"] <= hi and hi > 1.5 * lo  # the assumptions spread it far wider
    assert out["estimated"] is True and out["heading"].startswith("ESTIMATED")
    policies = {e["policy"]: e for e in out["policy_sensitivity"]}
    assert set(policies) == {"daly", "fixed: every 1800 s", "fixed: every 10800 s"}
    assert policies["daly"]["configured"] and not policies["fixed: every 1800 s"]["configured"]
    # defaults at an end of their range say so (the text no longer calls them midpoints)
    assert out["inputs"]["storage_write_gb_s"]["default_at"] == "at the low end"
    assert out["inputs"]["gpu_power_w"]["default_at"] == "at the high end"
    assert "midpoint" not in out["saved"]["interval_basis"]


def test_a_machine_class_scaling_is_an_assumption_and_one_size_fixes_no_slope(
    tmp_path: Path,
) -> None:
    cfg = parse_cluster(
        "gpus: 1024\nstate_bytes_per_gpu: 640000000\nstorage_write_gb_s: 1000000\n"
        "machine_stall_factor: 0.5\n",
        tmp_path / "c.yaml",
    )
    out = project(
        cfg, _side("baseline", 0.3, checkpoints=_sync(64 * MB, 0.3)), _side("candidate", 0.1)
    )
    sc = out["baseline"]["scaling"]
    assert sc["delta_s"] == pytest.approx(0.3 * 10 * 0.5, rel=1e-12)
    assert "one measured size: it fixes no slope" in sc["note"]
    assert out["inputs"]["machine_stall_factor"]["kind"] == "assumed"
    assert DEFAULTS["machine_stall_factor"][1] == (0.5, 2.0)


def test_the_projection_is_made_only_when_asked_for(tmp_path: Path) -> None:
    assert projection_cluster(None, project=False) is None  # off by default
    assert projection_cluster(None, project=True) == default_cluster()
    f = tmp_path / "c.yaml"
    f.write_text("gpus: 64\ngpus_per_node: 8\n")
    given = projection_cluster(f, project=False)
    assert given is not None and given.value("gpus") == 64 and given.path == str(f.absolute())
