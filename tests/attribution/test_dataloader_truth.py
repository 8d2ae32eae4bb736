"""Issue 22 item 2, the truth test: a DataLoader job's pickle CPU against its own timing.

tests/workloads/dataloader_job.py runs 2 forked workers feeding a small MLP under a real
`serwatt profile -- python dataloader_job.py` (which follows the workers), and times
every outermost ForkingPickler.dumps / .loads call with time.thread_time in every
process. serwatt's `pickle` CPU must be within 15% of the sum over all processes on a
quiet node (the test measures whether it was: other processes' CPU over the run), with
the batches' tensors crossing by file descriptor (unpickling runs Python frames under
`_ForkingPickler.loads(res)`: rebuild_storage_fd, resource_sharer, connection) and
without tensors (plain pickling, the control)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.node_load import OthersCpu

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "tests" / "workloads" / "dataloader_job.py"
# Issue 22's goal. It holds on a node where nothing but the job and serwatt runs; beside
# other busy processes serwatt reads low (docs/benchmarks.md "DataLoader pickle CPU against
# in-job ForkingPickler truth": a job's processes wait for a CPU least while they unpickle,
# in phases too short for the 0.1 s schedstat polls to tell apart), by 17-34% beside one or
# two busy loops, so there the test holds the bound every loaded run met.
GOAL = 0.15
LOADED_TOLERANCE = 0.55
# Other processes' CPU, in cores, over the run, above which the node counts as loaded: the
# job and serwatt alone left 0.000 cores to everything else on this VM in 10 runs (the
# difference clamps at 0); one busy loop beside them took 0.80-0.84
QUIET_CORES = 0.15
# 20 s, not 8: each run's estimate stands on its pickle samples (~340 at 8 s, noise 5-6%);
# 14 quiet 20 s runs read -10.1% to +4.4% (mean -3.3%, sd 3.8%: 15% is 3 sd away)
SECONDS = "20"


@dataclass(frozen=True)
class Run:
    seen: float  # serwatt's pickle cpu_s
    truth: float  # ForkingPickler dumps + loads, every process
    by_role: dict[str, float]
    wait: float  # the job's main threads' run-queue wait per CPU second (schedstat)
    others_cores: float  # CPU the rest of the node used over the run, in cores


def _profile(tmp_path: Path, mode: str) -> Run:
    out = tmp_path / "profile.json"
    # the load: serwatt, py-spy, the job and its workers are reaped descendants (each waits
    # for its children), so what is left is the node's other processes
    with OthersCpu() as load:
        # One window over the whole run (--window 60): py-spy's restart between windows
        # would miss part of what the truth counts.
        proc = subprocess.run(
            [sys.executable, "-m", "serwatt", "profile", "--rate", "100", "--window", "60",
             "--json", str(out), "--", sys.executable, str(WORKLOAD), str(tmp_path), mode,
             SECONDS],
            cwd=REPO, capture_output=True, text=True, timeout=150,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    others = load.cores
    assert proc.returncode == 0, proc.stderr[-2000:]
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["sampler"], "the job started before py-spy was attached"
    truths = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("truth-*.json"))]
    roles = sorted(t["role"] for t in truths)
    assert roles == ["main", "worker0", "worker1"], roles
    by_role = {t["role"]: t["dumps_cpu_s"] + t["loads_cpu_s"] for t in truths}
    wait = sum(t["run_delay_s"] for t in truths) / max(1e-9, sum(t["cpu_s"] for t in truths))
    doc = json.loads(out.read_text())
    run = Run(doc["codepaths"]["pickle"]["cpu_s"], sum(by_role.values()), by_role, wait, others)
    (tmp_path / "run.json").write_text(json.dumps(dataclasses.asdict(run)))  # for the record
    return run


@pytest.mark.serial
@pytest.mark.parametrize("mode", ["tensors", "plain"])
def test_dataloader_pickle_cpu_against_forkingpickler_truth(tmp_path: Path, mode: str) -> None:
    run = _profile(tmp_path, mode)
    error = run.seen / run.truth - 1
    quiet = run.others_cores <= QUIET_CORES
    bound = GOAL if quiet else LOADED_TOLERANCE
    assert abs(error) <= bound, (
        f"{mode}: serwatt pickle {run.seen:.3f} CPU-s against ForkingPickler dumps + loads "
        f"{run.truth:.3f} CPU-s ({error:+.1%}, held to {bound:.0%}: other processes used "
        f"{run.others_cores:.2f} cores, {'at most' if quiet else 'over'} the {QUIET_CORES} of "
        f"a quiet node; by process {run.by_role}; the job waited {run.wait:.2f} s in the run "
        "queue per CPU s)"
    )
