"""Run records: every window of every target, in one crash-safe SQLite file.

A *run* is what one run id names (a target's `run` template, rendered by
profiler.service.discovery): usually one training process, or several ranks that render
the same id. Each run holds the host fingerprint, the config it was recorded under,
the energy/GPU sources, and one row per sampling window with per-codepath
counters (samples, cpu_s, wall_s, low-confidence samples, energy_j and its source,
gpu_wait_s) and the sampler's own errors.

Durability: WAL journal, one transaction per window, committed before
`append_window` returns. `synchronous=NORMAL`: in WAL mode a commit is written to
the WAL file (the OS page cache) before it returns, so a crash or SIGKILL of the
daemon at any moment keeps every committed window and never corrupts the file;
only a power loss or kernel crash can drop the last commits since the last
checkpoint (still no corruption). FULL would add an fsync per window, and on the
ext4 data=ordered filesystems training nodes write checkpoints to, an fsync can
force out unrelated dirty data (the job's checkpoint) and stall us behind it: the
recorder would perturb the very serialization it measures.

The format is versioned (`meta.schema_version`); a file from a newer serwatt is
refused with a clear error rather than misread. Readers check every value they return
(its SQL type, JSON of the right shape), so a damaged file (a bad page, a dropped table,
text in a numeric column, broken JSON) is one RecordError naming the file and the fix
(`sqlite3 FILE .recover`), never a traceback or a wrong number.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler import __version__, safeio
from profiler.classify.codepaths import CODEPATHS
from profiler.records import checkpoint_rows
from profiler.sampling.window import WindowReport

SCHEMA_VERSION = 3  # 2 adds serialization episodes, 3 checkpoints by file events
# (profiler/records/checkpoint_rows.py); older files are upgraded in place
RECORD_FILENAME = "runs.sqlite"  # the file inside a record dir (config `record.dir`)
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
);
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
EPISODE_FIELDS = (
    "pid", "thread", "codepath", "start", "end", "wall_s", "period_s", "resolution_s",
    "unknown_s", "edge_unknown_s", "truncated", "samples", "cpu_s", "gpu_wait_s", "gpu_idle_j",
    "main_thread", "durable",
    *(name for name, _kind in checkpoint_rows.EPISODE_COLUMNS_V3),
)  # fmt: skip
_EPISODE_NULLABLE = (
    "gpu_wait_s", "gpu_idle_j", "timing_period_s", "clock_s", "durability_s", "host_lag_s",
)  # fmt: skip
_EPISODE_BOOLS = ("truncated", "main_thread", "durable")


class RecordError(Exception):
    """A record file that cannot be used; the message names the file and the fix."""


def _damaged(path: Path, detail: str) -> RecordError:
    detail = detail if len(detail) <= 300 else detail[:300] + "..."
    return RecordError(
        f"{path}: damaged run record: {detail}; recover what is left with "
        f"`sqlite3 {path} .recover | sqlite3 {path}.recovered` and read that file"
    )


def _shown(value: Any) -> str:
    """A value from the file, for an error line: repr (no control characters), bounded."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Readers check every value they hand on: a damaged or hand-edited file may hold text in
# a REAL column (SQLite keeps what it is given), a blob, or JSON of any shape. Each check
# raises ValueError naming the column; Recorder._reading turns it into a RecordError.


def _number(value: Any, what: str, *, nullable: bool = False) -> float | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is {_shown(value)}, not a number")
    if not math.isfinite(value):
        raise ValueError(f"{what} is {value}, not a finite number")
    return float(value)


def _real(value: Any, what: str) -> float:
    out = _number(value, what)
    assert out is not None
    return out


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is {_shown(value)}, not an integer")
    return value


def _text(value: Any, what: str, *, nullable: bool = False) -> Any:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is {_shown(value)}, not text")
    return value


def _json_of(value: Any, what: str, want: type, *, nullable: bool = False) -> Any:
    """Decoded JSON text of the type `want` (dict or list)."""
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is {_shown(value)}, not JSON text")
    try:
        decoded = json.loads(value)
    except RecursionError:
        raise ValueError(f"{what} is JSON nested too deep to read") from None
    except ValueError as exc:
        raise ValueError(f"{what} is not JSON ({exc})") from None
    if not isinstance(decoded, want):
        kind = "an object" if want is dict else "a list"
        raise ValueError(f"{what} is JSON {type(decoded).__name__}, not {kind}")
    return decoded


