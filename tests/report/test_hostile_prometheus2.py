"""`report --prometheus` against hostile servers and arguments (issue 21, findings 3, 4, 7):
a server that drips its answer is cut at the request's total deadline, a report's queries
together at the report's deadline; an answer that would blow up while parsing is refused
before it is parsed; bad ranges and URLs are one error line with exit 2.

The servers are real sockets on 127.0.0.1 (port 0), each serving a bounded number of
connections with a bounded number of bytes, so they stop by themselves."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from serwatt.profiler import deadline_http
from serwatt.profiler.cli.main import main
from serwatt.profiler.report import from_prometheus as fp
from serwatt.profiler.report import prom_client, prom_matrix
from serwatt.profiler.report.prom_error import PrometheusError

REPO = Path(__file__).resolve().parents[2]


class _RawServer:
    """Accepts up to `connections` clients; `serve(conn)` talks to each one in turn."""

    def __init__(self, serve: Callable[[socket.socket], None], connections: int = 20) -> None:
        self._serve = serve
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._left = connections
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while self._left > 0 and not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._left -= 1
            with conn:
                conn.settimeout(5.0)
                try:
                    _read_head(conn)
                    self._serve(conn)
                except OSError:
                    pass  # the client gave up: that is what these servers test

    def stopped(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._listener.close()


def _read_head(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk


@pytest.fixture()
def raw_server() -> Iterator[Callable[..., _RawServer]]:
    made: list[_RawServer] = []

    def make(serve: Callable[[socket.socket], None], connections: int = 20) -> _RawServer:
        s = _RawServer(serve, connections)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


DRIP_S = 0.3  # shorter than every deadline below: a per-recv timeout would never fire


def _drip(server_stopped: Callable[[], bool], conn: socket.socket, data: bytes) -> None:
    for i in range(len(data)):  # bounded: at most len(data) * DRIP_S seconds
        if server_stopped():
            return
        conn.sendall(data[i : i + 1])
        time.sleep(DRIP_S)


def _matrix(series: list[dict]) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": series}}
    ).encode()


def test_a_dripping_body_ends_at_the_request_deadline(raw_server) -> None:
    holder: list[_RawServer] = []

    def serve(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        )
        _drip(holder[0].stopped, conn, b"x" * 100)  # 30 s if nobody hangs up

    server = raw_server(serve)
    holder.append(server)
    prom = prom_client.PromQL(server.url, request_deadline_s=1.5, report_deadline_s=60.0)
    started = time.monotonic()
    with pytest.raises(PrometheusError) as info:
        prom.range("serwatt_cpu_seconds_total", 0, 100, 10)
    took = time.monotonic() - started
    assert took < 1.5 + 1.0, f"the request ran {took:.1f} s past its 1.5 s deadline"
    message = str(info.value)
    assert "1.5 s request deadline" in message and "\n" not in message
    assert not info.value.usage  # the server's fault: exit 1


def test_dripped_headers_end_at_the_request_deadline(raw_server) -> None:
    holder: list[_RawServer] = []

    def serve(conn: socket.socket) -> None:
        _drip(holder[0].stopped, conn, b"HTTP/1.1 200 OK\r\n" + b"X-Pad: y\r\n" * 20)

    server = raw_server(serve)
    holder.append(server)
    prom = prom_client.PromQL(server.url, request_deadline_s=1.5, report_deadline_s=60.0)
    started = time.monotonic()
    with pytest.raises(PrometheusError, match=r"1\.5 s request deadline"):
        prom.range("serwatt_cpu_seconds_total", 0, 100, 10)
    assert time.monotonic() - started < 1.5 + 1.0


def test_the_reports_deadline_bounds_all_its_queries_together(raw_server) -> None:
    """Each answer is quick enough for its own deadline; the report's queries together
    are not."""
    body = _matrix(
        [
            {
                "metric": {"codepath": "torch", "target": "t", "job": "j", "instance": "i"},
                "values": [[0, "1"], [60, "2"], [120, "3"]],
            }
        ]
    )
    holder: list[_RawServer] = []

    def serve(conn: socket.socket) -> None:
        for _ in range(4):  # 0.4 s, then the answer
            if holder[0].stopped():
                return
            time.sleep(0.1)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    server = raw_server(serve)
    holder.append(server)
    side = fp.SideQuery("baseline", '{variant="a"}', 0.0, 120.0, 60.0)
    other = fp.SideQuery("candidate", '{variant="b"}', 0.0, 120.0, 60.0)
    started = time.monotonic()
    with pytest.raises(PrometheusError) as info:
        fp.load_sides(server.url, side, other, request_deadline_s=10.0, report_deadline_s=1.0)
    took = time.monotonic() - started
    assert took < 1.0 + 1.0, f"the report ran {took:.1f} s past its 1 s deadline"
    assert "1 s report deadline" in str(info.value)
    assert not info.value.usage


def test_a_deadline_that_passes_before_connecting_is_the_deadline(raw_server, monkeypatch) -> None:
    # under load the report's deadline can pass between two queries, before the
    # watchdog's timer thread has run (here: it never runs): the error must name the
    # deadline, not say the server cannot be reached (a fresh-clone suite run did)
    monkeypatch.setattr(deadline_http._Watchdog, "_fire", lambda self: None)
    server = raw_server(lambda conn: None)
    with pytest.raises(TimeoutError):
        prom_client._http_get(f"{server.url}/api/v1/query_range?query=up", time.monotonic() - 1.0)
    prom = prom_client.PromQL(server.url, request_deadline_s=10.0, report_deadline_s=0.0)
    with pytest.raises(PrometheusError, match="0 s report deadline"):
        prom.range("up", 0.0, 60.0, 60.0)


def test_a_short_body_is_an_error_line_not_a_traceback(raw_server) -> None:
    def serve(conn: socket.socket) -> None:
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"status"')

    server = raw_server(serve)
    with pytest.raises(PrometheusError, match="cannot read the answer") as info:
        prom_client.PromQL(server.url).range("up", 0, 100, 10)
    assert not info.value.usage


# --------------------------------------------------------------------------- memory

# Peak RSS of one parse, in a fresh interpreter: the body is built first, the peak is
# reset (/proc/self/clear_refs 5), then only the parse is measured.
_MEASURE = textwrap.dedent(
    """
    import json, sys
    from serwatt.profiler.report import prom_matrix
    from serwatt.profiler.report.prom_error import PrometheusError

    def rss_kib(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])

    n, how = int(sys.argv[1]), sys.argv[2]
    item = b'{"metric":{},"values":[]}'
    body = b'{"status":"success","data":{"resultType":"matrix","result":[' + (
        item + b","
    ) * (n - 1) + item + b"]}}"
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss_kib("VmRSS")
    outcome = "parsed"
    try:
        if how == "control":
            doc = json.loads(body)
        else:
            prom_matrix.parse_matrix(body)
    except PrometheusError as exc:
        outcome = str(exc)
    print(json.dumps({"bytes": len(body), "grew": (rss_kib("VmHWM") - before) * 1024,
                      "outcome": outcome}))
    """
)


def _peak(n: int, how: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(n), how],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


@pytest.mark.long  # millions of series, at full size
def test_an_answer_of_millions_of_empty_series_is_refused_before_it_is_parsed() -> None:
    """1 M empty series (27 MB, within the byte cap): json.loads alone grows RSS by over
    ten times the body (the control); the parse refuses it growing by less than the body."""
    n = 1_000_000
    control = _peak(n, "control")
    assert control["outcome"] == "parsed"
    assert control["grew"] > 10 * control["bytes"], control  # the measurement sees a blow-up
    ours = _peak(n, "parse_matrix")
    assert "narrow the selector" in ours["outcome"], ours
    assert ours["grew"] < ours["bytes"], ours


def test_a_sound_answer_within_every_bound_is_still_read() -> None:
    series = [
        {"metric": {"codepath": "torch", "instance": f"n{i}"},
         "values": [[t * 60, str(t)] for t in range(50)]}
        for i in range(200)
    ]  # fmt: skip
    parsed = prom_matrix.parse_matrix(_matrix(series))
    assert len(parsed) == 200 and all(len(s.points) == 50 for s in parsed)


def test_more_points_than_one_answer_may_hold_is_the_callers_to_narrow(monkeypatch) -> None:
    monkeypatch.setattr(prom_matrix, "MAX_ANSWER_POINTS", 100)
    series = [{"metric": {}, "values": [[t, "1"] for t in range(60)]}] * 2
    with pytest.raises(PrometheusError, match="points in one answer") as info:
        prom_matrix.parse_matrix(_matrix(series))
    assert info.value.usage


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--range", "0..inf"], "--range"),
        (["--range", "1e18..1.000001e18"], "--range"),
        (["--range=-1e15..0"], "--range"),
        (["--range", "9" * 400 + "s"], "--range"),
        (["--range", "30m", "--step", "9" * 400 + "s"], "--step"),
        (["--range", "now-99999999999999w..now"], "--range"),
    ],
)
def test_bad_ranges_are_one_error_line(capsys, args, words) -> None:
    code = main(
        ["report", "--prometheus", "http://127.0.0.1:9", "--baseline", '{v="a"}',
         "--candidate", '{v="b"}', *args]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err, err


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:abc", "http://127.0.0.1:99999"])
def test_bad_urls_are_one_error_line(capsys, url) -> None:
    code = main(
        ["report", "--prometheus", url, "--baseline", '{v="a"}', "--candidate", '{v="b"}',
         "--range", "30m"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "--prometheus" in err, err
