"""Node-wide busy CPU from /proc/stat: tmp procfs files and the real /proc."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from serwatt.collectors.cpustat import CpuStat, CpuStatError, cpu_delta, parse_proc_stat

STAT_A = """cpu  1000 50 400 8000 200 10 40 30 0 0
cpu0 500 25 200 4000 100 5 20 15 0 0
cpu1 500 25 200 4000 100 5 20 15 0 0
intr 12345 0 0
ctxt 999
btime 1764400000
"""
STAT_B = """cpu  1300 50 500 8300 220 10 50 30 120 0
cpu0 650 25 250 4150 110 5 25 15 60 0
cpu1 650 25 250 4150 110 5 25 15 60 0
"""


def test_parse_counts_iowait_as_idle_and_guest_once() -> None:
    busy, total, ncpu = parse_proc_stat(STAT_A, 100)
    assert busy == pytest.approx((1000 + 50 + 400 + 10 + 40 + 30) / 100)
    assert total == pytest.approx(busy + (8000 + 200) / 100)
    assert ncpu == 2


def test_delta_from_injected_procfs_root(tmp_path: Path) -> None:
    clock = iter([100.0, 104.0])
    (tmp_path / "stat").write_text(STAT_A)
    cs = CpuStat(tmp_path, clock=lambda: next(clock), user_hz=100)
    a = cs.read()
    (tmp_path / "stat").write_text(STAT_B)
    b = cs.read()
    d = cpu_delta(a, b)
    assert d.wall_s == 4.0
    assert d.busy_s == pytest.approx((300 + 100 + 10) / 100)  # guest (120) not added
    assert d.total_s == pytest.approx(d.busy_s + (300 + 20) / 100)
    assert 0 < d.utilisation < 1


def test_bad_proc_stat_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("intr 1 2 3\n")
    with pytest.raises(CpuStatError, match="no aggregate 'cpu ' line"):
        CpuStat(tmp_path).read()
    status = CpuStat(tmp_path / "missing").probe()
    ok, reason = status.up, status.detail
    assert not ok and "missing/stat" in (reason or "")


def test_real_proc_stat_sees_a_busy_process() -> None:
    cs = CpuStat()
    a = cs.read()
    spin = "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"
    p = subprocess.Popen([sys.executable, "-c", spin])
    p.wait(timeout=60)
    time.sleep(0.05)
    b = cs.read()
    d = cpu_delta(a, b)
    # the spinning child alone used about 1 CPU-second; allow for a loaded machine
    assert d.busy_s >= 0.5
    assert d.total_s >= d.busy_s
    assert b.ncpu >= 1
