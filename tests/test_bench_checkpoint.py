"""bench/checkpoint.py refuses a wrong load: it names it, leaves it out of every table and
exits 1, while the other methods are still measured (a real run on a 2 MiB state). Cold
restores are what mincore says they are, a filesystem that cannot be made cold (tmpfs)
is said so and its cold samples refused, and intervals and verdicts are Student t."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.benches import load_bench

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("scipy")

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "checkpoint.py"


def _bench():
    return load_bench("checkpoint")


SHM = Path("/dev/shm")


def _fs_type(path: Path) -> str:
    best, fstype = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mnt, kind = line.split()[:3]
        if str(path.resolve()).startswith(mnt) and len(mnt) >= len(best):
            best, fstype = mnt, kind
    return fstype


@pytest.mark.long  # the checkpoint bench over every method
def test_a_damaged_checkpoint_fails_the_bench_and_is_never_ranked(tmp_path: Path) -> None:
    # On tmpfs (where the machine has one) the same run also shows that a directory that
    # cannot be made cold is said so, loudly, and no cold figure or goal comes from it.
    on_tmpfs = SHM.is_dir() and _fs_type(SHM) == "tmpfs"
    work = Path(tempfile.mkdtemp(dir=SHM, prefix="serwatt-bench-")) if on_tmpfs else tmp_path
    try:
        proc = subprocess.run(
            [
                sys.executable,
                str(BENCH),
                "--size-mb",
                "2",
                "--repeat",
                "6",
                "--methods",
                "many.save_state,many.Checkpointer,dcp.save",
                "--inject-wrong-load",
                "many.save_state",
                "--dir",
                str(work),
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert not list(work.iterdir())  # the bench removes what it wrote
    finally:
        if on_tmpfs:
            shutil.rmtree(work, ignore_errors=True)
    out = proc.stdout
    assert proc.returncode == 1, (out[-3000:], proc.stderr[-3000:])
    # Every round's many.save_state load was wrong (the flipped byte is inside a tensor).
    wrong = [ln for ln in out.splitlines() if "many.save_state" in ln and "WRONG" in ln]
    assert len(wrong) == 7, (out[-3000:], proc.stderr[-3000:])
    assert "differs from the state saved" in proc.stderr
    table = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert any(ln.startswith("| many.Checkpointer |") for ln in table), table
    assert any(ln.startswith("| dcp.save |") for ln in table), table
    assert not any(ln.startswith("| many.save_state |") for ln in table), table
    # The goals that need it are not measured, never decided from the wrong samples; the
    # same goal for the sound Checkpointer files is decided (the cold one only where the
    # files can be made cold).
    goal = [ln for ln in table if ln.startswith("| many.save_state open + first tensor")]
    assert len(goal) == 2 and all("not measured" in ln for ln in goal), goal
    sound = {
        temp: ln
        for ln in table
        if ln.startswith("| many.Checkpointer open + first tensor")
        for temp in ("cold", "warm")
        if f"({temp})" in ln
    }
    assert set(sound) == {"cold", "warm"} and "not measured" not in sound["warm"], sound
    rounds = [
        ln
        for ln in out.splitlines()
        if ln.lstrip().startswith(("round", "warm-up")) and "WRONG" not in ln
    ]
    assert len(rounds) == 14, rounds  # Checkpointer and dcp.save, 7 rounds each
    if on_tmpfs:
        assert "COLD RESTORES NOT MEASURABLE" in out and "COLD RESTORES NOT MEASURED" in out
        assert all("COLD REFUSED" in ln for ln in rounds), rounds
        row = next(ln for ln in table if ln.startswith("| many.Checkpointer |"))
        assert row.rstrip(" |").endswith("6/0"), row  # refused cold/warm
        assert "not measured" in sound["cold"], sound
    else:
        assert "COLD RESTORES NOT" not in out and "REFUSED" not in out, out[-3000:]
        assert "not measured" not in sound["cold"], sound


def test_cold_and_warm_are_what_mincore_says(tmp_path: Path) -> None:
    bench = _bench()
    f = tmp_path / "state.bin"
    f.write_bytes(b"\x01" * (8 << 20))
    f.read_bytes()
    assert bench.resident_fraction(f) >= bench.WARM_MIN_RESIDENT
    problem = bench.cold_cache_problem(tmp_path)
    cold = bench.drop_cache(f)
    # The probe and a real drop agree: either the pages go, or the bench said they cannot.
    assert (problem is None) == (cold <= bench.COLD_MAX_RESIDENT), (problem, cold)
    if _fs_type(tmp_path) in ("ext4", "xfs", "btrfs"):
        assert problem is None and cold <= bench.COLD_MAX_RESIDENT, (problem, cold)
    f.read_bytes()  # read again: warm, as mincore sees it
    assert bench.resident_fraction(f) >= bench.WARM_MIN_RESIDENT
    assert not (tmp_path / "cold-probe.bin").exists()


@pytest.mark.skipif(not SHM.is_dir() or _fs_type(SHM) != "tmpfs", reason="no tmpfs /dev/shm")
def test_tmpfs_cannot_be_made_cold_and_says_so(tmp_path: Path) -> None:
    bench = _bench()
    work = Path(tempfile.mkdtemp(dir=SHM, prefix="serwatt-cold-"))
    try:
        problem = bench.cold_cache_problem(work)
        assert problem is not None and "tmpfs" in problem and "--dir" in problem, problem
        f = work / "x.bin"
        f.write_bytes(b"\x02" * (1 << 20))
        assert bench.drop_cache(f) > bench.COLD_MAX_RESIDENT  # a cold sample here is refused
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_goal_verdicts_are_read_off_the_whole_interval() -> None:
    # the statistics are profiler/intervals.py's (tests/test_intervals.py); the bench maps
    # its verdicts to the tables' words, with the claim's direction
    bench = _bench()
    iv = bench.Interval

    def text(lo: float, hi: float, goal: float, at_most: bool) -> str:
        return bench.verdict_text(iv((lo + hi) / 2, lo, hi, 6, 5, "t"), goal, at_most)

    assert text(0.30, 0.45, 0.5, True) == "CONFIRMED"
    assert text(0.40, 0.60, 0.5, True) == "undecided"
    assert text(0.55, 0.70, 0.5, True) == "NOT MET"
    assert text(0.85, 0.95, 0.8, False) == "CONFIRMED"
    assert text(0.60, 0.79, 0.8, False) == "NOT MET"
    one = bench.geometric_mean_interval([0.4])
    assert bench.verdict_text(one, 0.5, True) == "undecided (too few rounds)"
