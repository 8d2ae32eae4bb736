"""The report recomputed from its inputs, end to end, without serwatt's statistics or
projection code (issue 25's done-when): a reader who takes the runs' checkpoint stalls and
the cluster file and redoes the sums with scipy and the formulas of docs/report.md gets
the report's stall ratio, p, interval, Daly interval, lost fraction, its three parts, the
yearly GPU-hours and energy, and the saved figures with their interval."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from serwatt.profiler.report import build_report, load_cluster
from serwatt.profiler.report.inputs import EpisodeInput, RunInput
from tests.report_synth import make_run

# Stalls in the order the job took them: no trend and no lag-1 dependence, so each
# episode is one observation (the report checks that, below). 7 + 7 episodes: 3432
# arrangements, so the permutation test is exact and scipy's must give the same p.
# four runs a side: the run is the test's unit, and 4 + 4 is the fewest that can reject
BASELINE = ((0.81, 0.74, 0.93, 0.70), (0.88, 0.69, 0.79), (0.77, 0.85, 0.72), (0.90, 0.76))
CANDIDATE = ((0.52, 0.61, 0.47, 0.58), (0.50, 0.66, 0.55), (0.59, 0.49, 0.57), (0.54, 0.63))
CLUSTER = """\
gpus: 4096
gpus_per_node: 8
mtbf_h: 5
restart_s: 900
gpu_power_w: 600
pue: 1.25
wue_l_per_kwh: 1.5
state_bytes_per_gpu: 1000000
storage_write_gb_s: 100000
policy: daly
"""
HOURS = 8760.0


def _run(run_id: str, codepath: str, stalls: tuple[float, ...], t0: float) -> RunInput:
    run = make_run(run_id, codepath=codepath, t0=t0, energy_source="unavailable", windows=12)
    episodes = tuple(
        EpisodeInput(
            pid=4242, thread=4242, codepath=codepath, start=t0 + 2.0 + 7.0 * i,
            end=t0 + 2.0 + 7.0 * i + s, wall_s=s, resolution_s=0.02, cpu_s=0.9 * s,
            gpu_wait_s=None, gpu_idle_j=None, main_thread=True, durable=True,
        )
        for i, s in enumerate(stalls)
    )  # fmt: skip
    return dataclasses.replace(run, episodes=episodes)


def _daly(delta: float, m: float) -> float:
    """Daly 2006's higher-order interval (docs/report.md)."""
    x = delta / (2 * m)
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def _lost(delta: float, m: float, r: float) -> tuple[float, float, float, float]:
    """The lost fraction at Daly's interval and its three parts: (lost, stall, rework,
    restart), from Daly's complete model T_w/T_s = M e^{R/M} (e^{(τ+δ)/M} − 1)/τ."""
    tau = _daly(delta, m)

    def lost_at(d: float) -> float:
        return 1 - tau / (m * math.exp(r / m) * math.expm1((tau + d) / m))

    restart = 1 - math.exp(-r / m)
    rework = lost_at(0.0) - restart
    return lost_at(delta), lost_at(delta) - rework - restart, rework, restart


def _figures(delta: float, m: float, r: float) -> dict[str, float]:
    lost = _lost(delta, m, r)[0]
    gpu_h = lost * 4096 * HOURS
    it_mwh = gpu_h * 600 / 1e6  # host energy unavailable on both sides: GPU energy only
    return {"gpu_h": gpu_h, "it_mwh": it_mwh, "facility_mwh": it_mwh * 1.25,
            "water_l": it_mwh * 1000 * 1.5}  # fmt: skip


