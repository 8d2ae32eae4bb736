"""Schema version 8 of the run record: the run's classified stacks, folded.

Each window's stacks (profiler/sampling/stacks.py: (frames, codepath, direction) with
samples and CPU-seconds) are added to the run's rows, so the A/B page can draw a
differential flame graph of two sets of runs (profiler/report/stack_diff.py).

Bounded, since a job may make endless distinct stacks (generated code, deep recursion):
at most MAX_RUN_STACKS distinct rows a run; a new stack past that is added to the
overflow pseudo-stack of its codepath and direction, and `stack_runs.merged` counts how
many were. A frame keeps at most MAX_NAME_CHARS of its function name and the last
MAX_FILE_CHARS of its file name (the flame graph shows a file's last two parts), and a
stack at most MAX_FRAMES frames (cut by the sampler already).

The frames are the target's own text: stored as JSON, escaped for nothing here; every
page that shows them escapes them there. `stack_runs` names the runs recorded with
stacks, so a run that began under an older writer reads as "not recorded" rather than
as a run with no stacks.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS
from serwatt.profiler.records.validation import _finite, _integer, _number, _shown, _text
from serwatt.profiler.sampling.stacks import (
    MAX_FRAMES,
    OVERFLOW_FRAME,
    FrameKey,
    StackKey,
    StackTally,
)

VERSION = 8  # the schema version that added this
MAX_RUN_STACKS = 5000
MAX_NAME_CHARS = 200
MAX_FILE_CHARS = 300
CUT = "…"
# a stored stack's text is never longer than this (a longer one is damage)
MAX_STACK_TEXT = (MAX_FRAMES + 1) * (MAX_NAME_CHARS + MAX_FILE_CHARS + 40) * 6

SCHEMA_V8 = """
CREATE TABLE IF NOT EXISTS stack_runs (
    run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
    stacks INTEGER NOT NULL DEFAULT 0,  -- rows of the run in run_stacks
    merged INTEGER NOT NULL DEFAULT 0   -- new stacks past MAX_RUN_STACKS, under the overflow one
);
CREATE TABLE IF NOT EXISTS run_stacks (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    frames TEXT NOT NULL,           -- JSON [[function, file, line], ...], leaf first
    codepath TEXT NOT NULL,
    direction TEXT NOT NULL,        -- encode | decode | unknown
    samples INTEGER NOT NULL,
    cpu_s REAL NOT NULL,
    PRIMARY KEY (run_id, frames, codepath, direction)
);
"""


@dataclass(frozen=True)
class RunStacks:
    """A run's folded stacks: (frames leaf first, codepath, direction, samples, cpu_s),
    and how many new stacks past the cap were counted under the overflow stack."""

    stacks: tuple[tuple[tuple[FrameKey, ...], str, str, int, float], ...]
    merged: int = 0


def _cut_frame(frame: FrameKey) -> list:
    name, filename, line = frame
    if len(name) > MAX_NAME_CHARS:
        name = name[: MAX_NAME_CHARS - 1] + CUT
    if len(filename) > MAX_FILE_CHARS:
        filename = CUT + filename[-(MAX_FILE_CHARS - 1) :]
    return [name, filename, int(line)]


def frames_text(frames: tuple[FrameKey, ...]) -> str:
    """A stack's stored form: JSON of its frames, each cut to the caps."""
    return json.dumps([_cut_frame(f) for f in frames[: MAX_FRAMES + 1]], ensure_ascii=False)


OVERFLOW_TEXT = frames_text((OVERFLOW_FRAME,))


def start(db: sqlite3.Connection, run_id: str) -> None:
    """Mark a new run as recorded with stacks."""
    db.execute("INSERT OR IGNORE INTO stack_runs(run_id) VALUES (?)", (run_id,))


