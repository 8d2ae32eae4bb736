"""The daemon's retry schedule when its own sampling fails (docs/daemon.md, `sampler_failed`).

Documented: a window that fails for serwatt's own reasons (py-spy killed or crashed) is
counted as `sampler_failed` and "retried next slot, then backing off": after the n-th
failure in a row the next try waits window_s x (2^(n-1) - 1) (0, 1, 3, 7, ... x window_s,
at most 60 s); a window that works resets the count.

The schedule itself is checked exactly in fake time (tests/service/test_daemon_schedule.py). Here
a real daemon samples a real process and this test SIGKILLs every `py-spy record` of
chosen windows the moment it appears (as an OOM killer or an operator would): each kill
must be counted once as `sampler_failed`, the daemon's log must state the documented
delays exactly, and the measured tries must follow them in real time. Times are taken
here: a try starts when its py-spy first shows up, a failure is over when the daemon has
reaped its py-spys (a killed py-spy stays a zombie until then). An idle slot checks for
a due retry every 0.5 s, so a try may start up to 0.5 s after it is due; RETRY_SLACK_S
adds 1 s for a loaded 2-core machine (py-spy's start, the slot's bookkeeping).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.daemon_support import (
    PYTHON,
    children_named,
    start_daemon,
    stop_process,
    total,
    wait_for,
)

WINDOW_S = 1.0
RETRY_SLACK_S = 0.5 + 1.0
POLL_S = 0.01
LIGHT = (
    "import pickle, time\nd = list(range(20000))\n"
    "while True:\n    pickle.dumps(d)\n    time.sleep(0.02)\n"
)


def documented_delay_s(failures_in_a_row: int) -> float:
    return min(60.0, WINDOW_S * (2 ** (failures_in_a_row - 1) - 1))


@dataclass
class Attempt:
    started: float  # monotonic: its first py-spy seen
    window_dir: str
    pids: set[int] = field(default_factory=set)
    killed: bool = False
    reaped: float | None = None  # monotonic: all its py-spys gone (reaped by the daemon)


class PySpyKiller:
    """Watches the daemon's `py-spy record` children; SIGKILLs those of the windows
    (attempts, counted from 1) listed in `kill`."""

    def __init__(self, daemon_pid: int, kill: set[int]) -> None:
        self.daemon_pid, self.kill = daemon_pid, kill
        self.attempts: list[Attempt] = []
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            live = set(children_named(self.daemon_pid, "py-spy", "record"))
            for a in self.attempts:
                if a.reaped is None and not (a.pids & live):
                    a.reaped = now
            for pid in sorted(live - self._seen):
                self._seen.add(pid)
                try:
                    cmd = psutil.Process(pid).cmdline()
                except psutil.NoSuchProcess:
                    continue  # (would show as a sampler error the test did not cause)
                # A window's two py-spy runs write into one temporary directory of its own.
                window_dir = os.path.dirname(cmd[cmd.index("--output") + 1])
                if not self.attempts or self.attempts[-1].window_dir != window_dir:
                    self.attempts.append(Attempt(started=now, window_dir=window_dir))
                attempt = self.attempts[-1]
                attempt.pids.add(pid)
                attempt.reaped = None
                if len(self.attempts) in self.kill:
                    attempt.killed = True
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(POLL_S)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.mark.serial  # times the retries against the wall clock
def test_sampler_failures_back_off_on_the_documented_schedule(tmp_path: Path) -> None:
    script = tmp_path / "backoff_trainer.py"
    script.write_text(LIGHT)
    work = subprocess.Popen([PYTHON, str(script)], stdout=subprocess.DEVNULL)
    d = start_daemon(tmp_path, {"trainer": "backoff_trainer"}, window_s=WINDOW_S, sample_rate_hz=20)
    killer = None
    try:
        d.wait_metric("serwatt_samples_total", 1, target="trainer")
        # From here: windows 1-3 fail (3 in a row), 4 works (resets), 5 fails once more.
        killer = PySpyKiller(d.pid, kill={2, 3, 4, 6})
        attempts = wait_for(
            lambda: len(killer.attempts) >= 7 and killer.attempts[5].reaped and killer.attempts,
            90,
            "seven windows",
            poll_s=0.1,
        )
        m = d.metrics()
        assert d.proc.poll() is None
        log = d.log()
    finally:
        if killer is not None:
            killer.close()
        d.kill()
        stop_process(work)
    # attempts[0] is the window running when the killer started (not killed).
    assert [a.killed for a in attempts[:7]] == [False, True, True, True, False, True, False], (
        attempts
    )
    told = re.findall(r"sampler_failed \((\d+) in a row, next try in ([\d.]+)s\)", log)
    why = (attempts, told, [ln for ln in log.splitlines() if "WARNING" in ln or "ERROR" in ln])
    failed_windows = total(
        m, "serwatt_sampler_errors_total", target="trainer", kind="sampler_failed"
    )
    assert failed_windows == 4, why
    assert total(m, "serwatt_sampler_errors_total", target="trainer") == 4, why
    # The daemon's own account of the schedule: 1, 2, 3 in a row, then 1 again after a
    # window that worked.
    assert [(int(n), float(s)) for n, s in told] == [
        (n, documented_delay_s(n)) for n in (1, 2, 3, 1)
    ], told
    # And the measured times: each failed try is retried after its documented delay.
    for failed, failures_in_a_row in ((1, 1), (2, 2), (3, 3), (5, 1)):
        a, nxt = attempts[failed], attempts[failed + 1]
        assert a.reaped is not None
        gap = nxt.started - a.reaped
        due = documented_delay_s(failures_in_a_row)
        assert due - 0.05 <= gap <= due + RETRY_SLACK_S, (failed, failures_in_a_row, gap, due)