@dataclass(frozen=True)
class CodepathTotals:
    samples: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    low_confidence_samples: int = 0
    energy_j: float | None = None
    gpu_wait_s: float | None = None
    gpu_wait_energy_j: float | None = None


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    target: str
    started_at: float
    ended_at: float | None
    last_seen_at: float
    windows: int
    pids: tuple[int, ...]
    samples: int
    cpu_s: float
    energy_j: float | None  # sum over codepaths of windows that had energy, None if none did
    energy_sources: tuple[str, ...]
    serwatt_version: str
    pythons: tuple[str, ...] = ()  # the targets' Python versions seen in the windows
    pyspy_samples: int = 0
    pyspy_errors: int = 0


@dataclass(frozen=True)
class WindowRecord:
    window_id: int
    pid: int
    started_at: float
    ended_at: float
    rate_hz: float
    cpu_s: float
    python: str | None
    exited: bool
    errors: Mapping[str, Any]
    energy: Mapping[str, Any] | None
    gpu: Mapping[str, Any] | None
    codepaths: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class RunDetail:
    summary: RunSummary
    host: Mapping[str, Any]
    config: Mapping[str, Any]
    sources: Mapping[str, Any]
    codepaths: Mapping[str, CodepathTotals]  # every codepath in CODEPATHS
    windows: tuple[WindowRecord, ...] = field(default=())
    # None: the run was recorded without episode detection (a version 1 writer)
    episodes: tuple[Mapping[str, Any], ...] | None = None
    # None: recorded without a --checkpoints watch (profiler/records/checkpoint_rows.py)
    checkpoint_events: Mapping[str, Any] | None = None

    def to_json(self, *, include_windows: bool = True) -> dict[str, Any]:
        s = self.summary
        doc: dict[str, Any] = {
            "schema": "serwatt.run/1",
            "run_id": s.run_id,
            "target": s.target,
            "started_at": s.started_at,
            "ended_at": s.ended_at,
            "last_seen_at": s.last_seen_at,
            "serwatt_version": s.serwatt_version,
            "pids": list(s.pids),
            "windows": s.windows,
            "samples": s.samples,
            "cpu_s": s.cpu_s,
            "energy_j": s.energy_j,
            "energy_sources": list(s.energy_sources),
            "host": dict(self.host),
            "config": self.config,
            "sources": dict(self.sources),
            "codepaths": {cp: vars_of(t) for cp, t in self.codepaths.items()},
        }
        if include_windows:
            doc["window_list"] = [
                {
                    "window_id": w.window_id,
                    "pid": w.pid,
                    "started_at": w.started_at,
                    "ended_at": w.ended_at,
                    "rate_hz": w.rate_hz,
                    "cpu_s": w.cpu_s,
                    "python": w.python,
                    "exited": w.exited,
                    "errors": dict(w.errors),
                    "energy": w.energy,
                    "gpu": w.gpu,
                    "codepaths": {k: dict(v) for k, v in w.codepaths.items()},
                }
                for w in self.windows
            ]
        return doc


def vars_of(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def _json(value: Any) -> str:
    """JSON for mappings from YAML/NVML: paths and other objects become strings, not errors."""
    return json.dumps(value, sort_keys=True, default=str, allow_nan=False)


def _finite(value: Any, what: str) -> float:
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"{what} is {f}: records hold finite numbers only")
    return f


def _codepath_values(mapping: Mapping | None, *keys: str) -> dict[str, float]:
    """Per-codepath numbers from an energy/gpu mapping, under the first key present."""
    if not mapping:
        return {}
    for key in keys:
        values = mapping.get(key)
        if isinstance(values, Mapping):
            unknown = set(values) - set(CODEPATHS)
            if unknown:
                raise ValueError(f"{key} names unknown codepath(s) {sorted(unknown)}")
            return {cp: _finite(v, f"{key}[{cp}]") for cp, v in values.items() if v is not None}
    return {}


