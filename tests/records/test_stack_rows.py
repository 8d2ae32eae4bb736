"""Schema 8: each run keeps its classified stacks, folded (profiler/records/stack_rows.py):
summed over windows, bounded in distinct stacks and frame-string length, stored as the
target's text (escaped for nothing), and a run an older writer began reads as "recorded
without stacks"."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.records import stack_rows
from serwatt.profiler.records.run_sink import RunSink
from serwatt.profiler.records.store import SCHEMA_VERSION, Recorder, RecordError
from serwatt.profiler.sampling.stacks import OVERFLOW_FRAME, StackTally
from tests.records.test_recorder import window

SITE = (("save_state", "/job/train.py", 5), ("main", "/job/train.py", 20))
HOSTILE = (("</script><img src=x onerror=alert(1)>", "/x.py", 1),)


def _stacks(**extra: StackTally) -> dict:
    out = {
        (SITE, "json", "encode"): StackTally(samples=3, cpu_s=0.25),
        (HOSTILE, "other", "unknown"): StackTally(samples=1, cpu_s=0.5),
    }
    out.update({(((name, "/f.py", 1),), "pickle", "encode"): t for name, t in extra.items()})
    return out


def test_stacks_sum_over_windows_and_an_older_run_has_none(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    with Recorder(path) as rec:
        rec.start_run("old", "t", host={}, config={}, sources={})
    db = sqlite3.connect(path)  # the file a version 7 writer left
    db.executescript(
        "DROP TABLE run_stacks; DROP TABLE stack_runs;"
        " UPDATE meta SET value = '7' WHERE key = 'schema_version';"
    )
    db.close()
    with Recorder(path, readonly=True) as rec:
        assert rec.run("old").stacks is None
    with Recorder(path) as rec:  # upgraded in place
        rec.append_window("old", replace(window(), stacks=_stacks()))  # began before 8
        rec.start_run("new", "t", host={}, config={}, sources={}, stacks=True)
        rec.start_run("daemon", "t", host={}, config={}, sources={})  # started without stacks
        for run_id in ("new", "daemon"):
            sink = RunSink(rec, run_id)  # the drivers' way: daemon and profile
            for i in range(2):
                sink.on_window(
                    AttributedWindow(report=replace(window(t0=1.8e9 + 10 * i), stacks=_stacks()))
                )
    with Recorder(path, readonly=True) as rec:
        assert rec.run("old").stacks is None  # its stacks would be only the later part
        assert rec.run("daemon").stacks is None  # not started with stacks: not "empty"
        got = rec.run("new").stacks
    assert got is not None and got.merged == 0
    rows = {(frames, cp, d): (n, cpu) for frames, cp, d, n, cpu in got.stacks}
    assert rows[SITE, "json", "encode"] == (6, 0.5)
    assert rows[HOSTILE, "other", "unknown"] == (2, 1.0)  # as the target wrote it
    meta = dict(sqlite3.connect(path).execute("SELECT key, value FROM meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION) == "8"


def test_distinct_stacks_and_frame_strings_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_rows, "MAX_RUN_STACKS", 4)
    long = ("f" * 1000, "/very" + "/deep" * 200 + "/mod.py", 7)
    path = tmp_path / "r.sqlite"
    with Recorder(path) as rec:
        rec.start_run("r", "t", host={}, config={}, sources={}, stacks=True)
        first = {((long,), "json", "decode"): StackTally(samples=1, cpu_s=0.1)}
        rec.append_window("r", replace(window(), stacks=first))
        many = {f"s{i}": StackTally(samples=1, cpu_s=0.01) for i in range(10)}
        rec.append_window("r", replace(window(t0=1.8e9 + 10), stacks=_stacks(**many)))
        got = rec.run("r").stacks
    assert got is not None
    # 4 distinct stacks, then one overflow row for (pickle, encode) holding the rest
    assert len(got.stacks) == 5, [s[0] for s in got.stacks]
    over = [s for s in got.stacks if s[0] == (OVERFLOW_FRAME,)]
    assert len(over) == 1 and over[0][1:3] == ("pickle", "encode"), over
    assert got.merged == over[0][3] == 9  # 12 new in the second window: 3 kept, 9 merged
    assert sum(s[3] for s in got.stacks) == 1 + 3 + 1 + 10
    name, filename, line = next(s[0][0] for s in got.stacks if s[1] == "json" and s[2] == "decode")
    assert len(name) == stack_rows.MAX_NAME_CHARS and name.endswith("…")
    assert len(filename) == stack_rows.MAX_FILE_CHARS and filename.endswith("/deep/mod.py")
    assert line == 7


@pytest.mark.parametrize(
    "frames",
    [
        "not json",
        '{"a": 1}',
        '[["f", "x.py", "1"]]',
        "[" + '["f", "", 1],' * 200 + '["f", "", 1]]',
        '[["' + "f" * 5000 + '", "", 1]]',
    ],
)
def test_a_stored_stack_serwatt_never_writes_is_damage(tmp_path: Path, frames: str) -> None:
    path = tmp_path / "r.sqlite"
    with Recorder(path) as rec:
        rec.start_run("r", "t", host={}, config={}, sources={}, stacks=True)
        rec.append_window("r", replace(window(), stacks=_stacks()))
    db = sqlite3.connect(path)
    db.execute("UPDATE run_stacks SET frames = ? WHERE codepath = 'json'", (frames,))
    db.commit()
    db.close()
    with Recorder(path, readonly=True) as rec, pytest.raises(RecordError, match="damaged"):
        rec.run("r")
