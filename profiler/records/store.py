"""Run records: every window of every target, in one crash-safe SQLite file. This module
is the Recorder: it opens the file (creating or upgrading it, profiler/records/schema.py),
holds its one connection under a lock, and writes runs, windows, episodes, checkpoints
and receipts; reading and row decoding are profiler/records/reader.py, the value checks
profiler/records/validation.py.

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

A damaged file (a bad page, a dropped table, text in a numeric column, broken JSON) is
one RecordError naming the file and the fix (`sqlite3 FILE .recover`), never a
traceback or a wrong number.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from serwatt.profiler import __version__, safeio
from serwatt.profiler.attribution.window import DirectedFigures, figures_of_records
from serwatt.profiler.attribution.window_records import EnergyRecord, GpuRecord
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records import checkpoint_rows, direction_rows, reader, schema, stack_rows
from serwatt.profiler.records.reader import CodepathTotals, RunDetail, RunSummary, WindowRecord
from serwatt.profiler.records.schema import EPISODE_FIELDS, SCHEMA_VERSION
from serwatt.profiler.records.validation import RecordError, _damaged, _finite, stored_name
from serwatt.profiler.sampling.window import WindowReport

# What other modules import from here: the Recorder, its error, and what it returns.
__all__ = [
    "RECORD_FILENAME",
    "SCHEMA_VERSION",
    "CodepathTotals",
    "RecordError",
    "Recorder",
    "RunDetail",
    "RunSummary",
    "WindowRecord",
]

RECORD_FILENAME = "runs.sqlite"  # the file inside a record dir (config `record.dir`)
# What one open, read or write may take before SQLite is stopped (its progress handler):
# a record's largest read, every window of a month-long run, takes seconds; its schema is
# checked before any read (schema.check), and this bounds what a crafted file or a
# runaway query could still make it do.
QUERY_DEADLINE_S = 60.0
_PROGRESS_STEPS = 10_000  # SQLite VM steps between looks at the clock (~1 ms)


def _json(value: Any) -> str:
    """JSON for mappings from YAML/NVML: paths and other objects become strings, not errors."""
    return json.dumps(value, sort_keys=True, default=str, allow_nan=False)


def _codepath_values(values: Mapping[str, float] | None, key: str) -> dict[str, float]:
    """Per-codepath numbers of an energy/GPU record, each checked finite; {} when the
    record has none."""
    if values is None:
        return {}
    return {cp: _finite(v, f"{key}[{cp}]") for cp, v in values.items()}


_INSERT_WINDOW = (
    "INSERT INTO windows(run_id, pid, started_at, ended_at, rate_hz, cpu_s, python,"
    " exited, pyspy_samples, pyspy_errors, partial_stacks, behind_s, notes_json,"
    " energy_source, energy_json, gpu_json, load_1min, cpu_source)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_WINDOW_CODEPATHS = (
    "INSERT INTO window_codepaths(window_id, codepath, samples, cpu_s, wall_s,"
    " low_confidence_samples, energy_j, energy_source, gpu_wait_s, gpu_wait_energy_j)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# a window's codepath rows added to its run's totals; a NULL (not measured) adds nothing
_ADD_RUN_CODEPATHS = (
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
    "   ELSE coalesce(gpu_wait_energy_j, 0) + excluded.gpu_wait_energy_j END"
)


def _window_row(
    run_id: str,
    window: WindowReport,
    energy_source: str | None,
    energy: EnergyRecord | None,
    gpu: GpuRecord | None,
    load_1min: float | None,
) -> tuple[Any, ...]:
    """The window's row of `windows` (_INSERT_WINDOW), every float checked finite."""
    e = window.errors
    return (
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
        None if energy is None else _json(energy.to_json()),
        None if gpu is None else _json(gpu.to_json()),
        None if load_1min is None else _finite(load_1min, "load_1min"),
        window.cpu_source,
    )


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
                safeio.make_dirs(self.path.parent)
            except safeio.UnsafePathError as exc:
                raise RecordError(str(exc)) from None
            except OSError as exc:
                raise RecordError(
                    f"{self.path}: cannot create the record directory {self.path.parent}: "
                    f"{exc.strerror or exc}; set record.dir to a writable directory"
                ) from None
        try:
            # SQLite opens the file and its -journal/-wal/-shm by name, resolving links:
            # it gets a name no other user can swap (readers too, since a reader may
            # create the -shm or roll back a journal)
            name = safeio.sqlite_name(self.path, create=not readonly)
        except safeio.UnsafePathError as exc:
            raise RecordError(str(exc)) from None
        except OSError as exc:
            raise RecordError(f"{self.path}: cannot open: {exc.strerror or exc}") from None
        self._db: sqlite3.Connection | None = None
        self._deadline = time.monotonic() + QUERY_DEADLINE_S
        try:
            db = sqlite3.connect(name, timeout=30.0, isolation_level=None, check_same_thread=False)
            self._db = db
            db.set_progress_handler(self._past_deadline, _PROGRESS_STEPS)
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("PRAGMA busy_timeout = 30000")
            schema.check(db, self.path)  # before any table is read: see schema.py
            version = schema.read_version(db, self.path)
            if version is None:
                if readonly:
                    raise RecordError(f"{self.path}: empty file, not a serwatt run record")
                with self._tx() as tx:
                    schema.create(tx)
            elif version < SCHEMA_VERSION and not readonly:
                with self._tx() as tx:
                    schema.upgrade(tx)
            elif version > SCHEMA_VERSION:
                raise RecordError(
                    f"{self.path}: record schema version {version} is newer than this serwatt "
                    f"({__version__}) reads (up to {SCHEMA_VERSION}); upgrade serwatt to read it, "
                    "or point record.dir at a new directory"
                )
            if not readonly:
                db.execute("PRAGMA journal_mode = WAL")
                db.execute("PRAGMA synchronous = NORMAL")
            if db.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                # past its first read, a WAL database reads no journal: the empty one
                # sqlite_name made in a shared directory would only be left behind
                with contextlib.suppress(OSError):  # tidying only
                    safeio.drop_empty_journal(self.path)
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
            if "interrupted" in text:
                raise self._too_long() from None
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

    # ----------------------------------------------------------------- connection

    def _past_deadline(self) -> bool:
        """SQLite's progress handler: True stops the running statement ("interrupted")."""
        return time.monotonic() > self._deadline

    def _too_long(self) -> RecordError:
        return RecordError(
            f"{self.path}: stopped a query that ran past {QUERY_DEADLINE_S:g} s; a record "
            f"this slow is crafted or far larger than serwatt writes: look at it with "
            f"`sqlite3 {self.path} .schema`, or move it aside and point record.dir (or --db) "
            "at a new file"
        )

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; SQLite failures (disk full, I/O error, locked) come out as
        RecordError naming the file, with nothing half-written."""
        with self._lock:
            db = self._conn()
            self._deadline = time.monotonic() + QUERY_DEADLINE_S
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
                if "interrupted" in str(exc):
                    raise self._too_long() from None
                raise RecordError(f"{self.path}: write failed: {exc}") from exc

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """One read under the lock. Whatever a damaged file makes it raise (SQLite's
        errors: malformed pages, a dropped table, undecodable text; a value of the wrong
        type) comes out as one RecordError naming the file and the .recover fix."""
        with self._lock:
            db = self._conn()
            self._deadline = time.monotonic() + QUERY_DEADLINE_S
            try:
                yield db
            except sqlite3.DatabaseError as exc:
                text = " ".join(str(exc).split()) or type(exc).__name__
                if "interrupted" in text:
                    raise self._too_long() from None
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
        stacks: bool = False,
    ) -> None:
        """Open (or re-open, after a daemon restart) a run. Idempotent for the same target.

        stacks: the driver folds each window's stacks (`serwatt profile` and the daemon
        do), so the run keeps them (stack_rows.py); a run not started with them
        reads as recorded without stacks, never as one whose stacks were empty."""
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
                direction_rows.start(db, run_id)
                if stacks:
                    stack_rows.start(db, run_id)
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
        energy: EnergyRecord | None = None,
        gpu: GpuRecord | None = None,
        load_1min: float | None = None,
        directed: DirectedFigures | None = None,
    ) -> int:
        """Record one window; durable (committed) on return. Returns the window id.

        energy: the window's joules and their source (codepaths its codepaths_j does not
        name get 0 J); None when the run measures no energy. gpu: its GPU-wait seconds and
        idle joules per codepath; None when it had no GPU data. Both are stored whole as
        their `to_json()` (windows.energy_json / gpu_json) and per codepath in the rows.
        load_1min: the host's 1-minute load average at the window's end (records/host.py);
        None when not read. directed: the window's figures by direction
        (AttributedWindow.by_direction, what RunSink hands); None: split from `energy`
        and `gpu` by the same rule (attribution.window.figures_of_records).
        """
        missing = [cp for cp in CODEPATHS if cp not in window.codepaths]
        unknown = [cp for cp in window.codepaths if cp not in CODEPATHS]
        if missing or unknown:
            raise ValueError(
                f"window codepaths must be exactly CODEPATHS: missing {missing}, unknown {unknown}"
            )
        energy_j: dict[str, float] = {}
        energy_source: str | None = None
        if energy is not None:
            energy_j = _codepath_values(energy.codepaths_j, "codepaths_j")
            energy_source = energy.source or "unavailable"
        wait_s: dict[str, float] = {}
        wait_j: dict[str, float] = {}
        if gpu is not None:
            wait_s = _codepath_values(gpu.codepaths_wait_s, "codepaths_wait_s")
            wait_j = _codepath_values(gpu.codepaths_wait_j, "codepaths_wait_j")
        if directed is None:
            directed = figures_of_records(window, energy, gpu)
        direction = direction_rows.window_rows(directed, gpu is not None)
        e = window.errors
        with self._tx() as db:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise KeyError(f"run {run_id!r} was not started: call start_run first")
            cur = db.execute(
                _INSERT_WINDOW, _window_row(run_id, window, energy_source, energy, gpu, load_1min)
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
                    energy_j.get(cp, 0.0 if energy_j else None) if energy is not None else None,
                    energy_source if energy is not None else None,
                    wait_s.get(cp, 0.0 if wait_s else None) if gpu is not None else None,
                    wait_j.get(cp, 0.0 if wait_j else None) if gpu is not None else None,
                )
                for cp, cw in ((cp, window.codepaths[cp]) for cp in CODEPATHS)
            ]
            db.executemany(_INSERT_WINDOW_CODEPATHS, codepath_rows)
            db.executemany(
                _ADD_RUN_CODEPATHS,
                [(run_id, *row[1:6], row[6], row[8], row[9]) for row in codepath_rows],
            )
            direction_rows.add_window(db, run_id, direction)
            stack_rows.add_window(db, run_id, window.stacks)
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
                self._deadline = time.monotonic() + QUERY_DEADLINE_S
                self._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return deleted

    # ----------------------------------------------------------------- reading

    def runs(self, run_id: str | None = None) -> list[RunSummary]:
        """Every run (or just `run_id`), oldest first."""
        with self._reading() as db:
            return reader.runs(db, run_id)

    def run(self, run_id: str, *, windows: bool = True) -> RunDetail:
        """One run: summary, host, config, sources, per-codepath totals (kept per run),
        and, when `windows`, every window (a month-long run holds ~260k of them)."""
        found = self.runs(run_id)
        if not found:
            with self._reading() as db:
                ids = reader.some_run_ids(db, 11)
            known = ", ".join(sorted(ids)[:10]) + (", ..." if len(ids) > 10 else "")
            raise KeyError(f"no run {run_id!r} in {self.path} (recorded: {known or 'none'})")
        with self._reading() as db:
            return reader.run_detail(db, found[0], windows=windows)

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
        rows = [(run_id, r, prev, stored_name(path), time.time()) for r, prev, path in receipts]
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
            rows = reader.receipt_rows(db, run_id)
        return reader.decode_receipts(rows, run_id)

    def directions(self, run_id: str) -> dict[str, dict[str, Any]] | None:
        """A run's per-codepath, per-direction totals; None when recorded without them."""
        with self._reading() as db:
            return direction_rows.read(db, run_id)

    def episodes(self, run_id: str) -> tuple[reader.RecordedEpisode, ...] | None:
        """A run's episodes in time order; None when it was recorded without detection."""
        with self._reading() as db:
            return reader.episodes(db, run_id)
