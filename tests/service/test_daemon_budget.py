"""`cpu_budget_cores`: a real daemon over real workloads lowers its windows' py-spy rate
to its budget, counts its own CPU, says when the budget cannot be met, and goes back
to the configured rate when a reload removes the budget."""

from __future__ import annotations

import signal

import pytest

from serwatt.profiler.records.store import Recorder
from tests.daemon_support import (
    DaemonProc,
    daemon_config,
    start_daemon,
    start_workload,
    stop_process,
    total,
    wait_for,
)

WINDOW_S = 1
# The daemon's own CPU against its budget, and py-spy keeping its rate: measured alone.
pytestmark = pytest.mark.serial


def _rate(d: DaemonProc) -> float:
    return total(d.metrics(), "serwatt_sample_rate_hz")


def test_budget_lowers_the_rate_py_spy_runs_at_and_a_reload_lifts_it(tmp_path):
    works = [start_workload(tmp_path, f"budget{i}_trainer") for i in range(2)]
    # The daemon process alone uses more than this: the rate must go to its 1 Hz floor.
    targets = {"t0": "budget0_trainer", "t1": "budget1_trainer"}
    d = start_daemon(tmp_path, targets, window_s=WINDOW_S, cpu_budget_cores=0.002)
    cfg = tmp_path / "serwatt.yaml"
    base = daemon_config(tmp_path / "runs", targets, window_s=WINDOW_S)
    try:
        d.wait_metric("serwatt_samples_total", 1, target="t0")
        m = d.metrics()
        assert total(m, "serwatt_cpu_budget_cores") == 0.002
        wait_for(lambda: _rate(d) == 1, 60, "the rate down to 1 Hz")
        wait_for(lambda: "cpu_budget_cores cannot be met" in d.log(), 30, "the warning")
        # Windows started after the drop ran at the low rate.
        d.wait_metric("serwatt_samples_total", total(d.metrics(), "serwatt_samples_total") + 4)
        m = d.metrics()
        daemon_s = total(m, "serwatt_self_cpu_seconds_total", part="daemon")
        samplers_s = total(m, "serwatt_self_cpu_seconds_total", part="samplers")
        assert daemon_s > 0 and samplers_s > 0, (daemon_s, samplers_s)
        page = d.get("/")
        assert "Sampling at 1 Hz (CPU budget 0.002 cores)" in page

        # A reload without the budget: back to the configured 50 Hz, no budget series.
        cfg.write_text(base)
        d.signal(signal.SIGHUP)
        wait_for(lambda: _rate(d) == 50, 30, "the rate back at 50 Hz")
        assert ("serwatt_cpu_budget_cores", ()) not in d.metrics()
        assert d.stop()[0] == 0
    finally:
        d.kill()
        for w in works:
            stop_process(w)

    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        windows = [w for run in rec.runs() for w in rec.run(run.run_id).windows]
    rates = {w.rate_hz for w in windows}
    assert 50 in rates and 1 in rates, rates

    # The recorded rate is the one py-spy ran at: its own tick counts say so. A window is
    # an on-CPU run at the rate and an --idle run at min(rate, 10 Hz). A 1 s window's runs
    # get `--duration 2` (whole seconds, one spare: the daemon stops them at 1 s), and
    # py-spy 0.4.3 stops a run after --duration x rate intervals and reports one sample
    # fewer (measured: -d 2 gives 99 samples at 50 Hz, 1 at 1 Hz). Written out here, not
    # taken from the runner's command line, so a longer run fails: at most 1 + 1 ticks at
    # 1 Hz (docs/daemon.md: "<= 2 ticks at 1 Hz") and 99 + 19 at 50 Hz.
    def cap(rate: float) -> int:
        return sum(2 * round(r) - 1 for r in (rate, min(rate, 10)))

    for w in windows:
        ticks = w.errors.get("pyspy_samples", 0)
        assert ticks <= cap(w.rate_hz), (w.rate_hz, ticks, cap(w.rate_hz))
    # Each 50 Hz window is stopped (SIGINT) at least WINDOW_S after py-spy starts
    # sampling: its ticks are Poisson with a mean of at least (50 + 10) x 1 s - 2 = 58,
    # so fewer than 20 has a probability of 2.5e-9.
    fast = [w.errors.get("pyspy_samples", 0) for w in windows if w.rate_hz == 50]
    assert fast and min(fast) >= 20, fast
