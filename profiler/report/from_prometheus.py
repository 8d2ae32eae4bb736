"""PromQL range queries (Prometheus or VictoriaMetrics HTTP API) turned into report inputs.

The second input adapter of the A/B report, beside from_records: it yields the same
`RunInput`s, so the report (statistics, projection, HTML, receipt) is built by the one
`build_report`. One "run" is one scraped target series set, the labels of a
`serwatt_cpu_seconds_total` series without `codepath` (job, instance, target and the
config's static labels such as `variant`). Its "windows" are the steps of the range
query: the counter deltas between consecutive grid points, per codepath, so a window's
figures are exact differences of scraped counter values (no `increase()`
extrapolation). A delta below zero is a counter reset (a restarted daemon) and counts
the new value, as Prometheus' `increase()` does. A step in which no counter moved (the
target was down, or no daemon window ended in it) is no window. A step whose CPU moved
with no samples is a window: a target's last window, cut short by its exit, can hold
CPU-seconds and no sample, and the record keeps that CPU too.

What Prometheus does not carry, and what the report then says:
- episodes (per-checkpoint stalls): the checkpoint section and the projection say
  "unavailable" (`NO_EPISODES_NOTE`); run records carry them;
- wall seconds per codepath (only CPU, joules and GPU-wait are exported): 0;
- host fingerprints (CPU model, sockets, GPUs, kernel): not compared (`HOST_CAVEAT`).
The serwatt version and sampling rate come from `serwatt_build_info` and
`serwatt_sample_rate_hz` of the same job and instance.

Queries go through prom_client (HTTP with deadlines), whose answers prom_matrix parses
and checks; the selectors, ranges and steps come checked from prom_args.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS
from serwatt.profiler.report.inputs import (
    CodepathFigures,
    DirectionFigures,
    InputError,
    RunInput,
    WindowInput,
)
from serwatt.profiler.report.prom_client import (
    REPORT_DEADLINE_S,
    REQUEST_DEADLINE_S,
    Fetch,
    PromQL,
)
from serwatt.profiler.report.prom_error import PrometheusError, bad_answer
from serwatt.profiler.report.prom_matrix import Series

NO_EPISODES_NOTE = (
    "no episodes: Prometheus carries counters, not per-checkpoint episodes "
    "(run records have them: serwatt report --baseline RUN... --candidate RUN...)"
)
HOST_CAVEAT = (
    "host fingerprints are not in Prometheus: CPU model, sockets, GPUs and kernel were "
    "not compared (only the serwatt version, sampling rate and sources were)"
)

# Counter -> (figure, extra labels that are summed over); the run key leaves these out.
_COUNTERS: tuple[tuple[str, str], ...] = (
    ("serwatt_cpu_seconds_total", "cpu_s"),
    ("serwatt_samples_total", "samples"),
    ("serwatt_energy_joules_total", "energy_j"),
    ("serwatt_gpu_wait_seconds_total", "gpu_wait_s"),
)
_NOT_RUN_LABELS = frozenset({"__name__", "codepath", "direction", "source", "gpu"})


@dataclass(frozen=True)
class SideQuery:
    """One side of the comparison: a selector over a time range, in steps of step_s."""

    name: str  # "baseline" | "candidate"
    selector: str  # checked by check_selector
    start: float
    end: float
    step_s: float


def _with_selector(metric: str, selector: str) -> str:
    return metric + selector


def _run_key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in _NOT_RUN_LABELS))


def _deltas(points: Sequence[tuple[float, float]]) -> dict[float, float]:
    """End time of each step -> the counter's change over it (a drop is a reset)."""
    out = {}
    for (_t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        out[t1] = v1 - v0 if v1 >= v0 else v1
    return out


def _gauge_by_node(series: Iterable[Series], label: str | None) -> dict[tuple[str, str], Any]:
    """(job, instance) -> the most common value (of `label`, or the sample value)."""
    seen: dict[tuple[str, str], dict[Any, int]] = {}
    for s in series:
        node = (s.labels.get("job", ""), s.labels.get("instance", ""))
        counts = seen.setdefault(node, {})
        for _t, v in s.points:
            key = s.labels.get(label, "") if label else v
            counts[key] = counts.get(key, 0) + 1
    return {node: max(sorted(c, key=str), key=lambda k: c[k]) for node, c in seen.items() if c}


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def load_side(prom: PromQL, side: SideQuery) -> tuple[list[RunInput], list[str]]:
    """The side's runs (one per scraped target series set), each with its step windows,
    and the ids of the matched targets that took no samples in the range (left out: a
    run with no window has nothing to compare)."""
    by_counter = {
        field: prom.range(_with_selector(metric, side.selector), side.start, side.end, side.step_s)
        for metric, field in _COUNTERS
    }
    if not by_counter["cpu_s"]:
        raise PrometheusError(
            f"--{side.name}: no serwatt_cpu_seconds_total series match {side.selector} between "
            f"{_stamp(side.start)} and {_stamp(side.end)} on {prom.url}; check the selector's "
            "labels (targets[].labels in the daemon config, e.g. variant) and the range",
            usage=True,
        )
    rates = _gauge_by_node(
        prom.range("serwatt_sample_rate_hz", side.start, side.end, side.step_s), None
    )
    versions = _gauge_by_node(
        prom.range("serwatt_build_info", side.start, side.end, side.step_s), "version"
    )
    # run key -> step end -> codepath -> field -> value (energy also by source)
    runs: dict[tuple[tuple[str, str], ...], dict[float, dict[str, dict[str, float]]]] = {}
    sources: dict[tuple[tuple[str, str], ...], set[str]] = {}
    gpus: set[tuple[tuple[str, str], ...]] = set()
    directed: set[tuple[tuple[str, str], ...]] = set()  # runs whose series carry direction
    for field, series in by_counter.items():
        for s in series:
            cp = s.labels.get("codepath")
            if cp not in CODEPATHS:
                raise bad_answer(f"a {field} series has codepath {str(cp)[:40]!r}, not serwatt's")
            key = _run_key(s.labels)
            name = field
            if field == "energy_j":
                src = s.labels.get("source", "")
                if src not in ("rapl", "model"):
                    raise bad_answer(f"an energy series has source {src[:40]!r}")
                sources.setdefault(key, set()).add(src)
                name = f"energy_j:{src}"
            if field == "gpu_wait_s":
                gpus.add(key)
            way = s.labels.get("direction")
            if way is not None and field in ("samples", "cpu_s"):
                if way not in DIRECTIONS:
                    raise bad_answer(f"a {field} series has direction {str(way)[:40]!r}")
                directed.add(key)
            steps = runs.setdefault(key, {})
            for t, d in _deltas(s.points).items():
                fig = steps.setdefault(t, {}).setdefault(cp, {})
                fig[name] = fig.get(name, 0.0) + d
                if way is not None and field in ("samples", "cpu_s"):
                    fig[f"{field}@{way}"] = fig.get(f"{field}@{way}", 0.0) + d
    out: list[RunInput] = []
    idle: list[RunInput] = []
    ids: dict[str, int] = {}
    for key in sorted(runs, key=lambda k: [v for _n, v in k]):
        labels = dict(key)
        if "target" not in labels:
            continue  # not a per-target series set
        node = (labels.get("job", ""), labels.get("instance", ""))
        run_id = f"{labels.get('instance', '?')}/{labels['target']}@{_stamp(side.start)}"
        ids[run_id] = ids.get(run_id, 0) + 1
        if ids[run_id] > 1:  # e.g. two jobs scraping one instance
            run_id += f"#{ids[run_id]}"
        srcs = sources.get(key, set())
        run = _run(
            side, run_id, labels, runs[key], srcs, key in gpus, rates, versions, node,
            directed=key in directed,
        )  # fmt: skip
        (out if run.windows else idle).append(run)
    if not out:
        raise PrometheusError(
            f"--{side.name}: no target under {side.selector} took samples in two scraped "
            f"points of the range ({len(idle)} matched but stayed idle); widen the range or "
            "lower --step",
            usage=True,
        )
    return out, [r.run_id for r in idle]


def _run(
    side: SideQuery,
    run_id: str,
    labels: Mapping[str, str],
    steps: Mapping[float, Mapping[str, Mapping[str, float]]],
    sources: set[str],
    has_gpu: bool,
    rates: Mapping[tuple[str, str], Any],
    versions: Mapping[tuple[str, str], Any],
    node: tuple[str, str],
    *,
    directed: bool,
) -> RunInput:
    source = next(iter(sources)) if len(sources) == 1 else None
    windows = []
    ways: dict[str, dict[str, list[float]]] = {}  # codepath -> direction -> [samples, cpu_s]
    for t in sorted(steps):
        cps = steps[t]
        if not any(v > 0 for f in cps.values() for v in f.values()):
            continue  # no daemon window ended in this step: nothing was seen
        figures = {}
        for cp, f in cps.items():
            for d in DIRECTIONS:
                acc = ways.setdefault(cp, {}).setdefault(d, [0.0, 0.0])
                acc[0] += f.get(f"samples@{d}", 0.0)
                acc[1] += f.get(f"cpu_s@{d}", 0.0)
            energy = f.get(f"energy_j:{source}") if source is not None else None
            figures[cp] = CodepathFigures(
                samples=max(0, round(f.get("samples", 0.0))),
                cpu_s=max(0.0, f.get("cpu_s", 0.0)),
                wall_s=0.0,  # not exported
                energy_j=None if energy is None else max(0.0, energy),
                gpu_wait_s=max(0.0, f.get("gpu_wait_s", 0.0)) if has_gpu else None,
            )
        windows.append(
            WindowInput(
                started_at=t - side.step_s,
                ended_at=t,
                cpu_s=sum(f.cpu_s for f in figures.values()),
                codepaths=figures,
                energy_source=source,
            )
        )
    if len(sources) > 1:
        energy_source, reason = "unavailable", f"series of several sources ({sorted(sources)})"
    elif source is None:
        energy_source, reason = "unavailable", "no serwatt_energy_joules_total series"
    else:
        energy_source, reason = source, None
    rate = rates.get(node)
    if not (isinstance(rate, float) and rate > 0):
        raise PrometheusError(
            f"{run_id}: no serwatt_sample_rate_hz series for job {node[0]!r} instance "
            f"{node[1]!r} in the range; the report compares sampling rates, so keep that "
            "series (check relabel rules that drop it)",
            usage=False,
        )
    started = windows[0].started_at if windows else side.start
    ended = windows[-1].ended_at if windows else side.start
    try:
        return RunInput(
            run_id=run_id,
            host={"source": "prometheus", "labels": dict(labels)},
            serwatt_version=str(versions.get(node, "unknown")),
            rate_hz=rate,
            energy_source=energy_source,
            energy_reason=reason,
            gpu_source="nvml" if has_gpu else "unavailable: no serwatt_gpu_wait_seconds_total",
            started_at=started,
            ended_at=ended,
            windows=tuple(windows),
            episodes=None,
            directions={
                cp: {
                    d: DirectionFigures(max(0, round(n)), max(0.0, c))
                    for d, (n, c) in parts.items()
                }
                for cp, parts in ways.items()
            }
            if directed
            else None,
        )
    except InputError as exc:
        raise bad_answer(str(exc)) from None


def load_sides(
    url: str,
    baseline: SideQuery,
    candidate: SideQuery,
    fetch: Fetch | None = None,
    *,
    request_deadline_s: float = REQUEST_DEADLINE_S,
    report_deadline_s: float = REPORT_DEADLINE_S,
) -> tuple[list[RunInput], list[RunInput], dict[str, Any]]:
    """(baseline runs, candidate runs, the report's `source` section)."""
    prom = PromQL(
        url, fetch, request_deadline_s=request_deadline_s, report_deadline_s=report_deadline_s
    )
    base, base_idle = load_side(prom, baseline)
    cand, cand_idle = load_side(prom, candidate)
    source = {
        "kind": "promql",
        "url": prom.url,
        "api": "/api/v1/query_range",
        "queried_at": _stamp(time.time()),
        "sides": {
            s.name: {
                "selector": s.selector,
                "start": s.start,
                "end": s.end,
                "step_s": s.step_s,
                "idle_targets": idle,
            }
            for s, idle in ((baseline, base_idle), (candidate, cand_idle))
        },
        "queries": sorted(set(prom.queries)),
        "windows": "counter deltas between consecutive query steps (a drop counts as a reset)",
        "missing": "episodes, per-codepath wall seconds and host fingerprints are not in "
        "Prometheus",
    }
    return base, cand, source
