"""Prometheus export of the ledger's latest snapshot, and the daemon's HTTP endpoint.

`SnapshotCollector` is a prometheus_client custom collector: on each scrape it
turns the latest immutable `LedgerSnapshot` into fresh metric families. It reads,
formats and returns; it never samples, reads sysfs or takes the ledger's lock, so
a scrape costs the same whatever the daemon is doing. It is registered in its own
`CollectorRegistry`, never the process-global one.

`METRICS` is the metric contract (name, type, labels, HELP); the contract test,
the dashboards test and the docs are checked against it.

Example exposition lines:
    serwatt_cpu_seconds_total{codepath="pickle",target="trainer"} 12.5
    serwatt_energy_joules_total{codepath="pickle",source="model",target="trainer"} 301.2
"""

from __future__ import annotations

import functools
import html
import io
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

from profiler.classify.codepaths import CODEPATHS
from profiler.service.config import parse_listen
from profiler.service.ledger import LedgerSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricSpec:
    name: str  # as exposed (counters include `_total`)
    type: str  # "counter" | "gauge" | "info" (an info is a gauge of value 1 in text format 0.0.4)
    labels: tuple[str, ...]
    help: str


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "serwatt_samples_total",
        "counter",
        ("target", "codepath"),
        "Stack samples of the target's threads classified into the codepath.",
    ),
    MetricSpec(
        "serwatt_cpu_seconds_total",
        "counter",
        ("target", "codepath"),
        "Measured per-thread CPU seconds of the target attributed to the codepath "
        "(each thread's CPU delta spread over its samples).",
    ),
    MetricSpec(
        "serwatt_energy_joules_total",
        "counter",
        ("target", "codepath", "source"),
        "CPU package energy attributed to the target's codepath, in joules; source is "
        "rapl (measured) or model (estimated).",
    ),
    MetricSpec(
        "serwatt_node_cpu_energy_joules_total",
        "counter",
        ("source",),
        "CPU package energy of the whole node over the daemon's sampling slots, in joules.",
    ),
    MetricSpec(
        "serwatt_unattributed_energy_joules_total",
        "counter",
        ("source",),
        "Node CPU energy that no target codepath received (other processes, idle, "
        "unsampled targets), in joules.",
    ),
    MetricSpec(
        "serwatt_gpu_idle_seconds_total",
        "counter",
        ("gpu",),
        "Seconds the GPU ran no kernel, from NVML utilization samples.",
    ),
    MetricSpec(
        "serwatt_gpu_wait_seconds_total",
        "counter",
        ("target", "codepath", "gpu"),
        "Seconds a GPU the target uses sat idle while the target's host threads were in "
        "the codepath.",
    ),
    MetricSpec(
        "serwatt_gpu_wait_energy_joules_total",
        "counter",
        ("target", "codepath", "gpu"),
        "GPU energy spent idle while the target's host threads were in the codepath, in joules.",
    ),
    MetricSpec(
        "serwatt_target_up",
        "gauge",
        ("target",),
        "1 if at least one process of the configured target is being profiled, else 0.",
    ),
    MetricSpec(
        "serwatt_target_info",
        "info",
        ("target", "pid", "python"),
        "One series per profiled process of the target (value 1): its pid and Python version.",
    ),
    MetricSpec(
        "serwatt_sampler_errors_total",
        "counter",
        ("target", "kind"),
        "Sampling windows of the target that failed, by kind (target_gone, not_python, "
        "ptrace_denied, unsupported_python, ...).",
    ),
    MetricSpec(
        "serwatt_collector_up",
        "gauge",
        ("collector",),
        "1 if the collector's last use succeeded, 0 if it failed or is unavailable.",
    ),
    MetricSpec(
        "serwatt_collector_duration_seconds",
        "gauge",
        ("collector",),
        "Seconds the collector's last use took.",
    ),
    MetricSpec(
        "serwatt_self_cpu_seconds_total",
        "counter",
        ("part",),
        "CPU seconds serwatt itself used: part=daemon (the daemon process, all its threads) "
        "or samplers (its py-spy processes, counted as each window's py-spy exits).",
    ),
    MetricSpec(
        "serwatt_sample_rate_hz",
        "gauge",
        (),
        "Samples per second the daemon's windows run at now: sample_rate_hz from the "
        "config, or less while cpu_budget_cores holds it down.",
    ),
    MetricSpec(
        "serwatt_cpu_budget_cores",
        "gauge",
        (),
        "The CPU the daemon and its samplers may use on average, in cores (cpu_budget_cores; "
        "no series when no budget is configured).",
    ),
    MetricSpec(
        "serwatt_build_info",
        "info",
        ("version",),
        "serwatt build information (value 1).",
    ),
)

