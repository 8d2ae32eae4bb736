"""The one overlap rule: targets' joules over a span never take more than the node's dynamic
joules over it, in a daemon slot and in a profile of a process tree alike (the profile's case:
tests/attribution/test_energy.py, test_a_profiles_process_tree_is_held_to_the_overlap_rule)."""

from __future__ import annotations

import math

import pytest

from serwatt.profiler.attribution.apportion import attribute_energy, overlap_factor, scaled_energy
from serwatt.profiler.attribution.tracker import WindowEnergy
from serwatt.profiler.attribution.window import attribute_span
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.sampling.window import CodepathWindow, WindowReport


def _report(pid: int, start: float, end: float, cpu: dict[str, float]) -> WindowReport:
    return WindowReport(
        pid=pid,
        started_at=start,
        ended_at=end,
        rate_hz=100,
        cpu_s=sum(cpu.values()),
        codepaths={cp: CodepathWindow(cpu_s=cpu.get(cp, 0.0)) for cp in CODEPATHS},
    )


def _reading(package_j: float, dynamic_j: float, busy_cpu_s: float) -> WindowEnergy:
    return WindowEnergy(
        start=100.0,
        end=105.0,
        source="rapl",
        reason=None,
        package_j=package_j,
        dynamic_j=dynamic_j,
        idle_j=package_j - dynamic_j,
        node_busy_cpu_s=busy_cpu_s,
        node_total_cpu_s=10.0,
    )


def test_the_factor_is_one_within_the_bound_and_fits_the_sum_past_it() -> None:
    assert overlap_factor(30.0, 30.0) == 1.0
    assert overlap_factor(12.0, 30.0) == 1.0
    assert overlap_factor(45.0, 30.0) == pytest.approx(2 / 3)
    assert overlap_factor(5.0, 0.0) == 0.0  # nothing measured, nothing to claim


def test_a_scaled_attribution_keeps_its_proportions_and_its_total() -> None:
    e = attribute_energy(
        total_j=50.0,
        dynamic_j=30.0,
        target_cpu_s=3.0,
        node_busy_cpu_s=3.0,
        codepath_cpu_s={"pickle": 2.0, "other": 1.0},
        source="rapl",
    )
    s = scaled_energy(e, 0.5)
    assert s.codepaths_j["pickle"] == pytest.approx(10.0)
    assert s.codepaths_j["other"] == pytest.approx(5.0)
    assert s.target_j == pytest.approx(15.0) and s.target_share == pytest.approx(0.5)
    # what the target no longer holds is other processes' part of the residual
    assert math.fsum(s.codepaths_j.values()) + s.unattributed_j == pytest.approx(50.0)
    parts = s.unattributed_idle_j + s.unattributed_other_processes_j
    assert parts + s.unattributed_target_unsampled_j == pytest.approx(s.unattributed_j)
    assert scaled_energy(e, 1.0) is e


def test_a_slots_targets_share_the_dynamic_joules_when_their_cpu_overshoots() -> None:
    """Two targets whose CPU (3 + 1 s) sums past the node's busy CPU over the slot (2 s):
    alone each would take 100% and 50% of the 30 dynamic joules; fitted, 20 and 10."""
    reading = _reading(package_j=50.0, dynamic_j=30.0, busy_cpu_s=2.0)
    a = _report(1, 100.0, 105.0, {"pickle": 2.0, "other": 1.0})
    b = _report(2, 100.0, 105.0, {"json": 1.0})
    alone = [attribute_span([r], reading, slot=True).windows[0].energy_j for r in (a, b)]
    assert [math.fsum(j.values()) for j in alone if j] == pytest.approx([30.0, 15.0])
    got = attribute_span([a, b], reading, slot=True)
    ja, jb = (w.energy_j for w in got.windows)
    assert ja is not None and jb is not None
    assert ja["pickle"] == pytest.approx(2 * 30.0 / 3 * 2 / 3)  # 13.33: 2/3 of a's 20 J
    assert ja["other"] == pytest.approx(20.0 / 3)
    assert jb["json"] == pytest.approx(10.0)
    assert got.node_j == 50.0 and got.attributed_j == pytest.approx(30.0)
    # the daemon's invariant: node = attributed + unattributed, nothing negative
    for w in got.windows:
        rec = w.energy_record()
        assert rec is not None and rec.codepaths_j == pytest.approx(dict(w.energy_j or {}))
        assert rec.slot is not None and rec.package_j == 50.0


def test_a_slot_within_the_bound_is_left_as_attributed() -> None:
    reading = _reading(package_j=50.0, dynamic_j=30.0, busy_cpu_s=4.0)
    reports = [_report(1, 100.0, 105.0, {"pickle": 1.0}), _report(2, 100.0, 105.0, {"json": 2.0})]
    got = attribute_span(reports, reading, slot=True)
    assert [w.energy_j for w in got.windows] == [
        attribute_span([r], reading, slot=True).windows[0].energy_j for r in reports
    ]
    assert got.attributed_j == pytest.approx(22.5)
