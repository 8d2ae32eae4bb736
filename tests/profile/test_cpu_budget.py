"""`serwatt profile --cpu-budget`'s bookkeeping (profiler/profile/cpu_budget.py): the
governed plan, the slots it observes, and what the document says of them. The CPU
reading is handed in, so the slots are exact."""

from __future__ import annotations

import pytest

from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.profile.cpu_budget import POLL_PERIODS, SessionBudget
from serwatt.profiler.sampling.budget import HEADROOM, PROFILE_FIX, RateGovernor, starting_rate

BASE = SamplingPlan(rate_hz=50, on_cpu_run=True, timing_rate_hz=200)


class Cpu:
    """A CPU counter the test advances."""

    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self) -> float:
        return self.s


def test_without_a_budget_the_plan_is_the_sessions_and_its_own_cpu_is_still_measured():
    cpu = Cpu()
    b = SessionBudget(None, cpu_s=cpu)
    b.begin(100.0, tree=lambda: 3, plan=BASE, window_s=5)
    assert b.plan(BASE) is BASE
    cpu.s = 0.75
    assert b.tick(107.5, launched_exited=False) is None
    section = b.section()
    assert section["budget_cores"] is None and section["rates_hz"] == []
    assert section["own_cpu_cores"] == pytest.approx(0.1)
    assert section["own_cpu_source"].startswith("measured")


def test_the_first_windows_start_at_the_cost_models_rate_for_the_tree():
    g = RateGovernor(0.04, 50, fix=PROFILE_FIX)
    b = SessionBudget(g, cpu_s=Cpu())
    b.begin(0.0, tree=lambda: 3, plan=BASE, window_s=5)
    # 3 processes x 2 counted runs, and the root's stack-change run at 200 Hz shared by 3
    assert g.rate_hz == starting_rate(
        0.04, 50, runs_per_window=7, window_s=5, ticks_per_hz=6 + 200 / 150
    )
    assert g.rate_hz < 50
    plan = b.plan(BASE)
    assert plan.rate_hz == g.rate_hz
    assert plan.timing_rate_hz == g.scaled(200)  # lowered in proportion
    assert plan.poll_s == pytest.approx(max(BASE.poll_s, POLL_PERIODS / g.rate_hz))
    assert b.section()["rates_hz"] == [g.rate_hz]


def test_a_governor_that_has_learnt_its_rate_keeps_it_at_the_next_sessions_start():
    g = RateGovernor(0.04, 50, fix=PROFILE_FIX)
    g.observe(HEADROOM * 0.04)  # one slot right at the aim: stays at 50
    SessionBudget(g, cpu_s=Cpu()).begin(0.0, tree=lambda: 3, plan=BASE, window_s=5)
    assert g.rate_hz == 50


def test_each_slot_of_a_window_length_sets_the_next_rate():
    cpu = Cpu()
    g = RateGovernor(0.1, 50, fix=PROFILE_FIX)
    b = SessionBudget(g, cpu_s=cpu)
    b.begin(0.0, tree=lambda: 1, plan=SamplingPlan(rate_hz=50), window_s=5)
    start = g.rate_hz
    cpu.s = 1.5
    # the first slot ends half a window after the first windows' end
    assert b.tick(7.4, launched_exited=False) is None
    assert g.rate_hz == start and g.observed == 0
    b.tick(7.5, launched_exited=False)  # 1.5 CPU-s in 7.5 s: 0.2 cores, twice the budget
    assert g.observed == 1 and g.rate_hz == pytest.approx(start / 2, abs=1)
    assert b.section()["own_cpu_cores"] == pytest.approx(0.2)
    cpu.s = 2.0
    assert b.tick(12.4, launched_exited=False) is None  # then one a window length
    b.tick(12.5, launched_exited=False)
    assert g.observed == 2 and b.section()["own_cpu_cores"] == pytest.approx(2.0 / 12.5)


def test_the_slot_the_launched_command_exits_in_is_not_observed():
    cpu = Cpu()
    g = RateGovernor(0.1, 50, fix=PROFILE_FIX)
    b = SessionBudget(g, cpu_s=cpu)
    b.begin(0.0, tree=lambda: 1, plan=SamplingPlan(rate_hz=50), window_s=5)
    cpu.s = 0.6
    b.tick(7.5, launched_exited=False)
    rate = g.rate_hz
    cpu.s = 90.0  # the command's own CPU, reaped with it
    b.tick(12.5, launched_exited=True)
    assert g.rate_hz == rate and g.observed == 1
    assert b.section()["own_cpu_cores"] == pytest.approx(0.6 / 7.5)


def test_a_budget_not_met_at_the_floor_is_said_once_with_the_fix():
    cpu = Cpu()
    g = RateGovernor(0.01, 50, fix=PROFILE_FIX)
    b = SessionBudget(g, cpu_s=cpu)
    b.begin(0.0, tree=lambda: 3, plan=BASE, window_s=5)
    said = []
    for i in range(1, 12):
        cpu.s += 1.0  # 0.2 cores whatever the rate
        said.append(b.tick(2.5 + 5.0 * i, launched_exited=False))
    notes = [s for s in said if s is not None]
    assert len(notes) == 1 and "--cpu-budget" in notes[0]
    # the document holds the latest slot's figures
    assert b.section()["over_budget"] == g.over_budget and "used 0.200 cores" in g.over_budget


def test_no_slot_observed_says_so():
    b = SessionBudget(RateGovernor(0.04, 50, fix=PROFILE_FIX), cpu_s=Cpu())
    b.begin(0.0, tree=lambda: 1, plan=BASE, window_s=5)
    b.tick(7.0, launched_exited=False)
    section = b.section()
    assert section["own_cpu_cores"] is None
    assert section["own_cpu_source"].startswith("unavailable")


def test_workers_that_start_before_the_first_slot_lower_the_models_rate():
    cpu = Cpu()
    g = RateGovernor(0.1, 50, fix=PROFILE_FIX)
    b = SessionBudget(g, cpu_s=cpu)
    b.begin(0.0, tree=lambda: 1, plan=BASE, window_s=5)  # a launched job: its root alone at start
    alone = g.rate_hz
    b.tree_grew(lambda: 3)  # its two workers
    assert g.rate_hz == starting_rate(
        0.1, 50, runs_per_window=7, window_s=5, ticks_per_hz=6 + 200 / 150
    )
    assert g.rate_hz < alone
    cpu.s = 0.1
    b.tick(7.5, launched_exited=False)  # measured from here on: the model no longer applies
    measured = g.rate_hz
    b.tree_grew(lambda: 8)
    assert g.rate_hz == measured


def test_the_tree_is_not_counted_where_the_model_does_not_apply():
    def scan() -> int:  # counting the tree scans /proc: only the cost model needs it
        raise AssertionError("the tree was counted")

    SessionBudget(None, cpu_s=Cpu()).begin(0.0, tree=scan, plan=BASE, window_s=5)
    g = RateGovernor(0.04, 50, fix=PROFILE_FIX)
    g.observe(HEADROOM * 0.04)  # measured: the model no longer applies
    b = SessionBudget(g, cpu_s=Cpu())
    b.begin(0.0, tree=scan, plan=BASE, window_s=5)
    b.tree_grew(scan)
