"""The one overlap rule: targets' joules over a span never take more than the node's dynamic
joules over it, in a daemon slot and in a profile of a process tree alike."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from profiler.attribution.apportion import attribute_energy, overlap_factor, scaled_energy
from profiler.attribution.tracker import EnergyTracker, WindowEnergy
from profiler.attribution.window import attribute, attribute_slot
from profiler.classify.codepaths import CODEPATHS
from profiler.profile.energy_sink import EnergySink
from profiler.sampling.window import CodepathWindow, WindowReport
from tests.nvml_replay import FakeClock
from tests.powercap import build_powercap


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
    alone = [attribute(r, reading, slot=True).energy_j for r in (a, b)]
    assert [math.fsum(j.values()) for j in alone if j] == pytest.approx([30.0, 15.0])
    got = attribute_slot([a, b], reading)
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
    got = attribute_slot(reports, reading)
    assert [w.energy_j for w in got.windows] == [
        attribute(r, reading, slot=True).energy_j for r in reports
    ]
    assert got.attributed_j == pytest.approx(22.5)


def _stat(busy: int, idle: int) -> str:
    return f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n"


def test_a_profiles_process_tree_is_held_to_the_same_rule(tmp_path: Path) -> None:
    """A profile of two processes whose windows cover the same 4 s, each with more CPU than
    the node's busy CPU (2 s each against 1.6 s: the clocks tick separately), so each alone
    takes all 8 dynamic joules: together they hold 8, not 16, and the per-direction split
    shrinks with them."""
    clock = FakeClock()
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    procfs.mkdir()
    tree = build_powercap(sysfs, max_uj=30_000_000, psys=False)
    (procfs / "stat").write_text(_stat(0, 0))
    tr = EnergyTracker(sysfs, procfs, nvml_mode="off", clock=clock)
    sink = EnergySink(tr)
    t0 = clock()
    tr.poll_once()
    for i in range(1, 9):
        clock.advance(0.5)
        tree.advance("intel-rapl:0", 5.0)  # 10 W
        (procfs / "stat").write_text(_stat(20 * i, 80 * i))  # 2 CPUs 20% busy: 1.6 CPU-s
        tr.poll_once()
    for pid, cpu in ((1, {"pickle": 2.0}), (2, {"pickle": 1.0, "other": 1.0})):
        rep = _report(pid, t0, t0 + 4.0, cpu)
        sink.on_window(attribute(rep, tr.window(t0, t0 + 4.0)))
    e = sink.finish().energy
    assert e["package_j"] == pytest.approx(40.0) and e["dynamic_j"] == pytest.approx(8.0)
    assert e["attributed_j"] == pytest.approx(8.0)  # not 16: each window alone took all 8
    cps = sink.summary.codepaths if sink.summary else {}
    assert cps["pickle"].energy_j == pytest.approx(6.0)  # (8 + 4) x 8 / 16
    assert cps["other"].energy_j == pytest.approx(2.0)
    assert sum(j for j, _ in cps["pickle"].by_direction.values() if j) == pytest.approx(6.0)
