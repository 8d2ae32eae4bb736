"""Schema 7: every window row says what weighed its CPU (`cpu_source`: kernel, the
scheduler timeline, or estimate, the fallback; issue 44), read back as written; a
version 6 file reads NULL for its old windows, read-only and after the upgrade."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.records.run_sink import RunSink
from serwatt.profiler.records.store import SCHEMA_VERSION, Recorder, RecordError
from tests.records.test_recorder import window


def test_each_window_says_its_cpu_source_and_a_version_6_file_is_upgraded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.sqlite"
    with Recorder(path) as rec:
        rec.start_run("old", "t", host={}, config={}, sources={})
        rec.append_window("old", window())
    db = sqlite3.connect(path)  # the file a version 6 writer left
    db.executescript(
        "ALTER TABLE windows DROP COLUMN cpu_source;"
        " UPDATE meta SET value = '6' WHERE key = 'schema_version';"
    )
    db.close()
    with Recorder(path, readonly=True) as rec:
        assert [w.cpu_source for w in rec.run("old").windows] == [None]
    with Recorder(path) as rec:
        rec.start_run("new", "t", host={}, config={}, sources={})
        rec.append_window("new", replace(window(), cpu_source="kernel"))
        # the fallback, through the run sink the drivers use
        sink = RunSink(rec, "new")
        sink.on_window(AttributedWindow(report=window(t0=1_800_000_010.0)))
    with Recorder(path, readonly=True) as rec:
        assert [w.cpu_source for w in rec.run("old").windows] == [None]
        assert [w.cpu_source for w in rec.run("new").windows] == ["kernel", "estimate"]
        listed = rec.run("new").to_json()["window_list"]
        assert [w["cpu_source"] for w in listed] == ["kernel", "estimate"]
    meta = dict(sqlite3.connect(path).execute("SELECT key, value FROM meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION) == "8"


def test_a_cpu_source_no_serwatt_writes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    with Recorder(path) as rec:
        rec.start_run("r", "t", host={}, config={}, sources={})
        rec.append_window("r", window())
    db = sqlite3.connect(path)
    db.execute("UPDATE windows SET cpu_source = 'guess\x1b[2J'")
    db.commit()
    db.close()
    with Recorder(path, readonly=True) as rec, pytest.raises(RecordError) as err:
        rec.run("r")
    assert "cpu_source" in str(err.value) and "\x1b" not in str(err.value)
