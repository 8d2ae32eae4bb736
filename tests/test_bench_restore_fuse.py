"""bench/restore_fuse.py at smoke size: it mounts its FUSE passthroughs, times every arm
each repeat, says how each arm read the file, and prints a ratio and verdict per claim."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.benches import BENCH_DIR
from tests.fuse_stall import fuse_available


@pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))
def test_restore_fuse_smoke() -> None:
    r = subprocess.run(
        [
            sys.executable,
            str(BENCH_DIR / "restore_fuse.py"),
            "--size-mib",
            "8",
            "--slots",
            "4",
            "--repeats",
            "2",
            "--latency-ms",
            "1",
        ],  # fmt: skip
        cwd=BENCH_DIR.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["slots"], out["repeats"]) == (4, 2)
    assert set(out["times_s"]) == {
        "local mmap", "local auto", "local copy", "fuse+lat mmap", "fuse+lat copy",
        "fuse+0 mmap", "fuse+0 copy",
    }  # fmt: skip
    assert all(len(xs) == 2 and all(x > 0 for x in xs) for xs in out["times_s"].values())
    modes = out["read_mode"]
    assert modes["local auto"].startswith("mapped: ") and "fuse" not in modes["local auto"]
    assert modes["local mmap"] == modes["local auto"] + "; read='mmap'"
    assert modes["local copy"].startswith("copied: ")
    assert modes["fuse+lat copy"] == "copied: fuse (0x65735546): mapping faults are round trips"
    assert modes["fuse+lat mmap"] == "mapped: fuse (0x65735546); read='mmap'"
    for claim in ("fuse+lat copy / fuse+lat mmap", "local auto / local mmap"):
        assert out[claim]["ratio"] > 0
        assert out[claim]["verdict"] in ("confirmed", "not met", "undecided")
