"""Ports of the stores the tests start, read back from the servers, so parallel tests
never race for one: each binds port 0 and the kernel picks. Prometheus logs the port it
bound ("Listening on"); VictoriaMetrics logs only its configured `:0`, so its port is its
own listening socket in the kernel's table. (The daemon's: DaemonProc.port, from its
landing line.)
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

TIMEOUT_S = 60

# Prometheus' web listener: msg="Listening on" address=127.0.0.1:PORT
_PROMETHEUS_LISTENING = re.compile(r'msg="Listening on" address=\S+:(\d+)')


def _poll(bound: Callable[[], int | None], what: str) -> int:
    """bound() until it gives a port; its exceptions (the server exited) end the wait."""
    deadline = time.monotonic() + TIMEOUT_S
    while (port := bound()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT_S} s waiting for {what}")
        time.sleep(0.1)
    return port


def _port_in_log(proc: subprocess.Popen, log: Path, pattern: re.Pattern[str], what: str) -> int:
    def bound() -> int | None:
        text = log.read_text(errors="replace")
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited {proc.returncode}:\n{text[-3000:]}")
        m = pattern.search(text)
        return int(m.group(1)) if m else None

    try:
        return _poll(bound, f"{what} to log its port")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- {log} ---\n{log.read_text(errors='replace')}") from None


def prometheus_port(proc: subprocess.Popen, log: Path) -> int:
    """The port a Prometheus started with `--web.listen-address=127.0.0.1:0` bound."""
    return _port_in_log(proc, log, _PROMETHEUS_LISTENING, "Prometheus")


def listening_port(proc: subprocess.Popen) -> int:
    """The one TCP port `proc` listens on, from the kernel's socket table."""

    def bound() -> int | None:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}")
        ports = {
            c.laddr.port
            for c in psutil.Process(proc.pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert len(ports) <= 1, f"listening on several ports: {sorted(ports)}"
        return ports.pop() if ports else None

    return _poll(bound, f"pid {proc.pid} to listen")
