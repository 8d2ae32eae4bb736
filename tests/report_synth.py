"""Synthetic report inputs: runs whose windows and checkpoint episodes follow known laws.

A run is `windows` consecutive windows of `window_s`; each window's checkpoint codepath
CPU is `ckpt_cpu_s` × a seeded noise factor; a checkpoint episode on the main thread
starts every `every_s` and lasts `stall_s` × noise. The same seed gives the same run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from serwatt.profiler.report.inputs import CodepathFigures, EpisodeInput, RunInput, WindowInput

HOST: dict[str, Any] = {
    "hostname": "node-a",
    "cpu_model": "AMD EPYC 7R13 Processor",
    "sockets": 1,
    "gpus": [],
    "kernel": "6.1.0-18-amd64",
}


def make_run(
    run_id: str,
    *,
    codepath: str = "torch",
    ckpt_cpu_s: float = 1.0,
    stall_s: float = 0.8,
    windows: int = 24,
    window_s: float = 5.0,
    every_s: float = 6.0,
    seed: int = 0,
    noise: float = 0.1,
    durable: bool = True,
    gpu: bool = False,
    energy_source: str = "model",
    host: dict[str, Any] | None = None,
    rate_hz: float = 50.0,
    serwatt_version: str = "0.1.0",
    episodes: bool = True,
    t0: float = 1_700_000_000.0,
) -> RunInput:
    rng = np.random.default_rng(seed)
    wins = []
    for i in range(windows):
        start = t0 + i * window_s
        ck = ckpt_cpu_s * float(rng.lognormal(0.0, noise))
        other = 3.0 * float(rng.lognormal(0.0, noise))
        figures = {
            codepath: CodepathFigures(
                samples=int(ck * 50),
                cpu_s=ck,
                wall_s=ck,
                energy_j=ck * 20.0 if energy_source != "unavailable" else None,
                gpu_wait_s=ck * 0.5 if gpu else None,
            ),
            "other": CodepathFigures(
                samples=int(other * 50),
                cpu_s=other,
                wall_s=other,
                energy_j=other * 20.0 if energy_source != "unavailable" else None,
                gpu_wait_s=0.0 if gpu else None,
            ),
        }
        wins.append(
            WindowInput(
                started_at=start,
                ended_at=start + window_s,
                cpu_s=ck + other,
                codepaths=figures,
                energy_source=energy_source,
                pid=4242,
            )
        )
    eps = []
    t = t0 + 1.0
    while t < t0 + windows * window_s - 2.0:
        wall = stall_s * float(rng.lognormal(0.0, noise))
        eps.append(
            EpisodeInput(
                pid=4242,
                thread=4242,
                codepath=codepath,
                start=t,
                end=t + wall,
                wall_s=wall,
                resolution_s=1.0 / rate_hz,
                cpu_s=wall * 0.9,
                gpu_wait_s=wall * 0.8 if gpu else None,
                gpu_idle_j=wall * 60.0 if gpu else None,
                main_thread=True,
                durable=durable,
            )
        )
        t += every_s
    return RunInput(
        run_id=run_id,
        host=dict(host if host is not None else HOST),
        serwatt_version=serwatt_version,
        rate_hz=rate_hz,
        energy_source=energy_source,
        gpu_source="nvml" if gpu else "unavailable: no NVML library",
        started_at=t0,
        ended_at=t0 + windows * window_s,
        windows=tuple(wins),
        episodes=tuple(eps) if episodes else None,
    )
