"""The replay harness's recorded raw windows (tests/replay/windows.json, written by
tests/replay/capture.py) turned back into RawWindows: py-spy's outputs through serwatt's
own parsers (speedscope, status line, thread mapping, tick times), the CPU snapshots
through procstat's delta, at any start time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serwatt.collectors import procstat
from serwatt.collectors.pyspy import PySpy, SamplingPlan
from serwatt.collectors.pyspy.speedscope import (
    WindowSamples,
    assemble_samples,
    parse_speedscope,
    parse_status,
)
from serwatt.collectors.pyspy.threads import map_threads
from serwatt.profiler.sampling.collect import RawWindow

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).with_name("windows.json")
REPO_MARK = "@REPO@"
WINDOW_S = 1.0
# the daemon's plan (service/pools.py daemon_plan(50, None)): on-CPU run at 50 Hz, --idle at 10
PLAN = SamplingPlan(rate_hz=50.0, on_cpu_run=True, idle_rate_hz=10.0, poll_s=0.5)


def load() -> list[dict[str, Any]]:
    text = OUT.read_text().replace(REPO_MARK, str(REPO))
    windows: list[dict[str, Any]] = json.loads(text)["windows"]
    return windows


class _Rate:
    def __init__(self, rate_hz: float) -> None:
        self.rate_hz = rate_hz


def _samples(pid: int, run: dict[str, Any], t0: float, procfs: Path) -> WindowSamples:
    tracks = parse_speedscope(run["doc"])
    return assemble_samples(
        pid,
        tracks,
        parse_status(run["stdout"]),
        map_threads(pid, tracks, procfs=procfs),
        started_at=t0 + quantized(run["started_at"]),
        ended_at=t0 + quantized(run["ended_at"]),
        rate_hz=run["rate_hz"],
        alive_tids=set(run["alive_tids"]),
    )


def quantized(rel_s: float) -> float:
    """A recorded time (seconds from the window's start) on a 1/64 s grid: every sum of
    such times and the fake clocks' (whole and half seconds from 1.8e9) is exact, so both
    drivers see the same floats whichever way they add them."""
    return round(rel_s * 64) / 64


def duration_s(rec: dict[str, Any]) -> float:
    """The window's span: its --idle run's start to end."""
    return quantized(rec["idle_run"]["ended_at"]) - quantized(rec["idle_run"]["started_at"])


def raw_window(
    rec: dict[str, Any], *, pid: int, t0: float, procfs: Path, exited: bool | None = None
) -> RawWindow:
    """The recorded window as `pid`'s, its --idle run starting at t0 (host epoch); with
    `exited`, the target's exit as given rather than as recorded."""
    idle = _samples(pid, rec["idle_run"], t0, procfs)
    on_cpu = _samples(pid, rec["on_cpu_run"], t0, procfs)
    window = PySpy._with_on_cpu(
        idle,
        on_cpu,
        _Rate(rec["idle_run"]["rate_hz"]),  # type: ignore[arg-type]
        _Rate(rec["on_cpu_run"]["rate_hz"]),  # type: ignore[arg-type]
    )
    snaps = tuple(
        procstat.CpuSnapshot(
            pid=pid,
            t=t0 + quantized(s["t"]),
            threads={
                th["tid"]: procstat.ThreadCpu(
                    **{**th, "switches": tuple(th["switches"]) if th["switches"] else None}
                )
                for th in s["threads"]
            },
        )
        for s in rec["snapshots"]
    )
    return RawWindow(
        pid=pid,
        rate_hz=PLAN.rate_hz,
        poll_s=PLAN.poll_s,
        procfs=procfs,
        window=window,
        snapshots=snaps,
        cpu=procstat.delta(snaps[0], snaps[-1]),
        exited=rec["exited"] if exited is None else exited,
        python=rec["python"],
        process_cpu_s=rec["process_cpu_s"],
    )
