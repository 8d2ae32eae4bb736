"""The replay harness's world: the recorded raw windows (tests/replay/raw.py) played
through BOTH drivers, `serwatt daemon` and `serwatt profile`, over the same node: a
powercap tree at 60 W, a /proc/stat at half busy, the H200 timeline replayed as NVML
(tests/nvml_replay.py, its idle stretch under the windows), all read by a real
EnergyTracker in fake time. Only time, py-spy's process runs and the hardware are
replayed; everything from py-spy's output on is serwatt's own code.

Each driver gets its own tracker over the same readings (`tracker`), polled ahead over
the whole span, so every reading either driver asks for is answered from history."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serwatt.collectors.pyspy import TargetGone
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.pipeline import Delivery, WindowPipeline
from serwatt.profiler.attribution.tracker import EnergyTracker
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.classify import target_files
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.profile.document import build_document
from serwatt.profiler.profile.energy_sink import EnergySink
from serwatt.profiler.profile.record_sink import RecordSink
from serwatt.profiler.profile.session import ProfileSession, SessionResult
from serwatt.profiler.sampling.collect import RawWindow, finish_window
from serwatt.profiler.service.config import load_config
from serwatt.profiler.service.daemon import Daemon
from serwatt.profiler.service.pools import SamplingJob
from serwatt.profiler.service.sdnotify import SdNotifier
from tests.daemon_fakes import (
    FAKE_EPOCH_OFFSET,
    FAKE_START_MONO,
    FakeClock,
    give_root_creds,
    make_proc,
)
from tests.daemon_support import daemon_config
from tests.nvml_replay import FakeClock as HostClock
from tests.nvml_replay import ReplayNvmlBackend, load_timeline
from tests.powercap import build_powercap
from tests.replay import raw

T0 = FAKE_START_MONO + FAKE_EPOCH_OFFSET  # the daemon's fake epoch when it starts
PACKAGE_W = 60.0
POLL_S = 0.25
READINGS_S = 30.0  # readings polled ahead, from T0 - 2 s
NVML_START = T0 - 8.0  # the replayed timeline's 0 s: its 11-13 s idle stretch at T0 + 3..5
STOP_AT_S = 20.0  # the daemon's SIGTERM, fake seconds after it starts
TARGET = "trainer"
PROFILE_RUN = "profile-replay"


def _stat(busy: int, idle: int) -> str:
    return (
        f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n"
    )


def tracker(root: Path, pid: int) -> EnergyTracker:
    """A node tracker over the replayed readings, polled every POLL_S from T0 - 2 s."""
    root.mkdir(parents=True)
    clock = HostClock(T0 - 2.0)
    tree = build_powercap(root / "sys", package_ids=(0,), dram=False, psys=False, mmio=False)
    procfs = root / "proc"
    procfs.mkdir()
    (procfs / "stat").write_text(_stat(0, 0))
    nvml = ReplayNvmlBackend(
        load_timeline("h200_checkpoint_stall"),
        target_pids=[pid],
        clock=clock,
        start=NVML_START,
        boot_epoch=T0 - 1000.0,
    )
    tr = EnergyTracker(
        root / "sys",
        procfs,
        nvml_backend=nvml,
        clock=clock,
        nvml_boottime=nvml.boottime,
    )
    tr.poll_once()
    ticks = 0
    while clock() < T0 + READINGS_S:
        clock.advance(POLL_S)
        tree.advance("intel-rapl:0", PACKAGE_W * POLL_S)
        ticks += round(2 * 100 * POLL_S)  # two CPUs at USER_HZ 100, half busy
        (procfs / "stat").write_text(_stat(ticks // 2, ticks // 2))
        tr.poll_once()
    return tr


def _procfs(tmp: Path, pid: int) -> Path:
    """The target as a fake Python process `python3 workload.py` (what the drivers'
    discovery and checks read)."""
    procfs = tmp / "proc"
    procfs.mkdir(parents=True)
    (procfs / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
    make_proc(procfs, pid, "workload")
    return procfs


def _exited_procfs(tmp: Path, pid: int) -> Path:
    """A procfs in which the target has exited (no stat), whose credentials the collector
    remembered while it lived (target_files.remember_creds, as collect_window does at
    each window's start): its sources are read from host paths as it could have."""
    procfs = tmp / "no-proc"
    (procfs / str(pid)).mkdir(parents=True)
    give_root_creds(procfs / str(pid))
    target_files.remember_creds(str(procfs / str(pid) / "root"))
    return procfs


def _spy(pipeline: WindowPipeline, seen: list[AttributedWindow], episodes: list[Episode]) -> None:
    """Keep every window (and closed episode) as the driver's pipeline delivers it."""
    deliver, finish = pipeline.deliver, pipeline.finish

    def delivering(window: AttributedWindow, sinks: Any) -> Delivery:
        seen.append(window)
        got = deliver(window, sinks)
        episodes.extend(got.episodes)
        return got

    def finishing(sinks: Any, pid: int | None = None) -> Delivery:
        got = finish(sinks, pid)
        episodes.extend(got.episodes)
        return got

    pipeline.deliver = delivering  # type: ignore[method-assign]
    pipeline.finish = finishing  # type: ignore[method-assign]


@dataclass
class DriverRun:
    windows: list[AttributedWindow] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)  # each window's t0 (host epoch)


