"""Ranks of one job share a run (docs/daemon.md, "Discovery").

"Processes that render the same run id (ranks of one job with a `run` template without
`{pid}`) share a run, closed when the last one leaves." A real daemon over two real
ranks of one job: both ranks' windows go into one run, the run stays open while one rank
is left, and is closed once the last one exits. A second target with the default template
(`{pid}` in it) is the control: its two processes get a run each.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from serwatt.profiler.records.store import Recorder
from tests.daemon_support import (
    PYTHON,
    DaemonProc,
    daemon_config,
    stop_process,
    wait_for,
)

# A light rank (a few ms of pickling, then asleep): four of them fit on a loaded 2-core box.
LIGHT = (
    "import pickle, time\nd = list(range(20000))\n"
    "while True:\n    pickle.dumps(d)\n    time.sleep(0.02)\n"
)


def start_light(tmp_path: Path, marker: str) -> subprocess.Popen:
    script = tmp_path / f"{marker}.py"
    script.write_text(LIGHT)
    return subprocess.Popen([PYTHON, str(script)], stdout=subprocess.DEVNULL)


def _runs(record_dir: Path) -> dict[str, list]:
    """target -> [(run summary, pids of its windows)], from the live record."""
    out: dict[str, list] = {}
    with Recorder.for_dir(record_dir, readonly=True) as rec:
        for s in rec.runs():
            pids = {w.pid for w in rec.run(s.run_id).windows}
            out.setdefault(s.target, []).append((s, pids))
    return out


def test_ranks_of_one_job_share_a_run_closed_when_the_last_leaves(tmp_path: Path) -> None:
    ranks = [start_light(tmp_path, f"jobx_rank{i}") for i in range(2)]
    solos = [start_light(tmp_path, f"soloy_proc{i}") for i in range(2)]
    procs: list[subprocess.Popen] = [*ranks, *solos]
    record_dir = tmp_path / "runs"
    text = daemon_config(
        record_dir,
        # the job's run id has no {pid}: every rank renders the same one
        {"job": {"cmdline": "jobx_rank", "run": "{target}-{host}"}, "solo": "soloy_proc"},
        window_s=1,
        sample_rate_hz=20,
    )
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(text)
    d = DaemonProc(cfg, None, tmp_path / "daemon.log")  # port 0: read from its landing line
    ranks_pids = {p.pid for p in ranks}
    try:

        def both_ranks_recorded():
            runs = _runs(record_dir)
            job, solo = runs.get("job", []), runs.get("solo", [])
            if len(job) == 1 and job[0][1] == ranks_pids and sum(len(p) for _, p in solo) == 2:
                return runs
            return None

        runs = wait_for(both_ranks_recorded, 60, "windows of both ranks in one run")
        ((summary, _),) = runs["job"]
        assert summary.ended_at is None
        assert set(summary.pids) == ranks_pids
        # Control: the default template names each process's own run.
        assert sorted(len(p) for _, p in runs["solo"]) == [1, 1]
        assert {pid for _, p in runs["solo"] for pid in p} == {p.pid for p in solos}

        # Rank 0 leaves: the run stays open and rank 1's windows keep coming into it.
        stop_process(ranks[0])
        left_at = time.time()

        def rank1_sampled_after_rank0_left():
            ((s, _),) = _runs(record_dir)["job"]
            with Recorder.for_dir(record_dir, readonly=True) as rec:
                later = [w for w in rec.run(s.run_id).windows if w.started_at > left_at + 1]
            return (s, later) if later else None

        summary, later = wait_for(rank1_sampled_after_rank0_left, 30, "rank 1 sampled alone")
        assert summary.ended_at is None, summary
        assert {w.pid for w in later} == {ranks[1].pid}

        # The last rank leaves: the run is closed.
        stop_process(ranks[1])
        gone_at = time.time()
        closed = wait_for(
            lambda: (r := _runs(record_dir)["job"][0][0]).ended_at is not None and r,
            30,
            "the job's run closed",
        )
        assert len(_runs(record_dir)["job"]) == 1
        assert gone_at - 1 <= closed.ended_at <= time.time()
        # The solo processes' runs are still open.
        assert all(s.ended_at is None for s, _ in _runs(record_dir)["solo"])
        assert d.stop()[0] == 0
    finally:
        d.kill()
        for p in procs:
            stop_process(p)
