"""systemd's sd_notify protocol, sending side: one datagram to $NOTIFY_SOCKET.

systemd (Type=notify) passes the socket path in NOTIFY_SOCKET; a leading "@" means
the Linux abstract namespace. Messages are newline-separated KEY=VALUE lines:
READY=1 (startup done), WATCHDOG=1 (keep-alive, expected every WATCHDOG_USEC
microseconds when WatchdogSec= is set), STOPPING=1, STATUS=free text.

Outside systemd (no NOTIFY_SOCKET) every call is a no-op that returns False. A
failed send is logged once and never raised: losing a status line must not take
the daemon down (a missed WATCHDOG=1 is what systemd is there to notice).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class SdNotifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._address = _socket_address(env.get("NOTIFY_SOCKET", ""))
        self._watchdog_s = _watchdog_interval_s(env)
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """WATCHDOG_USEC in seconds when the watchdog is on for this process, else None."""
        return self._watchdog_s

    def notify(self, *lines: str) -> bool:
        if self._address is None:
            return False
        payload = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self._address)
                sock.sendall(payload)
        except OSError as exc:
            if not self._warned:
                log.warning("sd_notify to %r failed: %s", self._address, exc)
                self._warned = True
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        lines = ["READY=1"] + ([f"STATUS={status}"] if status else [])
        return self.notify(*lines)

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1") if self._watchdog_s is not None else False

    def stopping(self, status: str | None = None) -> bool:
        lines = ["STOPPING=1"] + ([f"STATUS={status}"] if status else [])
        return self.notify(*lines)

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")


def _socket_address(value: str) -> str | bytes | None:
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    log.warning("ignoring NOTIFY_SOCKET=%r: neither a path nor an abstract name", value)
    return None


def _watchdog_interval_s(env: Mapping[str, str]) -> float | None:
    usec = env.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    # WATCHDOG_PID names the process systemd watches; a child that inherited the
    # environment must not ping on its parent's behalf.
    pid = env.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not an integer", usec)
        return None
    return value / 1e6 if value > 0 else None
