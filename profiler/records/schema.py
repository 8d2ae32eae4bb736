"""The run record's schema: its tables, its version, and the upgrade of older files.

The format is versioned (`meta.schema_version`). A file from an older serwatt is upgraded
in place when opened for writing; a file from a newer serwatt is refused with a clear
error rather than misread.

A record is checked before it is trusted (`check`): SQLite runs whatever a file's schema
says, so a `runs` that is a view over an endless recursive query, a trigger, or an index
on an expression would run on every read or write. Before any table is read, every
object of the file must be one the record makes, of the shape it makes it (columns,
indexes, foreign keys, table options); only objects a later version adds may be missing
from an older file. The check reads the schema only (sqlite_master and pragmas), never a
table, so it cannot be made to run a crafted query.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sqlite3
import time
from pathlib import Path

from serwatt.profiler import __version__
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.records import checkpoint_rows, direction_rows, stack_rows
from serwatt.profiler.records.validation import RecordError, _damaged, _shown

SCHEMA_VERSION = 8  # 2 adds serialization episodes, 3 checkpoints by file events
# (profiler/records/checkpoint_rows.py), 4 encode / decode (direction_rows.py), 5 the
# episodes' prepared_s (checkpoint_rows.py), 6 the windows' load_1min, 7 their
# cpu_source, 8 the runs' folded stacks (stack_rows.py); older files are upgraded in place
_APPLICATION = "serwatt.runs"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    started_at REAL NOT NULL,       -- epoch s, when start_run was first called
    ended_at REAL,                  -- epoch s, NULL while the run is open
    last_seen_at REAL NOT NULL,     -- epoch s, last start_run or window end: the retention key
    serwatt_version TEXT NOT NULL,
    host_json TEXT NOT NULL,
    config_json TEXT NOT NULL,
    sources_json TEXT NOT NULL,
    -- Totals kept in the same transaction as each window, so listing runs costs
    -- O(runs), not O(windows), and never disagrees with the windows.
    windows INTEGER NOT NULL DEFAULT 0,
    cpu_s REAL NOT NULL DEFAULT 0,
    pyspy_samples INTEGER NOT NULL DEFAULT 0,
    pyspy_errors INTEGER NOT NULL DEFAULT 0
);
-- Distinct values seen in a run's windows: kind is 'pid', 'python' or 'energy_source'.
CREATE TABLE IF NOT EXISTS run_facets (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (run_id, kind, value)
);
-- Per-codepath totals of a run (NULL energy/GPU: no window of the run had any).
CREATE TABLE IF NOT EXISTS run_codepaths (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    codepath TEXT NOT NULL,
    samples INTEGER NOT NULL,
    cpu_s REAL NOT NULL,
    wall_s REAL NOT NULL,
    low_confidence_samples INTEGER NOT NULL,
    energy_j REAL,
    gpu_wait_s REAL,
    gpu_wait_energy_j REAL,
    PRIMARY KEY (run_id, codepath)
);
CREATE TABLE IF NOT EXISTS windows (
    window_id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL NOT NULL,
    rate_hz REAL NOT NULL,
    cpu_s REAL NOT NULL,
    python TEXT,
    exited INTEGER NOT NULL,
    pyspy_samples INTEGER NOT NULL,
    pyspy_errors INTEGER NOT NULL,
    partial_stacks INTEGER NOT NULL,
    behind_s REAL NOT NULL,
    notes_json TEXT NOT NULL,
    energy_source TEXT,             -- rapl | model | unavailable | NULL (not given)
    energy_json TEXT,               -- the energy mapping as given, NULL when not given
    gpu_json TEXT                   -- the GPU mapping as given, NULL when not given
);                                  -- (versions 6, 7 add load_1min, cpu_source: _VERSIONS)
CREATE INDEX IF NOT EXISTS windows_by_run ON windows(run_id, started_at);
CREATE TABLE IF NOT EXISTS window_codepaths (
    window_id INTEGER NOT NULL REFERENCES windows(window_id) ON DELETE CASCADE,
    codepath TEXT NOT NULL,
    samples INTEGER NOT NULL,
    cpu_s REAL NOT NULL,
    wall_s REAL NOT NULL,
    low_confidence_samples INTEGER NOT NULL,
    energy_j REAL,                  -- NULL: no energy for this window
    energy_source TEXT,
    gpu_wait_s REAL,                -- NULL: no GPU data for this window
    gpu_wait_energy_j REAL,
    PRIMARY KEY (window_id, codepath)
);
"""

