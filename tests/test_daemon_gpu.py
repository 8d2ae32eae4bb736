"""The daemon's GPU path, in-process: a real daemon loop sampling a real workload with
py-spy, with NVML replaced by the replayed H200 timeline (tests/nvml_replay.py): a
busy GPU with a 3 s checkpoint stall (empty sample buffer) and a 2 s idle stretch.
This VM has no GPU; the replay goes through the real collector's interface."""

from __future__ import annotations

import os
import signal
import threading

from prometheus_client import generate_latest

from profiler.classify.codepaths import CODEPATHS
from profiler.records.store import Recorder
from profiler.service.config import load_config
from profiler.service.daemon import Daemon
from profiler.service.exporter import make_registry
from tests.nvml_replay import ReplayNvmlBackend, load_timeline
from tests.test_daemon_support import (
    config_text,
    free_port,
    parse_metrics,
    start_workload,
    stop_process,
    total,
    wait_for,
)


def test_gpu_idle_and_gpu_wait_reach_the_metrics_and_the_record(tmp_path):
    work = start_workload(tmp_path, "gpu_trainer")
    cfg_path = tmp_path / "serwatt.yaml"
    cfg_path.write_text(
        config_text(
            port=free_port(), record_dir=tmp_path / "runs", targets={"trainer": "gpu_trainer"}
        )
    )
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
                return idle >= 4.0 and wait > 0 and m

            seen.update(wait_for(waited, 90, "GPU idle >= 4 s and GPU-wait > 0"))
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
        key = (("codepath", cp), ("gpu", "0"), ("target", "trainer"))
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
    # Energy while waiting lies between the replayed H200's idle (75 W) and busy
    # (640 W) power: it is interpolated between NVML energy polls 0.5 s apart, so
    # idle spans next to busy ones take some busy power (measured ~160 W average).
    wait_j = total(m, "serwatt_gpu_wait_energy_joules_total", target="trainer", gpu="0")
    assert 75.0 * wait_s * 0.95 <= wait_j <= 640.0 * wait_s + 1e-6, (wait_j, wait_s)
    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        run = rec.runs()[0]
        detail = rec.run(run.run_id)
        recorded_wait = sum(
            (w.gpu or {}).get("codepaths_wait_s", {}).get(cp, 0.0)
            for w in detail.windows
            for cp in CODEPATHS
        )
        # Every window the counters saw is in the record (the record may hold more).
        assert recorded_wait >= wait_s - 1e-9
