"""Run records: round trip, schema versioning, retention, and survival of SIGKILL mid-write."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from serwatt.collectors.samples import SamplerErrors
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.attribution.window_records import EnergyRecord, GpuRecord
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records.run_sink import RunSink
from serwatt.profiler.records.store import RECORD_FILENAME, SCHEMA_VERSION, Recorder, RecordError
from serwatt.profiler.sampling.window import CodepathWindow, WindowReport

REPO = Path(__file__).resolve().parents[2]
HOST = {"hostname": "node-1", "cpu_model": "Test CPU", "sockets": 2, "gpus": []}
CONFIG = {"sample_rate_hz": 50, "targets": [{"name": "trainer"}]}
SOURCES = {"energy": "rapl", "gpu": "unavailable: no NVML"}


def window(
    pid: int = 100, t0: float = 1_800_000_000.0, seed: int = 1, exited: bool = False
) -> WindowReport:
    rng = random.Random(seed)
    cps = {
        cp: CodepathWindow(
            samples=rng.randint(0, 500),
            cpu_s=rng.random() * 3,
            wall_s=rng.random() * 10,
            low_confidence_samples=rng.randint(0, 5),
        )
        for cp in CODEPATHS
    }
    return WindowReport(
        pid=pid,
        started_at=t0,
        ended_at=t0 + 10.0,
        rate_hz=50.0,
        cpu_s=sum(c.cpu_s for c in cps.values()),
        codepaths=cps,
        errors=SamplerErrors(
            pyspy_samples=500, pyspy_errors=2, partial_stacks=1, behind_s=0.25, notes=("late",)
        ),
        python="3.11.7",
        exited=exited,
    )


def assert_totals_match_windows(rec: Recorder, run_id: str) -> None:
    """The per-run totals kept at append time equal the sums over the stored windows."""
    detail = rec.run(run_id)
    s = detail.summary
    assert s.windows == len(detail.windows)
    assert s.cpu_s == pytest.approx(sum(w.cpu_s for w in detail.windows))
    assert s.pids == tuple(sorted({w.pid for w in detail.windows}))
    assert s.pyspy_samples == sum(w.errors["pyspy_samples"] for w in detail.windows)
    for cp in CODEPATHS:
        rows = [w.codepaths[cp] for w in detail.windows]
        total = detail.codepaths[cp]
        assert total.samples == sum(r["samples"] for r in rows)
        assert total.cpu_s == pytest.approx(sum(r["cpu_s"] for r in rows))
        assert total.wall_s == pytest.approx(sum(r["wall_s"] for r in rows))
        energies = [r["energy_j"] for r in rows if r["energy_j"] is not None]
        assert total.energy_j == (pytest.approx(sum(energies)) if energies else None)
        waits = [r["gpu_wait_s"] for r in rows if r["gpu_wait_s"] is not None]
        assert total.gpu_wait_s == (pytest.approx(sum(waits)) if waits else None)


def test_round_trip_counters_sources_and_totals(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "r.sqlite")
    rec.start_run("trainer-1", "trainer", host=HOST, config=CONFIG, sources=SOURCES)
    w1, w2 = window(seed=1), window(pid=101, t0=1_800_000_010.0, seed=2, exited=True)
    energy = EnergyRecord(
        source="rapl", reason=None, package_j=950.0, codepaths_j={"pickle": 12.5, "other": 30.0}
    )
    gpu = GpuRecord(codepaths_wait_s={"pickle": 1.5}, codepaths_wait_j={"pickle": 300.0})
    id1 = rec.append_window("trainer-1", w1, energy=energy, gpu=gpu)
    id2 = rec.append_window("trainer-1", w2)
    rec.finish_run("trainer-1", 1_800_000_020.0)
    rec.close()

    rec = Recorder(tmp_path / "r.sqlite", readonly=True)
    (summary,) = rec.runs()
    assert summary.run_id == "trainer-1" and summary.target == "trainer"
    assert summary.windows == 2 and summary.pids == (100, 101)
    assert summary.ended_at == 1_800_000_020.0
    assert summary.samples == sum(w.codepaths[cp].samples for w in (w1, w2) for cp in CODEPATHS)
    assert summary.cpu_s == pytest.approx(w1.cpu_s + w2.cpu_s)
    assert summary.energy_j == pytest.approx(42.5)
    assert summary.energy_sources == ("rapl",)

    detail = rec.run("trainer-1")
    assert detail.host == HOST and detail.config == CONFIG and detail.sources == SOURCES
    assert [w.window_id for w in detail.windows] == [id1, id2]
    first, second = detail.windows
    assert first.energy == energy.to_json() and first.gpu == gpu.to_json()
    assert second.energy is None
    assert first.errors == {
        "pyspy_samples": 500,
        "pyspy_errors": 2,
        "partial_stacks": 1,
        "behind_s": 0.25,
        "notes": ["late"],
    }
    assert second.exited and second.python == "3.11.7"
    for cp in CODEPATHS:
        got = first.codepaths[cp]
        assert got["samples"] == w1.codepaths[cp].samples
        assert got["cpu_s"] == w1.codepaths[cp].cpu_s
        assert got["wall_s"] == w1.codepaths[cp].wall_s
        assert got["low_confidence_samples"] == w1.codepaths[cp].low_confidence_samples
        # Energy given for some codepaths means 0 J for the others, labelled with the source.
        assert got["energy_j"] == {"pickle": 12.5, "other": 30.0}.get(cp, 0.0)
        assert got["energy_source"] == "rapl"
        assert got["gpu_wait_s"] == {"pickle": 1.5}.get(cp, 0.0)
        # A window without energy says so (None), never 0 J.
        assert second.codepaths[cp]["energy_j"] is None
        assert second.codepaths[cp]["gpu_wait_s"] is None
        total = detail.codepaths[cp]
        assert total.samples == w1.codepaths[cp].samples + w2.codepaths[cp].samples
        assert total.cpu_s == pytest.approx(w1.codepaths[cp].cpu_s + w2.codepaths[cp].cpu_s)
    assert detail.codepaths["pickle"].energy_j == 12.5
    assert detail.codepaths["pickle"].gpu_wait_s == 1.5
    doc = detail.to_json()
    assert json.loads(json.dumps(doc)) == doc and doc["windows"] == 2
    assert_totals_match_windows(rec, "trainer-1")
    brief = rec.run("trainer-1", windows=False)
    assert brief.windows == () and brief.codepaths == detail.codepaths


def test_start_run_resumes_same_target_and_refuses_another(tmp_path: Path) -> None:
    rec = Recorder.for_dir(tmp_path / "runs")
    assert rec.path == tmp_path / "runs" / RECORD_FILENAME
    rec.start_run("r", "trainer", host=HOST, config=CONFIG, sources=SOURCES, started_at=10.0)
    rec.append_window("r", window())
    rec.finish_run("r", 20.0)
    # The daemon restarted and found the same process again: the run reopens.
    rec.start_run("r", "trainer", host={}, config={}, sources={"energy": "model"})
    (summary,) = rec.runs()
    assert summary.ended_at is None and summary.started_at == 10.0 and summary.windows == 1
    detail = rec.run("r")
    assert detail.host == HOST and detail.sources == {"energy": "model"}
    with pytest.raises(ValueError, match="already recorded for target 'trainer'"):
        rec.start_run("r", "other", host=HOST, config=CONFIG, sources=SOURCES)


def test_bad_appends_are_refused_and_leave_nothing(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "r.sqlite")
    with pytest.raises(KeyError, match="start_run first"):
        rec.append_window("nope", window())
    rec.start_run("r", "t", host=HOST, config=CONFIG, sources=SOURCES)
    w = window()
    partial = WindowReport(**{**w.__dict__, "codepaths": {"pickle": CodepathWindow()}})
    with pytest.raises(ValueError, match="missing"):
        rec.append_window("r", partial)
    # A record that could not be stored as it says is refused when it is built.
    with pytest.raises(ValueError, match="unknown codepath"):
        EnergyRecord(source="rapl", codepaths_j={"xml": 1.0})
    with pytest.raises(ValueError, match="needs codepaths_j"):
        EnergyRecord(source="rapl", package_j=10.0)
    with pytest.raises(ValueError, match="finite"):
        rec.append_window("r", w, energy=EnergyRecord("rapl", codepaths_j={"json": math.nan}))
    rec.append_window("r", w, energy=EnergyRecord.unavailable("no powercap"))
    nan = WindowReport(**{**w.__dict__, "cpu_s": float("nan")})
    with pytest.raises(ValueError, match="finite"):
        rec.append_window("r", nan)
    (summary,) = rec.runs()
    assert summary.windows == 1 and summary.energy_j is None  # only the unavailable one
    assert summary.energy_sources == ("unavailable",)
    with pytest.raises(KeyError, match="no run 'x'"):
        rec.run("x")
    with pytest.raises(KeyError):
        rec.finish_run("x", 1.0)


def test_wal_mode_and_schema_version_recorded(tmp_path: Path) -> None:
    Recorder(tmp_path / "r.sqlite").close()
    db = sqlite3.connect(tmp_path / "r.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    meta = dict(db.execute("SELECT key, value FROM meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION) and meta["application"] == "serwatt.runs"


def test_newer_schema_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    Recorder(tmp_path / "r.sqlite").close()
    db = sqlite3.connect(tmp_path / "r.sqlite")
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,))
    db.commit()
    db.close()
    with pytest.raises(
        RecordError, match=rf"schema version {SCHEMA_VERSION + 1} is newer .* upgrade serwatt"
    ):
        Recorder(tmp_path / "r.sqlite")


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(RecordError, match="not a readable serwatt run record"):
        Recorder(junk)
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(RecordError, match="not a serwatt run record"):
        Recorder(other)
    with pytest.raises(RecordError, match="no such record file"):
        Recorder(tmp_path / "missing.sqlite", readonly=True)
    assert junk.read_bytes() == b"this is not sqlite at all" * 100  # nothing overwritten


def test_retention_deletes_old_runs_with_their_windows(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "r.sqlite")
    day = 86400.0
    now = 1_800_000_000.0
    rec.start_run("old", "t", host=HOST, config=CONFIG, sources=SOURCES, started_at=now - 40 * day)
    rec.append_window("old", window(t0=now - 40 * day))
    rec.start_run("new", "t", host=HOST, config=CONFIG, sources=SOURCES, started_at=now - 40 * day)
    rec.append_window("new", window(t0=now - 1 * day))  # still active: its last window is fresh
    assert rec.apply_retention(30, now=now) == 1
    assert [r.run_id for r in rec.runs()] == ["new"]
    leftover = rec._db.execute("SELECT count(*) FROM window_codepaths").fetchone()[0]
    assert leftover == len(CODEPATHS)  # the old run's codepath rows went with it
    for table in ("run_codepaths", "run_facets"):
        left = rec._db.execute(f"SELECT count(*) FROM {table} WHERE run_id = 'old'").fetchone()
        assert left == (0,), table
    assert rec.apply_retention(30, now=now) == 0
    with pytest.raises(ValueError):
        rec.apply_retention(0)


def test_concurrent_appends_from_threads(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "r.sqlite")
    for i in range(4):
        rec.start_run(f"r{i}", "t", host=HOST, config=CONFIG, sources=SOURCES)

    def worker(i: int) -> None:
        for k in range(25):
            rec.append_window(f"r{i}", window(pid=i, t0=1e9 + k, seed=k))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.windows for r in rec.runs()] == [25, 25, 25, 25]
    for i in range(4):
        assert_totals_match_windows(rec, f"r{i}")


def test_a_reader_sees_committed_windows_while_the_writer_holds_the_file(tmp_path: Path) -> None:
    writer = Recorder(tmp_path / "r.sqlite")
    writer.start_run("r", "t", host=HOST, config=CONFIG, sources=SOURCES)
    writer.append_window("r", window())
    reader = Recorder(tmp_path / "r.sqlite", readonly=True)
    assert reader.runs()[0].windows == 1
    writer.append_window("r", window(seed=3))
    assert reader.runs()[0].windows == 2


CRASH_CHILD = r"""
import sys, random
sys.path.insert(0, sys.argv[2])
from tests.records.test_recorder import window, HOST, CONFIG, SOURCES
from serwatt.profiler.attribution.window_records import EnergyRecord
from serwatt.profiler.records.store import Recorder
rec = Recorder(sys.argv[1])
run_id = "crash-" + sys.argv[3]
rec.start_run(run_id, "trainer", host=HOST, config=CONFIG, sources=SOURCES)
print("started", flush=True)
k = 0
while True:
    k += 1
    energy = EnergyRecord(source="rapl", codepaths_j={"pickle": float(k)})
    wid = rec.append_window(run_id, window(pid=k, t0=1e9 + k, seed=k), energy=energy)
    # Reported only after append_window returned, i.e. after the commit.
    print(f"{run_id} {k} {wid}", flush=True)
