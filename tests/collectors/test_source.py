"""collectors/source.py: every node source has the one shape (name, absent reasons,
probe, read), the names are the keys a tracker's status uses, and "absent" is each
source's own reason set (the daemon's not-present rule reads it)."""

from __future__ import annotations

from pathlib import Path

from serwatt.collectors.source import SOURCES, absent
from serwatt.profiler.attribution.tracker import EnergyTracker


def test_every_source_has_the_one_shape_and_a_distinct_name() -> None:
    names = [s.name for s in SOURCES]
    assert names == ["rapl", "cpustat", "nvml"]
    for s in SOURCES:
        assert callable(s.probe) and callable(s.read)
        assert isinstance(s.absent_reasons, frozenset)


def test_the_sources_are_the_trackers_status_keys(tmp_path: Path) -> None:
    tracker = EnergyTracker(tmp_path / "sys", tmp_path / "proc", nvml_mode="off")
    assert {s.name for s in SOURCES} <= set(tracker.probe())


def test_absent_is_each_sources_own() -> None:
    assert absent("rapl", "no_powercap") and not absent("rapl", "permission")
    assert absent("nvml", "no_driver") and absent("nvml", "no_gpu")
    assert not absent("nvml", "no_powercap") and not absent("cpustat", "unreadable")