class Recorder:
    """One SQLite file (WAL) holding many runs; the daemon keeps one per record dir.

    Thread-safe: one connection guarded by a lock (the daemon appends from its
    sampling threads). Readers (`serwatt runs`) may open the same file at any time.
    """

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        if readonly and not self.path.exists():
            raise RecordError(f"{self.path}: no such record file")
        if self.path.is_dir():
            raise RecordError(
                f"{self.path}: is a directory; give the record file, e.g. "
                f"{self.path / RECORD_FILENAME} (or --dir {self.path} for `serwatt runs`)"
            )
        if not readonly:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RecordError(
                    f"{self.path}: cannot create the record directory {self.path.parent}: "
                    f"{exc.strerror or exc}; set record.dir to a writable directory"
                ) from None
        try:
            # SQLite opens the file and its -journal/-wal/-shm by name, following links:
            # the directory must be one no other user can plant a link in (readers too,
            # since a reader may create the -shm), and the file itself no link or device
            safeio.check_output_path(self.path)
        except safeio.UnsafePathError as exc:
            raise RecordError(str(exc)) from None
        except OSError as exc:
            raise RecordError(f"{self.path}: cannot open: {exc.strerror or exc}") from None
        self._db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(
                str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._db = db
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("PRAGMA busy_timeout = 30000")
            version = self._read_schema_version()
            if version is None:
                if readonly:
                    raise RecordError(f"{self.path}: empty file, not a serwatt run record")
                self._create()
            elif version < SCHEMA_VERSION and not readonly:
                self._upgrade()
            elif version > SCHEMA_VERSION:
                raise RecordError(
                    f"{self.path}: record schema version {version} is newer than this serwatt "
                    f"({__version__}) reads (up to {SCHEMA_VERSION}); upgrade serwatt to read it, "
                    "or point record.dir at a new directory"
                )
            if not readonly:
                db.execute("PRAGMA journal_mode = WAL")
                db.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.DatabaseError as exc:
            if self._db is not None:
                self._db.close()
            text = str(exc)
            if "locked" in text or "busy" in text:
                raise RecordError(
                    f"{self.path}: locked by another writer for 30 s ({text}); is a stuck "
                    "serwatt holding it?"
                ) from None
            if "unable to open" in text:
                raise RecordError(
                    f"{self.path}: cannot open ({text}); check that the directory exists and "
                    "is writable"
                ) from None
            if "malformed" in text or "corrupt" in text:
                raise _damaged(self.path, text) from None
            raise RecordError(
                f"{self.path}: not a readable serwatt run record ({text}); move it aside or "
                "point record.dir at a new directory"
            ) from None
        except RecordError:
            if self._db is not None:
                self._db.close()
            raise

    @classmethod
    def for_dir(cls, record_dir: Path, **kwargs: Any) -> Recorder:
        return cls(Path(record_dir) / RECORD_FILENAME, **kwargs)

    # ----------------------------------------------------------------- setup

    def _read_schema_version(self) -> int | None:
        tables = {
            r[0] for r in self._conn().execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if not tables:
            return None
        if "meta" not in tables:
            raise RecordError(
                f"{self.path}: an SQLite file but not a serwatt run record (no meta table); "
                "point record.dir at a new directory"
            )
        rows = dict(self._conn().execute("SELECT key, value FROM meta").fetchall())
        if rows.get("application") != _APPLICATION or "schema_version" not in rows:
            raise RecordError(f"{self.path}: an SQLite file but not a serwatt run record")
        version = rows["schema_version"]
        if not (isinstance(version, str) and version.isdigit() and version.isascii()):
            raise _damaged(self.path, f"meta.schema_version is {_shown(version)}, not a number")
        return int(version)

    def _create(self) -> None:
        with self._tx() as db:
            for stmt in (_SCHEMA + _SCHEMA_V2).split(";"):
                if stmt.strip():
                    db.execute(stmt)
            checkpoint_rows.upgrade(db)
            db.executemany(
                "INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)",
                [
                    ("application", _APPLICATION),
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("created_at", repr(time.time())),
                    ("created_by", f"serwatt {__version__}"),
                ],
            )

    def _upgrade(self) -> None:
        """Older versions in place: 1 -> 2 adds the episode tables (earlier runs keep no
        episodes), 2 -> 3 the episode fields and the checkpoint tables (earlier runs read as
        identified by the heuristic). Each statement is idempotent, so one pass does both."""
        with self._tx() as db:
            for stmt in _SCHEMA_V2.split(";"):
                if stmt.strip():
                    db.execute(stmt)
            checkpoint_rows.upgrade(db)
            db.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
            )

    def _has_table(self, name: str) -> bool:
        row = (
            self._conn()
            .execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,))
            .fetchone()
        )
        return row is not None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; SQLite failures (disk full, I/O error, locked) come out as
        RecordError naming the file, with nothing half-written."""
        with self._lock:
            db = self._conn()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    try:
                        db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # the original error is the one to report
                raise RecordError(f"{self.path}: write failed: {exc}") from exc

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """One read under the lock. Whatever a damaged file makes it raise (SQLite's
        errors: malformed pages, a dropped table, undecodable text; a value of the wrong
        type) comes out as one RecordError naming the file and the .recover fix."""
        with self._lock:
            db = self._conn()
            try:
                yield db
            except sqlite3.DatabaseError as exc:
                text = " ".join(str(exc).split()) or type(exc).__name__
                if "locked" in text or "busy" in text:
                    raise RecordError(
                        f"{self.path}: locked by another writer for 30 s ({text}); is a stuck "
                        "serwatt holding it?"
                    ) from None
                raise _damaged(self.path, text) from None
            except (ValueError, TypeError) as exc:
                raise _damaged(self.path, " ".join(str(exc).split())) from None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RecordError(f"{self.path}: the recorder is closed")
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- writing

    def start_run(
        self,
        run_id: str,
        target: str,
        *,
        host: Mapping,
        config: Mapping,
        sources: Mapping,
        started_at: float | None = None,
    ) -> None:
        """Open (or re-open, after a daemon restart) a run. Idempotent for the same target."""
        if not run_id:
            raise ValueError("run_id must not be empty")
        now = time.time() if started_at is None else started_at
        with self._tx() as db:
            row = db.execute("SELECT target FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO runs(run_id, target, started_at, ended_at, last_seen_at,"
                    " serwatt_version, host_json, config_json, sources_json)"
                    " VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        target,
                        now,
                        now,
                        __version__,
                        _json(host),
                        _json(config),
                        _json(sources),
                    ),
                )
            elif row[0] != target:
                raise ValueError(
                    f"run id {run_id!r} is already recorded for target {row[0]!r}, not "
                    f"{target!r}: give the targets different `run` templates"
                )
            if row is None:
                db.execute("INSERT OR IGNORE INTO episode_runs(run_id) VALUES (?)", (run_id,))
            else:
                # Resumed: keep the first host/config, refresh the sources (they may differ
                # after a restart, e.g. RAPL became readable) and reopen the run.
                db.execute(
                    "UPDATE runs SET ended_at = NULL, last_seen_at = max(last_seen_at, ?),"
                    " sources_json = ? WHERE run_id = ?",
                    (now, _json(sources), run_id),
                )

    def append_window(
        self,
        run_id: str,
        window: WindowReport,
        *,
        energy: Mapping | None = None,
        gpu: Mapping | None = None,
    ) -> int:
        """Record one window; durable (committed) on return. Returns the window id.

        energy: {"source": "rapl"|"model"|"unavailable", "reason": str|None,
                 "codepaths_j": {codepath: joules}   (required for rapl/model;
                                                      codepaths not named get 0 J),
                 ...anything else, kept as given}
        gpu:    {"codepaths_wait_s": {codepath: seconds},
                 "codepaths_wait_j": {codepath: joules}, ...anything else, kept as given}
        """
        missing = [cp for cp in CODEPATHS if cp not in window.codepaths]
        unknown = [cp for cp in window.codepaths if cp not in CODEPATHS]
        if missing or unknown:
            raise ValueError(
                f"window codepaths must be exactly CODEPATHS: missing {missing}, unknown {unknown}"
            )
        if energy is not None and energy.get("source") in ("rapl", "model"):
            if not isinstance(energy.get("codepaths_j"), Mapping):
                # Joules measured but not split by codepath would be recorded as "no
                # energy": refuse loudly instead of losing them quietly.
                raise ValueError(
                    f"energy with source {energy.get('source')!r} needs codepaths_j "
                    "{codepath: joules}"
                )
        energy_j = _codepath_values(energy, "codepaths_j")
        energy_source = None if energy is None else str(energy.get("source") or "unavailable")
        wait_s = _codepath_values(gpu, "codepaths_wait_s")
        wait_j = _codepath_values(gpu, "codepaths_wait_j")
        e = window.errors
        with self._tx() as db:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise KeyError(f"run {run_id!r} was not started: call start_run first")
            cur = db.execute(
                "INSERT INTO windows(run_id, pid, started_at, ended_at, rate_hz, cpu_s, python,"
                " exited, pyspy_samples, pyspy_errors, partial_stacks, behind_s, notes_json,"
                " energy_source, energy_json, gpu_json)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    window.pid,
                    _finite(window.started_at, "started_at"),
                    _finite(window.ended_at, "ended_at"),
                    _finite(window.rate_hz, "rate_hz"),
                    _finite(window.cpu_s, "cpu_s"),
                    window.python,
                    int(window.exited),
                    e.pyspy_samples,
                    e.pyspy_errors,
                    e.partial_stacks,
                    _finite(e.behind_s, "behind_s"),
                    _json(list(e.notes)),
                    energy_source,
                    None if energy is None else _json(energy),
                    None if gpu is None else _json(gpu),
                ),
            )
            window_id = int(cur.lastrowid or 0)
            codepath_rows = [
                (
                    window_id,
                    cp,
                    cw.samples,
                    _finite(cw.cpu_s, f"{cp}.cpu_s"),
                    _finite(cw.wall_s, f"{cp}.wall_s"),
                    cw.low_confidence_samples,
                    energy_j.get(cp, 0.0 if energy_j else None) if energy else None,
                    energy_source if energy else None,
                    wait_s.get(cp, 0.0 if wait_s else None) if gpu else None,
                    wait_j.get(cp, 0.0 if wait_j else None) if gpu else None,
                )
                for cp, cw in ((cp, window.codepaths[cp]) for cp in CODEPATHS)
            ]
            db.executemany(
                "INSERT INTO window_codepaths(window_id, codepath, samples, cpu_s, wall_s,"
                " low_confidence_samples, energy_j, energy_source, gpu_wait_s, gpu_wait_energy_j)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                codepath_rows,
            )
            db.executemany(
                "INSERT INTO run_codepaths(run_id, codepath, samples, cpu_s, wall_s,"
                " low_confidence_samples, energy_j, gpu_wait_s, gpu_wait_energy_j)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(run_id, codepath) DO UPDATE SET"
                " samples = samples + excluded.samples,"
                " cpu_s = cpu_s + excluded.cpu_s,"
                " wall_s = wall_s + excluded.wall_s,"
                " low_confidence_samples = low_confidence_samples"
                "   + excluded.low_confidence_samples,"
                " energy_j = CASE WHEN excluded.energy_j IS NULL THEN energy_j"
                "   ELSE coalesce(energy_j, 0) + excluded.energy_j END,"
                " gpu_wait_s = CASE WHEN excluded.gpu_wait_s IS NULL THEN gpu_wait_s"
                "   ELSE coalesce(gpu_wait_s, 0) + excluded.gpu_wait_s END,"
                " gpu_wait_energy_j = CASE WHEN excluded.gpu_wait_energy_j IS NULL"
                "   THEN gpu_wait_energy_j"
                "   ELSE coalesce(gpu_wait_energy_j, 0) + excluded.gpu_wait_energy_j END",
                [(run_id, *row[1:6], row[6], row[8], row[9]) for row in codepath_rows],
            )
            facets = [("pid", str(window.pid))]
            if window.python:
                facets.append(("python", window.python))
            if energy_source:
                facets.append(("energy_source", energy_source))
            db.executemany(
                "INSERT OR IGNORE INTO run_facets(run_id, kind, value) VALUES (?, ?, ?)",
                [(run_id, kind, value) for kind, value in facets],
            )
            db.execute(
                "UPDATE runs SET last_seen_at = max(last_seen_at, ?), windows = windows + 1,"
                " cpu_s = cpu_s + ?, pyspy_samples = pyspy_samples + ?,"
                " pyspy_errors = pyspy_errors + ? WHERE run_id = ?",
                (window.ended_at, window.cpu_s, e.pyspy_samples, e.pyspy_errors, run_id),
            )
        return window_id

    def finish_run(self, run_id: str, ended_at: float) -> None:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE runs SET ended_at = ?, last_seen_at = max(last_seen_at, ?)"
                " WHERE run_id = ?",
                (ended_at, ended_at, run_id),
            )
            if cur.rowcount == 0:
                raise KeyError(f"run {run_id!r} is not recorded")

    def apply_retention(self, days: float, now: float | None = None) -> int:
        """Delete runs last seen more than `days` ago; returns how many runs were deleted."""
        if not days > 0:
            raise ValueError(f"retention days must be > 0, got {days}")
        cutoff = (time.time() if now is None else now) - days * 86400.0
        with self._tx() as db:
            cur = db.execute("DELETE FROM runs WHERE last_seen_at < ?", (cutoff,))
            deleted = cur.rowcount
        if deleted:
            with self._lock:
                # Hand the freed pages back to the WAL checkpoint so the file stops growing.
                self._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return deleted

    # ----------------------------------------------------------------- reading

    def runs(self, run_id: str | None = None) -> list[RunSummary]:
        """Every run (or just `run_id`), oldest first."""
        where, params = ("WHERE r.run_id = ?", (run_id,)) if run_id is not None else ("", ())
        with self._reading() as db:
            rows = db.execute(
                "SELECT r.run_id, r.target, r.started_at, r.ended_at, r.last_seen_at,"
                " r.serwatt_version, r.windows,"
                " (SELECT group_concat(f.value) FROM run_facets f"
                "   WHERE f.run_id = r.run_id AND f.kind = 'pid'),"
                " (SELECT coalesce(sum(c.samples), 0) FROM run_codepaths c"
                "   WHERE c.run_id = r.run_id),"
                " r.cpu_s,"
                " (SELECT sum(c.energy_j) FROM run_codepaths c WHERE c.run_id = r.run_id),"
                " (SELECT group_concat(f.value) FROM run_facets f"
                "   WHERE f.run_id = r.run_id AND f.kind = 'energy_source'),"
                " (SELECT group_concat(f.value) FROM run_facets f"
                "   WHERE f.run_id = r.run_id AND f.kind = 'python'),"
                " r.pyspy_samples, r.pyspy_errors"
                f" FROM runs r {where} ORDER BY r.started_at, r.run_id",
                params,
            ).fetchall()
            return [_summary(row) for row in rows]

    def run(self, run_id: str, *, windows: bool = True) -> RunDetail:
        """One run: summary, host, config, sources, per-codepath totals (kept per run),
        and, when `windows`, every window (a month-long run holds ~260k of them)."""
        found = self.runs(run_id)
        if not found:
            with self._reading() as db:
                ids = [str(r[0]) for r in db.execute("SELECT run_id FROM runs LIMIT 11")]
            known = ", ".join(sorted(ids)[:10]) + (", ..." if len(ids) > 10 else "")
            raise KeyError(f"no run {run_id!r} in {self.path} (recorded: {known or 'none'})")
        with self._reading() as db:
            host_json, config_json, sources_json = db.execute(
                "SELECT host_json, config_json, sources_json FROM runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            trows = db.execute(
                "SELECT codepath, samples, cpu_s, wall_s, low_confidence_samples, energy_j,"
                " gpu_wait_s, gpu_wait_energy_j FROM run_codepaths WHERE run_id = ?",
                (run_id,),
            ).fetchall()
            wrows = crows = []
            if windows:
                wrows = db.execute(
                    "SELECT window_id, pid, started_at, ended_at, rate_hz, cpu_s, python,"
                    " exited, pyspy_samples, pyspy_errors, partial_stacks, behind_s,"
                    " notes_json, energy_json, gpu_json FROM windows WHERE run_id = ?"
                    " ORDER BY started_at, window_id",
                    (run_id,),
                ).fetchall()
                crows = db.execute(
                    "SELECT c.window_id, c.codepath, c.samples, c.cpu_s, c.wall_s,"
                    " c.low_confidence_samples, c.energy_j, c.energy_source, c.gpu_wait_s,"
                    " c.gpu_wait_energy_j FROM window_codepaths c JOIN windows w"
                    " USING (window_id) WHERE w.run_id = ?",
                    (run_id,),
                ).fetchall()
            detail = RunDetail(
                summary=found[0],
                host=_json_of(host_json, f"runs.host_json of run {run_id!r}", dict),
                config=_json_of(config_json, f"runs.config_json of run {run_id!r}", dict),
                sources=_json_of(sources_json, f"runs.sources_json of run {run_id!r}", dict),
                codepaths=_run_codepaths(trows, run_id),
                windows=_windows(wrows, crows),
                episodes=self._episodes(db, run_id),
                checkpoint_events=checkpoint_rows.read(db, run_id),
            )
        return detail

    def append_episodes(self, run_id: str, episodes: Iterable[Any]) -> int:
        """Record closed episodes (objects with the EPISODE_FIELDS attributes) of a run."""
        rows = []
        for ep in episodes:
            values = [getattr(ep, name) for name in EPISODE_FIELDS]
            for name, v in zip(EPISODE_FIELDS, values, strict=True):
                if isinstance(v, float) and not math.isfinite(v):
                    raise ValueError(f"episode {name} must be finite, got {v}")
            rows.append((run_id, *values))
        if rows:
            with self._tx() as db:
                db.executemany(
                    f"INSERT INTO episodes(run_id, {', '.join(EPISODE_FIELDS)})"
                    f" VALUES (?{', ?' * len(EPISODE_FIELDS)})",
                    rows,
                )
        return len(rows)

    def append_checkpoints(
        self,
        run_id: str,
        matched: Any,
        *,
        identity: Mapping[str, Any],
        read_bytes: int | None,
        read_bytes_source: str,
    ) -> None:
        """Record what a --checkpoints watch identified (checkpoint_rows.write)."""
        with self._tx() as db:
            checkpoint_rows.write(
                db,
                run_id,
                matched,
                identity=identity,
                read_bytes=read_bytes,
                read_bytes_source=read_bytes_source,
            )

    def checkpoint_events(self, run_id: str) -> Mapping[str, Any] | None:
        """A run's checkpoints and restores; None when recorded without a watch."""
        with self._reading() as db:
            return checkpoint_rows.read(db, run_id)

    def append_receipts(self, run_id: str, receipts: Iterable[tuple[str, str | None, str]]) -> int:
        """Anchor (receipt, prev_receipt, path) of checkpoint files a run wrote; a receipt
        already anchored for the run is kept as first seen. Returns how many were new."""
        rows = [(run_id, r, prev, path, time.time()) for r, prev, path in receipts]
        if not rows:
            return 0
        with self._tx() as db:
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO run_receipts(run_id, receipt, prev_receipt, path, seen_at)"
                " VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            return db.total_changes - before

    def receipts(self, run_id: str) -> tuple[dict[str, Any], ...]:
        """The checkpoint receipts anchored for a run, in the order they were seen."""
        with self._reading() as db:
            if not self._has_table("run_receipts"):
                return ()
            rows = db.execute(
                "SELECT receipt, prev_receipt, path, seen_at FROM run_receipts WHERE run_id = ?"
                " ORDER BY seen_at, receipt",
                (run_id,),
            ).fetchall()
        out = []
        for receipt, prev, path, seen_at in rows:
            what = f"run_receipts of run {run_id!r}"
            out.append(
                {
                    "receipt": _text(receipt, what),
                    "prev_receipt": None if prev is None else _text(prev, what),
                    "path": _text(path, what),
                    "seen_at": _number(seen_at, what),
                }
            )
        return tuple(out)

    def episodes(self, run_id: str) -> tuple[dict[str, Any], ...] | None:
        """A run's episodes in time order; None when it was recorded without detection."""
        with self._reading() as db:
            return self._episodes(db, run_id)

    def _episodes(self, db: sqlite3.Connection, run_id: str) -> tuple[dict[str, Any], ...] | None:
        if not self._has_table("episodes"):
            return None
        if db.execute("SELECT 1 FROM episode_runs WHERE run_id = ?", (run_id,)).fetchone() is None:
            return None
        # a version 2 file opened read-only (not upgraded) lacks version 3's columns
        have = {r[1] for r in db.execute("PRAGMA table_info(episodes)")}
        columns = ", ".join(n if n in have else f"NULL AS {n}" for n in EPISODE_FIELDS)
        rows = db.execute(
            f"SELECT {columns} FROM episodes WHERE run_id = ? ORDER BY start, episode_id",
            (run_id,),
        ).fetchall()
        out = []
        for r in rows:
            ep: dict[str, Any] = {}
            for name, value in zip(EPISODE_FIELDS, r, strict=True):
                what = f"episodes.{name} of run {run_id!r}"
                if name in ("pid", "thread", "samples"):
                    ep[name] = _integer(value, what)
                elif name == "main_thread" and value is None:
                    ep[name] = None  # the thread's kernel tid was not known
                elif name in _EPISODE_BOOLS:
                    ep[name] = bool(_integer(value, what))
                elif name == "codepath":
                    ep[name] = _text(value, what)
                elif name == "timed_by":
                    ep[name] = _text(value, what, nullable=True)  # NULL: a version 2 row
                else:
                    ep[name] = _number(value, what, nullable=name in _EPISODE_NULLABLE)
            out.append(ep)
        return tuple(out)