"""


@pytest.mark.long  # a recorder SIGKILLed at many random moments
def test_sigkill_at_random_moments_keeps_every_committed_window(tmp_path: Path) -> None:
    db_path = tmp_path / "crash.sqlite"
    rng = random.Random(int(os.environ.get("SERWATT_CRASH_SEED", "4")))
    committed: dict[str, list[tuple[int, int]]] = {}
    for attempt in range(6):
        child = subprocess.Popen(
            [sys.executable, "-c", CRASH_CHILD, str(db_path), str(REPO), str(attempt)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.05, 0.6))
        child.send_signal(signal.SIGKILL)
        # read() (not communicate()): it also returns lines readline() already buffered.
        out = child.stdout.read()
        child.wait(timeout=60)
        assert child.returncode == -signal.SIGKILL
        for line in out.splitlines():
            if line.count(" ") == 2 and line.startswith("crash-"):
                run_id, k, wid = line.split()
                committed.setdefault(run_id, []).append((int(k), int(wid)))
        # The file opens (as the next daemon would) after every kill.
        Recorder(db_path).close()
    assert sum(len(v) for v in committed.values()) > 0, "the child never committed a window"

    db = sqlite3.connect(db_path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    rec = Recorder(db_path)
    for run_id, entries in committed.items():
        detail = rec.run(run_id)
        stored = {w.window_id: w for w in detail.windows}
        for k, wid in entries:
            assert wid in stored, f"committed window {wid} of {run_id} lost"
            w = stored[wid]
            assert w.pid == k  # the whole window, not a torn row
            assert w.codepaths["pickle"]["energy_j"] == float(k)
            assert all(w.codepaths[cp] for cp in CODEPATHS)
        # At most one window more than reported: committed, killed before the print.
        assert len(stored) - len(entries) in (0, 1)
        # The run totals were committed with each window: never ahead or behind.
        assert_totals_match_windows(rec, run_id)


WRITER_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[2])
from tests.records.test_recorder import window, HOST, CONFIG, SOURCES
from serwatt.profiler.records.store import Recorder
rec = Recorder(sys.argv[1])
run_id = sys.argv[3]
rec.start_run(run_id, "t", host=HOST, config=CONFIG, sources=SOURCES)
for k in range(40):
    rec.append_window(run_id, window(pid=k, t0=1e9 + k, seed=k))
rec.close()
"""


