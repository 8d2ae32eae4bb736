"""`serwatt runs list|show` on real record files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.profiler.attribution.window_records import EnergyRecord
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records.host import fingerprint
from serwatt.profiler.records.store import RECORD_FILENAME, Recorder
from tests.records.test_recorder import window
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[2]


def serwatt_subprocess(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "serwatt", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


@pytest.fixture
def record_dir(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    rec = Recorder.for_dir(d)
    host = fingerprint()
    t0 = 1_800_000_000.0
    rec.start_run(
        "trainer-a",
        "trainer",
        host=host,
        config={"window_s": 10},
        sources={"energy": "rapl"},
        started_at=t0,
    )
    rec.append_window(
        "trainer-a",
        window(pid=11, t0=t0, seed=1),
        energy=EnergyRecord(source="rapl", codepaths_j={cp: 1.0 for cp in CODEPATHS}),
    )
    rec.append_window(
        "trainer-a",
        window(pid=12, t0=t0 + 10, seed=2),
        energy=EnergyRecord(source="rapl", codepaths_j={"pickle": 5.0}),
    )
    rec.finish_run("trainer-a", t0 + 20)
    rec.start_run(
        "eval-b",
        "eval",
        host=host,
        config={},
        sources={"energy": "unavailable"},
        started_at=t0 + 30,
    )
    rec.append_window("eval-b", window(pid=13, t0=t0 + 30, seed=3))
    rec.close()
    return d


def test_list_table_and_json(record_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = serwatt(capsys, "runs", "list", "--dir", str(record_dir))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["RUN", "TARGET"]
    assert lines[1].split()[:2] == ["trainer-a", "trainer"]
    assert "15.0 (rapl)" in lines[1]  # 10 codepaths x 1 J + 5 J
    assert lines[2].split()[:2] == ["eval-b", "eval"] and "running" in lines[2]
    assert "unavailable" in lines[2]  # no energy: said, not printed as 0

    js = serwatt(capsys, "runs", "list", "--db", str(record_dir / RECORD_FILENAME), "--json")
    doc = json.loads(js.stdout)
    assert [r["run_id"] for r in doc["runs"]] == ["trainer-a", "eval-b"]
    assert doc["runs"][0]["pids"] == [11, 12] and doc["runs"][0]["energy_j"] == 15.0
    assert doc["runs"][1]["energy_j"] is None and doc["runs"][1]["ended_at"] is None


def test_show_table_and_json_agree_with_the_record(
    record_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = serwatt(capsys, "runs", "show", "trainer-a", "--dir", str(record_dir), "--windows")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "run trainer-a  target trainer" in text and "2 window(s), pids 11, 12" in text
    assert "host: " in text and "sources: energy=rapl" in text and "target Python: 3.11.7" in text
    w1, w2 = window(pid=11, seed=1), window(pid=12, seed=2)
    pickle_row = next(line for line in text.splitlines() if line.startswith("pickle "))
    cells = pickle_row.split()
    assert int(cells[1]) == w1.codepaths["pickle"].samples + w2.codepaths["pickle"].samples
    assert float(cells[6]) == 6.0  # energy_j: 1 J + 5 J
    assert cells[7] == "-"  # no GPU data was recorded
    assert sum(1 for line in text.splitlines() if line.split()[:1] in (["1"], ["2"])) == 2

    doc = json.loads(
        serwatt(
            capsys, "runs", "show", "trainer-a", "--dir", str(record_dir), "--json", "--windows"
        ).stdout
    )
    assert doc["schema"] == "serwatt.run/1" and doc["windows"] == 2
    assert doc["codepaths"]["pickle"]["energy_j"] == 6.0
    assert doc["codepaths"]["json"]["energy_j"] == 1.0
    assert doc["host"]["cpu_model"] and doc["config"] == {"window_s": 10}
    assert [w["pid"] for w in doc["window_list"]] == [11, 12]
    brief = serwatt(capsys, "runs", "show", "trainer-a", "--dir", str(record_dir), "--json").stdout
    assert "window_list" not in json.loads(brief)  # windows only when asked for
    assert json.loads(brief)["codepaths"] == doc["codepaths"]


def test_config_points_at_the_record_dir(
    record_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        f"targets: [{{name: t, match: {{cmdline: x}}}}]\nrecord: {{dir: {record_dir}}}\n"
    )
    out = serwatt(capsys, "runs", "list", "--config", str(cfg))
    assert out.returncode == 0 and "trainer-a" in out.stdout
    cfg.write_text("targets: 3\n")
    bad = serwatt(capsys, "runs", "list", "--config", str(cfg))
    assert bad.returncode == 2 and "targets: must be a list" in bad.stderr


def test_errors_name_the_problem(
    record_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = serwatt(capsys, "runs", "list", "--dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 1
    assert "no such record file" in missing.stderr and "--db FILE" in missing.stderr
    assert not (tmp_path / "nowhere").exists()  # reading never creates
    unknown = serwatt(capsys, "runs", "show", "nope", "--dir", str(record_dir))
    assert unknown.returncode == 2
    assert "no run 'nope'" in unknown.stderr and "trainer-a" in unknown.stderr
    bare = serwatt(capsys, "runs")
    assert bare.returncode == 2 and "serwatt runs list" in bare.stderr
    both = serwatt(capsys, "runs", "list", "--db", "a", "--dir", "b")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_empty_record(tmp_path: Path) -> None:
    """`python -m serwatt runs` as a user runs it (the tests above call main() in process)."""
    Recorder.for_dir(tmp_path).close()
    out = serwatt_subprocess("runs", "list", "--dir", str(tmp_path))
    assert out.returncode == 0 and "no runs recorded" in out.stdout


def test_sources_text_reads_the_one_shape_and_the_older_flat_one() -> None:
    from serwatt.collectors.status import CollectorStatus
    from serwatt.profiler.records.sources import run_sources, sources_text

    status = {
        "rapl": CollectorStatus(False, "no_powercap", "no /sys/class/powercap"),
        "cpustat": CollectorStatus(True),
    }
    shaped = run_sources("model", status)
    assert shaped == {
        "energy": "model",
        "collectors": {
            "cpustat": {"up": True, "reason": None, "detail": None},
            "rapl": {"up": False, "reason": "no_powercap", "detail": "no /sys/class/powercap"},
        },
    }
    assert sources_text(shaped) == "energy=model; cpustat up, rapl down (no_powercap)"
    older = {"energy": "model", "rapl_up": False, "rapl_reason": "no_powercap"}
    assert sources_text(older) == "energy=model, rapl_reason=no_powercap, rapl_up=False"
    assert sources_text({}) == "none recorded"
    assert sources_text(run_sources("unavailable: off", {})) == "energy=unavailable: off"
