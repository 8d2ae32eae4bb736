"""Record the replay harness's raw windows: real py-spy runs of tests/replay/workload.py,
kept as py-spy wrote them (its speedscope output and its stdout), with the target's CPU
snapshots, in tests/replay/windows.json.

    PYTHONPATH=. .venv/bin/python -m tests.replay.capture [--windows 4]

Times are kept relative to each window's --idle run start, and the repository's path in
frames as @REPO@, so the replay is the same on any checkout and at any time."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from serwatt.collectors import procstat
from serwatt.collectors.pyspy import PySpy
from serwatt.collectors.pyspy.speedscope import WindowSamples
from serwatt.profiler.sampling.collect import collect_window
from tests.replay.raw import OUT, PLAN, REPO, REPO_MARK, WINDOW_S


class _RecordingPySpy(PySpy):
    """py-spy as serwatt runs it, keeping each run's output as it came."""

    runs: list[dict[str, Any]]

    def _assemble(  # type: ignore[override]
        self,
        pid: int,
        doc: dict[str, Any],
        text: str,
        *,
        started_at: float,
        ended_at: float,
        rate_hz: float,
        procfs: Path,
    ) -> WindowSamples:
        self.runs.append(
            {
                "doc": doc,
                "stdout": text,
                "started_at": started_at,
                "ended_at": ended_at,
                "rate_hz": rate_hz,
                "alive_tids": sorted(procstat.thread_ids(pid, procfs)),
            }
        )
        return PySpy._assemble(
            pid, doc, text, started_at=started_at, ended_at=ended_at, rate_hz=rate_hz,
            procfs=procfs,
        )  # fmt: skip


def _snapshot(s: procstat.CpuSnapshot, t0: float) -> dict[str, Any]:
    return {
        "t": s.t - t0,
        "threads": [dataclasses.asdict(th) for th in s.threads.values()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.replay.capture")
    parser.add_argument("--windows", type=int, default=4)
    args = parser.parse_args(argv)
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "replay" / "workload.py")])
    windows = []
    try:
        time.sleep(1.0)
        spy = _RecordingPySpy()
        for _ in range(args.windows):
            spy.runs = []
            raw = collect_window(proc.pid, duration_s=WINDOW_S, plan=PLAN, pyspy=spy)
            idle, on_cpu = spy.runs  # the --idle run is assembled first
            t0 = idle["started_at"]
            for run in (idle, on_cpu):
                run["started_at"] -= t0
                run["ended_at"] -= t0
            windows.append(
                {
                    "pid": raw.pid,
                    "python": raw.python,
                    "exited": raw.exited,
                    "process_cpu_s": raw.process_cpu_s,
                    "idle_run": idle,
                    "on_cpu_run": on_cpu,
                    "snapshots": [_snapshot(s, t0) for s in raw.snapshots],
                }
            )
    finally:
        proc.kill()
        proc.wait()
    text = json.dumps({"plan": dataclasses.asdict(PLAN), "windows": windows}, indent=1)
    OUT.write_text(text.replace(str(REPO), REPO_MARK) + "\n")
    print(f"wrote {len(windows)} window(s) to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
