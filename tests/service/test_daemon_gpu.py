"""The daemon's GPU path, in-process: a real daemon loop sampling a real workload with
py-spy, with NVML replaced by the replayed H200 timeline (tests/nvml_replay.py): a
busy GPU with a 3 s checkpoint stall (empty sample buffer) and a 2 s idle stretch.
This VM has no GPU; the replay goes through the real collector's interface."""

from __future__ import annotations

import os
import signal
import threading

from prometheus_client import generate_latest

from serwatt.profiler.attribution.tracker import NVML_POLL_S
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records.store import Recorder
from serwatt.profiler.service.config import load_config
from serwatt.profiler.service.daemon import Daemon
from serwatt.profiler.service.exporter import make_registry
from tests.daemon_support import (
    daemon_config,
    parse_metrics,
    start_workload,
    stop_process,
    total,
    wait_for,
)
from tests.nvml_replay import ReplayNvmlBackend, load_timeline

IDLE_W = 75.0  # tests/fixtures/nvml/h200_checkpoint_stall.json
# NVML energy is polled every NVML_POLL_S (0.5 s) and at each window's end; a poll may
# come late on a loaded VM, so segments up to 1 s from a window may shape its joules.
ENERGY_POLL_GAP_S = 2 * NVML_POLL_S
STAMP_REL = 1e-3
LAST_SEGMENT_S = 13.0  # the timeline's last segment (92% busy) starts here


def test_gpu_idle_and_gpu_wait_reach_the_metrics_and_the_record(tmp_path):
    work = start_workload(tmp_path, "gpu_trainer")
    cfg_path = tmp_path / "serwatt.yaml"
    cfg_path.write_text(daemon_config(tmp_path / "runs", {"trainer": "gpu_trainer"}))
    fake = ReplayNvmlBackend(load_timeline("h200_checkpoint_stall"), target_pids=[work.pid])
    daemon = Daemon(load_config(cfg_path), nvml_backend=fake)
    seen: dict = {}
    failure: list[BaseException] = []

    def watch() -> None:
        try:
            registry = make_registry(daemon.ledger.snapshot)

            def waited():
                m = parse_metrics(generate_latest(registry).decode())
                idle = total(m, "serwatt_gpu_idle_seconds_total", gpu="0")
                wait = total(m, "serwatt_gpu_wait_seconds_total", target="trainer", gpu="0")
                # and windows that start 1 s into the last, endless busy segment (from
                # 13 s), so some windows see one replayed segment only, even when slow
                late = fake.rel() >= LAST_SEGMENT_S + ENERGY_POLL_GAP_S + 4.0
                return idle >= 4.0 and wait > 0 and late and m

            seen.update(wait_for(waited, 90, "GPU idle >= 4 s, GPU-wait > 0, 18 s of replay"))
        except BaseException as exc:
            failure.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=watch, daemon=True)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        watcher.start()
        assert daemon.run() == 0
        watcher.join(timeout=30)
    finally:
        stop_process(work)
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored
    if failure:
        raise failure[0]
    m = seen
    assert total(m, "serwatt_collector_up", collector="nvml") == 1
    for cp in CODEPATHS:  # zero-filled for the declared GPU
        key = (("codepath", cp), ("direction", "unknown"), ("gpu", "0"), ("target", "trainer"))
        assert ("serwatt_gpu_wait_seconds_total", key) in m
        assert ("serwatt_gpu_wait_energy_joules_total", key) in m
    wait_s = total(m, "serwatt_gpu_wait_seconds_total", target="trainer", gpu="0")
    # GPU-wait can only happen while the GPU idles, and is counted once per instant.
    assert wait_s <= total(m, "serwatt_gpu_idle_seconds_total", gpu="0") + 1e-9
    serializing = sum(
        total(m, "serwatt_gpu_wait_seconds_total", target="trainer", codepath=cp)
        for cp in ("pickle", "json")
    )
    assert serializing > 0  # the workload serializes most of the time
    # Idle power is the replayed H200's least power, so no wait second costs less.
    wait_j = total(m, "serwatt_gpu_wait_energy_joules_total", target="trainer", gpu="0")
    assert wait_j >= IDLE_W * wait_s - 1e-6, (wait_j, wait_s)
    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        run = rec.runs()[0]
        windows = [w for w in rec.run(run.run_id).windows if w.gpu]
    recorded_wait = sum(sum(w.gpu["codepaths_wait_s"].values()) for w in windows)
    recorded_j = sum(sum(w.gpu["codepaths_wait_j"].values()) for w in windows)
    # Every window the counters saw is in the record (the record may hold more).
    assert recorded_wait >= wait_s - 1e-9 and recorded_j >= wait_j - 1e-6
    gpu = fake.gpus[0]
    exact = 0
    lo_j = hi_j = 0.0
    for w in windows:
        a, b = w.started_at - fake.start, w.ended_at - fake.start
        # Idle is never guessed: an empty buffer counts only once a poll confirms it,
        # so serwatt's idle seconds can fall short of the replay's, never exceed them.
        idle = w.gpu["gpus"][0]["idle_s"]
        assert idle <= fake.true_idle_s(0, w.started_at, w.ended_at) + 1e-3, (a, b, idle)
        ws = sum(w.gpu["codepaths_wait_s"].values())
        wj = sum(w.gpu["codepaths_wait_j"].values())
        if ws <= 0:
            continue
        # A wait second's joules are the GPU power interpolated between energy polls
        # (the model: idle + (busy - idle) x utilisation in the replay), so they lie
        # between the least and the most power of the segments within one poll gap of
        # the window, and equal that power when the window sees one segment only.
        powers = {
            gpu.power_w(busy)
            for s0, s1, busy, _ in gpu.segments()
            if s1 > a - ENERGY_POLL_GAP_S and s0 < b + ENERGY_POLL_GAP_S
        }
        lo_j += min(powers) * ws
        hi_j += max(powers) * ws
        # (0.1%: each energy point is stamped just before its read; a read preempted by
        # 0.5 ms on a loaded VM moves the power interpolated over a 0.5 s poll gap by that)
        lo, hi = min(powers) * (1 - STAMP_REL), max(powers) * (1 + STAMP_REL)
        if len(powers) == 1:
            exact += 1
        assert lo * ws <= wj <= hi * ws, (a, b, wj / ws, powers)
    assert exact >= 1, "no window inside one replayed segment: the exact check never ran"
    assert lo_j * (1 - STAMP_REL) <= recorded_j <= hi_j * (1 + STAMP_REL), (lo_j, recorded_j, hi_j)
    # The daemon's episodes carry GPU figures over their own spans: idle seconds never
    # above the replay's over the span (idle is never guessed), joules at least the idle
    # power's for them.
    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        episodes = rec.episodes(run.run_id) or ()
    timed = [e for e in episodes if e["gpu_wait_s"] is not None]
    assert timed, episodes
    for e in timed:
        assert e["gpu_wait_s"] <= fake.true_idle_s(0, e["start"], e["end"]) + 1e-3, e
        if e["gpu_idle_j"] is not None:
            assert e["gpu_idle_j"] >= IDLE_W * e["gpu_wait_s"] * (1 - STAMP_REL), e
    assert any(e["gpu_idle_j"] is not None for e in timed), timed