# Version 2: serialization episodes (profiler/attribution/episodes.py). `episode_runs`
# names the runs recorded with episode detection, so a run recorded by a version 1
# writer says it has no episodes rather than "zero episodes".
_SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS episode_runs (
    run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS episodes (
    episode_id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    pid INTEGER NOT NULL,
    thread INTEGER NOT NULL,
    codepath TEXT NOT NULL,
    start REAL NOT NULL,            -- epoch s
    end REAL NOT NULL,              -- epoch s
    wall_s REAL NOT NULL,
    period_s REAL NOT NULL,         -- tick period of the run that timed it
    resolution_s REAL NOT NULL,     -- 95% half-width of wall_s (profiler/attribution/episodes.py)
    unknown_s REAL NOT NULL,        -- time inside the episode between windows (not sampled)
    edge_unknown_s REAL NOT NULL,   -- it may have begun/ended this much earlier/later
    truncated INTEGER NOT NULL,     -- sampling started or stopped while it ran
    samples INTEGER NOT NULL,
    cpu_s REAL NOT NULL,
    gpu_wait_s REAL,                -- NULL: no GPU data
    gpu_idle_j REAL,
    main_thread INTEGER,            -- NULL: the thread's kernel tid was not known
    durable INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_by_run ON episodes(run_id, start);
-- Receipts of the .many checkpoints a run wrote (`serwatt profile --checkpoints DIR`):
-- a chain head anchored outside the files, so a chain cut short or rewritten is caught.
CREATE TABLE IF NOT EXISTS run_receipts (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    receipt TEXT NOT NULL,          -- rcpt_<hex>
    prev_receipt TEXT,              -- NULL: the first link of its chain
    path TEXT NOT NULL,             -- where the file was when it was seen
    seen_at REAL NOT NULL,          -- epoch s
    PRIMARY KEY (run_id, receipt)
);
"""
_EPISODE_COLUMNS_V2 = (
    "pid", "thread", "codepath", "start", "end", "wall_s", "period_s", "resolution_s",
    "unknown_s", "edge_unknown_s", "truncated", "samples", "cpu_s", "gpu_wait_s", "gpu_idle_j",
    "main_thread", "durable",
)  # fmt: skip
_EPISODE_COLUMNS = (
    *_EPISODE_COLUMNS_V2,
    *(name for name, _kind in checkpoint_rows.EPISODE_COLUMNS_V3),
    *(name for name, _kind in direction_rows.EPISODE_COLUMNS_V4),
    *(name for name, _kind in checkpoint_rows.EPISODE_COLUMNS_V5),
)
# The record's episode columns are the Episode dataclass's fields, so none is lost on the
# way to the report: a field without a column stops serwatt at import, here, rather than
# vanishing from every record (add its column in a schema upgrade).
EPISODE_FIELDS = tuple(f.name for f in dataclasses.fields(Episode))
_unstored = sorted(set(EPISODE_FIELDS) - set(_EPISODE_COLUMNS))
if _unstored or len(EPISODE_FIELDS) != len(_EPISODE_COLUMNS):
    raise ImportError(
        f"Episode fields without a record column: {_unstored}; columns without a field: "
        f"{sorted(set(_EPISODE_COLUMNS) - set(EPISODE_FIELDS))} (profiler/records/schema.py)"
    )


_CRAFTED_FIX = (
    "serwatt never makes it, so the file was edited or made by something else and is not "
    "read: move it aside and point record.dir (or --db) at a new file"
)
# comments and quoted text of a CREATE TABLE statement, left out when looking for CHECK
_SQL_NOISE = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", re.S)
_CHECK = re.compile(r"\bCHECK\b", re.I)


@dataclasses.dataclass(frozen=True)
class _Table:
    columns: frozenset  # (name, type, notnull, default, pk, hidden)
    foreign_keys: frozenset  # (table, from, to, on_update, on_delete, match)
    indexes: frozenset  # (name, unique, origin, partial, its columns)


def _shape(db: sqlite3.Connection, table: str) -> _Table:
    """A table's shape, from pragmas only (no row of it is read)."""
    columns = frozenset(
        tuple(row[1:]) for row in db.execute("SELECT * FROM pragma_table_xinfo(?)", (table,))
    )
    keys = frozenset(
        tuple(row[2:]) for row in db.execute("SELECT * FROM pragma_foreign_key_list(?)", (table,))
    )
    indexes = frozenset(
        (
            name,
            unique,
            origin,
            partial,
            tuple(tuple(r) for r in db.execute("SELECT * FROM pragma_index_xinfo(?)", (name,))),
        )
        for _seq, name, unique, origin, partial in db.execute(
            "SELECT * FROM pragma_index_list(?)", (table,)
        ).fetchall()
    )
    return _Table(columns, keys, indexes)


@functools.cache
def _expected() -> tuple[dict[str, tuple[str, str]], dict[str, _Table]]:
    """({name: (type, table)} of every object the record makes, {table: its shape})."""
    db = sqlite3.connect(":memory:")
    try:
        create(db)
        objects = {
            name: (kind, table)
            for kind, name, table in db.execute("SELECT type, name, tbl_name FROM sqlite_master")
        }
        tables = {name: _shape(db, name) for name, (kind, _t) in objects.items() if kind == "table"}
    finally:
        db.close()
    return objects, tables


def check(db: sqlite3.Connection, path: Path) -> None:
    """Raise RecordError unless every object of the file is the record's own, of its shape
    (or, in a file an older version wrote, a part of it: a missing column or table is
    left to the reads, which call it damaged)."""
    objects, tables = _expected()
    rows = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    if not any(name == "meta" for _kind, name, _table, _sql in rows):
        return  # empty, or not a record at all: read_version says which
    # what the record never holds is named first (a view, a trigger), then what it does
    # not hold, then what is of another shape
    foreign = sorted(
        (kind in ("table", "index"), what, name)
        for kind, name, table, _sql in rows
        if objects.get(name) != (kind, table)
        for what in [f"{kind} {_shown(name)}"]
    )
    if foreign:
        known_kind, what, name = foreign[0]
        part = ", which is not part of a run record" if known_kind else ""
        raise RecordError(f"{path}: holds a {what}{part}; {_CRAFTED_FIX}")
    for kind, name, _table, sql in rows:
        what = f"{kind} {_shown(name)}"
        if kind != "table":
            continue  # an index is checked with its table
        if not isinstance(sql, str) or not sql.lstrip()[:12].upper() == "CREATE TABLE":
            raise RecordError(f"{path}: its {what} is not a plain table; {_CRAFTED_FIX}")
        bare = _SQL_NOISE.sub(" ", sql)
        if _CHECK.search(bare):
            raise RecordError(f"{path}: its {what} has a CHECK constraint; {_CRAFTED_FIX}")
        if bare.rsplit(")", 1)[-1].strip():  # WITHOUT ROWID, STRICT
            raise RecordError(f"{path}: its {what} has table options; {_CRAFTED_FIX}")
        want, have = tables[name], _shape(db, name)
        for part in ("columns", "foreign_keys", "indexes"):
            extra = getattr(have, part) - getattr(want, part)
            if extra:
                shown = part.replace("_", " ")
                raise RecordError(
                    f"{path}: the {shown} of its {what} are not the record's "
                    f"({_shown(sorted(map(str, extra))[0])}); {_CRAFTED_FIX}"
                )


def read_version(db: sqlite3.Connection, path: Path) -> int | None:
    """The file's schema version; None for an empty file (no tables yet)."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        return None
    if "meta" not in tables:
        raise RecordError(
            f"{path}: an SQLite file but not a serwatt run record (no meta table); "
            "point record.dir at a new directory"
        )
    rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
    if rows.get("application") != _APPLICATION or "schema_version" not in rows:
        raise RecordError(f"{path}: an SQLite file but not a serwatt run record")
    version = rows["schema_version"]
    if not (isinstance(version, str) and version.isdigit() and version.isascii()):
        raise _damaged(path, f"meta.schema_version is {_shown(version)}, not a number")
    return int(version)


def create(db: sqlite3.Connection) -> None:
    """Every table of the current version, in the caller's transaction."""
    for stmt in (_SCHEMA + _SCHEMA_V2).split(";"):
        if stmt.strip():
            db.execute(stmt)
    _add_versions(db)
    db.executemany(
        "INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)",
        [
            ("application", _APPLICATION),
            ("schema_version", str(SCHEMA_VERSION)),
            ("created_at", repr(time.time())),
            ("created_by", f"serwatt {__version__}"),
        ],
    )


def upgrade(db: sqlite3.Connection) -> None:
    """Older versions in place, in the caller's transaction: 1 -> 2 adds the episode
    tables (earlier runs keep no episodes), 2 -> 3 the episode fields and the checkpoint
    tables (earlier runs read as identified by the heuristic), 3 -> 4 the episodes'
    direction and the per-direction totals (earlier runs read as not recorded), 4 -> 5
    the episodes' prepared_s (NULL in earlier rows), 5 -> 6 the windows' load_1min, 6 -> 7
    their cpu_source (NULL in earlier rows), 7 -> 8 the stack tables (earlier runs read as
    recorded without stacks). Each statement is idempotent, so one pass
    does all."""
    for stmt in _SCHEMA_V2.split(";"):
        if stmt.strip():
            db.execute(stmt)
    _add_versions(db)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))


