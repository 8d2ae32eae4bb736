"""Hostile HTTP clients against the daemon's endpoint (MetricsServer), on real sockets.

Idle connections must not cost threads, a client that never finishes its request is
dropped at its deadline, /metrics answers while others hold connections, and a client
that goes away mid-response is a debug line, not a traceback.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from serwatt.profiler.service import exporter
from serwatt.profiler.service.exporter import MetricsServer, make_registry
from serwatt.profiler.service.ledger import Ledger, LedgerSnapshot

WORKERS = 4  # the documented bound (exporter.HTTP_WORKERS)
MAX_CONNECTIONS = 64  # exporter.HTTP_MAX_CONNECTIONS


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.set_targets(["trainer"])
    ledger.add_window(
        "trainer", samples={("pickle", "encode"): 3}, cpu_s={("pickle", "encode"): 0.3}
    )
    ledger.publish()
    return ledger


def _start(get_snapshot: Callable[[], LedgerSnapshot] | None = None, **kw) -> MetricsServer:
    ledger = _ledger()
    get = get_snapshot or ledger.snapshot
    srv = MetricsServer("127.0.0.1:0", make_registry(get), get, **kw)
    srv.start()
    return srv


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def _connect(srv: MetricsServer, clients: list[socket.socket]) -> socket.socket:
    host, port = srv.address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    clients.append(s)
    return s


def _scrape(srv: MetricsServer) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://{srv.address}/metrics", timeout=10) as resp:
        return resp.status, resp.read().decode()


def _closed_by_peer(s: socket.socket) -> bool:
    """True once the server has closed this connection (EOF or reset), False on timeout."""
    try:
        return s.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_idle_clients_cost_no_threads_and_metrics_still_answers(clients) -> None:
    srv = _start()
    try:
        assert _scrape(srv)[0] == 200
        before = threading.active_count()
        # More idle clients than the connection bound: the oldest that sent nothing make
        # room for new ones, so a scraper still gets in.
        for _ in range(MAX_CONNECTIONS + 36):
            _connect(srv, clients)
        time.sleep(0.5)  # let the server accept them all
        status, body = _scrape(srv)
        assert status == 200 and "serwatt_samples_total" in body
        grown = threading.active_count() - before
        assert grown <= WORKERS, f"{grown} threads for {len(clients)} idle connections"
        assert exporter.HTTP_WORKERS == WORKERS
        assert exporter.HTTP_MAX_CONNECTIONS == MAX_CONNECTIONS
    finally:
        srv.close()


def test_a_client_that_never_finishes_its_request_is_dropped_at_the_deadline(clients) -> None:
    srv = _start(connection_timeout_s=1.0)
    try:
        slow = _connect(srv, clients)
        silent = _connect(srv, clients)
        slow.settimeout(0.2)
        silent.settimeout(0.2)
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        t0 = time.monotonic()
        slow_closed = silent_closed = None
        # Slowloris: a header line every 0.2 s keeps a per-read timeout from firing,
        # the connection's deadline does not.
        while time.monotonic() - t0 < 10 and (slow_closed is None or silent_closed is None):
            try:
                slow.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                slow_closed = slow_closed or time.monotonic() - t0
            if slow_closed is None and _closed_by_peer(slow):
                slow_closed = time.monotonic() - t0
            if silent_closed is None and _closed_by_peer(silent):
                silent_closed = time.monotonic() - t0
        assert slow_closed is not None, "the slow client was never dropped"
        assert silent_closed is not None, "the silent client was never dropped"
        assert slow_closed >= 0.9 and silent_closed >= 0.9  # not before its deadline
        assert _scrape(srv)[0] == 200
    finally:
        srv.close()


def test_a_client_gone_mid_response_is_a_debug_line_not_a_traceback(clients, caplog, capfd) -> None:
    ledger = _ledger()
    handling = threading.Event()
    proceed = threading.Event()

    def slow_snapshot() -> LedgerSnapshot:
        handling.set()
        proceed.wait(10)
        return ledger.snapshot()

    caplog.set_level(logging.DEBUG, logger="serwatt.profiler.service.exporter")
    srv = _start(slow_snapshot)
    try:
        s = _connect(srv, clients)
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert handling.wait(10), "the request never reached the handler"
        # Close with a reset (linger 0) while the server is building the response.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        time.sleep(0.1)
        proceed.set()

        stderr: list[str] = []

        def done() -> bool:
            stderr.append(capfd.readouterr().err)
            gone = any("went away" in r.getMessage() for r in caplog.records)
            return gone or "Traceback" in "".join(stderr)

        deadline = time.monotonic() + 10
        while not done() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # anything printed after the first sign
        err = "".join(stderr) + capfd.readouterr().err
        assert "Traceback" not in err and "Exception" not in err, err
        gone = [r for r in caplog.records if "went away" in r.getMessage()]
        assert gone and all(r.levelno == logging.DEBUG and r.exc_info is None for r in gone)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        handling.clear()
        assert _scrape(srv)[0] == 200  # the server goes on
    finally:
        proceed.set()
        srv.close()


def test_an_oversized_request_head_is_refused(clients) -> None:
    srv = _start()
    try:
        s = _connect(srv, clients)
        s.settimeout(5)
        try:
            s.sendall(b"GET /" + b"a" * 200_000)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
        assert data.startswith(b"HTTP/1.0 431") or data == b"", data[:80]
        assert _scrape(srv)[0] == 200
    finally:
        srv.close()


def test_a_request_past_its_deadline_in_a_busy_worker_costs_no_cpu(clients) -> None:
    """A request whose worker is stuck past the connection's deadline: the serving loop
    must wait for it, not spin (it once woke for the expired deadline at every turn)."""
    import psutil

    ledger = _ledger()
    release = threading.Event()

    def stuck_snapshot() -> LedgerSnapshot:
        release.wait(10)
        return ledger.snapshot()

    srv = _start(stuck_snapshot, workers=1, connection_timeout_s=0.3)
    try:
        for _ in range(2):  # one in the worker, one queued behind it
            _connect(srv, clients).sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        time.sleep(0.6)  # both past their deadline
        me = psutil.Process()
        before = sum(me.cpu_times()[:2])
        time.sleep(1.0)
        used = sum(me.cpu_times()[:2]) - before
        assert used < 0.1, f"{used:.2f} CPU s in 1 s while waiting for a stuck worker"
    finally:
        release.set()
        srv.close()