_WINDOW_CODEPATH_FIELDS = (
    "samples",
    "cpu_s",
    "wall_s",
    "low_confidence_samples",
    "energy_j",
    "energy_source",
    "gpu_wait_s",
    "gpu_wait_energy_j",
)


def _run_codepaths(rows: list[tuple], run_id: str) -> dict[str, CodepathTotals]:
    totals = dict.fromkeys(CODEPATHS, CodepathTotals())
    for cp, samples, cpu_s, wall_s, low, energy_j, wait_s, wait_j in rows:
        if cp not in totals:
            continue
        what = f"run_codepaths of run {run_id!r}, {cp}"
        totals[cp] = CodepathTotals(
            samples=_integer(samples or 0, f"{what}: samples"),
            cpu_s=_real(cpu_s or 0.0, f"{what}: cpu_s"),
            wall_s=_real(wall_s or 0.0, f"{what}: wall_s"),
            low_confidence_samples=_integer(low or 0, f"{what}: low_confidence_samples"),
            # NULL: no window of the run had energy / GPU data
            energy_j=_number(energy_j, f"{what}: energy_j", nullable=True),
            gpu_wait_s=_number(wait_s, f"{what}: gpu_wait_s", nullable=True),
            gpu_wait_energy_j=_number(wait_j, f"{what}: gpu_wait_energy_j", nullable=True),
        )
    return totals


