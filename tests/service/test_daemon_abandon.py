"""An abandoned window keeps its concurrency slot until its py-spy really ends.

docs/daemon.md, "Bounded work": "A window that overruns its end by 15 s is told to stop
(SIGINT to py-spy); one that still has not returned 15 s later is abandoned (counted as
`window_timeout`); its thread keeps its place in the limit until it really ends, so the
bound on py-spy processes holds."

A real daemon (max_concurrent_samplers: 1) samples two real targets; the test SIGSTOPs
both py-spys of one window, so that window cannot return until the sampler's own kill
bound (SIGKILL kill_grace_s after its SIGINT, collectors/pyspy/runner.py; 10 s by default,
5 s here) reaps them. The daemon runs with overrun_s and abandon_after_s of 1.5 s instead
of 15 s (Daemon's keywords), so that the window is abandoned well before that kill: the
15 s + 15 s of the real daemon would outlast the kill bound and never abandon a stopped
py-spy. The claim checked: between the abandonment and the end of the stopped py-spys no
other window starts, and sampling resumes after. The exact times are checked in fake
time (tests/service/test_daemon_schedule.py); this is the real processes' end of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
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

SHORT_S = 1.5  # overrun_s and abandon_after_s
# The sampler's SIGKILL after its SIGINT (at the window's end): past the abandonment
# (window end + 1.5 s + 1.5 s, at the next 0.5 s wake), so the window is abandoned
# 1.5-2 s before its py-spys end.
KILL_GRACE_S = 5.0
LIGHT = (
    "import pickle, time\nd = list(range(20000))\n"
    "while True:\n    pickle.dumps(d)\n    time.sleep(0.02)\n"
)


def _window_dir(pid: int) -> str | None:
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return None
    return os.path.dirname(cmd[cmd.index("--output") + 1])


@pytest.mark.serial  # orders real-time events a second apart
def test_abandoned_window_holds_its_slot_until_its_pyspy_ends(tmp_path: Path) -> None:
    works = []
    for name in ("abandon_a", "abandon_b"):
        script = tmp_path / f"{name}.py"
        script.write_text(LIGHT)
        works.append(subprocess.Popen([PYTHON, str(script)], stdout=subprocess.DEVNULL))
    d = start_daemon(
        tmp_path,
        {"a": "abandon_a", "b": "abandon_b"},
        window_s=1,
        sample_rate_hz=10,
        max_concurrent_samplers=1,
        daemon_options={
            "overrun_s": SHORT_S,
            "abandon_after_s": SHORT_S,
            "kill_grace_s": KILL_GRACE_S,
        },
    )
    # (monotonic time, py-spy record pids) every 20 ms, from the stop to the end
    seen: list[tuple[float, set[int]]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append((time.monotonic(), set(children_named(d.pid, "py-spy", "record"))))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        d.wait_metric("serwatt_samples_total", 1, target="a")
        d.wait_metric("serwatt_samples_total", 1, target="b")
        # Stop both py-spy runs of the next window (after their banner, as a hang would).
        first = wait_for(lambda: children_named(d.pid, "py-spy", "record"), 30, "a window")
        window = _window_dir(first[0])
        time.sleep(0.3)
        stopped = {p for p in children_named(d.pid, "py-spy", "record") if _window_dir(p) == window}
        assert len(stopped) == 2, stopped
        for p in stopped:
            os.kill(p, signal.SIGSTOP)
        watcher.start()
        m = d.wait_metric("serwatt_sampler_errors_total", 1, timeout_s=30, kind="window_timeout")
        abandoned_at = time.monotonic()
        assert stopped <= set(children_named(d.pid, "py-spy", "record")), "ended before abandon"
        assert total(m, "serwatt_collector_up", collector="pyspy") == 0
        # The sampler's kill bound ends the stopped py-spys; then sampling resumes.
        wait_for(
            lambda: not (stopped & set(children_named(d.pid, "py-spy", "record"))),
            40,
            "the stopped py-spys reaped",
        )
        before = total(d.metrics(), "serwatt_samples_total")
        d.wait_metric("serwatt_samples_total", before + 1, timeout_s=30)
        done.set()
        watcher.join(timeout=5)
        log = d.log()
        assert d.stop()[0] == 0
    finally:
        done.set()
        d.kill()
        for w in works:
            stop_process(w)
    assert f"overran by {SHORT_S:g}s: stopping it" in log
    assert "did not return: abandoned" in log
    gone_at = next(t for t, pids in seen if not (stopped & pids))
    assert gone_at > abandoned_at + 1, (abandoned_at, gone_at)  # held for a while
    # While the abandoned window's py-spys lived, no other window started: the limit is 1.
    others_while_held = {p for t, pids in seen if t < gone_at for p in pids - stopped}
    assert not others_while_held, others_while_held
    # And windows started again once they were gone.
    assert any(pids - stopped for t, pids in seen if t >= gone_at), "sampling never resumed"
    assert max(len(pids) for _, pids in seen) <= 2  # two py-spy runs per window, limit 1