def test_the_report_is_what_its_inputs_give_recomputed_by_hand(tmp_path: Path) -> None:
    baseline = [_run(f"a-{k}", "torch", s, 1e9 + 400 * k) for k, s in enumerate(BASELINE)]
    candidate = [_run(f"b-{k}", "many", s, 1e9 + 200 + 400 * k) for k, s in enumerate(CANDIDATE)]
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(CLUSTER)
    report = build_report(baseline, candidate, cluster=load_cluster(cluster_file))
    ck = report["checkpoint"]
    assert not ck["baseline"]["warmup"]["detected"] and not ck["candidate"]["warmup"]["detected"]
    assert report["interleaving"]["order"] == "ABABABAB"

    # the stall: the ratio of the sides' means over their checkpoints, tested by an exact
    # permutation test of whole runs, studentized by the runs' cluster-robust variance, and
    # by a Welch test of the log ratio with floored variances: p the larger
    x = np.array([s for run in BASELINE for s in run])
    y = np.array([s for run in CANDIDATE for s in run])
    # a run as one complex number: its summed stall (real) and its checkpoints (imag)
    xr = np.array([sum(run) + 1j * len(run) for run in BASELINE])
    yr = np.array([sum(run) + 1j * len(run) for run in CANDIDATE])

    def side(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, w = runs.real, runs.imag
        g = s.shape[-1]
        r = s.sum(-1) / w.sum(-1)
        resid = (s - r[..., None] * w) / w.mean(-1)[..., None]
        return r, (resid**2).sum(-1) / (g * (g - 1)) / r**2

    def studentized(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        (ra, va), (rb, vb) = side(a), side(b)
        return np.log(rb / ra) / np.sqrt(va + vb)

    def floored(runs: np.ndarray) -> float:
        # the Welch test's variance: at least what the spread of the runs' logs implies
        # for a lognormal side, (e^{s^2} - 1) * sum(W^2) / sum(W)^2
        s, w = runs.real, runs.imag
        floor = math.expm1(float(np.var(np.log(s / w), ddof=1))) * (w * w).sum() / w.sum() ** 2
        return max(float(side(runs)[1]), floor)

    def p_of(r: float) -> float:
        scaled = yr.real / r + 1j * yr.imag
        permutation = float(
            sps.permutation_test(
                (xr, scaled), studentized, permutation_type="independent", vectorized=True,
                n_resamples=math.inf,
            ).pvalue.real
        )  # fmt: skip
        # the reported p is the larger of it and Welch's, with Hsu's df (4 runs less one)
        t = math.log(ratio / r) / math.sqrt(floored(xr) + floored(yr))
        return max(permutation, float(2 * sps.t.sf(abs(t), 3)))

    ratio = y.mean() / x.mean()
    stall = ck["stall_s"]
    assert (stall["baseline"], stall["candidate"]) == pytest.approx((x.mean(), y.mean()), rel=1e-12)
    assert stall["ratio"] == pytest.approx(ratio, rel=1e-12)
    assert stall["p"] == pytest.approx(p_of(1.0), rel=1e-12)
    # one test in the primary family: Holm leaves it as it is
    assert stall["family"] == "checkpoint" and stall["p_adjusted"] == stall["p"]
    # the interval: the ratios the same test does not reject at 5%, found by bisection
    # between the estimate and a ratio it rejects (p is a step function of r)
    lo = optimize.bisect(lambda r: p_of(r) - 0.0499999, ratio * 0.5, ratio, xtol=1e-7)
    hi = optimize.bisect(lambda r: p_of(r) - 0.0499999, ratio, ratio * 2.0, xtol=1e-7)
    assert stall["ci95"] == pytest.approx([lo, hi], rel=1e-5)
    assert stall["significant"] == (not lo <= 1.0 <= hi) == (stall["p"] < 0.05)

    # the projection: each side's δ is its mean stall (the bandwidth bound, 1 MB x 4096
    # GPUs / 100 TB/s = 41 us, binds neither), R = restart_s (no restores)
    proj = report["projection"]
    m, r = 5 * 3600.0, 900.0
    for side, delta in (("baseline", x.mean()), ("candidate", y.mean())):
        got = proj[side]
        assert got["bound"] == "measured stall" and got["delta_s"] == pytest.approx(delta)
        assert got["interval_s"] == pytest.approx(_daly(delta, m), rel=1e-9)
        lost, stall_part, rework, restart = _lost(delta, m, r)
        assert got["lost_fraction"] == pytest.approx(lost, rel=1e-9)
        parts = got["lost_parts"]
        assert [parts["stall"], parts["rework"], parts["restart"]] == pytest.approx(
            [stall_part, rework, restart], rel=1e-9
        )
        want = _figures(delta, m, r)
        assert got["gpu_hours_per_year"] == pytest.approx(want["gpu_h"], rel=1e-9)
        assert got["it_mwh_per_year"] == pytest.approx(want["it_mwh"], rel=1e-9)
    # saved = baseline - candidate; its interval: the candidate's δ at the baseline's δ
    # times each end of the ratio's interval (every saved figure falls as that δ grows)
    central = {k: _figures(x.mean(), m, r)[k] - _figures(y.mean(), m, r)[k] for k in
               ("gpu_h", "it_mwh", "facility_mwh", "water_l")}  # fmt: skip
    for key, value in central.items():
        saved = proj["saved"][key]
        assert saved["value"] == pytest.approx(value, rel=1e-9), key
        at_hi = _figures(x.mean(), m, r)[key] - _figures(x.mean() * hi, m, r)[key]
        at_lo = _figures(x.mean(), m, r)[key] - _figures(x.mean() * lo, m, r)[key]
        assert saved["ci95"] == pytest.approx([at_hi, at_lo], rel=1e-4), key