_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "real": ((float, int), "a number"),
    "real?": ((float, int, type(None)), "a number or NULL"),
    "text": ((str,), "text"),
    "text?": ((str, type(None)), "text or NULL"),
}
_WINDOW_KINDS = (
    ("window_id", "int"), ("pid", "int"), ("started_at", "real"), ("ended_at", "real"),
    ("rate_hz", "real"), ("cpu_s", "real"), ("python", "text?"), ("exited", "int"),
    ("pyspy_samples", "int"), ("pyspy_errors", "int"), ("partial_stacks", "int"),
    ("behind_s", "real"),
)  # fmt: skip
_WINDOW_CODEPATH_KINDS = (
    ("window_id", "int"), ("codepath", "text"), ("samples", "int"), ("cpu_s", "real"),
    ("wall_s", "real"), ("low_confidence_samples", "int"), ("energy_j", "real?"),
    ("energy_source", "text?"), ("gpu_wait_s", "real?"), ("gpu_wait_energy_j", "real?"),
)  # fmt: skip


def _signatures(kinds: tuple[tuple[str, str], ...]) -> frozenset[tuple[type, ...]]:
    return frozenset(itertools.product(*(_KINDS[kind][0] for _name, kind in kinds)))


_WINDOW_SIGNATURES = _signatures(_WINDOW_KINDS)
_WINDOW_CODEPATH_SIGNATURES = _signatures(_WINDOW_CODEPATH_KINDS)


