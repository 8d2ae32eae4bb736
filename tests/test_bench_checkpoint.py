"""bench/checkpoint.py refuses a wrong load: it names it, leaves it out of every table and
exits 1, while the other methods are still measured (a real run on a 2 MiB state)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("scipy")

REPO = Path(__file__).resolve().parents[1]


def test_a_damaged_checkpoint_fails_the_bench_and_is_never_ranked(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "checkpoint.py"),
            "--size-mb",
            "2",
            "--repeat",
            "6",
            "--methods",
            "many.save_state,many.Checkpointer,dcp.save",
            "--inject-wrong-load",
            "many.save_state",
            "--dir",
            str(tmp_path),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    # Every round's many.save_state load was wrong (the flipped byte is inside a tensor).
    wrong = [ln for ln in proc.stdout.splitlines() if "many.save_state" in ln and "WRONG" in ln]
    assert len(wrong) == 7, proc.stdout[-3000:]
    assert "differs from the state saved" in proc.stderr
    table = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ")]
    assert any(ln.startswith("| many.Checkpointer |") for ln in table), table
    assert any(ln.startswith("| dcp.save |") for ln in table), table
    assert not any(ln.startswith("| many.save_state |") for ln in table), table
    # The goals that need it are not measured, never decided from the wrong samples; the
    # same goal for the sound Checkpointer files is decided.
    goal = [ln for ln in table if ln.startswith("| many.save_state open + first tensor")]
    assert len(goal) == 2 and all("not measured" in ln for ln in goal), goal
    sound = [ln for ln in table if ln.startswith("| many.Checkpointer open + first tensor")]
    assert len(sound) == 2 and not any("not measured" in ln for ln in sound), sound
    assert not list(tmp_path.iterdir())  # the bench removes what it wrote
