"""HTTP requests with a total deadline, connect to last byte.

A socket timeout bounds one recv, so a server sending one byte at a time never trips it:
a request that must end by a deadline needs the deadline enforced on the connection
itself. `deadline_opener` gives a urllib opener whose connections a watchdog shuts down
when the deadline passes; whichever read is blocked then (status line, headers, body, TLS
handshake) ends at once, and `watchdog.fired` says why it ended. The host name is
looked up by the same deadline.

The watchdog watches the connections of HTTP and HTTPS only, so the opener speaks nothing
else: it is built from its handlers alone (urllib's `build_opener` adds FTP, file and data
handlers), and a redirect to any other scheme is `RedirectRefused`, not followed. A
redirect within http(s) is followed under the same deadline.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

WEB_SCHEMES = ("http", "https")


class RedirectRefused(urllib.error.URLError):
    """A server redirected to a URL outside http(s); `location` is where (as sent)."""

    def __init__(self, location: str) -> None:
        super().__init__(f"redirected to {location}")
        self.location = location


class _WebOnlyRedirect(urllib.request.HTTPRedirectHandler):
    def http_error_302(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any
    ) -> Any:
        # checked before urllib's own scheme check, which lets ftp:// through
        location = headers.get("location") or headers.get("uri")
        if location is not None:
            newurl = urllib.parse.urljoin(req.full_url, location)
            if urllib.parse.urlsplit(newurl).scheme.lower() not in WEB_SCHEMES:
                raise RedirectRefused(location)
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _resolve(host: str, port: int, deadline: float) -> list[tuple[Any, ...]]:
    """socket.getaddrinfo by `deadline`: the lookup runs on a thread of its own (nothing
    can interrupt a resolver that does not answer; the thread ends when it does)."""
    box: list[Any] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            box.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except OSError as exc:
            box.append(exc)
        finally:
            done.set()

    threading.Thread(target=lookup, name="serwatt-resolve", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        raise TimeoutError("the deadline passed while looking up the host name")
    if isinstance(box[0], OSError):
        raise box[0]
    return list(box[0])


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
        host, port = address
        failure: OSError | None = None
        for *_kind, sockaddr in _resolve(host, port, self.deadline):
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the deadline passed before connecting")
            try:  # a numeric address: create_connection looks nothing up
                sock = socket.create_connection(sockaddr[:2], left, source_address)
                break
            except OSError as exc:
                failure = exc
        else:
            raise failure or OSError(f"{host}: no address to connect to")
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
    It speaks http(s) only (a URL or redirect of another scheme is an error, the latter
    RedirectRefused). Proxies from the environment still apply: a proxy's connection is
    made by the watched classes too."""
    with _Watchdog(deadline) as watchdog:
        opener = urllib.request.OpenerDirector()
        for handler in (
            urllib.request.ProxyHandler(),
            urllib.request.UnknownHandler(),
            _WatchedHTTP(watchdog),
            _WatchedHTTPS(watchdog),
            urllib.request.HTTPDefaultErrorHandler(),
            _WebOnlyRedirect(),
            urllib.request.HTTPErrorProcessor(),
        ):
            opener.add_handler(handler)
        yield opener, watchdog