METRIC_NAMES: frozenset[str] = frozenset(m.name for m in METRICS)
_SPEC = {m.name: m for m in METRICS}


def _family(name: str) -> CounterMetricFamily | GaugeMetricFamily:
    spec = _SPEC[name]
    if spec.type == "counter":
        # prometheus_client appends `_total` to counter samples itself.
        return CounterMetricFamily(name.removesuffix("_total"), spec.help, labels=spec.labels)
    return GaugeMetricFamily(name, spec.help, labels=spec.labels)


def _info_family(name: str) -> InfoMetricFamily:
    spec = _SPEC[name]
    # prometheus_client appends `_info`; the labels are passed per sample as the value.
    return InfoMetricFamily(name.removesuffix("_info"), spec.help)


# Counters read straight from a snapshot mapping whose keys are the label values in
# the MetricSpec's label order.
_COUNTER_FIELDS: tuple[tuple[str, str], ...] = (
    ("serwatt_samples_total", "samples"),
    ("serwatt_cpu_seconds_total", "cpu_s"),
    ("serwatt_energy_joules_total", "energy_j"),
    ("serwatt_node_cpu_energy_joules_total", "node_cpu_energy_j"),
    ("serwatt_unattributed_energy_joules_total", "unattributed_energy_j"),
    ("serwatt_gpu_idle_seconds_total", "gpu_idle_s"),
    ("serwatt_gpu_wait_seconds_total", "gpu_wait_s"),
    ("serwatt_gpu_wait_energy_joules_total", "gpu_wait_energy_j"),
    ("serwatt_sampler_errors_total", "sampler_errors"),
    ("serwatt_self_cpu_seconds_total", "self_cpu_s"),
)


def build_families(snap: LedgerSnapshot) -> Iterator[Metric]:
    """The metric families for one snapshot. A family that fails to build is logged
    and left out; the others are still exported."""
    builders: list[tuple[str, Callable[[LedgerSnapshot], Metric]]] = [
        (name, functools.partial(_counter, name, field)) for name, field in _COUNTER_FIELDS
    ]
    builders += [
        ("serwatt_target_up", _target_up),
        ("serwatt_target_info", _target_info),
        ("serwatt_collector_up", _collector_up),
        ("serwatt_collector_duration_seconds", _collector_duration),
        ("serwatt_sample_rate_hz", _sample_rate),
        ("serwatt_cpu_budget_cores", _cpu_budget),
        ("serwatt_build_info", _build_info),
    ]
    target_labels = {t.name: t.labels for t in snap.targets if t.labels}
    for name, build in builders:
        try:
            fam = build(snap)
            if target_labels and "target" in _SPEC[name].labels:
                _add_target_labels(fam, target_labels)
            yield fam
        except Exception:
            log.exception("building %s failed; left out of this scrape", name)


def _add_target_labels(fam: Metric, target_labels: Mapping[str, Mapping[str, str]]) -> None:
    """The config's static labels (targets[].labels) on each of the target's series.
    They never collide with the family's own labels: the config refuses serwatt's
    label names (profiler.service.config.RESERVED_LABELS)."""
    fam.samples[:] = [
        s._replace(labels={**s.labels, **target_labels.get(s.labels.get("target", ""), {})})
        for s in fam.samples
    ]


