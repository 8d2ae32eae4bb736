"""The CPU budget's rate governor (profiler/sampling/budget.py), driven by a cost model shaped
like the measured one: a fixed part plus a part per sample."""

from __future__ import annotations

import math
import os

import pytest

from serwatt.profiler.sampling.budget import (
    DEFAULT_BUDGET_SHARE,
    HEADROOM,
    MAX_STEP,
    MIN_RATE_HZ,
    OWN_CORES,
    PROFILE_FIX,
    RUN_START_CPU_S,
    TICK_CPU_S,
    RateGovernor,
    default_budget_cores,
    starting_rate,
)

# Measured on the reference VM (docs/daemon.md), 8 targets, 10 s windows: the daemon
# ~2.3% of a core, py-spy 20 ms per start and 0.28 ms per sample.
TARGETS, WINDOW_S = 8, 10.0


def usage(rate_hz: float, *, daemon=0.023, start_s=0.020, per_sample_s=0.00028) -> float:
    """Cores used by one slot sampling TARGETS targets at rate_hz."""
    return daemon + TARGETS * (start_s + per_sample_s * rate_hz * WINDOW_S) / WINDOW_S


def test_no_budget_always_runs_at_the_configured_rate():
    g = RateGovernor(None, 50)
    assert [g.observe(u) for u in (0.0, 0.5, 10.0)] == [50, 50, 50]
    assert g.over_budget is None


def test_converges_under_the_budget_from_the_configured_rate():
    g = RateGovernor(0.10, 50)
    assert usage(50) > 0.13  # the unbudgeted cost the bench measured
    seen = []
    for _ in range(12):
        seen.append(usage(g.rate_hz))
        g.observe(seen[-1])
    # Within three slots the usage is under the budget, and it stays there...
    assert all(u <= 0.10 for u in seen[3:]), seen
    # ...near the aim (HEADROOM x budget), not collapsed to the floor.
    assert usage(g.rate_hz) == pytest.approx(HEADROOM * 0.10, rel=0.05)
    assert 20 <= g.rate_hz < 50 and g.rate_hz == int(g.rate_hz)
    assert g.over_budget is None


def test_rate_rises_back_when_the_cost_falls_but_never_above_the_configured_rate():
    g = RateGovernor(0.10, 50)
    for _ in range(6):
        g.observe(usage(g.rate_hz))
    low = g.rate_hz
    for _ in range(10):  # the node got cheaper: half the per-sample cost
        g.observe(usage(g.rate_hz, per_sample_s=0.00014))
    assert g.rate_hz > low
    for _ in range(10):  # and far cheaper: capped at the configured rate
        g.observe(usage(g.rate_hz, daemon=0.0, start_s=0.0, per_sample_s=1e-7))
    assert g.rate_hz == 50


def test_one_step_moves_the_rate_by_at_most_max_step():
    g = RateGovernor(0.10, 50)
    g.observe(100.0)  # one absurd slot
    assert g.rate_hz == math.floor(50 / MAX_STEP)
    g.observe(0.0)  # an idle-looking slot
    assert g.rate_hz == 50


def test_a_budget_that_cannot_be_met_stops_at_the_floor_and_says_why():
    g = RateGovernor(0.01, 50)
    for _ in range(20):
        g.observe(usage(g.rate_hz))  # the daemon alone is 2.3% > 1%
    assert g.rate_hz == MIN_RATE_HZ
    assert g.over_budget is not None
    assert "over the budget of 0.01" in g.over_budget and "max_concurrent_samplers" in g.over_budget
    g.reconfigure(0.5, 50)  # a reload with room: the complaint goes once a slot fits
    g.observe(usage(g.rate_hz))
    assert g.over_budget is None and g.rate_hz > MIN_RATE_HZ


def test_reconfigure_caps_the_learnt_rate_and_none_restores_the_configured_rate():
    g = RateGovernor(0.10, 50)
    for _ in range(6):
        g.observe(usage(g.rate_hz))
    g.reconfigure(0.10, 20)
    assert g.rate_hz <= 20
    g.reconfigure(None, 40)
    assert g.rate_hz == 40


@pytest.mark.parametrize(
    ("budget", "rate", "used"),
    [(0.0, 50, None), (-1.0, 50, None), (0.1, 0, None), (0.1, 50, -0.1), (0.1, 50, math.nan)],
)
def test_bad_values_are_refused(budget, rate, used):
    with pytest.raises(ValueError):
        g = RateGovernor(budget, rate)
        g.observe(used)


def test_another_runs_rate_falls_in_proportion_with_the_governed_rate():
    g = RateGovernor(0.10, 50)
    assert g.scaled(40) == 40  # at the configured rate: as configured
    g.observe(2 * HEADROOM * 0.10)  # twice the aim: the rate halves
    assert g.rate_hz == 25 and g.scaled(40) == 20
    for _ in range(20):
        g.observe(100.0)  # far over: the floor
    assert g.rate_hz == MIN_RATE_HZ and g.scaled(40) == MIN_RATE_HZ  # never below 1 Hz


def test_the_profiles_over_budget_note_names_its_own_options():
    g = RateGovernor(0.01, 50, fix=PROFILE_FIX)
    for _ in range(20):
        g.observe(usage(g.rate_hz))
    assert g.over_budget is not None and "--cpu-budget" in g.over_budget
    assert "max_concurrent_samplers" not in g.over_budget
    assert g.observed == 20


def test_the_default_budget_is_a_share_of_the_cpus():
    assert default_budget_cores(2) == pytest.approx(2 * DEFAULT_BUDGET_SHARE)
    assert default_budget_cores(64) == pytest.approx(64 * DEFAULT_BUDGET_SHARE)
    assert default_budget_cores(0) == pytest.approx(DEFAULT_BUDGET_SHARE)  # at least one CPU
    assert default_budget_cores() == pytest.approx(
        len(os.sched_getaffinity(0)) * DEFAULT_BUDGET_SHARE
    )


def modelled(rate_hz: float, *, runs: int, window_s: float, ticks_per_hz: float) -> float:
    """The cost model's cores at rate_hz, written out from its constants."""
    return OWN_CORES + runs * RUN_START_CPU_S / window_s + TICK_CPU_S * ticks_per_hz * rate_hz


@pytest.mark.parametrize(
    ("budget", "runs", "ticks"),
    [(0.04, 7, 7.33), (0.04, 3, 6.0), (0.2, 7, 7.33), (1.28, 7, 7.33)],
)
def test_the_starting_rate_is_the_highest_whole_rate_the_model_fits_under_the_aim(
    budget, runs, ticks
):
    rate = starting_rate(budget, 50, runs_per_window=runs, window_s=5, ticks_per_hz=ticks)
    assert rate == int(rate) and MIN_RATE_HZ <= rate <= 50
    aim = HEADROOM * budget
    if rate < 50:
        assert modelled(rate, runs=runs, window_s=5, ticks_per_hz=ticks) <= aim
        assert modelled(rate + 1, runs=runs, window_s=5, ticks_per_hz=ticks) > aim
    else:
        assert modelled(50, runs=runs, window_s=5, ticks_per_hz=ticks) <= aim


def test_a_budget_the_model_cannot_fit_starts_at_the_floor():
    assert starting_rate(0.005, 50, runs_per_window=7, window_s=5, ticks_per_hz=7) == MIN_RATE_HZ
    with pytest.raises(ValueError):
        starting_rate(0.0, 50, runs_per_window=7, window_s=5, ticks_per_hz=7)
