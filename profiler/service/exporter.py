"""The daemon's HTTP endpoint: `/metrics` (Prometheus exposition) and `/` (the status
page) on one address, with bounded threads and per-connection deadlines.

What is exported and how a snapshot becomes metric families is metrics.py; the page at
`/` is status_page.py. Their public names are re-exported here for the daemon and the
tests that import them from this module.
"""

from __future__ import annotations

import io
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from serwatt.profiler.service.config import parse_listen
from serwatt.profiler.service.ledger import LedgerSnapshot
from serwatt.profiler.service.metrics import (
    METRIC_NAMES,
    METRICS,
    MetricSpec,
    SeriesCount,
    SnapshotCollector,
    build_families,
    make_registry,
    series_count,
)
from serwatt.profiler.service.status_page import render_landing_page

__all__ = [
    "HTTP_CONNECTION_TIMEOUT_S",
    "HTTP_MAX_CONNECTIONS",
    "HTTP_MAX_REQUEST_HEAD",
    "HTTP_WORKERS",
    "METRICS",
    "METRIC_NAMES",
    "MetricSpec",
    "MetricsServer",
    "SeriesCount",
    "SnapshotCollector",
    "build_families",
    "make_registry",
    "render_landing_page",
    "series_count",
]

log = logging.getLogger(__name__)


# A scraper, a browser and a curl need a few threads; idle and slow clients get none.
HTTP_WORKERS = 4  # threads answering complete requests, whatever the number of clients
# Open connections at most; at the bound the oldest one still sending its request is
# dropped for a new one, so connections held open by idle clients cannot lock a
# scraper out for long.
HTTP_MAX_CONNECTIONS = 64
# A connection's whole life, reading its request and writing the response: a client
# that dribbles a header byte at a time (slowloris) is dropped here too. Prometheus'
# default scrape_timeout.
HTTP_CONNECTION_TIMEOUT_S = 10.0
HTTP_MAX_REQUEST_HEAD = 8192  # bytes of request line + headers; a GET has no body
_HEAD_ENDS = (b"\r\n\r\n", b"\n\n")
_TOO_LARGE = (
    b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    peer: str
    deadline: float  # time.monotonic() by which it is closed, whatever state it is in
    head: bytearray = field(default_factory=bytearray)
    handed: bool = False  # the request is complete and queued for (or in) a worker
    expired: bool = False  # closed by its deadline, not by the client


class _SocketWriter(io.BufferedIOBase):
    """`wfile` of a handler: every write goes out whole (sendall) or raises."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[no-untyped-def, override]
        self._sock.sendall(data)
        return len(memoryview(data))


class _HttpServer:
    """One thread reads request heads from every connection without blocking (a
    selector); complete requests go to a pool of HTTP_WORKERS threads. So an idle or
    slow client holds a file descriptor, never a thread, and every connection is
    closed at its deadline."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        *,
        workers: int,
        max_connections: int,
        connection_timeout_s: float,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))  # binds now: OSError if it cannot
            listener.listen(max_connections)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._handler = handler
        self._max_connections = max_connections
        self._timeout_s = connection_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="serwatt-http")
        self._lock = threading.Lock()  # guards _conns and closing their sockets
        self._conns: dict[socket.socket, _Connection] = {}  # in accept order
        self._stopping = threading.Event()
        self._accept_failing = False  # warn once per run of failed accepts
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)

    @property
    def server_address(self) -> tuple:
        return self._listener.getsockname()

    def serve(self) -> None:
        while not self._stopping.is_set():
            try:
                self._serve_once()
            except Exception:  # a bug here must not leave the endpoint dead
                log.exception("http: the connection loop failed; going on")
                time.sleep(0.1)

    def _serve_once(self) -> None:
        for key, _events in self._selector.select(self._wait_s()):
            if key.fileobj is self._listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._wake_r.recv(64)
            else:
                self._read(key.data)
        self._expire(time.monotonic())

    def _wait_s(self) -> float:
        with self._lock:
            # An expired connection waits for its worker to close it: not a wake-up.
            first = min((c.deadline for c in self._conns.values() if not c.expired), default=None)
        return 1.0 if first is None else min(1.0, max(0.0, first - time.monotonic()))

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE and friends: the backlog keeps the client
                (log.debug if self._accept_failing else log.warning)(
                    "http: cannot accept a connection: %s", exc
                )
                self._accept_failing = True
                time.sleep(0.05)
                return
            self._accept_failing = False
            peer = str(addr[0])
            conn = _Connection(sock, peer, time.monotonic() + self._timeout_s)
            with self._lock:
                if len(self._conns) >= self._max_connections:
                    oldest = next((c for c in self._conns.values() if not c.handed), None)
                    if oldest is None:  # every slot is a request being answered
                        log.debug("http %s: refused, %d connections open", peer, len(self._conns))
                        sock.close()
                        continue
                    log.debug("http %s: dropped for a new connection (no request)", oldest.peer)
                    self._drop_locked(oldest)
                sock.setblocking(False)
                self._conns[sock] = conn
                self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection) -> None:
        try:
            chunk = conn.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("http %s: client went away before its request (%s)", conn.peer, exc)
            chunk = b""
        if not chunk:
            with self._lock:
                self._drop_locked(conn)
            return
        conn.head += chunk
        if any(end in conn.head for end in _HEAD_ENDS):
            with self._lock:
                self._selector.unregister(conn.sock)
                conn.handed = True
                conn.sock.settimeout(max(0.001, conn.deadline - time.monotonic()))
            self._pool.submit(self._answer, conn)
        elif len(conn.head) > HTTP_MAX_REQUEST_HEAD:
            log.debug("http %s: request head over %d bytes", conn.peer, HTTP_MAX_REQUEST_HEAD)
            try:
                conn.sock.send(_TOO_LARGE)
            except OSError:
                pass  # it is being dropped either way
            with self._lock:
                self._drop_locked(conn)

    def _answer(self, conn: _Connection) -> None:
        try:
            if not conn.expired:
                self._handler((conn.sock, bytes(conn.head)), (conn.peer, 0), self)  # type: ignore[arg-type]
        except OSError as exc:  # reset, broken pipe, a send past the deadline
            what = "dropped at its deadline" if conn.expired else "client went away"
            log.debug("http %s: %s mid-response (%s)", conn.peer, what, exc)
        except Exception:
            log.exception("http %s: answering the request failed", conn.peer)
        finally:
            with self._lock:
                self._conns.pop(conn.sock, None)
                conn.sock.close()

    def _expire(self, now: float) -> None:
        with self._lock:
            for conn in [c for c in self._conns.values() if c.deadline <= now]:
                if conn.handed:
                    if not conn.expired:
                        # A worker is writing to (or about to answer) it: a shutdown makes
                        # its blocked send fail at once; the worker closes the socket.
                        conn.expired = True
                        _shutdown(conn.sock)
                else:
                    log.debug("http %s: no complete request within %g s", conn.peer,
                              self._timeout_s)  # fmt: skip
                    self._drop_locked(conn)

    def _drop_locked(self, conn: _Connection) -> None:
        """Forget and close a connection no worker has; the caller holds _lock."""
        self._conns.pop(conn.sock, None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def stop(self) -> None:
        self._stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self) -> None:
        with self._lock:
            for conn in list(self._conns.values()):
                if conn.handed:
                    conn.expired = True
                    _shutdown(conn.sock)
                else:
                    self._drop_locked(conn)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:  # requests whose worker never started
            for conn in list(self._conns.values()):
                self._conns.pop(conn.sock, None)
                conn.sock.close()
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already reset by the client


