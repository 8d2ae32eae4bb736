"""Reading the run record: the SQL that reads runs back and the decoding of its rows into
RunSummary, RunDetail and plain episode and receipt mappings.

Every value is checked on its way out (its SQL type, JSON of the right shape;
profiler/records/validation.py), so a damaged file (a bad page, a dropped table, text in
a numeric column, broken JSON) fails as one error rather than a wrong number. The
functions take a connection the Recorder holds under its lock (`Recorder._reading`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.window_records import EnergyRecord, GpuRecord
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records import checkpoint_rows, direction_rows, stack_rows
from serwatt.profiler.records.direction_rows import DirectionTotals
from serwatt.profiler.records.schema import EPISODE_FIELDS, has_table
from serwatt.profiler.records.stack_rows import RunStacks
from serwatt.profiler.records.validation import (
    _check_row,
    _integer,
    _json_of,
    _number,
    _real,
    _shown,
    _signatures,
    _text,
    read_name,
)
from serwatt.profiler.sampling.kernel_cpu import CPU_SOURCES

_EPISODE_NULLABLE = (
    "gpu_wait_s", "gpu_idle_j", "timing_period_s", "clock_s", "durability_s", "host_lag_s",
    "prepared_s",
)  # fmt: skip
_EPISODE_BOOLS = ("truncated", "main_thread", "durable")


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
    load_1min: float | None = None  # the host's 1-minute load at the window's end
    # `energy` and `gpu` as the writer was given them (None where those are)
    energy_record: EnergyRecord | None = None
    gpu_record: GpuRecord | None = None
    # what weighed its CPU: "kernel" or "estimate" (profiler/sampling/kernel_cpu.py);
    # None in a window an older version wrote
    cpu_source: str | None = None


@dataclass(frozen=True)
class RecordedEpisode:
    """A recorded episode as the writer was given it (`episode`). A row an older writer
    recorded lacks the later columns (timed_by: schema 2; direction: 3; clock_s,
    durability_s, host_lag_s, prepared_s after): those read as Episode's defaults in
    `episode` ("sample counts", "unknown", 0.0) and are named in `unrecorded`; by name
    (`ep["prepared_s"]`) an unrecorded field reads None, as its column does."""

    episode: Episode
    unrecorded: frozenset[str] = frozenset()

    def __getitem__(self, name: str) -> Any:
        if name not in EPISODE_FIELDS:
            raise KeyError(name)
        return None if name in self.unrecorded else getattr(self.episode, name)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in EPISODE_FIELDS else default


@dataclass(frozen=True)
class RunDetail:
    summary: RunSummary
    host: Mapping[str, Any]
    config: Mapping[str, Any]
    sources: Mapping[str, Any]
    codepaths: Mapping[str, CodepathTotals]  # every codepath in CODEPATHS
    windows: tuple[WindowRecord, ...] = field(default=())
    # None: the run was recorded without episode detection (a version 1 writer)
    episodes: tuple[RecordedEpisode, ...] | None = None
    # None: recorded without a --checkpoints watch (profiler/records/checkpoint_rows.py)
    checkpoint_events: Mapping[str, Any] | None = None
    # codepath -> direction -> totals; None: recorded by a writer older than schema 4
    directions: Mapping[str, Mapping[str, DirectionTotals]] | None = None
    # the run's folded stacks; None: recorded by a writer older than schema 8
    stacks: RunStacks | None = None

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
            "directions": None
            if self.directions is None
            else {
                cp: {d: vars_of(t) for d, t in parts.items()}
                for cp, parts in self.directions.items()
            },
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
                    "load_1min": w.load_1min,
                    "cpu_source": w.cpu_source,
                }
                for w in self.windows
            ]
        return doc


def vars_of(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def runs(db: sqlite3.Connection, run_id: str | None = None) -> list[RunSummary]:
    """Every run (or just `run_id`), oldest first."""
    where, params = ("WHERE r.run_id = ?", (run_id,)) if run_id is not None else ("", ())
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


def some_run_ids(db: sqlite3.Connection, limit: int) -> list[str]:
    """Up to `limit` recorded run ids, for naming what is there when a run is not."""
    return [str(r[0]) for r in db.execute("SELECT run_id FROM runs LIMIT ?", (limit,))]


def run_detail(db: sqlite3.Connection, summary: RunSummary, *, windows: bool) -> RunDetail:
    """The rest of a run beside its summary: host, config, sources, per-codepath totals
    (kept per run), episodes, checkpoint events and, when `windows`, every window (a
    month-long run holds ~260k of them)."""
    run_id = summary.run_id
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
        # a file older than version 6 opened read-only (not upgraded) has no load_1min
        have = {r[1] for r in db.execute("PRAGMA table_info(windows)")}
        load = "load_1min" if "load_1min" in have else "NULL AS load_1min"
        source = "cpu_source" if "cpu_source" in have else "NULL AS cpu_source"
        wrows = db.execute(
            "SELECT window_id, pid, started_at, ended_at, rate_hz, cpu_s, python,"
            " exited, pyspy_samples, pyspy_errors, partial_stacks, behind_s,"
            f" notes_json, energy_json, gpu_json, {load}, {source} FROM windows"
            " WHERE run_id = ?"
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
    return RunDetail(
        summary=summary,
        host=_json_of(host_json, f"runs.host_json of run {run_id!r}", dict),
        config=_json_of(config_json, f"runs.config_json of run {run_id!r}", dict),
        sources=_json_of(sources_json, f"runs.sources_json of run {run_id!r}", dict),
        codepaths=_run_codepaths(trows, run_id),
        windows=_windows(wrows, crows),
        episodes=episodes(db, run_id),
        checkpoint_events=checkpoint_rows.read(db, run_id),
        directions=direction_rows.read(db, run_id),
        stacks=stack_rows.read(db, run_id),
    )


def receipt_rows(db: sqlite3.Connection, run_id: str) -> list[tuple]:
    """The run_receipts rows of a run, in the order they were seen (decode_receipts)."""
    if not has_table(db, "run_receipts"):
        return []
    return db.execute(
        "SELECT receipt, prev_receipt, path, seen_at FROM run_receipts WHERE run_id = ?"
        " ORDER BY seen_at, receipt",
        (run_id,),
    ).fetchall()


def decode_receipts(rows: list[tuple], run_id: str) -> tuple[dict[str, Any], ...]:
    out = []
    for receipt, prev, path, seen_at in rows:
        what = f"run_receipts of run {run_id!r}"
        out.append(
            {
                "receipt": _text(receipt, what),
                "prev_receipt": None if prev is None else _text(prev, what),
                "path": read_name(path, what),
                "seen_at": _number(seen_at, what),
            }
        )
    return tuple(out)


def episodes(db: sqlite3.Connection, run_id: str) -> tuple[RecordedEpisode, ...] | None:
    """A run's episodes in time order; None when it was recorded without detection."""
    if not has_table(db, "episodes"):
        return None
    if db.execute("SELECT 1 FROM episode_runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        return None
    # a version 2 or 3 file opened read-only (not upgraded) lacks the later columns
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
            elif name in ("timed_by", "direction"):
                # NULL: a row a version 2 (timed_by) or 3 (direction) writer recorded
                ep[name] = _text(value, what, nullable=True)
            else:
                ep[name] = _number(value, what, nullable=name in _EPISODE_NULLABLE)
        # NULL where an Episode holds None is a value; elsewhere it is a column an older
        # writer did not have: Episode's default, named unrecorded
        unrecorded = frozenset(n for n, v in ep.items() if v is None and n not in _EPISODE_NONE)
        typed = Episode(**{n: v for n, v in ep.items() if n not in unrecorded})
        out.append(RecordedEpisode(typed, unrecorded))
    return tuple(out)


# the Episode fields whose None is a value (unknown), not a missing column
_EPISODE_NONE = ("main_thread", "gpu_wait_s", "gpu_idle_j", "timing_period_s")


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


_WINDOW_SIGNATURES = _signatures(_WINDOW_KINDS)
_WINDOW_CODEPATH_SIGNATURES = _signatures(_WINDOW_CODEPATH_KINDS)


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
                energy=(energy := _json_of(r[13], f"{what}: energy_json", dict, nullable=True)),
                gpu=(gpu := _json_of(r[14], f"{what}: gpu_json", dict, nullable=True)),
                codepaths={cp: per_window.get(r[0], {}).get(cp, {}) for cp in CODEPATHS},
                load_1min=_number(r[15], f"{what}: load_1min", nullable=True),
                energy_record=_typed(EnergyRecord.from_json, energy, f"{what}: energy_json"),
                gpu_record=_typed(GpuRecord.from_json, gpu, f"{what}: gpu_json"),
                cpu_source=_cpu_source(r[16], what),
            )
        )
    return tuple(out)


_R = TypeVar("_R")


def _typed(decode: Callable[[Mapping[str, Any]], _R], doc: Any, what: str) -> _R | None:
    """A stored record's typed value; a shape its writer could not have given is one
    ValueError naming the column."""
    if doc is None:
        return None
    try:
        return decode(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not a record serwatt wrote ({exc!r})") from None


def _cpu_source(value: object, what: str) -> str | None:
    source = _text(value, f"{what}: cpu_source", nullable=True)
    if source is not None and source not in CPU_SOURCES:
        raise ValueError(f"{what}: cpu_source is {_shown(source)}, not one of {CPU_SOURCES}")
    return source


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
