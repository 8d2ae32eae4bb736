"""`report --prometheus` against redirects (issue 45, item 7): one deadline covers the
whole request whatever the scheme, and no redirect leaves http(s).

A 302 to `ftp://` was followed by urllib's FTP handler, outside the deadline's watchdog
(which watches HTTP connections only): an FTP server dripping its greeting held the
report past every limit. The servers are real sockets on 127.0.0.1 (port 0)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from serwatt.profiler.report import prom_client
from serwatt.profiler.report.prom_error import PrometheusError

DRIP_S = 0.3


class _Listener:
    """Counts connections; `serve(conn, stopped)` talks to each (bounded by its own loop)."""

    def __init__(self, serve: Callable[[socket.socket, threading.Event], None]) -> None:
        self._serve = serve
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.accepted = 0
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self.stopped.is_set() and self.accepted < 10:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            with conn:
                conn.settimeout(5.0)
                try:
                    self._serve(conn, self.stopped)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopped.set()
        self._thread.join(10)
        self._sock.close()


@pytest.fixture()
def listener() -> Iterator[Callable[..., _Listener]]:
    made: list[_Listener] = []

    def make(serve: Callable[[socket.socket, threading.Event], None]) -> _Listener:
        made.append(_Listener(serve))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _drip_ftp_greeting(conn: socket.socket, stopped: threading.Event) -> None:
    for ch in b"220 " + b"x" * 200:  # 60 s if nobody hangs up
        if stopped.is_set():
            return
        conn.sendall(bytes([ch]))
        time.sleep(DRIP_S)


def _redirecting_to(location: str) -> Callable[[socket.socket, threading.Event], None]:
    def serve(conn: socket.socket, stopped: threading.Event) -> None:
        conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 302 Found\r\nLocation: " + location.encode()
            + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )  # fmt: skip

    return serve


def test_a_redirect_to_ftp_is_refused_not_followed(listener) -> None:
    ftp = listener(_drip_ftp_greeting)
    http = listener(_redirecting_to(f"ftp://127.0.0.1:{ftp.port}/x"))
    prom = prom_client.PromQL(f"http://127.0.0.1:{http.port}", request_deadline_s=1.5,
                     report_deadline_s=60.0)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(PrometheusError) as info:
        prom.range("serwatt_cpu_seconds_total", 0, 100, 10)
    took = time.monotonic() - started
    assert took < 1.5, f"took {took:.1f} s: the redirect was followed"
    message = str(info.value)
    assert "redirected to ftp://" in message and "http(s)" in message, message
    assert "\n" not in message
    assert ftp.accepted == 0, "serwatt connected to the FTP server"


@pytest.mark.parametrize("location", ["file:///etc/passwd", "data:,{}", "gopher://127.0.0.1:1/"])
def test_a_redirect_to_any_other_scheme_is_refused(listener, location: str) -> None:
    http = listener(_redirecting_to(location))
    with pytest.raises(PrometheusError, match=r"redirected to .*; serwatt follows"):
        prom_client.PromQL(f"http://127.0.0.1:{http.port}").range("up", 0, 100, 10)


def test_a_redirect_within_http_is_followed_under_the_same_deadline(listener) -> None:
    def drip_http(conn: socket.socket, stopped: threading.Event) -> None:
        conn.recv(65536)
        for ch in b"HTTP/1.1 200 OK\r\n" + b"X-Pad: y\r\n" * 20:
            if stopped.is_set():
                return
            conn.sendall(bytes([ch]))
            time.sleep(DRIP_S)

    slow = listener(drip_http)
    http = listener(_redirecting_to(f"http://127.0.0.1:{slow.port}/api/v1/query_range"))
    prom = prom_client.PromQL(f"http://127.0.0.1:{http.port}", request_deadline_s=1.5,
                     report_deadline_s=60.0)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(PrometheusError, match=r"1\.5 s request deadline"):
        prom.range("up", 0, 100, 10)
    took = time.monotonic() - started
    assert slow.accepted == 1  # followed
    assert 1.5 - 0.2 < took < 1.5 + 1.0, f"took {took:.1f} s for a 1.5 s deadline"


def test_a_stalled_name_lookup_ends_at_the_request_deadline(monkeypatch) -> None:
    """The deadline covers the name lookup too (a resolver that does not answer: the
    fake is at the network's edge, socket.getaddrinfo, which blocks until released)."""
    release = threading.Event()
    real = socket.getaddrinfo

    def stalled(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        if host == "stalled.example":
            release.wait(60)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stalled)
    prom = prom_client.PromQL("http://stalled.example:9090", request_deadline_s=1.5,
                     report_deadline_s=60.0)  # fmt: skip
    started = time.monotonic()
    try:
        with pytest.raises(PrometheusError, match=r"1\.5 s request deadline"):
            prom.range("up", 0, 100, 10)
    finally:
        release.set()
    took = time.monotonic() - started
    assert 1.5 - 0.2 < took < 1.5 + 1.0, f"took {took:.1f} s for a 1.5 s deadline"