@dataclass(frozen=True)
class SeriesCount:
    """The series one node exports now, by the terms of its cardinality formula:
    targets x (codepaths x (2 + energy sources + 2 x GPUs) + 1) + processes + error
    series + node series. Static target labels add no term: each target has one fixed
    label set, so they rename series, never multiply them."""

    targets: int
    codepaths: int
    energy_sources: int
    gpus: int
    processes: int  # serwatt_target_info: one per sampled process
    error_series: int  # serwatt_sampler_errors_total: (target, kind) pairs seen so far
    node: int  # node energy, GPU idle, collectors, own CPU, rate, budget, build info

    @property
    def per_target(self) -> int:
        return self.codepaths * (2 + self.energy_sources + 2 * self.gpus) + 1

    @property
    def total(self) -> int:
        return self.targets * self.per_target + self.processes + self.error_series + self.node

    def line(self) -> str:
        return (
            f"Series exported: {self.total} = {self.targets} target(s) x ({self.codepaths} "
            f"codepaths x (2 + {self.energy_sources} energy source(s) + 2 x {self.gpus} GPU(s)) "
            f"+ 1) + {self.processes} process(es) + {self.error_series} sampler-error "
            f"series + {self.node} node series; target labels add none (one fixed set per "
            "target)."
        )


def series_count(snap: LedgerSnapshot) -> SeriesCount:
    """The node's series in terms of the cardinality formula (tests compare `total`
    with the series in a real /metrics)."""
    sources = {src for (_t, _cp, src) in snap.energy_j} | set(snap.node_cpu_energy_j)
    gpus = {g for (_t, _cp, g) in snap.gpu_wait_s} | set(snap.gpu_idle_s)
    node = (
        len(snap.node_cpu_energy_j)
        + len(snap.unattributed_energy_j)
        + len(snap.gpu_idle_s)
        + 2 * len(snap.collectors)
        + len(snap.self_cpu_s)
        + 1  # serwatt_sample_rate_hz
        + (snap.cpu_budget_cores is not None)
        + 1  # serwatt_build_info
    )
    return SeriesCount(
        targets=len(snap.targets),
        codepaths=len(CODEPATHS),
        energy_sources=len(sources),
        gpus=len(gpus),
        processes=sum(len(t.processes) for t in snap.targets),
        error_series=len(snap.sampler_errors),
        node=node,
    )


def _sorted_items(mapping):
    return sorted(mapping.items(), key=lambda kv: kv[0])


def _counter(name: str, field: str, snap: LedgerSnapshot) -> Metric:
    fam = _family(name)
    mapping: Mapping = getattr(snap, field)
    for key, v in _sorted_items(mapping):
        fam.add_metric(list(key) if isinstance(key, tuple) else [key], v)
    return fam


def _target_up(snap: LedgerSnapshot) -> Metric:
    fam = _family("serwatt_target_up")
    for t in snap.targets:
        fam.add_metric([t.name], 1.0 if t.up else 0.0)
    return fam


def _target_info(snap: LedgerSnapshot) -> Metric:
    fam = _info_family("serwatt_target_info")
    for t in snap.targets:
        for p in t.processes:
            fam.add_metric([], {"target": t.name, "pid": str(p.pid), "python": p.python})
    return fam


def _collector_up(snap: LedgerSnapshot) -> Metric:
    fam = _family("serwatt_collector_up")
    for name, c in _sorted_items(snap.collectors):
        fam.add_metric([name], 1.0 if c.up else 0.0)
    return fam


def _collector_duration(snap: LedgerSnapshot) -> Metric:
    fam = _family("serwatt_collector_duration_seconds")
    for name, c in _sorted_items(snap.collectors):
        fam.add_metric([name], c.duration_s)
    return fam


def _sample_rate(snap: LedgerSnapshot) -> Metric:
    fam = _family("serwatt_sample_rate_hz")
    fam.add_metric([], snap.sample_rate_hz)
    return fam


def _cpu_budget(snap: LedgerSnapshot) -> Metric:
    fam = _family("serwatt_cpu_budget_cores")
    if snap.cpu_budget_cores is not None:
        fam.add_metric([], snap.cpu_budget_cores)
    return fam