_ADD = (
    "UPDATE run_stacks SET samples = samples + ?, cpu_s = cpu_s + ?"
    " WHERE run_id = ? AND frames = ? AND codepath = ? AND direction = ?"
)
_INSERT = (
    "INSERT INTO run_stacks(run_id, frames, codepath, direction, samples, cpu_s)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)


def add_window(db: sqlite3.Connection, run_id: str, stacks: Mapping[StackKey, StackTally]) -> None:
    """Add one window's stacks to the run's rows (in the window's transaction). A run that
    began under an older writer gets none: its stacks would be only the later part."""
    row = db.execute("SELECT stacks FROM stack_runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None or not stacks:
        return
    count, merged = int(row[0]), 0
    for (frames, cp, d), t in stacks.items():
        if not t.samples and not t.cpu_s:
            continue
        cpu_s = _finite(t.cpu_s, f"stack {cp}.{d}.cpu_s")
        text = frames_text(frames)
        if db.execute(_ADD, (t.samples, cpu_s, run_id, text, cp, d)).rowcount:
            continue
        if count >= MAX_RUN_STACKS and text != OVERFLOW_TEXT:
            merged += 1
            text = OVERFLOW_TEXT
            if db.execute(_ADD, (t.samples, cpu_s, run_id, text, cp, d)).rowcount:
                continue
        db.execute(_INSERT, (run_id, text, cp, d, t.samples, cpu_s))
        count += 1
    db.execute(
        "UPDATE stack_runs SET stacks = ?, merged = merged + ? WHERE run_id = ?",
        (count, merged, run_id),
    )


def _frames(value: object, what: str) -> tuple[FrameKey, ...]:
    text = _text(value, what)
    if len(text) > MAX_STACK_TEXT:
        raise ValueError(f"{what} is {len(text)} characters, more than serwatt writes")
    try:
        decoded = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError(f"{what} is {_shown(text)}, not JSON frames") from None
    # no frames: samples py-spy gave no stack for, kept as the sampler folded them
    if not isinstance(decoded, list) or len(decoded) > MAX_FRAMES + 1:
        raise ValueError(f"{what} is {_shown(text)}, not a list of at most {MAX_FRAMES + 1} frames")
    out = []
    for f in decoded:
        if not (
            isinstance(f, list)
            and len(f) == 3
            and isinstance(f[0], str)
            and isinstance(f[1], str)
            and type(f[2]) is int
            and len(f[0]) <= MAX_NAME_CHARS
            and len(f[1]) <= MAX_FILE_CHARS
        ):
            raise ValueError(f"{what}: a frame is {_shown(f)}, not [function, file, line]")
        out.append((f[0], f[1], f[2]))
    return tuple(out)


def read(db: sqlite3.Connection, run_id: str) -> RunStacks | None:
    """The run's stacks; None when it was recorded without them (before schema 8)."""
    has = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='stack_runs'"
    ).fetchone()
    if has is None:
        return None
    mark = db.execute("SELECT merged FROM stack_runs WHERE run_id = ?", (run_id,)).fetchone()
    if mark is None:
        return None
    what = f"run_stacks of run {run_id!r}"
    limit = MAX_RUN_STACKS + len(CODEPATHS) * len(DIRECTIONS)
    rows = db.execute(
        "SELECT frames, codepath, direction, samples, cpu_s FROM run_stacks WHERE run_id = ?"
        " ORDER BY rowid LIMIT ?",
        (run_id, limit + 1),
    ).fetchall()
    if len(rows) > limit:
        raise ValueError(f"{what}: more than the {limit} rows serwatt writes")
    out = []
    for frames, cp, d, samples, cpu_s in rows:
        cp, d = _text(cp, f"{what}: codepath"), _text(d, f"{what}: direction")
        if cp not in CODEPATHS or d not in DIRECTIONS:
            raise ValueError(f"{what}: unknown codepath/direction {_shown(cp)}/{_shown(d)}")
        out.append(
            (
                _frames(frames, f"{what}: frames"),
                cp,
                d,
                _integer(samples, f"{what}: samples"),
                float(_number(cpu_s, f"{what}: cpu_s") or 0.0),
            )
        )
    return RunStacks(tuple(out), merged=_integer(mark[0], f"stack_runs of run {run_id!r}: merged"))
