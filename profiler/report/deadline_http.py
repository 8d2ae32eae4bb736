"""HTTP GET with a total deadline, connect to last byte.

A socket timeout bounds one recv, so a server sending one byte at a time never trips it:
a request that must end by a deadline needs the deadline enforced on the connection
itself. `deadline_opener` gives a urllib opener whose connections a watchdog shuts down
when the deadline passes; whichever read is blocked then (status line, headers, body, TLS
handshake) ends at once, and `watchdog.fired` says why it ended.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _Watchdog:
    """Shuts a request's socket down when the request's deadline passes.

    A socket timeout bounds one recv, so a server sending a byte at a time never trips
    it; shutting the socket down ends whichever read is blocked (headers, body, TLS) at
    once. It holds a duplicate of the socket, so the shutdown reaches the connection
    even after urllib has closed its own handle or TLS has taken the socket over."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True

    def connect(
        self, address: tuple[str, int], timeout: Any = None, source_address: Any = None
    ) -> socket.socket:
        """socket.create_connection, watched (http.client's connection factory)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed before connecting")
        sock = socket.create_connection(address, left, source_address)
        with self._lock:
            self._sockets.append(sock.dup())
            fired = self.fired
        if fired:
            sock.close()
            raise TimeoutError("the deadline passed while connecting")
        return sock

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already gone

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()


def _watched(connection: type[http.client.HTTPConnection], watchdog: _Watchdog) -> Any:
    def make(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
        conn = connection(*args, **kwargs)
        # http.client opens its socket through this attribute (proxy tunnels included)
        conn._create_connection = watchdog.connect  # type: ignore[attr-defined]
        return conn

    return make


class _WatchedHTTP(urllib.request.HTTPHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, self._watchdog), req)


class _WatchedHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(
            _watched(http.client.HTTPSConnection, self._watchdog),
            req,
            context=ssl.create_default_context(),
        )


@contextmanager
def deadline_opener(
    deadline: float,
) -> Iterator[tuple[urllib.request.OpenerDirector, _Watchdog]]:
    """(an opener whose requests end by `deadline` (time.monotonic()), its watchdog).
    Proxies from the environment still apply: only the connection classes change."""
    with _Watchdog(deadline) as watchdog:
        yield urllib.request.build_opener(_WatchedHTTP(watchdog), _WatchedHTTPS(watchdog)), watchdog
