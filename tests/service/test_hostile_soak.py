"""Issue 45's soak: one hostile job beside three honest ones, in one real daemon.

The hostile job runs a script served by a FUSE filesystem it controls, mounted inside its
own checkpoints directory, and a second entry of it names a FIFO as its pid file. Once
the daemon has sampled it, the filesystem stops answering: the source's re-stat, its
reloads and the checkpoint watch would each have stopped every target's windows
(issue 45 items 1-4). The honest targets must go on as before: windows applied, and
their serializer share (which needs their sources: pickle.dumps is C, found by its call
site) where it was before the stall. And SIGTERM stops the daemon within the unit's stop
timeout (configs/systemd/serwatt.service TimeoutStopSec=30).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serwatt.profiler.records.store import Recorder
from tests.daemon_support import WORKLOAD, start_daemon, start_workload, stop_process, total
from tests.fuse_stall import fuse_available, stalling_fuse

HONEST = ("honest_a", "honest_b", "honest_c")
SER = ("pickle", "json")
PHASE_S = 12.0  # each phase: six 2 s windows per target at most
UNIT_STOP_TIMEOUT_S = 30.0
# How far an honest target's serializer share after the stall may sit from its share
# before it, in the same daemon: the sampling error of the difference of two 12 s phases.
# A phase holds ~60 samples of a target at 10 Hz (3-4 windows of 2 s); at a share near
# 0.87, sd sqrt(2 * 0.87 * 0.13 / 60) = 0.061 for the difference, so 0.15 is ~2.5 sd (a
# false failure ~1% per target). Measured: 0.001-0.065 apart. Item 3's starvation put every
# call-site sample in `other` (pickle.dumps is found by its call site): a drift near 0.87.
SHARE_DRIFT = 0.15


def _shares(m: dict) -> dict[str, tuple[float, float]]:
    """target -> (serializer CPU-s, all CPU-s)."""
    out = {}
    for t in HONEST:
        ser = sum(total(m, "serwatt_cpu_seconds_total", target=t, codepath=cp) for cp in SER)
        out[t] = (ser, total(m, "serwatt_cpu_seconds_total", target=t))
    return out


@pytest.mark.serial  # measures the honest targets' shares and the stop time
@pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))
def test_one_hostile_job_beside_three_honest_ones(tmp_path: Path) -> None:
    hostile_ckpt = tmp_path / "hostile-ckpt"
    hostile_ckpt.mkdir()
    fifo = tmp_path / "hostile.pid"
    os.mkfifo(fifo)
    honest = [start_workload(tmp_path, f"{t}_marker") for t in HONEST]
    hostile = None
    with stalling_fuse(hostile_ckpt / "src", {"job.py": WORKLOAD.encode()}) as fs:
        try:
            hostile = subprocess.Popen(
                [sys.executable, str(fs.mountpoint / "job.py"), "hostile_marker"],
                stdout=subprocess.DEVNULL,
            )
            targets: dict = {t: f"{t}_marker" for t in HONEST}
            targets["hostile"] = {"cmdline": "hostile_marker", "checkpoints": hostile_ckpt}
            targets["hostile_pid"] = {"cmdline": "x", "match": {"pid_file": str(fifo)}}
            d = start_daemon(tmp_path, targets, window_s=2)
            try:
                d.wait_metric("serwatt_samples_total", 1, target="hostile", timeout_s=90)
                for t in HONEST:
                    d.wait_metric("serwatt_samples_total", 1, target=t, timeout_s=90)
                m0, t0 = d.metrics(), time.time()
                time.sleep(PHASE_S)
                m1, t1 = d.metrics(), time.time()
                fs.stall()
                time.sleep(PHASE_S)
                m2, t2 = d.metrics(), time.time()
                code, took = d.stop(timeout_s=UNIT_STOP_TIMEOUT_S + 5)
            finally:
                d.kill()
        finally:
            for p in [*honest, *([hostile] if hostile else [])]:
                stop_process(p)
    log = d.log()
    assert code == 0, log[-3000:]
    assert took < UNIT_STOP_TIMEOUT_S, (took, log[-3000:])
    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        starts = {
            r.target: [w.started_at for w in rec.run(r.run_id).windows]
            for r in rec.runs()
            if r.target in HONEST
        }
    s0, s1, s2 = _shares(m0), _shares(m1), _shares(m2)
    figures = {}
    for t in HONEST:
        share_before = (s1[t][0] - s0[t][0]) / max(s1[t][1] - s0[t][1], 1e-9)
        share_after = (s2[t][0] - s1[t][0]) / max(s2[t][1] - s1[t][1], 1e-9)
        before = sum(t0 <= w < t1 for w in starts[t])
        after = sum(t1 <= w < t2 for w in starts[t])
        figures[t] = (before, after, round(share_before, 3), round(share_after, 3))
    print("honest (windows before, after; serializer share before, after):", figures)
    for before, after, share_before, share_after in figures.values():
        # the stall takes none of an honest target's slots: as many windows after as
        # before (3-4 a phase measured), +-1 for where a phase cuts a window
        assert before >= 2 and abs(after - before) <= 1, figures
        assert share_before > 0.3, figures  # the control: the sources were read
        assert abs(share_after - share_before) <= SHARE_DRIFT, figures
    # the hostile job's own figures say what it cost it
    assert total(m2, "serwatt_sampler_errors_total", target="hostile_pid") > 0
