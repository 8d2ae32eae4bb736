"""NVML collector against replayed GPU timelines (fake backend, real collector code)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serwatt.collectors.nvml import (
    REASON_GPU_LOST,
    REASON_MIG,
    REASON_NO_DRIVER,
    REASON_PERMISSION,
    NvmlCollector,
    calibrate_clock,
    clean_samples,
    read_clock_pair,
)
from tests.nvml_replay import FakeClock, ReplayNvmlBackend, load_timeline

REPO = Path(__file__).resolve().parents[2]
TARGET = 31337


def _replay(name: str, poll_every_s: float, duration_s: float, **kw: object):
    clock = FakeClock()
    fake = ReplayNvmlBackend(
        kw.pop("timeline", None) or load_timeline(name),  # type: ignore[arg-type]
        target_pids=[TARGET],
        clock=clock,
        boot_epoch=clock() - 3 * 86400,
    )
    col = NvmlCollector(fake, clock=clock, boottime=fake.boottime)
    status = col.probe()
    steps = round(duration_s / poll_every_s)
    for _ in range(steps):
        clock.advance(poll_every_s)
        col.poll()
    return clock, fake, col, status


def test_checkpoint_stall_idle_seconds_match_the_timeline() -> None:
    clock, fake, col, status = _replay("h200_checkpoint_stall", 0.5, 16.0)
    assert status.up and status.gpus[0].name == "NVIDIA H200"
    cal = col.clock_calibration
    assert cal is not None and cal.domain == "boottime"
    assert cal.offset_s == pytest.approx(fake.boot_epoch)
    assert 0 <= cal.lag_s < 0.5
    start, end = fake.start + 0.5, fake.start + 15.5
    (w,) = col.window(start, end)
    assert w.up and w.reason is None
    assert w.sample_period_s == pytest.approx(1 / 6, rel=1e-3)
    truth = fake.true_idle_s(0, start, end)
    assert truth == pytest.approx(0.04 * 3.5 + 3 + 0.12 * 4 + 2 + 0.08 * 2.5)
    assert w.idle_s == pytest.approx(truth, abs=0.2)
    assert w.covered_s == pytest.approx(end - start, abs=0.2)
    # the empty-buffer stall is idle because utilisation rates confirmed 0
    stall = [iv for iv in w.intervals if iv.confirmed_idle]
    assert stall and stall[0].t0 == pytest.approx(fake.start + 4.0, abs=0.01)
    assert sum(iv.t1 - iv.t0 for iv in stall) == pytest.approx(3.0, abs=0.2)
    # junk dropped, sorted, no overlap
    assert all(0.0 <= iv.busy_frac <= 1.0 for iv in w.intervals)
    assert all(a.t1 <= b.t0 + 1e-9 for a, b in zip(w.intervals, w.intervals[1:], strict=False))
    assert w.energy_source == "nvml_energy_counter"
    assert w.energy_j == pytest.approx(fake.true_energy_j(0, start, end), rel=0.01)
    assert w.pids == frozenset({TARGET, 4242})
    assert col.poll_errors == []


def test_empty_buffer_while_busy_is_not_counted_idle() -> None:
    tl = load_timeline("h200_checkpoint_stall")
    tl["gpus"][0]["segments"] = [{"until_s": 1e9, "busy": 60, "buffer": False}]
    clock, fake, col, _ = _replay("", 0.5, 5.0, timeline=tl)
    (w,) = col.window(fake.start + 0.5, fake.start + 5.0)
    assert w.idle_s == 0.0 and w.covered_s == 0.0  # no data, not guessed idle
    truth = fake.true_energy_j(0, fake.start + 0.5, fake.start + 5.0)
    assert w.energy_j == pytest.approx(truth, rel=0.01)  # energy still measured


def test_gpu_lost_mid_run_keeps_earlier_data() -> None:
    clock, fake, col, status = _replay("two_gpus_one_lost", 0.5, 8.0)
    assert status.up and [g.up for g in status.gpus] == [True, True]
    assert col.clock_calibration is not None and col.clock_calibration.domain == "epoch"
    before = col.window(fake.start + 1.0, fake.start + 3.0)
    assert before[1].up and before[1].covered_s == pytest.approx(2.0)
    after = col.window(fake.start + 1.0, fake.start + 8.0)
    assert (after[1].up, after[1].reason) == (False, REASON_GPU_LOST)
    # The fake clock makes the replay exact: GPU 1's samples come each second (each covers
    # the second before it) until it is lost at 3.5 s, so [1, 8] keeps exactly the samples
    # of 2 s and 3 s (busy 50%) and nothing after.
    lost = [(iv.t0 - fake.start, iv.t1 - fake.start, iv.busy_frac) for iv in after[1].intervals]
    assert lost == [(1.0, 2.0, 0.5), (2.0, 3.0, 0.5)]
    assert after[1].covered_s == pytest.approx(2.0)
    g0 = after[0]
    assert g0.up and g0.sample_period_s == pytest.approx(1.0)
    assert g0.covered_s == pytest.approx(7.0)
    # 1-2 s at 70% busy, 2-5 s idle (confirmed), then 100%: the timeline's 0.3 + 3 s.
    truth = fake.true_idle_s(0, fake.start + 1.0, fake.start + 8.0)
    assert truth == pytest.approx(3.3)
    assert g0.idle_s == pytest.approx(truth)
    assert g0.pids == frozenset({TARGET})
    assert after[1].pids == frozenset({999999})


def test_pre_volta_energy_is_integrated_power() -> None:
    clock, fake, col, _ = _replay("pascal_power_only", 0.1, 6.0)
    (w,) = col.window(fake.start + 0.15, fake.start + 5.95)
    assert w.energy_source == "nvml_power_integrated"
    truth = fake.true_energy_j(0, fake.start + 0.15, fake.start + 5.95)
    assert w.energy_j == pytest.approx(truth, rel=0.03)


def test_mig_is_unavailable_with_reason() -> None:
    _, _, col, status = _replay("a100_mig", 0.5, 1.0)
    assert not status.up
    assert (status.gpus[0].up, status.gpus[0].reason) == (False, REASON_MIG)
    assert "MIG" in (status.gpus[0].detail or "")
    assert col.window(0, 1)[0].reason == REASON_MIG


@pytest.mark.parametrize(
    ("code", "reason"), [(12, REASON_NO_DRIVER), (9, REASON_NO_DRIVER), (4, REASON_PERMISSION)]
)
def test_init_errors_become_reasons(code: int, reason: str) -> None:
    tl = load_timeline("h200_checkpoint_stall")
    tl["driver"]["init_error"] = code
    fake = ReplayNvmlBackend(tl)
    status = NvmlCollector(fake).probe()
    assert (status.up, status.reason) == (False, reason)
    assert "nvmlInit" in (status.detail or "")


def test_real_backend_on_this_machine_says_no_driver() -> None:
    # No GPU or driver here: the real pynvml backend must say so, not crash or report 0.
    status = NvmlCollector().probe()
    if Path("/dev/nvidiactl").exists():  # a GPU node: the real backend must find GPUs
        assert status.up and status.gpus, status.detail
        return
    assert (status.up, status.reason) == (False, REASON_NO_DRIVER)
    assert "libnvidia-ml" in (status.detail or "")


def test_import_is_lazy_and_only_collectors_nvml_imports_pynvml() -> None:
    code = "import sys, serwatt.collectors.nvml; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
    importers = []
    for pkg in ("profiler", "collectors"):
        for f in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                if any(n.split(".")[0] == "pynvml" for n in names):
                    importers.append(str(f.relative_to(REPO)))
    assert sorted(set(importers)) == ["collectors/nvml.py"]


def test_calibration_picks_the_nearer_clock() -> None:
    epoch_now, boot_now = 1_764_400_000.0, 259_200.0
    c = calibrate_clock(round((epoch_now - 0.2) * 1e6), epoch_now, boot_now)
    assert (c.domain, c.offset_s) == ("epoch", 0.0) and c.lag_s == pytest.approx(0.2)
    c = calibrate_clock(round((boot_now - 3600) * 1e6), epoch_now, boot_now)  # idle for 1 h
    assert c.domain == "boottime" and c.lag_s == pytest.approx(3600)
    assert c.to_host(round(boot_now * 1e6)) == pytest.approx(epoch_now)


def test_the_clock_pair_is_the_read_no_preemption_split() -> None:
    """Epoch and boottime read 50 ms apart (the reader descheduled between them) would
    shift every NVML sample by 50 ms; the pair kept is the tightest bracketed read."""
    boot_offset = 1_764_000_000.0  # epoch at boot
    t = [259_200.0]
    stalls = iter([0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # one per read

    def boottime() -> float:
        t[0] += next(stalls, 0.0) + 1e-6
        return t[0]

    def epoch() -> float:
        t[0] += 1e-6
        return t[0] + boot_offset

    e, b = read_clock_pair(epoch, boottime)
    assert e - b == pytest.approx(boot_offset, abs=2e-6)
    # that split read alone is 25 ms off (the bracket's midpoint)
    t[0] = 259_200.0
    stalls = iter([0.0, 0.05])
    e, b = read_clock_pair(epoch, boottime, tries=1)
    assert e - b == pytest.approx(boot_offset - 0.025, abs=2e-6)


@given(
    raw=st.lists(st.tuples(st.integers(0, 10**16), st.integers(0, 2**32 - 1)), max_size=200),
    last_seen=st.integers(0, 10**16),
)
def test_clean_samples_sorted_unique_and_valid(raw: list[tuple[int, int]], last_seen: int) -> None:
    out = clean_samples(raw, last_seen)
    ts = [t for t, _ in out]
    assert ts == sorted(set(ts))
    assert all(t > 0 and t > last_seen and 0 <= v <= 100 for t, v in out)
    valid = {t for t, v in raw if t > 0 and t > last_seen and 0 <= v <= 100}
    assert set(ts) == valid


def test_smoke_script_fails_clearly_without_a_gpu() -> None:
    out = subprocess.run(
        [sys.executable, "bench/nvml_smoke.py", "--seconds", "0.5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if Path("/dev/nvidiactl").exists():
        assert out.returncode == 0 and "sample_period_s=" in out.stdout, out.stderr
        return
    assert out.returncode == 1
    assert "NVML unavailable: no_driver" in out.stderr
    assert "libnvidia-ml.so.1" in out.stderr
