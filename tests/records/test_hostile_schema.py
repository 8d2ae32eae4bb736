"""Crafted run records (issue 45, item 6): SQLite runs whatever a file's schema says, so a
record is checked before it is trusted. `runs`, `report --db` and the recorder the daemon
and `profile --record` open refuse a file whose objects are not exactly the record's
(views, triggers, extra tables or indexes, altered tables), naming the object and the
fix, before any table is read; and every open, read and write is stopped at
QUERY_DEADLINE_S (SQLite's progress handler)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serwatt.profiler.records import store
from serwatt.profiler.records.store import Recorder, RecordError
from tests.records.test_hostile_records import LIST, REPORT, SHOW, _build
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[2]
ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
RUNS_AS_VIEW = (
    "ALTER TABLE runs RENAME TO runs_real;"
    " CREATE VIEW runs AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)"
    " SELECT r.* FROM runs_real r, c;"
)

CRAFTED = {
    "runs a view over an endless query": (RUNS_AS_VIEW, "view 'runs'"),
    "meta a view": (
        "ALTER TABLE meta RENAME TO m2; CREATE VIEW meta AS SELECT * FROM m2;",
        "view 'meta'",
    ),
    "a trigger": (
        "CREATE TRIGGER t AFTER INSERT ON windows BEGIN SELECT 1; END;",
        "trigger 't'",
    ),
    "an extra table": ("CREATE TABLE notes (x);", "table 'notes'"),
    "an extra index on an expression": (
        "CREATE INDEX slow ON windows(abs(cpu_s));",
        "index 'slow'",
    ),
    "a column the record has not": (
        "ALTER TABLE runs ADD COLUMN extra TEXT DEFAULT 'x';",
        "columns of its table 'runs'",
    ),
    "a table without rowid": (
        "DROP TABLE run_facets; CREATE TABLE run_facets (run_id TEXT NOT NULL REFERENCES"
        " runs(run_id) ON DELETE CASCADE, kind TEXT NOT NULL, value TEXT NOT NULL,"
        " PRIMARY KEY (run_id, kind, value)) WITHOUT ROWID;",
        "table options",
    ),
    "a generated column": (
        "ALTER TABLE windows ADD COLUMN g REAL AS (cpu_s * 2);",
        "columns of its table 'windows'",
    ),
}


def _craft(tmp_path: Path, sql: str) -> Path:
    db_path = _build(tmp_path / "runs.sqlite")
    db = sqlite3.connect(db_path)
    db.executescript(sql)
    db.close()
    return db_path


@pytest.mark.parametrize("name", list(CRAFTED))
def test_a_crafted_record_is_refused_before_it_is_read(tmp_path: Path, name: str) -> None:
    sql, named = CRAFTED[name]
    db = _craft(tmp_path, sql)
    for cmd in (LIST, SHOW, REPORT):
        # a subprocess: on the old code the view's query never ends
        started = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "serwatt", *cmd, "--db", str(db)],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert time.monotonic() - started < 30
        lines = r.stderr.splitlines()
        assert r.returncode == 1 and len(lines) == 1, (cmd, r.returncode, r.stderr[-2000:])
        assert str(db) in lines[0] and named in lines[0], lines[0]
        assert "serwatt never makes it" in lines[0] and "new file" in lines[0], lines[0]
    # the writer (the daemon's, profile --record's) refuses it too, and leaves it as it was
    with pytest.raises(RecordError, match="serwatt never makes it"):
        Recorder(db)


def test_the_intact_record_and_an_older_one_are_still_read(tmp_path: Path, capsys) -> None:
    db = _build(tmp_path / "runs.sqlite")
    for cmd in (LIST, SHOW, REPORT):
        assert serwatt(capsys, *cmd, "--db", str(db)).returncode == 0
    # the file a version 5 writer left (no load_1min) is read, then upgraded
    conn = sqlite3.connect(db)
    conn.executescript(
        "ALTER TABLE windows DROP COLUMN load_1min;"
        " UPDATE meta SET value = '5' WHERE key = 'schema_version';"
    )
    conn.close()
    with Recorder(db, readonly=True) as rec:
        assert len(rec.runs()) == 2
    Recorder(db).close()


def test_every_read_and_write_is_stopped_at_the_deadline(tmp_path: Path, monkeypatch) -> None:
    """The bound behind the schema check: a query that would never end is stopped, as one
    RecordError naming the file and the fix."""
    monkeypatch.setattr(store, "QUERY_DEADLINE_S", 1.0)
    db = _build(tmp_path / "runs.sqlite")
    with Recorder(db) as rec:
        for block in (rec._reading, rec._tx):
            started = time.monotonic()
            with pytest.raises(RecordError, match=r"ran past 1 s.*\.schema") as info:
                with block() as conn:
                    conn.execute(ENDLESS).fetchone()
            took = time.monotonic() - started
            assert 1.0 <= took < 1.0 + 2.0, f"stopped after {took:.1f} s"
            assert str(db) in str(info.value)
        assert len(rec.runs()) == 2  # the connection still works after a stop


def test_the_daemon_refuses_a_crafted_record_at_start(tmp_path: Path) -> None:
    from tests.daemon_support import daemon_config

    record_dir = tmp_path / "runs"
    record_dir.mkdir()
    _craft(record_dir, RUNS_AS_VIEW)
    config = tmp_path / "serwatt.yaml"
    config.write_text(daemon_config(record_dir, {"t": "no-such-process-h45b"}, rapl=False,
                                    nvml=False))  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "daemon", "--config", str(config)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "view 'runs'" in out and "serwatt never makes it" in out, out[-3000:]
