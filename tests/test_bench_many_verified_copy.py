"""bench/many_verified_copy.py at smoke size: its output has the bench's shape, and the fact
it records for docs/benchmarks.md holds here (a MAP_PRIVATE mapping shows a later write to
the file, which is why load(verify=True) copies instead)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.benches import BENCH_DIR


def test_many_verified_copy_smoke() -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH_DIR / "many_verified_copy.py"), "4", "2"],
        cwd=BENCH_DIR.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["size_mib"], out["repeats"]) == (4, 2)
    assert len(out["in_place_s"]) == len(out["copy_s"]) == 2
    assert all(x > 0 for x in out["in_place_s"] + out["copy_s"])
    assert out["copy_shmem_mib"] == 4.0  # the copy holds the whole file (4 MiB + 8 KiB head)
    assert out["map_private_sees_later_writes"] is True