# What versions 3 (checkpoint_rows.py), 4 (direction_rows.py), 5 to 7 and 8
# (stack_rows.py) add: columns of one table, then tables; each statement is idempotent
_VERSIONS = (
    ("episodes", checkpoint_rows.EPISODE_COLUMNS_V3, checkpoint_rows.SCHEMA_V3),
    ("episodes", direction_rows.EPISODE_COLUMNS_V4, direction_rows.SCHEMA_V4),
    ("episodes", checkpoint_rows.EPISODE_COLUMNS_V5, ""),
    # the host's 1-minute load average at the window's end; NULL when unreadable or
    # written by an older version
    ("windows", (("load_1min", "REAL"),), ""),
    # what weighed the window's CPU: kernel (the scheduler timeline) or estimate
    # (profiler/sampling/kernel_cpu.py); NULL when written by an older version
    ("windows", (("cpu_source", "TEXT"),), ""),
    ("runs", (), stack_rows.SCHEMA_V8),
)


def _add_versions(db: sqlite3.Connection) -> None:
    """Versions 3 to 8 onto a file that has version 2's tables (caller's transaction)."""
    for table, columns, tables in _VERSIONS:
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        for name, kind in columns:
            if name not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
        for stmt in tables.split(";"):
            if stmt.strip():
                db.execute(stmt)


def has_table(db: sqlite3.Connection, name: str) -> bool:
    row = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)
    ).fetchone()
    return row is not None
