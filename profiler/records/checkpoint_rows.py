"""Schema version 3 of the run record: the episode fields version 2 left out, and the
checkpoints and restores a `--checkpoints DIR` watch identified
(profiler/attribution/checkpoints.py).

`checkpoint_runs` names the runs recorded with a watch, so a run without one reads as
identified by the heuristic rather than as "no checkpoints". A checkpoint's episode is
named by (pid, thread, start) of the episode row it matched; a file-event-only checkpoint
has none.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping
from typing import Any

from serwatt.profiler.records.validation import (
    _integer,
    _json_of,
    _number,
    _text,
    read_name,
    stored_name,
)

# Added to version 2's `episodes`: NULL in rows a version 2 writer recorded.
EPISODE_COLUMNS_V3 = (
    ("timed_by", "TEXT"),  # "stack changes" | "sample counts"
    ("timing_period_s", "REAL"),  # the stack-change run's tick period
    ("clock_s", "REAL"),  # part of resolution_s: py-spy clocks against the host
    ("durability_s", "REAL"),  # time in fsync/replace calls
    ("host_lag_s", "REAL"),  # how much earlier than the host's its times may be
)
# Added to `episodes` in version 5: NULL in rows an older writer recorded.
EPISODE_COLUMNS_V5 = (("prepared_s", "REAL"),)  # its save function's preparation before it

SCHEMA_V3 = """
CREATE TABLE IF NOT EXISTS checkpoint_runs (
    run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
    identity_json TEXT NOT NULL,    -- the watch: dir, glob, events dropped, overflows
    unmatched_episodes INTEGER NOT NULL,
    read_bytes INTEGER,             -- storage reads over the run (NULL: unknown)
    read_bytes_source TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    bytes INTEGER,
    event_t REAL NOT NULL,          -- epoch s, the watch's stamp
    pid INTEGER,
    thread_id INTEGER,              -- the writer's thread (NULL: file event only)
    episode_start REAL,             -- the writer episode's start
    stall_thread INTEGER,
    stall_start REAL,
    stall_s REAL,                   -- the main thread's wall time (NULL: none seen)
    resolution_s REAL,
    timed_by TEXT NOT NULL,
    cpu_s_all_threads REAL,
    async_tail_s REAL
);
CREATE INDEX IF NOT EXISTS checkpoints_by_run ON checkpoints(run_id, event_t);
CREATE TABLE IF NOT EXISTS restores (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    bytes INTEGER,
    open_t REAL NOT NULL,
    pid INTEGER,
    thread_id INTEGER,
    episode_start REAL,
    wall_s REAL,
    resolution_s REAL,
    timed_by TEXT NOT NULL,
    read_bytes INTEGER,
    lazy INTEGER NOT NULL
);
"""

CHECKPOINT_FIELDS = (
    "path", "bytes", "event_t", "pid", "thread_id", "episode_start", "stall_thread",
    "stall_start", "stall_s", "resolution_s", "timed_by", "cpu_s_all_threads", "async_tail_s",
)  # fmt: skip
RESTORE_FIELDS = (
    "path", "bytes", "open_t", "pid", "thread_id", "episode_start", "wall_s", "resolution_s",
    "timed_by", "read_bytes", "lazy",
)  # fmt: skip
_TEXT = ("timed_by",)
_INTEGERS = ("bytes", "pid", "thread_id", "stall_thread", "read_bytes")
_REQUIRED = ("path", "event_t", "open_t", "timed_by", "lazy")


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"a checkpoint figure must be finite, got {v}")
    return v


def write(
    db: sqlite3.Connection,
    run_id: str,
    matched: Any,
    *,
    identity: Mapping[str, Any],
    read_bytes: int | None,
    read_bytes_source: str,
) -> None:
    """Store a run's matches (profiler.attribution.checkpoints.Matched)."""
    db.execute(
        "INSERT OR REPLACE INTO checkpoint_runs(run_id, identity_json, unmatched_episodes,"
        " read_bytes, read_bytes_source) VALUES (?, ?, ?, ?, ?)",
        (run_id, json.dumps(dict(identity)), len(matched.unmatched), read_bytes, read_bytes_source),
    )
    rows = []
    for c in matched.checkpoints:
        ep, st = c.episode, c.stall
        rows.append(
            (run_id, stored_name(c.path), c.bytes, c.event_t, c.pid, c.thread_id,
             ep.start if ep else None, st.thread if st else None, st.start if st else None,
             c.stall_s, c.resolution_s, c.timed_by, c.cpu_s_all_threads, c.async_tail_s)
        )  # fmt: skip
    db.executemany(
        f"INSERT INTO checkpoints(run_id, {', '.join(CHECKPOINT_FIELDS)})"
        f" VALUES (?{', ?' * len(CHECKPOINT_FIELDS)})",
        [tuple(_finite(v) for v in r) for r in rows],
    )
    rrows = []
    for r in matched.restores:
        ep = r.episode
        rb = None if r.read_bytes is None else int(r.read_bytes)
        rrows.append(
            (run_id, stored_name(r.path), r.bytes, r.open_t, r.pid, r.thread_id,
             ep.start if ep else None, r.wall_s, r.resolution_s, r.timed_by, rb, int(r.lazy))
        )  # fmt: skip
    db.executemany(
        f"INSERT INTO restores(run_id, {', '.join(RESTORE_FIELDS)})"
        f" VALUES (?{', ?' * len(RESTORE_FIELDS)})",
        [tuple(_finite(v) for v in r) for r in rrows],
    )


def _row(names: tuple[str, ...], values: tuple, what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in zip(names, values, strict=True):
        where = f"{what}.{name}"
        if name == "path":
            out[name] = read_name(v, where)
        elif name in _TEXT:
            out[name] = _text(v, where)
        elif name == "lazy":
            out[name] = bool(_integer(v, where))
        elif v is None and name not in _REQUIRED:
            out[name] = None
        elif name in _INTEGERS:
            out[name] = _integer(v, where)
        else:
            out[name] = _number(v, where)
    return out


def read(db: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """A run's checkpoints and restores; None when it was recorded without a watch."""
    has = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='checkpoint_runs'"
    ).fetchone()
    if has is None:
        return None
    head = db.execute(
        "SELECT identity_json, unmatched_episodes, read_bytes, read_bytes_source"
        " FROM checkpoint_runs WHERE run_id = ?",
        (run_id,),
    ).fetchone()
    if head is None:
        return None
    what = f"checkpoint_runs of run {run_id!r}"
    identity_json, unmatched, read_bytes, source = head
    ckpts = db.execute(
        f"SELECT {', '.join(CHECKPOINT_FIELDS)} FROM checkpoints WHERE run_id = ?"
        " ORDER BY event_t, rowid",
        (run_id,),
    ).fetchall()
    restores = db.execute(
        f"SELECT {', '.join(RESTORE_FIELDS)} FROM restores WHERE run_id = ? ORDER BY open_t, rowid",
        (run_id,),
    ).fetchall()
    return {
        "identity": _json_of(identity_json, f"{what}.identity_json", dict),
        "unmatched_episodes": _integer(unmatched, f"{what}.unmatched_episodes"),
        "read_bytes": None if read_bytes is None else _integer(read_bytes, f"{what}.read_bytes"),
        "read_bytes_source": _text(source, f"{what}.read_bytes_source"),
        "checkpoints": tuple(
            _row(CHECKPOINT_FIELDS, r, f"checkpoints of run {run_id!r}") for r in ckpts
        ),
        "restores": tuple(_row(RESTORE_FIELDS, r, f"restores of run {run_id!r}") for r in restores),
    }
