"""bench/nvml_smoke.py's --burn verdict, on replayed NVML timelines (no GPU here): a
GPU that follows the burn schedule is CONFIRMED; one that idles through the burn, stays
busy after it, or reads at the wrong host time is NOT MET; spans too short or without
utilisation data are undecided. The verdict runs on the real NvmlCollector."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from serwatt.collectors.nvml import NvmlCollector
from tests.benches import load_bench
from tests.nvml_replay import FakeClock, ReplayNvmlBackend

PID = 4711


smoke = load_bench("nvml_smoke")

# One H100-like GPU: busy from 1 s to 5 s of the replay (the burn), then idle; the driver
# keeps adding 0% samples while idle (buffer on).
BURN = {
    "driver": {"clock": "boottime", "buffer_depth": 120},
    "gpus": [
        {
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-00000000-0000-0000-0000-burn00000000",
            "mig": 0,
            "period_s": 1 / 6,
            "energy_counter": True,
            "idle_w": 70.0,
            "busy_w": 690.0,
            "pids": ["target"],
            "segments": [
                {"until_s": 1.0, "busy": 0},
                {"until_s": 5.0, "busy": 100},
                {"until_s": 1e9, "busy": 0},
            ],
        }
    ],
}


def _run(
    timeline: dict[str, Any],
    busy_from: float = 1.0,
    busy_until: float = 5.0,
    end: float = 9.0,
    *,
    skew_s: float = 0.0,
):
    """Poll the replay every 0.5 s until `end` and judge the schedule (relative seconds).
    `skew_s` shifts the schedule the burner reports against the GPU's real one."""
    clock = FakeClock()
    fake = ReplayNvmlBackend(timeline, target_pids=[PID], clock=clock, boot_epoch=clock() - 86400)
    col = NvmlCollector(fake, clock=clock, boottime=fake.boottime)
    assert col.probe().up
    col.poll()
    while clock() - fake.start < end - 1e-9:
        clock.advance(0.5)
        col.poll()
    t0 = fake.start + skew_s
    sched = smoke.BurnSchedule(t0 + busy_from, t0 + busy_until, fake.start + end)
    return smoke.burn_verdict(col, sched, PID)


def test_a_gpu_that_follows_the_burn_is_confirmed() -> None:
    v = _run(BURN)
    assert v.verdict == "CONFIRMED", v
    assert v.gpu == 0 and len(v.checks) == 3 and all(c.endswith("ok") for c in v.checks), v


def test_a_gpu_that_idles_through_the_burn_is_not_met() -> None:
    idle = copy.deepcopy(BURN)
    idle["gpus"][0]["segments"] = [{"until_s": 1e9, "busy": 0}]
    v = _run(idle)
    assert v.verdict == "NOT MET", v
    assert any(c.startswith("busy span") and "FAIL" in c for c in v.checks), v
    assert any(c.startswith("power") and "FAIL" in c for c in v.checks), v


def test_a_gpu_still_busy_after_the_burn_is_not_met() -> None:
    busy = copy.deepcopy(BURN)
    busy["gpus"][0]["segments"] = [{"until_s": 1.0, "busy": 0}, {"until_s": 1e9, "busy": 100}]
    v = _run(busy)
    assert v.verdict == "NOT MET", v
    assert any(c.startswith("idle span") and "FAIL" in c for c in v.checks), v


def test_samples_at_the_wrong_host_time_are_not_met() -> None:
    # The burner's clock and NVML's disagree by 2 s: the busy span then reads half idle.
    v = _run(BURN, skew_s=2.0, end=11.0)
    assert v.verdict == "NOT MET", v


@pytest.mark.parametrize(
    "busy_until, end, why",
    [(2.5, 9.0, "busy span"), (5.0, 6.0, "idle span")],
)
def test_spans_too_short_are_undecided(busy_until: float, end: float, why: str) -> None:
    short = copy.deepcopy(BURN)
    short["gpus"][0]["segments"][1]["until_s"] = busy_until  # the GPU follows the schedule
    v = _run(short, 1.0, busy_until, end)
    assert v.verdict == "undecided", v
    assert any(c.startswith(why) and "too short" in c for c in v.checks), v


def test_an_empty_buffer_nvml_cannot_confirm_is_undecided() -> None:
    # No samples after the burn, and the current utilisation never reads 0: no idle data.
    gap = copy.deepcopy(BURN)
    gap["gpus"][0]["segments"] = [
        {"until_s": 1.0, "busy": 0},
        {"until_s": 5.0, "busy": 100},
        {"until_s": 1e9, "busy": 3, "buffer": False},
    ]
    v = _run(gap)
    assert v.verdict == "undecided", v
    assert any(c.startswith("idle span: utilisation data for") for c in v.checks), v


def test_a_burn_that_did_not_run_is_undecided() -> None:
    col = NvmlCollector(ReplayNvmlBackend(BURN, target_pids=[PID]))
    v = smoke.burn_verdict(col, smoke.BurnSchedule(error="RuntimeError: no CUDA"), PID)
    assert v.verdict == "undecided" and "no CUDA" in v.checks[0], v
