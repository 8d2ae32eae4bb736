"""Damaged run records, as the real CLI reads them: one error line naming the file and the fix.

Each damage is made on a real record file (pages with every bit flipped, a dropped
table, a schema version that is not a number, broken or mistyped JSON, text in a
numeric column); `serwatt runs list`, `runs show` and `report` must then print one
line naming the file and `sqlite3 FILE .recover`, and exit 1: never a traceback.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from serwatt.profiler.attribution.window_records import EnergyRecord
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records.host import fingerprint
from serwatt.profiler.records.store import Recorder
from tests.records.test_recorder import window
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0


def serwatt_subprocess(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "serwatt", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def _build(path: Path) -> Path:
    """Two runs of 8 windows each, with energy: enough for `serwatt report`."""
    rec = Recorder(path)
    host = fingerprint()
    for i, run_id in enumerate(("base-a", "cand-b")):
        t0 = T0 + i * 1000
        rec.start_run(run_id, "trainer", host=host, config={"window_s": 10},
                      sources={"energy": "rapl"}, started_at=t0)  # fmt: skip
        for w in range(8):
            rec.append_window(
                run_id,
                window(pid=100 + i, t0=t0 + 10 * w, seed=10 * i + w),
                energy=EnergyRecord(source="rapl", codepaths_j={cp: 1.0 + w for cp in CODEPATHS}),
            )
        rec.finish_run(run_id, t0 + 80)
    rec.close()  # the last close checkpoints the WAL into the file
    assert not Path(f"{path}-wal").exists()
    return path


def _sql(statement: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        db = sqlite3.connect(path)
        db.execute(statement)
        db.commit()
        db.close()

    return damage


def _flip_page_of(table: str) -> Callable[[Path], None]:
    """Flip every bit of the root page of `table` (a disk or memory fault)."""

    def damage(path: Path) -> None:
        db = sqlite3.connect(path)
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        db.close()
        data = bytearray(path.read_bytes())
        start = (root[0] - 1) * page_size
        data[start : start + page_size] = bytes(b ^ 0xFF for b in data[start : start + page_size])
        path.write_bytes(bytes(data))

    return damage


LIST = ("runs", "list")
SHOW = ("runs", "show", "base-a")
SHOW_WINDOWS = ("runs", "show", "base-a", "--windows")
SHOW_JSON = ("runs", "show", "base-a", "--windows", "--json")
REPORT = ("report", "--baseline", "base-a", "--candidate", "cand-b")

DAMAGES: dict[str, tuple[Callable[[Path], None], tuple[tuple[str, ...], ...]]] = {
    "flipped runs page": (_flip_page_of("runs"), (LIST, SHOW, REPORT)),
    "flipped run_codepaths page": (_flip_page_of("run_codepaths"), (LIST, SHOW, REPORT)),
    "flipped windows page": (_flip_page_of("windows"), (SHOW_WINDOWS, REPORT)),
    "dropped run_facets": (_sql("DROP TABLE run_facets"), (LIST, SHOW, REPORT)),
    "dropped windows": (_sql("DROP TABLE windows"), (SHOW_WINDOWS, REPORT)),
    "dropped episodes": (_sql("DROP TABLE episode_runs"), (SHOW, REPORT)),
    "schema version not a number": (
        _sql("UPDATE meta SET value = 'two' WHERE key = 'schema_version'"),
        (LIST, SHOW, REPORT),
    ),
    "host_json broken": (_sql("UPDATE runs SET host_json = '{\"cpu'"), (SHOW, REPORT)),
    "host_json a list": (_sql("UPDATE runs SET host_json = '[1, 2]'"), (SHOW, REPORT)),
    "host_json nested too deep": (
        _sql("UPDATE runs SET host_json = '" + "[" * 100_000 + "'"),
        (SHOW, REPORT),
    ),
    "config_json broken": (_sql("UPDATE runs SET config_json = 'nan nan'"), (SHOW, REPORT)),
    "notes_json broken": (
        _sql("UPDATE windows SET notes_json = '[\"late'"),
        (SHOW_WINDOWS, SHOW_JSON, REPORT),
    ),
    "energy_json broken": (
        _sql("UPDATE windows SET energy_json = '{' WHERE window_id = 3"),
        (SHOW_WINDOWS, REPORT),
    ),
    "text in runs.cpu_s": (_sql("UPDATE runs SET cpu_s = 'lots'"), (LIST, SHOW, REPORT)),
    "text in run_codepaths.cpu_s": (
        _sql("UPDATE run_codepaths SET cpu_s = 'x' WHERE codepath = 'pickle'"),
        (SHOW, REPORT),
    ),
    "text in windows.started_at": (
        _sql("UPDATE windows SET started_at = 'yesterday' WHERE window_id = 2"),
        (SHOW_WINDOWS, REPORT),
    ),
    "text in window_codepaths.samples": (
        _sql("UPDATE window_codepaths SET samples = 'many' WHERE window_id = 4"),
        (SHOW_WINDOWS, REPORT),
    ),
    "blob as a pid facet": (
        _sql("UPDATE run_facets SET value = x'00ff' WHERE kind = 'pid'"),
        (LIST, SHOW, REPORT),
    ),
    "text as a run's window count": (
        _sql("UPDATE runs SET windows = 'eight'"),
        (LIST, SHOW, REPORT),
    ),
}


def _assert_one_error_line(db: Path, cmd: tuple[str, ...], code: int, stderr: str) -> None:
    lines = stderr.splitlines()
    assert code == 1, (cmd, code, stderr[-2000:])
    assert "Traceback" not in stderr, (cmd, stderr[-2000:])
    assert len(lines) == 1, (cmd, stderr[-2000:])
    assert str(db) in lines[0] and f"sqlite3 {db} .recover" in lines[0], (cmd, lines[0])
    assert len(lines[0]) < 600, lines[0]  # a bounded line, whatever the file holds


def test_the_intact_record_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The control: every command below works on the record before it is damaged."""
    db = _build(tmp_path / "runs.sqlite")
    for cmd in (LIST, SHOW, SHOW_WINDOWS, SHOW_JSON, REPORT):
        ran = serwatt(capsys, *cmd, "--db", str(db))
        assert ran.returncode == 0, (cmd, ran.stderr)


@pytest.mark.parametrize("damage_name", list(DAMAGES))
def test_a_damaged_record_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage_name: str
) -> None:
    damage, commands = DAMAGES[damage_name]
    db = _build(tmp_path / "runs.sqlite")
    damage(db)
    for cmd in commands:
        ran = serwatt(capsys, *cmd, "--db", str(db))
        _assert_one_error_line(db, cmd, ran.returncode, ran.stderr)


@pytest.mark.parametrize(
    "damage_name", ["flipped runs page", "host_json broken", "text in windows.started_at"]
)
def test_python_m_profiler_prints_one_line_too(tmp_path: Path, damage_name: str) -> None:
    """`python -m serwatt` as a user runs it, on one damage of each family."""
    damage, commands = DAMAGES[damage_name]
    db = _build(tmp_path / "runs.sqlite")
    damage(db)
    for cmd in commands:
        out = serwatt_subprocess(*cmd, "--db", str(db))
        _assert_one_error_line(db, cmd, out.returncode, out.stderr)