def test_two_processes_append_to_one_file(tmp_path: Path) -> None:
    db_path = tmp_path / "shared.sqlite"
    Recorder(db_path).close()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER_CHILD, str(db_path), str(REPO), f"w{i}"], cwd=REPO
        )
        for i in range(2)
    ]
    assert [c.wait(timeout=120) for c in children] == [0, 0]
    rec = Recorder(db_path)
    assert sorted((r.run_id, r.windows) for r in rec.runs()) == [("w0", 40), ("w1", 40)]
    for run_id in ("w0", "w1"):
        assert_totals_match_windows(rec, run_id)


def test_unusable_paths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="is a directory; give the record file"):
        Recorder(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RecordError, match="cannot create the record directory"):
        Recorder.for_dir(blocker / "runs")
    rec = Recorder(tmp_path / "r.sqlite")
    rec.close()
    with pytest.raises(RecordError, match="recorder is closed"):
        rec.start_run("r", "t", host=HOST, config=CONFIG, sources=SOURCES)


def test_a_full_disk_fails_the_append_cleanly_and_loses_nothing_committed(
    tmp_path: Path,
) -> None:
    rec = Recorder(tmp_path / "r.sqlite")
    rec.start_run("r", "t", host=HOST, config=CONFIG, sources=SOURCES)
    rec.append_window("r", window(seed=0))
    # SQLITE_FULL without filling a real disk: cap the file at its current size.
    pages = rec._db.execute("PRAGMA page_count").fetchone()[0]
    rec._db.execute(f"PRAGMA max_page_count = {pages}")
    committed = 1
    with pytest.raises(RecordError, match=r"r\.sqlite: write failed: database or disk is full"):
        for k in range(1, 10_000):
            rec.append_window("r", window(pid=k, seed=k))
            committed += 1
    assert_totals_match_windows(rec, "r")  # the failed window left no partial rows
    assert rec.runs()[0].windows == committed
    rec._db.execute(f"PRAGMA max_page_count = {pages * 1000}")  # space again
    rec.append_window("r", window(seed=99))
    assert rec.runs()[0].windows == committed + 1
    assert_totals_match_windows(rec, "r")