def _build_info(snap: LedgerSnapshot) -> Metric:
    fam = _info_family("serwatt_build_info")
    fam.add_metric([], {"version": snap.version})
    return fam


class SnapshotCollector:
    """prometheus_client custom collector over `get_snapshot()` (no computing on scrape)."""

    def __init__(self, get_snapshot: Callable[[], LedgerSnapshot]) -> None:
        self._get_snapshot = get_snapshot

    def collect(self) -> Iterator[Metric]:
        yield from build_families(self._get_snapshot())


def make_registry(get_snapshot: Callable[[], LedgerSnapshot]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot))
    return registry


# -- landing page ----------------------------------------------------------------


def render_landing_page(snap: LedgerSnapshot, *, listen: str = "") -> str:
    """The HTML at `/`: a link to /metrics, the targets and the collectors' status."""
    e = html.escape
    age_s = max(0.0, time.time() - snap.taken_at)
    rows = []
    for t in snap.targets:
        samples = sum(snap.samples.get((t.name, cp), 0) for cp in CODEPATHS)
        cpu_s = sum(snap.cpu_s.get((t.name, cp), 0.0) for cp in CODEPATHS)
        errors = sum(v for (name, _k), v in snap.sampler_errors.items() if name == t.name)
        procs = (
            ", ".join(f"pid {p.pid} (Python {e(p.python)})" for p in t.processes) or "none found"
        )
        state = "up" if t.up else ("down" if t.configured else "removed from config")
        labels = ", ".join(f"{k}={v}" for k, v in t.labels.items()) or "none"
        rows.append(
            f"<tr><td>{e(t.name)}</td><td>{e(labels)}</td>"
            f"<td class='{'up' if t.up else 'down'}'>{state}</td>"
            f"<td>{procs}</td><td>{samples}</td><td>{cpu_s:.2f}</td><td>{errors}</td></tr>"
        )
    crows = []
    for name, c in sorted(snap.collectors.items()):
        crows.append(
            f"<tr><td>{e(name)}</td><td class='{'up' if c.up else 'down'}'>"
            f"{'up' if c.up else 'down'}</td><td>{c.duration_s:.4f}</td>"
            f"<td>{e(c.detail)}</td></tr>"
        )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>serwatt {e(snap.version)}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:left}}
.up{{color:#070}}.down{{color:#a00}}</style></head>
<body><h1>serwatt {e(snap.version)}</h1>
<p>Per-node serialization profiler. Metrics: <a href="/metrics">/metrics</a>.
Listening on {e(listen)}. Snapshot taken {age_s:.1f} s ago, {snap.windows} windows recorded.</p>
<p>{e(_sampling_line(snap))}</p>
<p class="series">{e(series_count(snap).line())}</p>
<h2>Targets</h2>
<table><tr><th>target</th><th>labels</th><th>state</th><th>processes</th><th>samples</th>
<th>CPU s</th><th>sampler errors</th></tr>
{"".join(rows) or "<tr><td colspan=7>no targets configured</td></tr>"}
</table>
<h2>Collectors</h2>
<table><tr><th>collector</th><th>state</th><th>last duration s</th><th>detail</th></tr>
{"".join(crows) or "<tr><td colspan=4>no collector has run yet</td></tr>"}
</table>
</body></html>
"""


def _sampling_line(snap: LedgerSnapshot) -> str:
    used = ", ".join(f"{part} {s:.1f} CPU s" for part, s in sorted(snap.self_cpu_s.items()))
    budget = (
        f"CPU budget {snap.cpu_budget_cores:g} cores"
        if snap.cpu_budget_cores is not None
        else "no CPU budget"
    )
    return (
        f"Sampling at {snap.sample_rate_hz:g} Hz ({budget}); serwatt's own CPU so far: "
        f"{used or 'none measured yet'}."
    )


# -- HTTP server -----------------------------------------------------------------


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
    ) -> None:
        host, port = parse_listen(listen, any_port=True)
        self.registry = registry
        self._get_snapshot = get_snapshot
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
                page = render_landing_page(server._get_snapshot(), listen=server.address)
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
