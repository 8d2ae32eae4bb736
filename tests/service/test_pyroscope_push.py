"""The daemon's `pyroscope:` push (profiler/service/pyroscope_push.py), against a real HTTP
server on 127.0.0.1 that records what it is sent. No Pyroscope runs here: the requests
are held to the recorded request shape, tests/fixtures/pyroscope/ingest_request.json
(Pyroscope's documented /ingest API; docs/daemon.md says the push is unverified against a
live server)."""

from __future__ import annotations

import gzip
import http.server
import json
import re
import signal
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from serwatt.profiler.cli.daemon import PPROF_ENCODER
from serwatt.profiler.profile.pprof import Profile
from serwatt.profiler.profile.stack_profile import StackFigures, StackProfile
from serwatt.profiler.service.config_pyroscope import PyroscopeConfig
from serwatt.profiler.service.ledger import Ledger
from serwatt.profiler.service.pyroscope_push import MAX_QUEUED, PushJob, PyroscopePusher
from tests.daemon_support import (
    daemon_config,
    start_daemon,
    start_workload,
    stop_process,
    total,
    wait_for,
)

SHAPE = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures/pyroscope/ingest_request.json").read_text()
)


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names in lower case (HTTP's are case-insensitive)
    body: bytes


class Server:
    """A real HTTP server that records each request; `hold_s`: how long it sits on a
    request before answering; `answer`: (status, headers) it answers with."""

    def __init__(self, hold_s: float = 0.0, answer: tuple[int, dict[str, str]] = (200, {})):
        self.seen: list[Seen] = []
        self.released = threading.Event()  # close() ends a hold early
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                self._answer(*answer)

            def do_GET(self) -> None:  # noqa: N802 (a followed redirect arrives as a GET)
                self._answer(200, {})

            def _answer(self, status: int, headers: dict[str, str]) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                url = urllib.parse.urlsplit(self.path)
                outer.seen.append(
                    Seen(self.command, url.path, urllib.parse.parse_qs(url.query),
                         {k.lower(): v for k, v in self.headers.items()}, body)
                )  # fmt: skip
                outer.released.wait(hold_s)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory():
    made: list[Server] = []

    def make(**kw: Any) -> Server:
        made.append(Server(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def shape_problems(req: Seen) -> list[str]:
    """What of `req` differs from the recorded shape (empty: it matches)."""
    problems = []
    if req.method != SHAPE["method"] or req.path != SHAPE["path"]:
        problems.append(f"{req.method} {req.path}")
    q, want = req.query, SHAPE["query"]
    if any(len(v) != 1 for v in q.values()):
        problems.append(f"a repeated query key: {q}")
    missing = set(want["required"]) - set(q)
    extra = set(q) - set(want["required"]) - set(want["optional"])
    if missing or extra:
        problems.append(f"query keys: missing {missing}, unknown {extra}")
    for k, v in want["values"].items():
        if q.get(k) != [v]:
            problems.append(f"{k}={q.get(k)}")
    for k in want["unix_seconds"]:
        if not re.fullmatch(r"[0-9]{10}", q.get(k, [""])[0]):
            problems.append(f"{k}={q.get(k)} is not UNIX seconds")
    if not re.fullmatch(want["name"], q.get("name", [""])[0]):
        problems.append(f"name={q.get('name')}")
    for k, v in SHAPE["headers"].items():
        if req.headers.get(k.lower()) != v:
            problems.append(f"{k}: {req.headers.get(k)}")
    if not req.body.startswith(b"\x1f\x8b"):
        return [*problems, "the body is not gzip"]
    prof = Profile.FromString(gzip.decompress(req.body))
    st = list(prof.string_table)
    types = [[st[t.type], st[t.unit]] for t in prof.sample_type]
    if types != SHAPE["body"]["sample_types"]:
        problems.append(f"sample types {types}")
    if st[prof.default_sample_type] != SHAPE["body"]["default_sample_type"]:
        problems.append(f"default sample type {st[prof.default_sample_type]}")
    for s in prof.sample:
        keys = [st[lb.key] for lb in s.label]
        if keys != SHAPE["body"]["sample_labels"]:
            problems.append(f"sample labels {keys}")
            break
    return problems


def _codepaths(req: Seen) -> dict[str, int]:
    prof = Profile.FromString(gzip.decompress(req.body))
    st = list(prof.string_table)
    out: dict[str, int] = {}
    for s in prof.sample:
        cp = {st[lb.key]: st[lb.str] for lb in s.label}["codepath"]
        out[cp] = out.get(cp, 0) + s.value[0]
    return out


def test_the_recorded_shape_catches_a_wrong_request() -> None:
    good = Seen(
        "POST", "/ingest",
        {"name": ["serwatt-t{target=t,host=h}"], "from": ["1765000000"],
         "until": ["1765000002"], "format": ["pprof"], "spyName": ["serwatt"]},
        {"content-type": "application/octet-stream"},
        PPROF_ENCODER.encode(StackProfile(), 0.0, 1.0, 50.0),
    )  # fmt: skip
    assert shape_problems(good) == []
    assert shape_problems(Seen(**{**good.__dict__, "path": "/push"}))
    assert shape_problems(Seen(**{**good.__dict__, "query": {**good.query, "format": ["folded"]}}))
    assert shape_problems(Seen(**{**good.__dict__, "query": {**good.query, "name": ["a{b}"]}}))
    assert shape_problems(Seen(**{**good.__dict__, "body": b"not gzip"}))
    no_until = {k: v for k, v in good.query.items() if k != "until"}
    assert shape_problems(Seen(**{**good.__dict__, "query": no_until}))


def test_a_real_daemon_pushes_the_recorded_request_shape(tmp_path: Path, server_factory) -> None:
    server = server_factory()
    token = tmp_path / "pyroscope-token"
    token.write_text("s3cret-token\n")
    workload = start_workload(tmp_path, "pushjob")
    daemon = start_daemon(
        tmp_path,
        {"pushjob": {"cmdline": r"pushjob\.py", "labels": {"variant": "a-1"}}},
        window_s=1,
        pyroscope={
            "url": server.url,
            "period_s": 2,
            "timeout_s": 1,
            "tenant_id": "team-a",
            "auth": {"bearer_token_file": str(token)},
        },
    )
    try:
        wait_for(
            lambda: sum(1 for r in server.seen if _codepaths(r)) >= 2,
            120,
            f"two pushes with samples (daemon log: {tmp_path / 'daemon.log'})",
        )
        code, _ = daemon.stop()
    finally:
        daemon.kill()
        stop_process(workload)
    assert code == 0, daemon.log()
    assert server.seen
    for req in server.seen:
        assert shape_problems(req) == [], (req.query, daemon.log())
        assert req.headers["authorization"] == "Bearer s3cret-token"
        assert req.headers["x-scope-orgid"] == "team-a"
        name = re.fullmatch(SHAPE["query"]["name"], req.query["name"][0])
        assert name is not None and name["app"] == "serwatt-pushjob"
        assert name["target"] == "pushjob" and req.query["name"][0].endswith(",variant=a-1}")
        start, end = int(req.query["from"][0]), int(req.query["until"][0])
        # a period is 2 s of slots at least (the last one, cut at shutdown, may be less);
        # a slot is one 1 s window plus its applying
        assert 0 < end - start <= 10, req.query
    # periods follow each other: none overlaps the one before by more than the rounding
    spans = [(int(r.query["from"][0]), int(r.query["until"][0])) for r in server.seen]
    assert all(b[0] >= a[1] - 1 for a, b in zip(spans, spans[1:], strict=False)), spans
    seen_codepaths = set().union(*(_codepaths(r) for r in server.seen))
    assert {"pickle", "json"} <= seen_codepaths, seen_codepaths


def test_a_hanging_server_never_holds_the_windows_and_is_counted(
    tmp_path: Path, server_factory
) -> None:
    server = server_factory(hold_s=60)
    workload = start_workload(tmp_path, "hangjob")
    # each push hangs for timeout_s (8 s), eight 1 s windows' worth: a push that held the
    # main loop would stop the windows, and the samples with them, until it gave up
    daemon = start_daemon(
        tmp_path,
        {"hangjob": r"hangjob\.py"},
        window_s=1,
        pyroscope={"url": server.url, "period_s": 10, "timeout_s": 8},
    )
    try:
        wait_for(lambda: server.seen, 120, "the first push")
        hung_at = time.monotonic()
        samples = total(daemon.metrics(), "serwatt_samples_total")
        time.sleep(4)
        during = daemon.metrics()
        assert time.monotonic() - hung_at < 8  # still within the push's timeout
        m = daemon.wait_metric("serwatt_push_errors_total", 1, timeout_s=60, kind="timeout")
        code, took = daemon.stop()
    finally:
        daemon.kill()
        stop_process(workload)
    assert code == 0, daemon.log()
    # the windows went on while the push hung, and the hung push was counted
    assert total(during, "serwatt_samples_total") > samples, daemon.log()
    assert total(during, "serwatt_push_errors_total") == 0
    kinds = {dict(lab)["kind"] for (n, lab) in m if n == "serwatt_push_errors_total"}
    assert kinds == {"timeout"}, m
    # shutdown gives the push thread at most one more timeout_s
    assert took < 8 + 10, took


# ----------------------------------------------------------------- the pusher alone


def _pusher(url: str, **kw: Any) -> tuple[PyroscopePusher, Ledger]:
    ledger = Ledger(version="test")
    cfg = PyroscopeConfig(
        url=url, period_s=kw.pop("period_s", 5.0), timeout_s=kw.pop("timeout_s", 1.0), **kw
    )
    return PyroscopePusher(
        cfg,
        PPROF_ENCODER,
        ledger,
        target_labels={},
        started_at=0.0,
        wall_clock=time.time,
        host="node1",
    ), ledger


def _job() -> PushJob:
    stacks = StackProfile()
    stacks.stacks[((("dumps", "json/__init__.py", 231),), "json", "encode")] = StackFigures(
        samples=3, cpu_s=0.03
    )
    labels = (("target", "t"), ("host", "node1"))
    return PushJob("t", stacks, 1765000000.2, 1765000002.7, 50.0, labels)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ((500, {}), "http_status"),
        ((302, {"Location": "ftp://example.invalid/x"}), "redirect"),
        ((302, {"Location": "/elsewhere"}), "redirect"),  # urllib would re-send as a GET
    ],
)
def test_a_push_the_server_did_not_take_is_counted_by_kind(server_factory, answer, kind) -> None:
    server = server_factory(answer=answer)
    pusher, ledger = _pusher(server.url)
    assert pusher.push(_job()) is False
    assert dict(ledger.publish().push_errors) == {kind: 1}
    assert pusher.pushed == 0


def test_a_refused_connection_is_counted_and_an_accepted_push_is_not() -> None:
    pusher, ledger = _pusher(f"http://127.0.0.1:{_free_port()}")
    assert pusher.push(_job()) is False
    assert dict(ledger.publish().push_errors) == {"connect": 1}


def test_an_accepted_push_counts_no_error_and_has_the_shape(server_factory) -> None:
    server = server_factory()
    pusher, ledger = _pusher(server.url + "/prefix/")
    assert pusher.push(_job()) is True
    assert dict(ledger.publish().push_errors) == {}
    (req,) = server.seen
    assert req.path == "/prefix/ingest"
    assert shape_problems(Seen(**{**req.__dict__, "path": "/ingest"})) == []
    assert req.query["from"] == ["1765000000"] and req.query["until"] == ["1765000003"]
    assert _codepaths(req) == {"json": 3}


def test_a_missing_credentials_file_drops_the_push_without_sending(
    tmp_path: Path, server_factory
) -> None:
    server = server_factory()
    pusher, ledger = _pusher(server.url, basic_auth_file=tmp_path / "gone")
    assert pusher.push(_job()) is False
    assert dict(ledger.publish().push_errors) == {"credentials": 1}
    assert server.seen == []


def test_tick_never_waits_on_a_hanging_server_and_the_queue_is_bounded(server_factory) -> None:
    # the server holds each request past the push's timeout_s (20 s): a tick that waited
    # on the network would take that long, so a quarter of it tells the two apart at
    # any load (the deadline is long so that a loaded machine still delivers the first)
    timeout_s = 20.0
    server = server_factory(hold_s=60)
    pusher, ledger = _pusher(server.url, period_s=1.0, timeout_s=timeout_s)
    pusher.start()
    slowest = 0.0
    try:
        for i in range(MAX_QUEUED + 4):
            pusher._stacks["t"] = _job().stacks
            t0 = time.monotonic()
            pusher.tick(10.0 * (i + 1), 50.0)  # a period has passed at every tick
            slowest = max(slowest, time.monotonic() - t0)
            if i == 0:  # the thread has taken the first job and hangs on it
                wait_for(lambda: server.seen, 60, "the first push")
        drops = ledger.publish().push_errors.get("queue_full", 0)
    finally:
        # the thread must end inside the test: one that logs after it, into pytest's
        # closed capture, prints a "Logging error" into the run's output
        while not pusher._queue.empty():
            pusher._queue.get_nowait()
        pusher._queue.put(None)
        server.close()
        pusher._thread.join(timeout_s)
    assert not pusher._thread.is_alive()
    assert slowest < timeout_s / 4, slowest
    # the thread took one job (or two, if the first timed out meanwhile): the rest queue
    assert MAX_QUEUED + 4 - 2 - MAX_QUEUED <= drops <= MAX_QUEUED + 4 - 1 - MAX_QUEUED, drops


def test_a_period_is_cut_per_target_with_its_labels_and_empty_ones_skipped() -> None:
    ledger = Ledger(version="test")
    pusher = PyroscopePusher(
        PyroscopeConfig(url="http://127.0.0.1:9", period_s=5.0, timeout_s=1.0),
        PPROF_ENCODER,
        ledger,
        # a reload may drop `pyroscope:` from the file while this push keeps running, so
        # its labels were not checked against Pyroscope's syntax: unfit ones stay out
        target_labels={"t": {"variant": "a-1", "bad": "a,b}"}},
        started_at=100.0,
        wall_clock=time.time,
        host="node1",
    )
    pusher._stacks = {"t": _job().stacks, "idle": StackProfile()}
    pusher.tick(104.9, 50.0)  # not a period yet
    assert pusher._queue.empty()
    pusher.tick(105.0, 50.0)
    job = pusher._queue.get_nowait()
    assert pusher._queue.empty()  # `idle` had no stacks: nothing to push
    assert (job.target, job.started_at, job.ended_at, job.rate_hz) == ("t", 100.0, 105.0, 50.0)
    assert job.labels == (("target", "t"), ("host", "node1"), ("variant", "a-1"))
    assert pusher._stacks == {}  # the next period starts empty


def test_a_reload_keeps_the_running_push_and_says_so(tmp_path: Path, server_factory) -> None:
    first, second = server_factory(), server_factory()
    workload = start_workload(tmp_path, "reloadjob")
    push = {"url": first.url, "period_s": 2, "timeout_s": 1}
    daemon = start_daemon(tmp_path, {"reloadjob": r"reloadjob\.py"}, window_s=1, pyroscope=push)
    try:
        wait_for(lambda: first.seen, 120, "a push to the first server")
        (tmp_path / "serwatt.yaml").write_text(
            daemon_config(
                tmp_path / "runs",
                {"reloadjob": r"reloadjob\.py"},
                window_s=1,
                pyroscope=push | {"url": second.url},
            )
        )
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: "reloaded:" in daemon.log(), 60, "the reload")
        pushed = len(first.seen)
        wait_for(lambda: len(first.seen) > pushed, 60, "a push after the reload")
        code, _ = daemon.stop()
    finally:
        daemon.kill()
        stop_process(workload)
    assert code == 0, daemon.log()
    assert "reload: pyroscope changed" in daemon.log()
    assert second.seen == []  # the new URL waits for a restart, as the log says
