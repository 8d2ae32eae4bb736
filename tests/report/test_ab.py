"""`serwatt ab`: the run plan, every error path as one line and an exit code, a failing run,
Ctrl-C, the page-cache eviction, and a whole A/B of the training workload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serwatt.profiler.exitcodes import EXIT_USAGE
from serwatt.profiler.many.format import MAGIC
from serwatt.profiler.profile.ab import run_order
from serwatt.profiler.profile.page_cache import cache_state
from serwatt.profiler.profile.pickle_scan import unsupported_by_swap
from serwatt.profiler.records.store import Recorder
from serwatt.profiler.report.render_text import fmt
from tests.serwatt_cli import serwatt

PY = sys.executable
TRAIN = f"{PY} -m serwatt.profiler.workloads.train"
SLEEPER = f"{PY} -c 'import time; time.sleep(1.5)'"


def _ab(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "serwatt", "ab", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------- the plan


def test_interleaved_order_alternates_sides() -> None:
    assert run_order(3, "interleaved", None) == [
        ("baseline", 1),
        ("candidate", 1),
        ("baseline", 2),
        ("candidate", 2),
        ("baseline", 3),
        ("candidate", 3),
    ]


def test_random_order_is_the_seeds() -> None:
    a = run_order(6, "random", 7)
    assert a == run_order(6, "random", 7)
    assert sorted(a) == sorted(run_order(6, "interleaved", None))
    assert a != run_order(6, "interleaved", None)
    assert a != run_order(6, "random", 8)


# ---------------------------------------------------------------------- bad input


def test_empty_command_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    r = serwatt(
        capsys,
        "ab",
        "--baseline",
        "  ",
        "--candidate",
        SLEEPER,
        "--record",
        str(tmp_path / "r.sqlite"),
    )
    assert r.returncode == EXIT_USAGE
    assert "--baseline: the command is empty" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("n", ["0", "1"])
def test_fewer_than_two_repeats_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, n: str
) -> None:
    r = serwatt(
        capsys,
        "ab",
        "--baseline",
        SLEEPER,
        "--candidate",
        SLEEPER,
        "--repeats",
        n,
        "--record",
        str(tmp_path / "r.sqlite"),
    )
    assert r.returncode == EXIT_USAGE
    assert "no statistics possible" in r.stderr and "--repeats 2" in r.stderr
    assert not (tmp_path / "r.sqlite").exists() or not Recorder(tmp_path / "r.sqlite").runs()


def test_checkpoint_dir_that_is_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "ck"
    f.write_text("not a directory")
    r = serwatt(
        capsys,
        "ab",
        "--swap",
        "torch",
        "--checkpoints",
        str(f),
        "--record",
        str(tmp_path / "r.sqlite"),
        "--",
        *SLEEPER.split(),
    )
    assert r.returncode == EXIT_USAGE
    assert f"--checkpoints {f}: not a directory" in r.stderr


def test_unwritable_checkpoint_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    if os.geteuid() == 0:  # root writes through any mode bits: make the directory immutable
        subprocess.run(["chattr", "+i", str(ck)], check=True)
    else:
        ck.chmod(0o500)
    try:
        r = serwatt(
            capsys,
            "ab",
            "--swap",
            "torch",
            "--checkpoints",
            str(ck),
            "--record",
            str(tmp_path / "r.sqlite"),
            "--",
            *SLEEPER.split(),
        )
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(ck)], check=True)
    assert r.returncode == EXIT_USAGE
    assert f"--checkpoints {ck}: not writable" in r.stderr


def test_damaged_record(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    db.write_bytes(b"this is not SQLite " * 100)
    r = serwatt(capsys, "ab", "--baseline", SLEEPER, "--candidate", SLEEPER, "--record", str(db))
    assert r.returncode == EXIT_USAGE
    assert f"--record {db}" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_swap_wants_one_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    r = serwatt(
        capsys,
        "ab",
        "--swap",
        "torch",
        "--candidate",
        SLEEPER,
        "--checkpoints",
        str(tmp_path),
        "--",
        *SLEEPER.split(),
    )
    assert r.returncode == EXIT_USAGE and "give no --candidate" in r.stderr


# ---------------------------------------------------------------------- runs


def test_a_failing_run_stops_the_ab_and_keeps_what_was_recorded(tmp_path: Path) -> None:
    failing = (
        f"{PY} -c 'import sys, time; time.sleep(1); "
        'print("boom: bad step", file=sys.stderr); sys.exit(3)\''
    )
    r = _ab(
        "--baseline",
        SLEEPER,
        "--candidate",
        failing,
        "--repeats",
        "2",
        "--record",
        "r.sqlite",
        cwd=tmp_path,
    )
    assert r.returncode == 3, r.stderr
    assert "-candidate-1 failed with exit code 3" in r.stderr
    assert "boom: bad step" in r.stderr
    assert "Traceback" not in r.stderr
    with Recorder(tmp_path / "r.sqlite", readonly=True) as rec:
        ids = [s.run_id for s in rec.runs()]
    assert any(i.endswith("-baseline-1") for i in ids), ids  # the run before it is kept
    assert not any("-baseline-2" in i for i in ids)  # and nothing ran after it


def _running(pattern: str) -> bool:
    """Whether a process whose command line holds `pattern` runs (pgrep -f)."""
    return subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True).returncode == 0


def test_ctrl_c_stops_after_the_current_run(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "serwatt",
            "ab",
            "--baseline",
            SLEEPER,
            "--candidate",
            SLEEPER,
            "--repeats",
            "2",
            "--record",
            "r.sqlite",
            "--json",
            "r.json",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "run 1/4" in line:
            # while run 2 runs (its profiler is up: a Ctrl-C before it starts rightly stops
            # after run 1, which a loaded CI pass hit): it finishes, no run 3
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not _running("-candidate-1 "):
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == 130, err
    assert "partial: stopped by Ctrl-C after 2 of 4 runs" in err
    ab = json.loads((tmp_path / "r.json").read_text())["ab"]
    assert [(x["side"], x["k"], x["exit_code"]) for x in ab["runs"]] == [
        ("baseline", 1, 0),
        ("candidate", 1, 0),
    ]
    assert "partial" in ab and out.startswith("stall per checkpoint:")


def test_cold_restore_evicts_and_mincore_confirms(tmp_path: Path) -> None:
    f = tmp_path / "ckpt.bin"
    f.write_bytes(os.urandom(4 << 20))
    f.read_bytes()  # in the page cache now
    assert cache_state(tmp_path, evict=False) == {str(f): 1.0}
    assert cache_state(tmp_path, evict=True) == {str(f): 0.0}
    f.read_bytes()
    assert cache_state(tmp_path, evict=False) == {str(f): 1.0}


def test_swap_refused_for_what_the_drop_in_cannot_write(tmp_path: Path) -> None:
    import argparse

    import torch

    torch.save({"w": torch.ones(3), "args": argparse.Namespace(lr=0.1)}, tmp_path / "a.pt")
    torch.save({"w": torch.ones(3), "step": 5, "names": ["x"]}, tmp_path / "b.pt")
    assert unsupported_by_swap([str(tmp_path / "a.pt")]) == ["a.pt pickles argparse.Namespace"]
    assert unsupported_by_swap([str(tmp_path / "b.pt")]) == []


@pytest.mark.long  # 8 profiled torch jobs, the real-job A/B
def test_swap_ab_of_the_training_job_with_cold_restore(tmp_path: Path) -> None:
    """The whole A/B: torch.save against the same job swapped to .many, each run resumed
    from its own directory after its files were evicted."""
    (tmp_path / "ck").mkdir()
    job = f"{TRAIN} --ckpt torch --steps 6 --every 2 --size 1 --keep 0 --dir {{dir}}"
    r = _ab(
        "--swap",
        "torch",
        "--repeats",
        "2",
        "--checkpoints",
        "ck",
        "--resume-args=--resume",
        "--cold-restore",
        "--record",
        "r.sqlite",
        "--json",
        "r.json",
        "--html",
        "r.html",
        "--",
        *job.split(),
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    ab = report["ab"]
    assert (ab["order"], ab["seed"], ab["repeats"], ab["swap"]) == ("interleaved", None, 2, "torch")
    runs = ab["runs"]
    assert [(x["side"], x["k"], x["resumed"]) for x in runs] == [
        (side, k, resumed)
        for k in (1, 2)
        for side in ("baseline", "candidate")
        for resumed in (False, True)
    ]
    for x in runs:
        assert set(x) >= {
            "run_id",
            "side",
            "k",
            "resumed",
            "exit_code",
            "checkpoint_files",
            "many_files",
        }
        assert x["exit_code"] == 0
        directory = Path(x["directory"])
        if not x["resumed"]:  # steps 2, 4, 6: three files, all .many on the candidate only
            assert x["checkpoint_files"] == 3
            assert x["many_files"] == (3 if x["side"] == "candidate" else 0)
            heads = {p.read_bytes()[:8] == MAGIC for p in directory.glob("ckpt-*.pt")}
            assert heads == {x["side"] == "candidate"}
        else:
            assert x["restores"] >= 1 and x["restore_cache"] == "cold"
    assert report["baseline"]["runs"] == [x["run_id"] for x in runs if x["side"] == "baseline"]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("stall per checkpoint: ")
    assert lines[1].startswith(("restore (cold): ", "restore: not measured"))
    assert lines[2].startswith("compared: ") and "torch_compat" in lines[2]
    k = len(ab["headline"])  # a fourth line when a warm-up is flagged
    assert k == 3 or (k == 4 and lines[3].startswith("warm-up: ")), ab["headline"]
    assert lines[k] == "" and lines[k + 1].startswith("serwatt A/B report")
    assert ab["headline"] == lines[:k]
    # it ends with what the numbers mean: stall, restore with the bytes read, the page
    stall, restore, where = lines[-3:]
    assert lines[-4] == "" and stall == lines[0]
    read = {s: report["restore"][s]["read_bytes"] for s in ("baseline", "candidate")}
    assert all(isinstance(b, int) and b > 0 for b in read.values()), read  # evicted: cold
    mb = {s: fmt(b / 1e6) for s, b in read.items()}
    assert restore == (
        f"{lines[1]}; read from storage: baseline {mb['baseline']} MB, "
        f"candidate {mb['candidate']} MB"
    )
    assert where == "HTML report: r.html"
    page = (tmp_path / "r.html").read_text()
    assert page.index('id="ab-headline"') < page.index("<table")


@pytest.mark.long  # a second profiled A/B end to end
def test_a_resumed_run_that_reads_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    job = f"{TRAIN} --ckpt json --steps 2 --every 1 --size 0.1 --dir {{dir}}"
    # --seed is not --resume: the "resumed" run trains from scratch and reads nothing
    r = _ab(
        "--baseline",
        job,
        "--candidate",
        job,
        "--repeats",
        "2",
        "--checkpoints",
        "ck",
        "--resume-args=--seed=1",
        "--record",
        "r.sqlite",
        cwd=tmp_path,
    )
    assert r.returncode == EXIT_USAGE, r.stderr
    assert "no restore measured: the resumed run opened no file under " in r.stderr
    assert "-baseline-1-resumed" in r.stderr and "Traceback" not in r.stderr


def test_the_headline_says_why_no_restore_was_compared() -> None:
    """Restores seen but none timed on a side (a lazy open shorter than the sampling can
    time) are not "not measured": the line says whose and how many; no restore at all is."""
    from serwatt.profiler.cli.ab import headline
    from serwatt.profiler.profile.ab import AbOptions

    opts = AbOptions(baseline=("python", "t.py"), candidate=("python", "t.py"), repeats=2,
                     record=Path("r.sqlite"))  # fmt: skip
    timed = {"restores": 2, "file_event_only": 0, "wall_s": {"mean": 0.09}}
    untimed = {"restores": 2, "file_event_only": 2, "wall_s": None}
    runs = [
        {"side": "baseline", "resumed": True, "restore_cache": "cold"},
        {"side": "candidate", "resumed": False, "restore_cache": None},
    ]
    report = {
        "checkpoint": {"stall_s": None, "restore_s": None, "note": "no episodes"},
        "restore": {"baseline": timed, "candidate": untimed, "wall_s": None},
        "ab": {"runs": runs},
    }
    assert headline(report, opts)[1] == (
        "restore (cold): not compared, no timed restore "
        "(candidate: 2 of 2 seen only as a file event)"
    )
    # with the bound the sampling puts on them: shorter than two sampling periods
    report["restore"]["candidate"] = untimed | {"file_event_only_below_s": 0.04}
    assert headline(report, opts)[1] == (
        "restore (cold): not compared, no timed restore "
        "(candidate: 2 of 2 seen only as a file event, each under 40 ms: no sample)"
    )
    none = {"restores": 0, "file_event_only": 0, "wall_s": None}
    report["restore"] = {"baseline": none, "candidate": none, "wall_s": None}
    report["ab"] = {"runs": [{"side": "baseline", "resumed": False, "restore_cache": None}]}
    assert headline(report, opts)[1] == "restore: not measured"


def test_the_closing_lines_name_where_the_report_is() -> None:
    """Without --html the last line says where the report went instead; a side whose
    reads were not measured says so rather than 0 MB."""
    from serwatt.profiler.cli.ab import closing

    report = {
        "ab": {"headline": ["stall per checkpoint: x", "restore (cold): y", "compared: z"]},
        "restore": {
            "baseline": {"restores": 2, "read_bytes": 67108864},
            "candidate": {"restores": 2, "read_bytes": None},
        },
    }
    assert closing(report, None, Path("r.json")) == [
        "stall per checkpoint: x",
        "restore (cold): y; read from storage: baseline 67.1 MB, candidate not measured",
        "JSON report: r.json (--html FILE writes the page)",
    ]
    report["restore"] = {"baseline": {"restores": 0}, "candidate": None}
    assert closing(report, None, None) == [
        "stall per checkpoint: x",
        "restore (cold): y",
        "report: the text above (--html FILE writes the page, --json FILE the document)",
    ]