class _ReplaySampler:
    """The daemon's sampler: the n-th window of the target is the n-th recorded one, at
    the job's start on the daemon's clock, over as long as it was recorded; the last says
    the target exited. It folds each window's stacks, as the daemon's own sampler does."""

    keep_stacks = True

    def __init__(self, clock: FakeClock, recs: list[dict[str, Any]], pid: int, procfs: Path):
        self.clock, self.recs, self.pid, self.procfs = clock, recs, pid, procfs
        self.run = DriverRun()

    def __call__(self, job: SamplingJob, classifier: Classifier) -> Any:
        k = len(self.run.starts)
        if k >= len(self.recs):
            raise TargetGone(f"no such process: {job.pid} (replay over)")
        rec = self.recs[k]
        t0 = job.started_mono + FAKE_EPOCH_OFFSET
        self.run.starts.append(t0)
        end = job.started_mono + raw.duration_s(rec)
        self.clock.park(lambda: self.clock.now >= end, end)
        last = k == len(self.recs) - 1
        got = raw.raw_window(rec, pid=self.pid, t0=t0, procfs=self.procfs, exited=last)
        return finish_window(got, classifier, keep_stacks=self.keep_stacks)


def run_daemon(tmp: Path, recs: list[dict[str, Any]], pid: int) -> tuple[Daemon, DriverRun]:
    procfs = _procfs(tmp, pid)
    cfg = tmp / "serwatt.yaml"
    cfg.write_text(
        daemon_config(tmp / "runs", {TARGET: "workload"}, tdp_w=None, procfs=procfs, window_s=2)
    )
    clock = FakeClock(lambda: {f"serwatt-sample-{pid}"})
    sampler = _ReplaySampler(clock, recs, pid, _exited_procfs(tmp, pid))
    daemon = Daemon(
        load_config(cfg),
        notifier=SdNotifier(env={}),
        clock=clock,
        sampler=sampler,
        energy_tracker=tracker(tmp / "node", pid),
    )
    _spy(daemon._pipeline, sampler.run.windows, sampler.run.episodes)
    clock.call_at(FAKE_START_MONO + STOP_AT_S, lambda: os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = daemon.run()
    finally:
        clock.close()
    assert code == 0, code
    assert signal.getsignal(signal.SIGTERM) is previous
    return daemon, sampler.run


@dataclass
class ProfileRun:
    run: DriverRun
    result: SessionResult
    document: dict[str, Any]
    record: Path


def run_profile(
    tmp: Path,
    recs: list[dict[str, Any]],
    pid: int,
    starts: list[float],
    db: Path,
    host: dict[str, Any],
) -> ProfileRun:
    """`serwatt profile` of the same target: the recorded windows at the same host times
    the daemon's ran at (`starts`), its record written beside the daemon's (`db`) with
    the daemon's `host` (the same machine: the report compares like with like)."""
    procfs = _procfs(tmp, pid)
    no_proc = _exited_procfs(tmp, pid)
    queue = list(zip(starts, recs, strict=True))
    lock = threading.Lock()
    now = [starts[0]]  # the session's host clock: each window's end once collected

    def collect(wpid: int, **_: Any) -> RawWindow:
        with lock:
            if not queue:
                raise TargetGone(f"no such process: {wpid} (replay over)")
            t0, rec = queue.pop(0)
            last = not queue
            now[0] = t0 + raw.duration_s(rec)
        return raw.raw_window(rec, pid=wpid, t0=t0, procfs=no_proc, exited=last)

    def clock() -> float:
        with lock:
            return now[0]

    tr = tracker(tmp / "node", pid)
    energy = EnergySink()
    record = RecordSink(db, tracker=tr, host=host, run_id=PROFILE_RUN, target=TARGET, clock=clock)
    session = ProfileSession(
        pid,
        classifier=Classifier.default(),
        plan=raw.PLAN,
        window_s=2.0,
        procfs=procfs,
        tracker=tr,
        sinks=[energy, record],
        follow_children=False,
        progress=None,
        strict_root=False,
        collect=collect,
        clock=clock,
    )
    run = DriverRun(starts=list(starts))
    _spy(session._pipeline, run.windows, run.episodes)
    result = session.run()
    return ProfileRun(run, result, build_document(result, energy=energy.summary), db)


Normalize = Callable[[Any], Any]
