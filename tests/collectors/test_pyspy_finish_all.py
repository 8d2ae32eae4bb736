"""A failed window reaps both of its py-spy runs (collectors/pyspy/runner.py).

A window is two py-spy processes (the --idle run and the on-CPU run). When one of them has
to be killed (it ignored SIGINT: hung, or stopped), the window fails with SamplingError,
and the other run must still be stopped and reaped before the error is raised: otherwise
it is a py-spy that nobody waits for, outside the daemon's bound on py-spy processes (the
abandoned-window test in tests/service/test_daemon_abandon.py leaked one that way).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from serwatt.collectors.pyspy import PySpy, SamplingError, SamplingPlan

LIGHT = (
    "import pickle, time\nd = list(range(20000))\n"
    "while True:\n    pickle.dumps(d)\n    time.sleep(0.02)\n"
)


def _pyspy_children() -> list[psutil.Process]:
    return [c for c in psutil.Process().children() if c.name() == "py-spy"]


def test_a_killed_run_does_not_leave_the_other_behind() -> None:
    target = subprocess.Popen([sys.executable, "-c", LIGHT])
    stopped: list[int] = []

    def stop_both_runs() -> None:
        # The on-CPU run at once (before its banner: it has no deadline yet, so it is only
        # interrupted by a stop request), the --idle run once it has started (interrupted at
        # its deadline, killed kill_grace_s later): the --idle run is killed first.
        deadline = time.monotonic() + 20
        idle_seen: dict[int, float] = {}
        while time.monotonic() < deadline and len(stopped) < 2:
            now = time.monotonic()
            for kid in _pyspy_children():
                if kid.pid in stopped:
                    continue
                if "--idle" in kid.cmdline():
                    if now - idle_seen.setdefault(kid.pid, now) < 0.3:
                        continue
                os.kill(kid.pid, signal.SIGSTOP)
                stopped.append(kid.pid)
            time.sleep(0.001)

    stopper = threading.Thread(target=stop_both_runs, daemon=True)
    stopper.start()
    try:
        time.sleep(0.3)
        spy = PySpy(kill_grace_s=1.0, priority="off")
        with pytest.raises(SamplingError, match="did not stop"):
            spy.record_window(
                target.pid, duration_s=1.0, plan=SamplingPlan(rate_hz=20, on_cpu_run=True)
            )
        stopper.join(timeout=5)
        assert len(stopped) == 2, "both runs were not seen"
        # Neither run is left: not the killed one, not the other (running or a zombie).
        assert _pyspy_children() == []
    finally:
        for c in _pyspy_children():
            c.kill()
            c.wait(5)
        target.kill()
        target.wait()