class MetricsServer:
    """`/metrics` (Prometheus exposition) and `/` (landing page) on one address.

    At most `workers` threads answer requests however many clients connect; each
    connection is closed `connection_timeout_s` after it was accepted.
    """

    def __init__(
        self,
        listen: str,
        registry: CollectorRegistry,
        get_snapshot: Callable[[], LedgerSnapshot],
        *,
        workers: int = HTTP_WORKERS,
        max_connections: int = HTTP_MAX_CONNECTIONS,
        connection_timeout_s: float = HTTP_CONNECTION_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """clock: epoch seconds on the snapshots' clock (the daemon's, service/clock.py),
        for the landing page's "snapshot taken N s ago"."""
        host, port = parse_listen(listen, any_port=True)
        self.registry = registry
        self._get_snapshot = get_snapshot
        self._clock = clock
        self._httpd = _HttpServer(
            host,
            port,
            _make_handler(self),
            workers=workers,
            max_connections=max_connections,
            connection_timeout_s=connection_timeout_s,
        )
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve, name="serwatt-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.stop()
            self._thread.join(timeout=5)
        self._httpd.close()


def _make_handler(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # One request per connection (HTTP/1.0), its head already read by _HttpServer.
        def setup(self) -> None:
            sock, head = self.request
            self.connection = sock
            self.rfile = io.BytesIO(head)
            self.wfile = _SocketWriter(sock)

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                body = encoder(server.registry)
                self._send(200, content_type, body)
            elif path == "/":
                page = render_landing_page(
                    server._get_snapshot(), listen=server.address, now=server._clock()
                )
                self._send(200, "text/html; charset=utf-8", page.encode())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: try / or /metrics\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002
            log.debug("http %s: " + format, self.address_string(), *args)

    return Handler