def _episode(**over: object) -> object:
    fields = dict(
        pid=7, thread=7, codepath="pickle", start=100.0, end=100.8, wall_s=0.8, period_s=0.02,
        resolution_s=0.2, unknown_s=0.0, edge_unknown_s=0.0, truncated=False, samples=40,
        cpu_s=0.75, gpu_wait_s=None, gpu_idle_j=None, main_thread=True, durable=False,
        timed_by="stack changes", timing_period_s=0.005, clock_s=0.001, durability_s=0.1,
        host_lag_s=0.02, direction="encode", prepared_s=0.03,
    )  # fmt: skip
    fields.update(over)
    return type("Episode", (), fields)()


def _older_file(tmp_path: Path, version: int, undo: str) -> Path:
    """A record holding run `old`, made into the file a `version` writer left by `undo`
    (SQL dropping what later versions added)."""
    path = tmp_path / "r.sqlite"
    with Recorder(path) as rec:
        rec.start_run("old", "t", host={}, config={}, sources={})
    db = sqlite3.connect(path)
    db.executescript(f"{undo} UPDATE meta SET value = '{version}' WHERE key = 'schema_version';")
    db.close()
    return path


def test_episodes_round_trip_and_a_version_1_file_says_it_has_none(tmp_path: Path) -> None:
    # the file a version 1 writer left: no episode tables
    path = _older_file(tmp_path, 1, "DROP TABLE episodes; DROP TABLE episode_runs;")
    with Recorder(path, readonly=True) as rec:
        assert rec.run("old").episodes is None  # read, and says it has no episodes
    with Recorder(path) as rec:  # a writer upgrades it in place
        rec.start_run("new", "t", host={}, config={}, sources={})
        assert rec.append_episodes("new", [_episode(), _episode(start=102.0, durable=True)]) == 2
        with pytest.raises(ValueError, match="wall_s must be finite"):
            rec.append_episodes("new", [_episode(wall_s=float("nan"))])
    with Recorder(path, readonly=True) as rec:
        assert rec.run("old").episodes is None
        eps = rec.run("new").episodes
        assert eps is not None and [e["start"] for e in eps] == [100.0, 102.0]
        assert eps[0]["main_thread"] is True and eps[1]["durable"] is True
        assert eps[0]["gpu_wait_s"] is None and eps[0]["wall_s"] == 0.8
        assert (eps[0]["timed_by"], eps[0]["timing_period_s"], eps[0]["durability_s"]) == (
            "stack changes",
            0.005,
            0.1,
        )
    assert eps[0]["direction"] == "encode" and eps[0]["prepared_s"] == 0.03
    meta = dict(sqlite3.connect(path).execute("SELECT key, value FROM meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION) == "8"


def test_a_version_4_files_episodes_read_no_prepared_s_and_new_ones_keep_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.sqlite"
    with Recorder(path) as rec:
        rec.start_run("old", "t", host={}, config={}, sources={})
        rec.append_episodes("old", [_episode()])
    db = sqlite3.connect(path)  # the file a version 4 writer left
    db.executescript(
        "ALTER TABLE episodes DROP COLUMN prepared_s;"
        " UPDATE meta SET value = '4' WHERE key = 'schema_version';"
    )
    db.close()
    with Recorder(path, readonly=True) as rec:  # read as it is
        assert [e["prepared_s"] for e in rec.run("old").episodes or ()] == [None]
    with Recorder(path) as rec:  # upgraded in place
        rec.start_run("new", "t", host={}, config={}, sources={})
        rec.append_episodes("new", [_episode()])
    with Recorder(path, readonly=True) as rec:
        assert [e["prepared_s"] for e in rec.run("old").episodes or ()] == [None]
        assert [e["prepared_s"] for e in rec.run("new").episodes or ()] == [0.03]
    meta = dict(sqlite3.connect(path).execute("SELECT key, value FROM meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION)


def _directed(encode: tuple[int, float], decode: tuple[int, float]) -> WindowReport:
    """A window whose pickle codepath ran both ways (samples, cpu_s per direction), with
    0.1 CPU-s of `other` that no direction claims."""
    from serwatt.profiler.sampling.window import DirectionWindow

    (ne, ce), (nd, cd) = encode, decode
    cps = {cp: CodepathWindow() for cp in CODEPATHS}
    cps["pickle"] = CodepathWindow(
        samples=ne + nd,
        cpu_s=ce + cd,
        wall_s=1.0,
        direction={"encode": DirectionWindow(ne, ce), "decode": DirectionWindow(nd, cd)},
    )
    cps["other"] = CodepathWindow(
        samples=3, cpu_s=0.1, wall_s=0.1, direction={"unknown": DirectionWindow(3, 0.1)}
    )
    return WindowReport(
        pid=5, started_at=1_800_000_000.0, ended_at=1_800_000_010.0, rate_hz=50.0,
        cpu_s=ce + cd + 0.1, codepaths=cps,
        errors=SamplerErrors(pyspy_samples=10, pyspy_errors=0, partial_stacks=0, behind_s=0.0),
    )  # fmt: skip


def test_directions_are_kept_per_run_and_an_older_run_says_it_has_none(tmp_path: Path) -> None:
    # the file a version 3 writer left: no direction tables or column
    path = _older_file(
        tmp_path,
        3,
        "DROP TABLE direction_runs; DROP TABLE run_codepath_directions;"
        " ALTER TABLE episodes DROP COLUMN direction;",
    )
    with Recorder(path, readonly=True) as rec:
        assert rec.directions("old") is None and rec.run("old").directions is None
    energy = EnergyRecord(source="model", codepaths_j={"pickle": 8.0, "other": 1.0})
    gpu = GpuRecord(
        codepaths_wait_s={"pickle": 0.5},
        codepaths_wait_by_direction_s={"pickle": {"encode": 0.2, "decode": 0.3}},
    )
    with Recorder(path) as rec:  # upgraded in place
        rec.start_run("new", "t", host={}, config={}, sources={})
        rec.append_window("new", _directed((30, 0.6), (10, 0.2)), energy=energy, gpu=gpu)
        rec.append_window("new", _directed((0, 0.0), (20, 0.4)))  # no energy, no GPU
    with Recorder(path, readonly=True) as rec:
        assert rec.run("old").directions is None
        got = rec.run("new").directions
    assert got is not None
    enc, dec, unk = (got["pickle"][d] for d in ("encode", "decode", "unknown"))
    assert (enc.samples, dec.samples, unk.samples) == (30, 30, 0)
    assert (enc.cpu_s, dec.cpu_s) == (pytest.approx(0.6), pytest.approx(0.6))
    # 8 J over 0.8 CPU-s split 3:1; the second window had no energy and adds none
    assert (enc.energy_j, dec.energy_j) == (pytest.approx(6.0), pytest.approx(2.0))
    assert (enc.gpu_wait_s, dec.gpu_wait_s) == (pytest.approx(0.2), pytest.approx(0.3))
    other = got["other"]["unknown"]
    assert (other.samples, other.cpu_s, other.energy_j) == (6, pytest.approx(0.2), 1.0)
    assert got["json"]["encode"].samples == 0 and got["json"]["encode"].energy_j is None


def test_each_window_keeps_the_load_and_a_version_5_file_is_upgraded(tmp_path: Path) -> None:
    """Schema 6: every window row holds the host's 1-minute load at its end (the report
    compares the load over the runs, issue 25 section 3); a version 5 file reads NULL for
    its old windows, read-only as it is and after the upgrade in place."""
    path = tmp_path / "r.sqlite"
    with Recorder(path) as rec:
        rec.start_run("old", "t", host={}, config={}, sources={})
        rec.append_window("old", window())
    db = sqlite3.connect(path)  # the file a version 5 writer left
    db.executescript(
        "ALTER TABLE windows DROP COLUMN load_1min;"
        " UPDATE meta SET value = '5' WHERE key = 'schema_version';"
    )
    db.close()
    with Recorder(path, readonly=True) as rec:
        assert [w.load_1min for w in rec.run("old").windows] == [None]
    with Recorder(path) as rec:
        rec.start_run("new", "t", host={}, config={}, sources={})
        rec.append_window("new", window(), load_1min=2.5)
        RunSink(rec, "new").on_window(AttributedWindow(report=window(t0=1_800_000_010.0)))
        with pytest.raises(ValueError, match="load_1min is inf"):
            rec.append_window("new", window(), load_1min=math.inf)
    with Recorder(path, readonly=True) as rec:
        assert [w.load_1min for w in rec.run("old").windows] == [None]
        loads = [w.load_1min for w in rec.run("new").windows]
        assert loads[0] == 2.5
        # the run sink reads the host's load when it records the window: this machine's
        assert loads[1] is not None and 0 <= loads[1] <= 1000, loads
        assert rec.run("new").to_json()["window_list"][0]["load_1min"] == 2.5
    meta = dict(sqlite3.connect(path).execute("SELECT key, value FROM meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION)
