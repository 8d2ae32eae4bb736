"""The metric contract and its exposition: what the daemon exports and how a ledger
snapshot becomes metric families.

`METRICS` is the metric contract (name, type, labels, HELP); the contract test,
the dashboards test and the docs are checked against it.

`SnapshotCollector` is a prometheus_client custom collector: on each scrape it
turns the latest immutable `LedgerSnapshot` into fresh metric families. It reads,
formats and returns; it never samples, reads sysfs or takes the ledger's lock, so
a scrape costs the same whatever the daemon is doing. It is registered in its own
`CollectorRegistry`, never the process-global one.

Example exposition lines:
    serwatt_cpu_seconds_total{codepath="pickle",direction="decode",target="trainer"} 12.5
    serwatt_energy_joules_total{codepath="json",direction="encode",source="model",target="t"} 3.2

`direction` is encode, decode or unknown for a serializer codepath and unknown alone for
`other` (profiler/classify/direction.py); `sum without (direction)` gives the codepath.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from serwatt.profiler.classify.direction import CODEPATH_DIRECTIONS
from serwatt.profiler.service.ledger import LedgerSnapshot

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
        ("target", "codepath", "direction"),
        "Stack samples of the target's threads classified into the codepath, by direction "
        "(encode, decode, unknown).",
    ),
    MetricSpec(
        "serwatt_cpu_seconds_total",
        "counter",
        ("target", "codepath", "direction"),
        "Measured per-thread CPU seconds of the target attributed to the codepath, by "
        "direction (each thread's CPU delta spread over its samples).",
    ),
    MetricSpec(
        "serwatt_energy_joules_total",
        "counter",
        ("target", "codepath", "direction", "source"),
        "CPU package energy attributed to the target's codepath, by direction, in joules; "
        "source is rapl (measured) or model (estimated).",
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
        ("target", "codepath", "direction", "gpu"),
        "Seconds a GPU the target uses sat idle while the target's host threads were in "
        "the codepath, by direction.",
    ),
    MetricSpec(
        "serwatt_gpu_wait_energy_joules_total",
        "counter",
        ("target", "codepath", "direction", "gpu"),
        "GPU energy spent idle while the target's host threads were in the codepath, by "
        "direction, in joules.",
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
        ("target", "pid", "python", "cpu_source"),
        "One series per profiled process of the target (value 1): its pid, Python version and "
        "what weighed its last window's CPU (cpu_source: kernel, the scheduler timeline; "
        "estimate, the fallback; unknown before its first window).",
    ),
    MetricSpec(
        "serwatt_sampler_errors_total",
        "counter",
        ("target", "kind"),
        "Sampling windows of the target that failed, by kind (target_gone, not_python, "
        "ptrace_denied, unsupported_python, ...).",
    ),
    MetricSpec(
        "serwatt_push_errors_total",
        "counter",
        ("kind",),
        "Profile pushes to Pyroscope that failed or were dropped, by kind (timeout, connect, "
        "http_status, redirect, queue_full, ...).",
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
    ("serwatt_push_errors_total", "push_errors"),
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
    targets x (codepath directions x (2 + energy sources + 2 x GPUs) + 1) + processes +
    error series + node series, where codepath directions is 28: 9 serializer codepaths
    x 3 directions + `other` x 1. Static target labels add no term: each target has one
    fixed label set, so they rename series, never multiply them."""

    targets: int
    codepaths: int  # (codepath, direction) pairs: CODEPATH_DIRECTIONS
    energy_sources: int
    gpus: int
    processes: int  # serwatt_target_info: one per sampled process
    error_series: int  # serwatt_sampler_errors_total: (target, kind) pairs seen so far
    # node energy, GPU idle, collectors, own CPU, rate, budget, build info, push errors
    node: int

    @property
    def per_target(self) -> int:
        return self.codepaths * (2 + self.energy_sources + 2 * self.gpus) + 1

    @property
    def total(self) -> int:
        return self.targets * self.per_target + self.processes + self.error_series + self.node

    def line(self) -> str:
        return (
            f"Series exported: {self.total} = {self.targets} target(s) x ({self.codepaths} "
            f"codepath directions x (2 + {self.energy_sources} energy source(s) + 2 x "
            f"{self.gpus} GPU(s)) "
            f"+ 1) + {self.processes} process(es) + {self.error_series} sampler-error "
            f"series + {self.node} node series; target labels add none (one fixed set per "
            "target)."
        )


def series_count(snap: LedgerSnapshot) -> SeriesCount:
    """The node's series in terms of the cardinality formula (tests compare `total`
    with the series in a real /metrics)."""
    sources = {src for (_t, _cp, _d, src) in snap.energy_j} | set(snap.node_cpu_energy_j)
    gpus = {g for (_t, _cp, _d, g) in snap.gpu_wait_s} | set(snap.gpu_idle_s)
    node = (
        len(snap.node_cpu_energy_j)
        + len(snap.unattributed_energy_j)
        + len(snap.gpu_idle_s)
        + 2 * len(snap.collectors)
        + len(snap.self_cpu_s)
        + 1  # serwatt_sample_rate_hz
        + (snap.cpu_budget_cores is not None)
        + 1  # serwatt_build_info
        + len(snap.push_errors)  # a kind's series once a push failed so (none without push)
    )
    return SeriesCount(
        targets=len(snap.targets),
        codepaths=len(CODEPATH_DIRECTIONS),
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
            fam.add_metric(
                [],
                {"target": t.name, "pid": str(p.pid), "python": p.python,
                 "cpu_source": p.cpu_source},
            )  # fmt: skip
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
