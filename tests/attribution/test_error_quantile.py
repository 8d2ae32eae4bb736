"""error_quantile_s: a stated 95% half-width turned into a one-sided bound at another
probability, under the error model of how the duration was timed."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from serwatt.profiler.attribution.episodes import CHANGE_EDGES_95, error_quantile_s

PERIOD_S = 0.0025  # the stack-change run at 400 Hz


def test_stack_changes_follow_the_difference_of_two_exponential_edge_lags() -> None:
    # each edge shows at the first tick after it: lags exponential with mean one period
    rng = np.random.default_rng(7)
    lags = rng.exponential(PERIOD_S, size=(2, 400_000))
    error = lags[1] - lags[0]  # the end's lag lengthens the duration, the start's shortens it
    resolution_s = CHANGE_EDGES_95 * PERIOD_S
    assert np.mean(np.abs(error) <= resolution_s) == pytest.approx(0.95, abs=0.002)
    for p in (0.025, 0.005, 0.001):
        bound = error_quantile_s(resolution_s, "stack changes, 2 episodes", p)
        assert bound == pytest.approx(np.quantile(error, 1 - p), rel=0.03), p
    # a normal's 3.09 sigma, the bound this replaces, is exceeded 4.4 times as often as the
    # 0.1% it stands for (0.5 * exp(-4.72))
    normal_bound = resolution_s * norm.ppf(0.999) / norm.ppf(0.975)
    assert np.mean(error > normal_bound) == pytest.approx(0.0044, abs=0.0005)


def test_sample_counts_are_normal() -> None:
    assert error_quantile_s(0.0075, "sample counts", 0.001) == pytest.approx(
        0.0075 * norm.ppf(0.999) / norm.ppf(0.975)
    )
    assert error_quantile_s(0.0075, "sample counts", 0.025) == pytest.approx(0.0075)


@pytest.mark.parametrize("p", [0.0, 0.5, 1.2, -0.1])
def test_a_probability_outside_a_one_sided_tail_is_refused(p: float) -> None:
    with pytest.raises(ValueError, match="one-sided tail"):
        error_quantile_s(0.0075, "stack changes", p)
