"""The report's statistics on cases whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from serwatt.profiler.report import stats
from serwatt.profiler.report.inputs import CodepathFigures, WindowInput


def _ci(c: stats.Comparison) -> tuple[float, float]:
    assert c.ci95 is not None and c.ci95[0] is not None and c.ci95[1] is not None
    return c.ci95[0], c.ci95[1]


def test_identical_constant_samples_give_p_1_ratio_1_and_an_interval_holding_1() -> None:
    c = stats.compare([2.0] * 6, [2.0] * 6)
    assert c.p == 1.0
    assert c.ratio == 1.0
    lo, hi = _ci(c)
    assert lo <= 1.0 <= hi


def test_identical_varied_samples_give_p_1_and_an_interval_holding_1() -> None:
    values = [3.1, 2.4, 5.0, 4.2, 3.3, 2.9, 4.8, 3.7]
    c = stats.compare(values, list(reversed(values)))
    assert c.p == 1.0
    assert c.ratio == pytest.approx(1.0)
    lo, hi = _ci(c)
    assert lo < 1.0 < hi
    assert c.ci_method == stats.CI_METHOD


def test_shifted_samples_are_significant_with_an_interval_excluding_1() -> None:
    rng = np.random.default_rng(7)
    base = rng.normal(10.0, 0.5, 10)
    cand = base * 0.5  # exactly half of every baseline value
    c = stats.compare(base, cand)
    assert c.ratio == pytest.approx(0.5)
    # fully separated samples of 10 + 10: the exact two-sided p is 2 / C(20, 10)
    assert c.p is not None and c.p < 0.001
    lo, hi = _ci(c)
    assert hi < 1.0 and lo < 0.5 < hi


def test_weights_make_the_side_value_a_ratio_of_sums() -> None:
    # blocks of 10 s and 30 s: 5 J in the first, 30 J in the second -> 35 J / 40 s
    c = stats.compare([5.0, 30.0], [5.0, 30.0], [10.0, 30.0], [10.0, 30.0])
    assert c.baseline == pytest.approx(35.0 / 40.0)
    assert c.ratio == pytest.approx(1.0)
    assert stats.side_value([5.0, 30.0], [10.0, 30.0]) == pytest.approx(0.875)


def test_bootstrap_is_reproducible() -> None:
    a, b = [1.0, 2.5, 3.0, 2.2, 1.9], [2.0, 3.5, 2.8, 4.1, 3.3]
    assert stats.compare(a, b) == stats.compare(a, b)


def test_zero_on_both_sides_is_not_tested() -> None:
    c = stats.compare([0.0, 0.0, 0.0], [0.0, 0.0])
    assert c.p is None and c.ratio is None
    assert c.note == "not tested: zero on both sides"


@pytest.mark.parametrize("n", [2, 3])
def test_where_no_arrangement_can_reject_there_is_no_interval(n: int) -> None:
    c = stats.compare([1.0 + i for i in range(n)], [3.0 + i for i in range(n)])
    assert c.ci95 is None and "no arrangement extreme enough" in (c.ci_note or "")
    assert c.p is not None
    four = stats.compare([1.0 + i for i in range(4)], [3.0 + i for i in range(4)])
    assert four.ci95 is not None


def test_one_run_on_a_side_is_not_tested() -> None:
    # one run shows no run-to-run variation: nothing to studentize by
    c = stats.compare([1.0], [3.0, 3.5, 2.9])
    assert c.p is None and "needs at least 2 runs per side" in (c.note or "")


@pytest.mark.parametrize(("n", "m"), [(2, 2), (2, 3), (3, 3), (4, 4), (5, 5), (3, 5), (2, 39)])
def test_min_p_is_two_over_the_number_of_run_arrangements(n: int, m: int) -> None:
    assert stats.min_p(n, m) == pytest.approx(min(1.0, 2.0 / math.comb(n + m, n)))
    assert stats.min_p(1, m) == 1.0  # one run: not tested


def test_minimum_sizes_match_the_exact_distribution() -> None:
    assert stats.min_p(4, 4) == pytest.approx(0.0286, abs=1e-4)  # benchstat's figure
    assert stats.min_p(5, 5) == pytest.approx(0.0079, abs=1e-4)
    assert stats.needed_per_side() == 4
    assert stats.needed_n(3) == 5  # 2/C(8,3) = 0.0357; 2/C(7,3) = 0.057
    assert stats.needed_n(2) == 8  # 2/C(10,2) = 0.044; 2/C(9,2) = 0.056
    assert stats.needed_n(1) is None


def test_min_attainable_p_counts_the_holm_family() -> None:
    # the figures: 4 + 4 gives 2/70 = 0.0286, x2 = 0.057, x8 = 0.229
    assert stats.min_attainable_p(4, 4, 1) == pytest.approx(2 / 70)
    assert stats.min_attainable_p(4, 4, 2) == pytest.approx(0.0571, abs=1e-4)
    assert stats.min_attainable_p(4, 4, 8) == pytest.approx(0.229, abs=1e-3)
    assert stats.power_warning(4, 4, "episodes", family=2) is not None
    w = stats.power_warning(4, 4, "blocks", family=8)
    assert w is not None and "0.229" in w.message and "Holm family of 8" in w.message
    # 5 + 5: 2/252 = 0.0079, x8 = 0.063 still too big; 6 + 6: 2/924 x 8 = 0.0173
    assert stats.needed_per_side(family=8) == 6
    # sampled arrangements: no p below 2 / (N_RESAMPLES + 1)
    assert stats.min_p(30, 30) == pytest.approx(2 / (stats.N_RESAMPLES + 1))


def test_p_is_scipys_permutation_test_of_the_studentized_ratio_over_runs() -> None:
    from scipy import stats as sps

    rng = np.random.default_rng(3)
    # six and seven runs (1716 arrangements: exact), each a sum of 3-7 checkpoints
    sb, sc = rng.lognormal(0.0, 1.0, 6) * 5, rng.lognormal(0.4, 1.0, 7) * 5
    wb, wc = rng.integers(3, 8, 6).astype(float), rng.integers(3, 8, 7).astype(float)

    def side(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, w = runs.real, runs.imag  # a run's sum and weight, kept together through scipy
        g = s.shape[-1]
        r = s.sum(-1) / w.sum(-1)
        resid = (s - r[..., None] * w) / w.mean(-1)[..., None]
        return r, (resid**2).sum(-1) / (g * (g - 1)) / r**2

    def studentized(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        (rb, vb), (rc, vc) = side(x), side(y)
        return np.log(rc / rb) / np.sqrt(vb + vc)

    want = sps.permutation_test(
        (sb + 1j * wb, sc + 1j * wc), studentized, permutation_type="independent", vectorized=True
    ).pvalue
    assert stats.compare(sb, sc, wb, wc).p == pytest.approx(want.real, rel=1e-12)


def test_the_interval_inverts_the_test_and_ignores_input_order() -> None:
    rng = np.random.default_rng(11)
    base, cand = rng.lognormal(0.0, 0.5, 12), rng.lognormal(-0.5, 0.5, 12)
    c = stats.compare(base, cand)
    lo, hi = _ci(c)
    assert lo < c.ratio < hi  # type: ignore[operator]
    # the bounds are where the test of candidate / r turns significant
    assert stats.compare(base, cand / (lo * 1.001)).p >= 0.05
    assert stats.compare(base, cand / (lo * 0.99)).p < 0.05
    assert stats.compare(base, cand / (hi * 0.999)).p >= 0.05
    assert stats.compare(base, cand / (hi * 1.01)).p < 0.05
    assert (c.p < 0.05) == (not lo <= 1.0 <= hi)  # type: ignore[operator]
    shuffled = stats.compare(rng.permutation(base), rng.permutation(cand))
    assert shuffled == c


def test_serial_dependence_describes_a_warm_up() -> None:
    rng = np.random.default_rng(5)
    flat = rng.lognormal(0.0, 0.1, 20)
    assert not stats.serial_dependence(flat).found
    warm = flat.copy()
    warm[:4] *= np.array([3.0, 2.6, 2.2, 1.8])  # the first checkpoints 2-3x the rest
    dep = stats.serial_dependence(warm)
    assert dep.found
    assert dep.trend_p is not None and dep.trend_p < 0.05
    assert dep.lag1_autocorrelation is not None and dep.lag1_autocorrelation > 0.3


def test_too_few_samples_warn_with_the_needed_n() -> None:
    w = stats.power_warning(3, 3, "blocks")
    assert w is not None
    assert w.needed_per_side == 4
    assert (w.needed_baseline, w.needed_candidate) == (5, 5)
    assert "needs at least 4 per side" in w.message and "attainable p is 0.1" in w.message
    assert stats.power_warning(4, 4, "blocks") is None
    lopsided = stats.power_warning(1, 20, "runs")
    assert lopsided is not None and lopsided.needed_baseline == 2  # 2/C(22,2) = 0.0087


def test_fully_separated_minimum_samples_reach_significance() -> None:
    # the needed size really is enough: four fully separated blocks per side
    c = stats.compare([1.0, 1.1, 1.2, 1.3], [2.0, 2.1, 2.2, 2.3])
    assert c.p is not None and c.p < 0.05
    c3 = stats.compare([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert c3.p is not None and c3.p >= 0.05


def test_holm_against_hand_worked_tables() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # sorted 0.001, 0.012, 0.04, 0.2, 0.3 times 5..1 = 0.005, 0.048, 0.12, 0.4, 0.3 -> 0.4
    got = stats.holm([0.001, 0.2, 0.012, 0.04, 0.3])
    assert got == pytest.approx([0.005, 0.4, 0.048, 0.12, 0.4])
    # untested entries stay None and do not count in the family (m = 2 here)
    got = stats.holm([None, 0.5, None, 0.01])
    assert got[0] is None and got[2] is None
    assert got[1] == pytest.approx(0.5) and got[3] == pytest.approx(0.02)
    # adjusted p caps at 1: 0.7 x 3 = 2.1
    assert stats.holm([0.7, 0.9, 0.8]) == pytest.approx([1.0, 1.0, 1.0])


def _window(t: float, pid: int | None = 1) -> WindowInput:
    return WindowInput(
        started_at=t,
        ended_at=t + 5.0,
        cpu_s=1.0,
        codepaths={"pickle": CodepathFigures(10, 0.5, 0.5)},
        pid=pid,
    )