def _check_row(
    row: tuple,
    kinds: tuple[tuple[str, str], ...],
    signatures: frozenset[tuple[type, ...]],
    table: str,
) -> None:
    """Every column of `row` of the SQL type its table declares (a finite number where a
    number goes; SQLite stores NaN as NULL but keeps infinities). A month-long run reads
    ~2M such values, so the common case is one set lookup of the row's types."""
    if (
        tuple(map(type, row[: len(kinds)])) in signatures
        and math.inf not in row
        and -math.inf not in row
    ):
        return
    for value, (name, kind) in zip(row, kinds, strict=False):
        types, want = _KINDS[kind]
        if type(value) not in types or (type(value) is float and not math.isfinite(value)):
            raise ValueError(f"{table} row {_shown(row[0])}: {name} is {_shown(value)}, not {want}")


def _windows(wrows: list[tuple], crows: list[tuple]) -> tuple[WindowRecord, ...]:
    per_window: dict[int, dict[str, dict[str, Any]]] = {}
    for crow in crows:
        _check_row(crow, _WINDOW_CODEPATH_KINDS, _WINDOW_CODEPATH_SIGNATURES, "window_codepaths")
        wid, cp, *values = crow
        per_window.setdefault(wid, {})[cp] = dict(zip(_WINDOW_CODEPATH_FIELDS, values, strict=True))
    out = []
    for r in wrows:
        _check_row(r, _WINDOW_KINDS, _WINDOW_SIGNATURES, "windows")
        what = f"windows row {r[0]}"
        out.append(
            WindowRecord(
                window_id=r[0],
                pid=r[1],
                started_at=r[2],
                ended_at=r[3],
                rate_hz=r[4],
                cpu_s=r[5],
                python=r[6],
                exited=bool(r[7]),
                errors={
                    "pyspy_samples": r[8],
                    "pyspy_errors": r[9],
                    "partial_stacks": r[10],
                    "behind_s": r[11],
                    "notes": _json_of(r[12], f"{what}: notes_json", list),
                },
                energy=_json_of(r[13], f"{what}: energy_json", dict, nullable=True),
                gpu=_json_of(r[14], f"{what}: gpu_json", dict, nullable=True),
                codepaths={cp: per_window.get(r[0], {}).get(cp, {}) for cp in CODEPATHS},
            )
        )
    return tuple(out)


