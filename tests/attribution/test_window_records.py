"""The energy and GPU records an attributed window hands the recorder: their stored JSON
(windows.energy_json / gpu_json, which the reader and older files share) and their checks."""

from __future__ import annotations

import pytest

from serwatt.profiler.attribution.apportion import EnergyAttribution, GpuWaitAttribution
from serwatt.profiler.attribution.tracker import WindowEnergy
from serwatt.profiler.attribution.window import AttributedWindow, TargetAttribution
from serwatt.profiler.attribution.window_records import EnergyRecord, GpuRecord
from serwatt.profiler.classify.codepaths import CODEPATHS
from tests.records.test_recorder import window

CODEPATHS_J = {cp: float(i) for i, cp in enumerate(CODEPATHS)}
ENERGY = EnergyAttribution(
    source="rapl",
    total_j=100.0,
    dynamic_j=60.0,
    idle_j=40.0,
    target_share=0.5,
    target_j=50.0,
    codepaths_j=CODEPATHS_J,
    unattributed_j=3.0,
    unattributed_idle_j=1.0,
    unattributed_other_processes_j=1.0,
    unattributed_target_unsampled_j=1.0,
)
READING = WindowEnergy(
    start=10.0,
    end=20.0,
    source="rapl",
    reason=None,
    package_j=100.0,
    node_busy_cpu_s=5.0,
    notes=("slot shared",),
)


def _gpu(index: int, idle_energy_j: dict[str, float] | None) -> GpuWaitAttribution:
    return GpuWaitAttribution(
        gpu_index=index,
        window_s=10.0,
        covered_s=9.0,
        idle_s=4.0,
        wait_s=dict.fromkeys(CODEPATHS, 0.25),
        unattributed_s=0.5,
        idle_energy_j=idle_energy_j,
        unattributed_idle_energy_j=None,
        wait_by_direction_s={"pickle": {"encode": 0.1, "decode": 0.0, "unknown": 0.15}},
    )


def test_a_slot_window_stores_the_shape_the_reader_reads() -> None:
    ta = TargetAttribution(ENERGY, (_gpu(0, dict.fromkeys(CODEPATHS, 2.0)),), (0,))
    aw = AttributedWindow(window(), READING, ta, slot=True)
    energy, gpu = aw.energy_record(), aw.gpu_record()
    assert energy is not None and gpu is not None
    assert energy.to_json() == {
        "source": "rapl",
        "reason": None,
        "package_j": 100.0,
        "target_j": 50.0,
        "unattributed_j": 3.0,
        "codepaths_j": CODEPATHS_J,
        "slot": [10.0, 20.0],
        "node_busy_cpu_s": 5.0,
        "target_share": 0.5,
        "model": None,
        "notes": ["slot shared"],
    }
    assert gpu.to_json() == {
        "codepaths_wait_s": dict.fromkeys(CODEPATHS, 0.25),
        "codepaths_wait_j": dict.fromkeys(CODEPATHS, 2.0),
        # a codepath's wait with no split by direction is `unknown`'s: the one fold
        # (DirectedTotals), as in the daemon's counters
        "codepaths_wait_by_direction_s": {
            cp: {"encode": 0.1, "decode": 0.0, "unknown": 0.15}
            if cp == "pickle"
            else {"encode": 0.0, "decode": 0.0, "unknown": 0.25}
            for cp in CODEPATHS
        },
        "gpus": [
            {
                "index": 0,
                "covered_s": 9.0,
                "idle_s": 4.0,
                "unattributed_s": 0.5,
                "wait_s": dict.fromkeys(CODEPATHS, 0.25),
            }
        ],
    }


def test_unknown_gpu_idle_energy_and_missing_energy_are_left_out_not_zero() -> None:
    ta = TargetAttribution(None, (_gpu(0, dict.fromkeys(CODEPATHS, 2.0)), _gpu(1, None)), (0, 1))
    no_energy = WindowEnergy(start=10.0, end=20.0, source="unavailable", reason="no powercap")
    aw = AttributedWindow(window(), no_energy, ta)
    energy, gpu = aw.energy_record(), aw.gpu_record()
    assert energy is not None and energy.to_json() == {
        "source": "unavailable",
        "reason": "no powercap",
    }
    assert gpu is not None and "codepaths_wait_j" not in gpu.to_json()
    assert gpu.to_json()["codepaths_wait_s"] == dict.fromkeys(CODEPATHS, 0.5)
    assert [g["index"] for g in gpu.to_json()["gpus"]] == [0, 1]
    failed = AttributedWindow(window(), READING, failure="RAPL went away")
    assert failed.energy_record() == EnergyRecord.unavailable("attribution failed: RAPL went away")
    assert AttributedWindow(window()).energy_record() is None
    assert AttributedWindow(window()).gpu_record() is None


def test_records_that_could_not_be_stored_as_they_say_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="energy with source 'model' needs codepaths_j"):
        EnergyRecord(source="model", package_j=10.0)
    with pytest.raises(ValueError, match=r"codepaths_j names unknown codepath\(s\) \['xml'\]"):
        EnergyRecord(source="rapl", codepaths_j={"xml": 1.0})
    with pytest.raises(ValueError, match="codepaths_wait_j names unknown codepath"):
        GpuRecord(codepaths_wait_s={"pickle": 1.0}, codepaths_wait_j={"xml": 1.0})
    assert EnergyRecord.unavailable("no powercap").measured is False
