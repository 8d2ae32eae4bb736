"""The PromQL input adapter against a hostile server (real HTTP on loopback): size bound,
shape checks, and the error kinds; and the argument parsers. The fleet test
(tests/report/test_fleet.py) runs it against real Prometheus and VictoriaMetrics."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from serwatt.profiler.report import from_prometheus as fp
from serwatt.profiler.report import prom_args, prom_client, prom_matrix
from serwatt.profiler.report.prom_error import PrometheusError


class _Server:
    """Answers every request with (status, body) from `reply`, and keeps the paths."""

    def __init__(self) -> None:
        # one answer to every request, or one per query: reply(query) -> (status, body)
        self.reply: tuple[int, bytes] | Callable[[str], tuple[int, bytes]] = (200, b"{}")
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.paths.append(self.path)
                reply = outer.reply
                if callable(reply):
                    query = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
                    reply = reply(query)
                code, body = reply
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def server():
    s = _Server()
    yield s
    s.close()


def _matrix(series: list[dict]) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": series}}
    ).encode()


def _range(server: _Server) -> list[prom_matrix.Series]:
    return prom_client.PromQL(server.url).range("serwatt_cpu_seconds_total", 0, 100, 10)


def test_a_good_matrix_is_read_and_the_query_sent(server):
    server.reply = (
        200,
        _matrix([{"metric": {"codepath": "torch"}, "values": [[20, "2"], [10, "1"]]}]),
    )
    (s,) = _range(server)
    assert s.labels == {"codepath": "torch"} and s.points == ((10.0, 1.0), (20.0, 2.0))
    assert server.paths[0].startswith("/api/v1/query_range?query=serwatt_cpu_seconds_total")
    assert "step=10" in server.paths[0]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"<html>hi</html>", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode(),
         "not 'matrix'"),
        (_matrix([{"metric": {"a": 1}, "values": []}]), "label is not a string"),
        (_matrix([{"metric": {"a": "x" * 2000}, "values": []}]), "longer than"),
        (_matrix([{"metric": {}, "values": [[1, "NaN"]]}]), "NaN or infinite"),
        (_matrix([{"metric": {}, "values": [[1, "+Inf"]]}]), "NaN or infinite"),
        (_matrix([{"metric": {}, "values": [[1, 2]]}]), 'not [time, "value"]'),
        (_matrix([{"metric": {}, "values": [["1", "2"]]}]), "time is not a number"),
        (_matrix([{"metric": {}, "values": [[1, "two"]]}]), "is not a number"),
        (_matrix([{"metric": {}}]), "lacks its metric labels or values"),
        (_matrix([{"metric": {}, "values": [[i, "1"] for i in range(prom_matrix.MAX_POINTS + 1)]}]),
         "more than"),
        (json.dumps({"status": "error", "error": "boom"}).encode(), "the query failed: boom"),
    ],
)  # fmt: skip
def test_hostile_answers_are_refused_with_the_reason(server, body, words):
    server.reply = (200, body)
    with pytest.raises(PrometheusError) as info:
        _range(server)
    assert words in str(info.value)
    assert not info.value.usage


def test_an_answer_over_the_size_bound_is_not_parsed(server, monkeypatch):
    monkeypatch.setattr(prom_client, "MAX_RESPONSE_BYTES", 1000)
    server.reply = (200, _matrix([{"metric": {"k": "v" * 600}, "values": [[1, "1"]]}] * 3))
    with pytest.raises(PrometheusError) as info:
        _range(server)
    assert "is over 1000 bytes" in str(info.value)
    assert info.value.usage  # the fix is the caller's: a narrower query


def test_too_many_series_is_the_callers_to_narrow(server, monkeypatch):
    monkeypatch.setattr(prom_matrix, "MAX_SERIES", 2)
    server.reply = (200, _matrix([{"metric": {}, "values": []}] * 3))
    with pytest.raises(PrometheusError, match="narrow the selector") as info:
        _range(server)
    assert info.value.usage


@pytest.mark.parametrize(
    ("code", "body", "words", "usage"),
    [
        (400, b'{"status":"error","errorType":"bad_data","error":"parse error"}',
         "refused the query (400): parse error", True),
        (404, b"404 page not found", "has no /api/v1/query_range", True),
        (503, b'{"status":"error","error":"overloaded"}', "HTTP 503: overloaded", False),
    ],
)  # fmt: skip
def test_http_errors_say_what_to_fix(server, code, body, words, usage):
    server.reply = (code, body)
    with pytest.raises(PrometheusError) as info:
        _range(server)
    assert words in str(info.value) and info.value.usage is usage


def test_an_unreachable_server_is_a_runtime_error():
    # A port bound and never listened on: connections are refused, and while the socket
    # is open no other process (a parallel test's server) can take the port.
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{reserved.getsockname()[1]}"
        with pytest.raises(PrometheusError, match="cannot reach") as info:
            prom_client.PromQL(url).range("up", 0, 10, 1)
    assert not info.value.usage


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://localhost:9090", True),
        ("https://vm.example:8428/select/0/prometheus/", True),
        ("localhost:9090", False),
        ("ftp://x", False),
        ("http://", False),
        ("http://h:1/?q=1", False),
    ],
)
def test_urls(url, ok):
    if ok:
        assert not prom_args.check_url(url).endswith("/")
    else:
        with pytest.raises(PrometheusError, match="--prometheus"):
            prom_args.check_url(url)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('{variant="many"}', '{variant="many"}'),
        (" { variant = 'many' , job_name=~\"gpt.*\" } ", "{variant='many', job_name=~\"gpt.*\"}"),
        ('{a!="x\\"y"}', '{a!="x\\"y"}'),
    ],
)
def test_good_selectors(text, want):
    assert prom_args.check_selector(text, "--baseline") == want


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("variant=many", "in braces"),
        ("{}", "empty selector"),
        ('{__name__="x"}', "leave the metric name out"),
        ('{variant="many" job="x"}', "separated by commas"),
        ("{variant=many}", "cannot read a label matcher"),
        ('{variant="many"} or vector(1)', "in braces"),
        ('{variant="a"}) or (up{x="1"}', "separated by commas"),
    ],
)
def test_bad_selectors(text, words):
    with pytest.raises(PrometheusError, match="--baseline") as info:
        prom_args.check_selector(text, "--baseline")
    assert words in str(info.value) and info.value.usage


def test_durations_times_and_ranges():
    assert prom_args.parse_duration("1h30m", "--range") == 5400
    assert prom_args.parse_duration("90s", "--range") == 90
    for bad in ("", "30", "30 minutes", "0s", "-5m", "1h 30m"):
        with pytest.raises(PrometheusError, match="not a duration"):
            prom_args.parse_duration(bad, "--range")
    now = 1_800_000_000.0
    assert prom_args.parse_range("30m", "--range", now=now) == (now - 1800, now)
    assert prom_args.parse_range("now-1h..now-30m", "--range", now=now) == (now - 3600, now - 1800)
    assert (
        prom_args.parse_range("2026-12-01T10:00:00Z..2026-12-01T10:30:00Z", "--r", now=now)[1]
        - (prom_args.parse_range("2026-12-01T10:00:00Z..2026-12-01T10:30:00Z", "--r", now=now)[0])
        == 1800
    )
    with pytest.raises(PrometheusError, match="time zone"):
        prom_args.parse_range("2026-12-01T10:00:00..now", "--range", now=now)
    with pytest.raises(PrometheusError, match="not after the start"):
        prom_args.parse_range("now..now-1h", "--range", now=now)
    assert prom_args.default_step(0, 1800) == 60 and prom_args.default_step(0, 36000) == 1200


def test_counter_deltas_count_a_reset_as_the_new_value():
    assert fp._deltas([(0, 5.0), (10, 7.0), (20, 1.0), (30, 4.0)]) == {10: 2.0, 20: 1.0, 30: 3.0}


def test_a_step_whose_cpu_moved_without_samples_is_a_window(server):
    """A target's last window, cut short by its exit, can hold CPU and no sample (the
    record keeps its CPU-seconds). A step in which nothing moved is no window."""
    labels = {"job": "serwatt", "instance": "n:1", "target": "trainer", "codepath": "other"}
    counters = {
        "serwatt_cpu_seconds_total": ["0", "0.5", "1.0", "1.05", "1.05"],
        "serwatt_samples_total": ["0", "10", "20", "20", "20"],
    }

    def reply(query: str) -> tuple[int, bytes]:
        name = query.split("{", 1)[0]
        if name in counters:
            values = [[10 * i, v] for i, v in enumerate(counters[name])]
            return 200, _matrix([{"metric": labels, "values": values}])
        if name in ("serwatt_sample_rate_hz", "serwatt_build_info"):
            info = {"job": "serwatt", "instance": "n:1", "version": "0.1.0"}
            return 200, _matrix([{"metric": info, "values": [[0, "20"], [40, "20"]]}])
        return 200, _matrix([])

    server.reply = reply
    side = fp.SideQuery("baseline", '{target="trainer"}', 0.0, 40.0, 10.0)
    (run,), idle = fp.load_side(prom_client.PromQL(server.url), side)
    assert idle == []
    assert [(w.ended_at, w.codepaths["other"].samples) for w in run.windows] == [
        (10.0, 10),
        (20.0, 10),
        (30.0, 0),
    ]
    assert sum(w.cpu_s for w in run.windows) == pytest.approx(1.05, abs=1e-12)
