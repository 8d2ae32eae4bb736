"""Issue 43, ask 3: the records reader returns the typed values the writer was given (an
Episode, the window's EnergyRecord and GpuRecord), and the report's inputs are built from
them; a row an older writer recorded reads with Episode's defaults, its missing columns
named (`unrecorded`) and None to the report."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.window_records import (
    EnergyRecord,
    GpuFigures,
    GpuRecord,
    SlotSplit,
)
from serwatt.profiler.records.store import Recorder
from serwatt.profiler.report.from_records import run_input
from tests.records.test_recorder import CONFIG, HOST, SOURCES, window

EPISODE = Episode(
    pid=7, thread=7, codepath="pickle", start=100.0, end=100.8, wall_s=0.8, period_s=0.02,
    resolution_s=0.2, cpu_s=0.75, main_thread=True, durable=False, samples=40,
    gpu_wait_s=0.5, gpu_idle_j=None, timed_by="stack changes", timing_period_s=0.005,
    clock_s=0.001, durability_s=0.1, host_lag_s=0.02, direction="encode", prepared_s=0.03,
)  # fmt: skip
ENERGY = EnergyRecord(
    source="rapl",
    reason=None,
    package_j=60.0,
    target_j=20.0,
    unattributed_j=41.5,
    codepaths_j={"pickle": 12.0, "json": 6.5},
    slot=SlotSplit(
        start=1.0, end=3.0, node_busy_cpu_s=1.5, target_share=0.4, model=None, notes=("n",)
    ),
)
GPU = GpuRecord(
    codepaths_wait_s={"pickle": 0.5},
    codepaths_wait_j={"pickle": 40.0},
    codepaths_wait_by_direction_s={"pickle": {"encode": 0.5}},
    gpus=(GpuFigures(0, covered_s=2.0, idle_s=0.6, unattributed_s=0.1, wait_s={"pickle": 0.5}),),
)


def test_the_reader_returns_what_the_writer_was_given(tmp_path: Path) -> None:
    with Recorder(tmp_path / "r.sqlite") as rec:
        rec.start_run("r", "trainer", host=HOST, config=CONFIG, sources=SOURCES)
        rec.append_window("r", window(), energy=ENERGY, gpu=GPU)
        rec.append_window("r", window(seed=2), energy=EnergyRecord.unavailable("no RAPL"))
        rec.append_episodes("r", [EPISODE])
        detail = rec.run("r")
    first, second = detail.windows
    assert first.energy_record == ENERGY and first.gpu_record == GPU
    assert second.energy_record == EnergyRecord.unavailable("no RAPL")
    assert second.gpu_record is None
    assert detail.episodes is not None
    (got,) = detail.episodes
    assert got.episode == EPISODE and got.unrecorded == frozenset()
    # the report's inputs, built from the typed values
    run = run_input(detail)
    assert run.energy_source == "rapl"
    assert [w.energy_source for w in run.windows] == ["rapl", "unavailable"]
    assert run.episodes is not None
    (ep,) = run.episodes
    assert (ep.direction, ep.prepared_s, ep.timed_by, ep.gpu_wait_s) == (
        "encode", 0.03, "stack changes", 0.5,
    )  # fmt: skip


def test_an_older_writers_episode_reads_with_defaults_and_names_what_it_lacked(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.sqlite"
    with Recorder(path) as rec:
        rec.start_run("old", "t", host={}, config={"rate_hz": 50.0}, sources={})
        rec.append_episodes("old", [EPISODE])
    db = sqlite3.connect(path)  # the file a version 4 writer left: no prepared_s
    db.executescript(
        "ALTER TABLE episodes DROP COLUMN prepared_s;"
        " UPDATE meta SET value = '4' WHERE key = 'schema_version';"
    )
    db.close()
    with Recorder(path, readonly=True) as rec:
        detail = rec.run("old")
    assert detail.episodes is not None
    (got,) = detail.episodes
    assert got.unrecorded == frozenset({"prepared_s"})
    assert got.episode.prepared_s == 0.0  # Episode's default
    assert got["prepared_s"] is None and got["direction"] == "encode"
    run = run_input(detail)
    assert run.episodes is not None and run.episodes[0].prepared_s is None
