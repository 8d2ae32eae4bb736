"""CPU weighting when the target waits for a CPU: real py-spy, real processes that time
themselves (profiler/sampling/weighting.py, docs/sampling.md "CPU weighting").

A runnable thread is in state R whether it runs or waits in a run queue, so py-spy's
on-CPU samples follow a thread's runnable time, not its CPU. Spread evenly over them,
a thread's CPU goes wherever it waited most. Two real cases:

- tests/workloads/contended.py: compute shares one CPU with three worker threads
  hashing in C (GIL released), the checkpoint (pickle) runs alone: compute waits,
  pickle does not. Even spreading gave pickle about half its share.
- tests/workloads/wakeups.py beside a busy process on the same CPU: serializes 2 ms,
  sleeps 18 ms, and (a SCHED_BATCH thread, whose wakeups preempt nothing) waits after
  every wakeup at the sleep line; the fix that took those waits off blocking lines is
  what the second test guards.

Each test compares serwatt's share with the workload's own thread_time() truth and,
from the same windows, with the even spread over the on-CPU samples (what serwatt did
without the correction), so it fails when the correction is undone whatever the
machine's load, and says by how much it helped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.sampling.collect import default_timing_rate_hz, sample_window
from serwatt.profiler.sampling.window import WindowReport

# measures CPU shares and time: runs alone, after the parallel pass
pytestmark = pytest.mark.serial

WORKLOADS = Path(__file__).parents[1] / "workloads"
WINDOWS = 4  # of 5 s, the `serwatt profile` default window
# contended.py's cycle (0.6 s of CPU at a quarter of the CPU, then 0.6 s alone) is about
# 3 s of wall, and its truth brackets the py-spy gaps between windows as well: one 5 s
# window's share scatters 0.19-0.31 around a truth of 0.27, so the pickle test averages 8
CONTENDED_WINDOWS = 8
RATE_HZ = 100
PIN_LAST_CPU = "import os\nos.sched_setaffinity(0, {max(os.sched_getaffinity(0))})\n"


def run_windows(
    script: Path,
    key: str,
    tmp_path: Path,
    *,
    hogs: int = 0,
    timing: bool = False,
    windows: int = WINDOWS,
) -> tuple[float, list[WindowReport]]:
    """Profile `script` for `windows` windows; (true share of `key`, the reports).
    timing: with the stack-change run, as `serwatt profile` samples by default."""
    truth_file = tmp_path / "truth.jsonl"
    busy = [
        subprocess.Popen([sys.executable, "-c", PIN_LAST_CPU + "while True:\n    pass\n"])
        for _ in range(hogs)
    ]
    p = subprocess.Popen([sys.executable, str(script), str(truth_file)], stdout=subprocess.PIPE)
    classifier = Classifier.default()
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        time.sleep(1.0)
        os.kill(p.pid, signal.SIGUSR1)
        reports = [
            sample_window(
                p.pid,
                duration_s=5,
                classifier=classifier,
                plan=SamplingPlan(
                    rate_hz=RATE_HZ,
                    on_cpu_run=True,
                    poll_s=0.1,
                    timing_rate_hz=default_timing_rate_hz(RATE_HZ) if timing else None,
                ),
            )  # fmt: skip
            for _ in range(windows)
        ]
        os.kill(p.pid, signal.SIGUSR1)
        deadline = time.time() + 5
        while time.time() < deadline and len(truth_file.read_text().splitlines()) < 2:
            time.sleep(0.05)
    finally:
        for q in (p, *busy):
            q.kill()
            q.wait()
    before, after = (json.loads(x) for x in truth_file.read_text().splitlines()[:2])
    return (after[key] - before[key]) / (after["total"] - before["total"]), reports


def shares(reports: Sequence[WindowReport], codepaths: set[str]) -> tuple[float, float]:
    """(serwatt's share of `codepaths`, the share an even spread of each thread's CPU
    over its on-CPU samples gives), over all the windows."""
    total = sum(r.cpu_s for r in reports)
    weighted = sum(r.codepaths[cp].cpu_s for r in reports for cp in codepaths)
    even = 0.0
    for r in reports:
        cpu: dict[int | None, float] = defaultdict(float)
        n: dict[int | None, int] = defaultdict(int)
        hits: dict[int | None, int] = defaultdict(int)
        for lab in r.cpu_timeline:
            cpu[lab.tid] += lab.cpu_s
            n[lab.tid] += 1
            hits[lab.tid] += lab.codepath in codepaths
        even += sum(cpu[t] * hits[t] / n[t] for t in n)
    return weighted / total, even / total


def test_a_checkpoint_alone_on_a_cpu_gets_its_cpu_share_not_its_runnable_share(
    tmp_path: Path,
) -> None:
    """contended.py pins itself and its three hashing threads to one CPU at nice -20, so
    compute's share of that CPU (1/4) is the workload's, whatever else the machine runs;
    sampled as `serwatt profile` samples (with the stack-change run)."""
    truth, reports = run_windows(
        WORKLOADS / "contended.py", "pickle", tmp_path, timing=True, windows=CONTENDED_WINDOWS
    )
    got, even = shares(reports, {"pickle"})
    err, err_even = abs(got - truth) * 100, abs(even - truth) * 100
    print(f"pickle: truth {truth:.4f}, serwatt {got:.4f}, even spread {even:.4f}")
    assert any("run-queue" in n for r in reports for n in r.errors.notes), "nothing waited"
    assert err_even > 5, f"the workload did not make compute wait: {even:.3f} vs {truth:.3f}"
    # README: the CPU-share error when the target waits for a CPU, <= 1.5 pp: the bench's
    # mean over repeats (bench/accuracy.py --contention) guards that figure. One run
    # scatters around it (four windows: 1.8-5.2 pp against an even spread's 11-14 pp, a
    # ratio of 0.21-0.37; eight: 0.07-0.19 on a quiet VM, 0.35 in a fresh-clone run whose
    # serial pass took 1.4x its usual time: 16.5% against 20.2%, even spread 9.9%), so
    # this single run guards the mechanism: under 0.4 of the error the even spread (the
    # runnable share) makes, over 5 pp; undone, the two are equal.
    assert err <= 0.4 * err_even, (got, truth, even)


def test_waits_after_wakeups_are_taken_off_the_sleep_line(tmp_path: Path) -> None:
    truth, reports = run_windows(WORKLOADS / "wakeups.py", "serialization", tmp_path, hogs=1)
    got, even = shares(reports, {"pickle", "json"})
    err, err_even = abs(got - truth) * 100, abs(even - truth) * 100
    print(f"serialization: truth {truth:.4f}, serwatt {got:.4f}, even spread {even:.4f}")
    assert err_even > 5, f"no wait after wakeups: {even:.3f} vs {truth:.3f}"
    # The same windows weighted both ways: undone, serwatt's share is exactly the even
    # spread's. The correction takes most of the wake-up waits off the sleep line: it
    # removed 75-91% of the even spread's error on a quiet VM (e.g. 89.3% against 45.4%,
    # truth 99.1%) and 21-26% beside three more busy processes (65.2% against 53.0%,
    # truth 98.8%); docs/sampling.md "Under CPU contention". A sixth of the error is
    # clear of both float noise and zero, which is what undoing it gives.
    assert even < truth and got - even >= (truth - even) / 6, (got, truth, even)
    assert err < err_even, (got, truth, even)
