"""`serwatt profile --cpu-budget` on a real multi-process job: a 2-worker DataLoader
(tests/workloads/dataloader_loop.py), three processes that fill the machine's CPUs.
Unbudgeted, serwatt took 15-17% of a core on it (docs/benchmarks.md); under a budget
of 0.04 cores the rates fall and serwatt's CPU, read from outside through /proc (its
own times and its reaped py-spy runs'), stays under the budget after its start-up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serwatt.collectors import procstat
from serwatt.profiler.records.store import Recorder

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "workloads" / "dataloader_loop.py"
BUDGET = 0.04
# The governor aims at 0.9 x budget; one slot's usage varies by +-10% on this VM, and
# the first slots start from the cost model: over 20 s, 10% over the budget at most.
OVER = 1.10


def _cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid`, in seconds (its reaped children's too)."""
    text = (Path("/proc") / str(pid) / "stat").read_text()
    f = text[text.rindex(")") + 2 :].split()
    return sum(int(x) for x in f[11:15]) / procstat.CLOCK_TICKS_PER_S


@pytest.mark.serial  # it measures CPU use
def test_serwatt_stays_under_its_cpu_budget_on_a_dataloader_job(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests' / 'workloads'}"}
    job = subprocess.Popen(
        [sys.executable, str(JOB), str(tmp_path)], stdout=subprocess.PIPE, text=True,
        env=env, start_new_session=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None
        job.stdout.readline()  # its first counter line: torch imported, workers started
        out, db = tmp_path / "profile.json", tmp_path / "runs.sqlite"
        serwatt = subprocess.Popen(
            [sys.executable, "-m", "serwatt", "profile", "--pid", str(job.pid),
             "--duration", "28", "--cpu-budget", str(BUDGET), "--json", str(out),
             "--record", str(db), "--run-id", "budgeted"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        time.sleep(8)  # its imports and attach are start-up, not sampling
        t0, c0 = time.monotonic(), _cpu_s(serwatt.pid)
        time.sleep(18)
        used = (_cpu_s(serwatt.pid) - c0) / (time.monotonic() - t0)
        stdout, stderr = serwatt.communicate(timeout=60)
        assert serwatt.returncode == 0, stderr[-2000:]
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    doc = json.loads(out.read_text())
    budget = doc["cpu_budget"]
    assert len(doc["targets"]) == 3  # the main process and both workers
    assert budget["budget_cores"] == BUDGET
    assert budget["rates_hz"] and max(budget["rates_hz"]) < doc["rate_hz"] == 50
    assert used <= OVER * BUDGET, (used, budget)
    # serwatt's own reading agrees with the outside one (its whole run against 18 s of
    # it: 0.0303-0.0317 against 0.0311-0.0317 in three runs on the quiet VM)
    assert budget["own_cpu_cores"] == pytest.approx(used, rel=0.15)
    assert budget["own_cpu_source"].startswith("measured")
    assert f"cpu budget: {BUDGET:g} cores" in stdout
    # the record says so, and each window's row has the rate it ran at
    with Recorder(db, readonly=True) as rec:
        run = rec.run("budgeted")
    assert run.config["cpu_budget_cores"] == BUDGET and run.config["rate_hz"] == 50
    assert {w.rate_hz for w in run.windows} <= set(budget["rates_hz"])