def _summary(row: tuple) -> RunSummary:
    (
        run_id,
        target,
        started_at,
        ended_at,
        last_seen_at,
        version,
        windows,
        pids,
        samples,
        cpu_s,
        energy_j,
        sources,
        pythons,
        pyspy_samples,
        pyspy_errors,
    ) = row
    run_id = _text(run_id, "runs.run_id")
    what = f"runs row {run_id!r}"

    def facets(value: Any, kind: str) -> list[str]:
        return _text(value, f"{what}: {kind} facets", nullable=True).split(",") if value else []

    pid_list = facets(pids, "pid")
    if not all(p.isdigit() and p.isascii() for p in pid_list):
        raise ValueError(f"{what}: a pid facet is not a number ({_shown(pids)})")
    return RunSummary(
        run_id=run_id,
        target=_text(target, f"{what}: target"),
        started_at=_real(started_at, f"{what}: started_at"),
        ended_at=_number(ended_at, f"{what}: ended_at", nullable=True),
        last_seen_at=_real(last_seen_at, f"{what}: last_seen_at"),
        windows=_integer(windows, f"{what}: windows"),
        pids=tuple(sorted(int(p) for p in pid_list)),
        samples=_integer(samples, f"{what}: samples"),
        cpu_s=_real(cpu_s, f"{what}: cpu_s"),
        energy_j=_number(energy_j, f"{what}: energy_j", nullable=True),
        energy_sources=tuple(sorted(facets(sources, "energy_source"))),
        serwatt_version=_text(version, f"{what}: serwatt_version"),
        pythons=tuple(sorted(facets(pythons, "python"))),
        pyspy_samples=_integer(pyspy_samples, f"{what}: pyspy_samples"),
        pyspy_errors=_integer(pyspy_errors, f"{what}: pyspy_errors"),
    )
