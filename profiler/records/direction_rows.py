"""Schema version 4 of the run record: encode / decode (profiler/classify/direction.py).

Each episode keeps its `direction`, and each run keeps, per codepath, what each direction
took: samples, CPU-seconds, joules and GPU-wait, as the window's one split by direction
gives them (profiler/attribution/window.py `AttributedWindow.by_direction`: joules split
within a codepath as its CPU does; GPU-wait split by its own attribution, an instant's
share of a codepath divided among the directions running then).

`direction_runs` names the runs recorded with directions, so a run a version 3 writer
recorded reads as "not recorded" rather than as all `unknown`. Only directions with
something in them get a row.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from serwatt.profiler.attribution.window import DirectedFigures
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS
from serwatt.profiler.records.validation import _finite, _integer, _number, _text

# Added to `episodes`: NULL in rows a version 3 writer recorded.
EPISODE_COLUMNS_V4 = (("direction", "TEXT"),)  # encode | decode | unknown

SCHEMA_V4 = """
CREATE TABLE IF NOT EXISTS direction_runs (
    run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS run_codepath_directions (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    codepath TEXT NOT NULL,
    direction TEXT NOT NULL,        -- encode | decode | unknown
    samples INTEGER NOT NULL,
    cpu_s REAL NOT NULL,
    energy_j REAL,                  -- NULL: no window of the run had energy
    gpu_wait_s REAL,                -- NULL: no window of the run had GPU data
    PRIMARY KEY (run_id, codepath, direction)
);
"""


@dataclass(frozen=True)
class DirectionTotals:
    """One direction's part of one codepath over a run."""

    samples: int = 0
    cpu_s: float = 0.0
    energy_j: float | None = None
    gpu_wait_s: float | None = None


def start(db: sqlite3.Connection, run_id: str) -> None:
    """Mark a new run as recorded with directions."""
    db.execute("INSERT OR IGNORE INTO direction_runs(run_id) VALUES (?)", (run_id,))


def window_rows(
    figures: DirectedFigures, gpu: bool
) -> list[tuple[str, str, int, float, float | None, float | None]]:
    """(codepath, direction, samples, cpu_s, energy_j, gpu_wait_s) of one window, for
    the directions with something in them, read from the window's one split by
    direction (AttributedWindow.by_direction, the figures the ledger and the profile
    document fold too); energy_j None when the window had none, gpu_wait_s None when it
    had no GPU data (`gpu` False), as in the codepath's own row."""
    waits: dict[tuple[str, str], float] = {}
    for (cp, d, _gpu), s in figures.gpu_wait_s.items():
        waits[(cp, d)] = waits.get((cp, d), 0.0) + s
    rows = []
    for cp in CODEPATHS:
        for d in DIRECTIONS:
            samples = figures.samples.get((cp, d), 0)
            cpu_s = figures.cpu_s.get((cp, d), 0.0)
            j = None if figures.energy_j is None else figures.energy_j.get((cp, d), 0.0)
            wait = waits.get((cp, d), 0.0) if gpu else None
            if samples or cpu_s or j or wait:
                rows.append(
                    (cp, d, int(samples), _finite(cpu_s, f"{cp}.{d}.cpu_s"),
                     None if j is None else _finite(j, f"{cp}.{d}.energy_j"),
                     None if wait is None else _finite(wait, f"{cp}.{d}.gpu_wait_s"))
                )  # fmt: skip
    return rows


def add_window(db: sqlite3.Connection, run_id: str, rows: list[tuple]) -> None:
    """Add one window's direction rows (window_rows) to the run's totals."""
    db.executemany(
        "INSERT INTO run_codepath_directions(run_id, codepath, direction, samples, cpu_s,"
        " energy_j, gpu_wait_s) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(run_id, codepath, direction) DO UPDATE SET"
        " samples = samples + excluded.samples,"
        " cpu_s = cpu_s + excluded.cpu_s,"
        " energy_j = CASE WHEN excluded.energy_j IS NULL THEN energy_j"
        "   ELSE coalesce(energy_j, 0) + excluded.energy_j END,"
        " gpu_wait_s = CASE WHEN excluded.gpu_wait_s IS NULL THEN gpu_wait_s"
        "   ELSE coalesce(gpu_wait_s, 0) + excluded.gpu_wait_s END",
        [(run_id, *row) for row in rows],
    )


def read(db: sqlite3.Connection, run_id: str) -> dict[str, dict[str, DirectionTotals]] | None:
    """Per codepath (every one of CODEPATHS), per direction (every one of DIRECTIONS):
    the run's totals; None when the run was recorded without directions."""
    has = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='direction_runs'"
    ).fetchone()
    if has is None:
        return None
    if db.execute("SELECT 1 FROM direction_runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        return None
    out = {cp: dict.fromkeys(DIRECTIONS, DirectionTotals()) for cp in CODEPATHS}
    rows = db.execute(
        "SELECT codepath, direction, samples, cpu_s, energy_j, gpu_wait_s"
        " FROM run_codepath_directions WHERE run_id = ?",
        (run_id,),
    ).fetchall()
    for cp, d, samples, cpu_s, energy_j, wait_s in rows:
        what = f"run_codepath_directions of run {run_id!r}"
        cp, d = _text(cp, f"{what}: codepath"), _text(d, f"{what}: direction")
        if cp not in out or d not in DIRECTIONS:
            raise ValueError(f"{what}: unknown codepath/direction {cp!r}/{d!r}")
        out[cp][d] = DirectionTotals(
            samples=_integer(samples, f"{what}: samples"),
            cpu_s=float(_number(cpu_s, f"{what}: cpu_s") or 0.0),
            energy_j=_number(energy_j, f"{what}: energy_j", nullable=True),
            gpu_wait_s=_number(wait_s, f"{what}: gpu_wait_s", nullable=True),
        )
    return out
