"""Exporter: custom collector over snapshots, own registry, HTTP endpoint, landing page."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.service.config import parse_listen
from serwatt.profiler.service.exporter import MetricsServer, make_registry
from serwatt.profiler.service.ledger import Ledger, TargetProcess


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.set_targets(["trainer", "<evil & target>"])
    ledger.declare_energy_source("model")
    ledger.add_window(
        "trainer",
        samples={("pickle", "decode"): 7},
        cpu_s={("pickle", "decode"): 0.7},
        energy_j={("pickle", "decode"): 2.5},
        energy_source="model",
    )
    ledger.set_target_processes("trainer", [TargetProcess(4242, "3.11.7")])
    ledger.set_collector("rapl", up=False, duration_s=0.0012, detail="unavailable: no powercap")
    ledger.set_collector("pyspy", up=True, duration_s=10.1)
    ledger.publish()
    return ledger


def _values(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture()
def server():
    ledger = _ledger()
    srv = MetricsServer("127.0.0.1:0", make_registry(ledger.snapshot), ledger.snapshot)
    srv.start()
    yield srv, ledger
    srv.close()


def _get(srv: MetricsServer, path: str, accept: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(f"http://{srv.address}{path}")
    if accept:
        req.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_metrics_endpoint_serves_the_snapshot(server):
    srv, _ledger = server
    status, ctype, body = _get(srv, "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    values = _values(body)
    key = (
        "serwatt_samples_total",
        (("codepath", "pickle"), ("direction", "decode"), ("target", "trainer")),
    )
    assert values[key] == 7
    for cp in CODEPATHS:
        labels = (("codepath", cp), ("direction", "unknown"), ("target", "trainer"))
        assert ("serwatt_cpu_seconds_total", labels) in values
    # no window has reported a cpu_source for the process yet
    info = (
        "serwatt_target_info",
        (("cpu_source", "unknown"), ("pid", "4242"), ("python", "3.11.7"), ("target", "trainer")),
    )
    assert values[info] == 1
    assert values[("serwatt_collector_up", (("collector", "rapl"),))] == 0
    assert values[("serwatt_collector_duration_seconds", (("collector", "pyspy"),))] == 10.1


def test_openmetrics_negotiation(server):
    srv, _ = server
    status, ctype, body = _get(
        srv, "/metrics", accept="application/openmetrics-text; version=1.0.0"
    )
    assert status == 200 and ctype.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")
    assert "# TYPE serwatt_target info" in body


def test_scrape_reads_only_the_published_snapshot(server):
    srv, ledger = server
    ledger.add_window("trainer", samples={("pickle", "decode"): 100}, cpu_s={})
    _, _, body = _get(srv, "/metrics")
    key = (
        "serwatt_samples_total",
        (("codepath", "pickle"), ("direction", "decode"), ("target", "trainer")),
    )
    assert _values(body)[key] == 7  # unpublished work is invisible
    ledger.publish()
    _, _, body = _get(srv, "/metrics")
    assert _values(body)[key] == 107


def test_scrape_does_not_wait_for_the_sampling_side(server):
    srv, ledger = server
    with ledger._lock:  # the daemon is in the middle of applying a window
        result: list = []
        t = threading.Thread(target=lambda: result.append(_get(srv, "/metrics")[0]))
        t.start()
        t.join(timeout=15)
        assert result == [200]


def test_a_broken_family_does_not_fail_the_scrape(server, caplog):
    srv, ledger = server
    # A corrupt collector entry: only the two collector families can fail on it.
    ledger._collectors["broken"] = "not a CollectorState"  # type: ignore[assignment]
    ledger.publish()
    status, _, body = _get(srv, "/metrics")
    assert status == 200
    names = {fam.name for fam in text_string_to_metric_families(body)}
    assert "serwatt_samples" in names and "serwatt_build_info" in names
    assert "serwatt_collector_up" not in names
    assert any("serwatt_collector_up" in r.getMessage() for r in caplog.records)


def test_landing_page_links_metrics_and_shows_targets_and_collectors(server):
    srv, _ = server
    status, ctype, page = _get(srv, "/")
    assert status == 200 and ctype.startswith("text/html")
    assert '<a href="/metrics">/metrics</a>' in page
    assert "trainer" in page and "pid 4242 (Python 3.11.7)" in page
    assert "unavailable: no powercap" in page
    # Names from the config are escaped, never injected.
    assert "&lt;evil &amp; target&gt;" in page and "<evil" not in page
    assert "Sampling at 0 Hz (no CPU budget)" in page and "none measured yet" in page
    assert _get(srv, "/nope")[0] == 404


def test_budget_and_own_cpu_are_exported_and_on_the_landing_page(server):
    srv, ledger = server
    text = _get(srv, "/metrics")[2]
    assert ("serwatt_cpu_budget_cores", ()) not in _values(text)  # none configured: no series
    ledger.add_self_cpu("daemon", 1.5)
    ledger.add_self_cpu("samplers", 3.5)
    ledger.set_sampling(rate_hz=27.0, budget_cores=0.1)
    ledger.publish()
    v = _values(_get(srv, "/metrics")[2])
    assert v[("serwatt_self_cpu_seconds_total", (("part", "daemon"),))] == 1.5
    assert v[("serwatt_self_cpu_seconds_total", (("part", "samplers"),))] == 3.5
    assert v[("serwatt_sample_rate_hz", ())] == 27.0
    assert v[("serwatt_cpu_budget_cores", ())] == 0.1
    page = _get(srv, "/")[2]
    assert "Sampling at 27 Hz (CPU budget 0.1 cores)" in page
    assert "daemon 1.5 CPU s, samplers 3.5 CPU s" in page


def test_own_registry_not_the_global_one():
    ledger = _ledger()
    registry = make_registry(ledger.snapshot)
    assert registry is not REGISTRY
    assert b"serwatt_" not in generate_latest(REGISTRY)
    assert b"serwatt_samples_total" in generate_latest(registry)


def test_bind_failure_is_an_oserror_and_listen_parsing(server):
    srv, ledger = server
    with pytest.raises(OSError):
        MetricsServer(srv.address, make_registry(ledger.snapshot), ledger.snapshot)
    assert parse_listen("127.0.0.1:9977") == ("127.0.0.1", 9977)
    assert parse_listen("[::1]:9977") == ("::1", 9977)
    for bad in ("localhost", "127.0.0.1:http", "1.2.3.4:70000"):
        with pytest.raises(ValueError, match="listen"):
            parse_listen(bad)
