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

The server is hostile too. Each request has a total deadline (REQUEST_DEADLINE_S: a
socket timeout bounds one recv only, so a server dripping a byte at a time would hold a
request for ever), and the report's queries together have one (REPORT_DEADLINE_S). The
answer's size is bounded (MAX_RESPONSE_BYTES), and so is what parsing it may build: the
JSON values it can hold are counted in the raw bytes first (MAX_JSON_VALUES, derived from
the series, label and point bounds), since json.loads builds a Python object per value
(a 63 MB answer of empty series took 1.7 GB) before any bound could look at it. Its shape
is checked (status, resultType matrix, label maps of strings, [time, "value"] pairs of
finite numbers), and series and points are bounded. Every failure is a
`PrometheusError` whose message names the problem and the fix; `usage` says whether it
is the caller's input (exit 2) or the server/network (exit 1).
"""

from __future__ import annotations

import http.client
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS
from serwatt.profiler.many.format import escape_text
from serwatt.profiler.report.deadline_http import RedirectRefused, deadline_opener
from serwatt.profiler.report.inputs import (
    CodepathFigures,
    DirectionFigures,
    InputError,
    RunInput,
    WindowInput,
)

MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # one query's JSON; more is refused, not parsed
MAX_ERROR_BODY_BYTES = 64 * 1024  # of an HTTP error's body, only its message is shown
MAX_SERIES = 20_000  # series in one response
MAX_POINTS = 11_000  # points per series: Prometheus' own limit per query_range series
MAX_ANSWER_POINTS = 1_000_000  # points of all series of one response together
MAX_LABELS = 64  # labels of one series
MAX_LABEL_TEXT = 1024  # characters of one label name or value
REQUEST_DEADLINE_S = 30.0  # one HTTP request, connect to last byte
REPORT_DEADLINE_S = 300.0  # every query of one report together
# Epoch seconds a --range may name: RFC 3339's years 0001-9999 less what is before 1970
# (Prometheus' timestamps are milliseconds since 1970).
MAX_EPOCH_S = 253_402_300_799.0
DEFAULT_WINDOWS = 30  # default step: the range in this many windows, and
MIN_DEFAULT_STEP_S = 60.0  # at least this long (several daemon windows and scrapes)

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

_MATCHER = re.compile(
    r"""\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*"""
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class PrometheusError(Exception):
    """A query that could not be answered; the message names the problem and the fix.
    usage: True when the caller's input is at fault (exit 2), False for the server or
    the network (exit 1)."""

    def __init__(self, message: str, *, usage: bool) -> None:
        super().__init__(message)
        self.usage = usage


# --------------------------------------------------------------------------- arguments


def check_url(url: str) -> str:
    """The API root, e.g. http://localhost:9090 (a trailing slash is dropped)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (reading it checks it: a port that is not 0-65535 raises)
    except ValueError as exc:
        raise PrometheusError(
            f"--prometheus {url!r}: not a URL ({exc}); give the server's API root, e.g. "
            "http://localhost:9090 or http://[::1]:9090",
            usage=True,
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PrometheusError(
            f"--prometheus {url!r}: not an http(s) URL with a host; give the server's API "
            "root, e.g. http://localhost:9090 (Prometheus) or http://localhost:8428 "
            "(VictoriaMetrics)",
            usage=True,
        )
    if parts.query or parts.fragment:
        raise PrometheusError(
            f"--prometheus {url!r}: give the API root without a query or fragment", usage=True
        )
    return url.rstrip("/")


def check_selector(selector: str, option: str) -> str:
    """A PromQL label-matcher set, `{variant="many", job_name=~"gpt.*"}`; returned
    normalised (no metric name: serwatt's metric names are added per query)."""
    text = selector.strip()
    example = "e.g. '{variant=\"many\"}'"
    if not (text.startswith("{") and text.endswith("}")):
        raise PrometheusError(
            f"{option} {selector!r}: a selector is label matchers in braces, {example}",
            usage=True,
        )
    body = text[1:-1].strip()
    matchers = []
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise PrometheusError(
                f"{option} {selector!r}: cannot read a label matcher at {body[pos : pos + 20]!r}; "
                f'write name="value" (or =~ != !~), comma-separated, {example}',
                usage=True,
            )
        name, op, value = m.groups()
        if name == "__name__":
            raise PrometheusError(
                f"{option} {selector!r}: leave the metric name out; the report queries "
                "serwatt's counters itself",
                usage=True,
            )
        matchers.append(f"{name}{op}{value}")
        pos = m.end()
        if pos < len(body):
            if body[pos] != ",":
                raise PrometheusError(
                    f"{option} {selector!r}: matchers are separated by commas, {example}",
                    usage=True,
                )
            pos += 1
    if not matchers:
        raise PrometheusError(
            f"{option} {selector!r}: an empty selector would compare every target; "
            f"name the side, {example}",
            usage=True,
        )
    return "{" + ", ".join(matchers) + "}"


def parse_duration(text: str, option: str) -> float:
    """Prometheus duration syntax (30m, 1h30m, 90s, 2d) in seconds."""
    s = text.strip()
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DURATION.match(s, pos)
        if m is None:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not s or pos != len(s) or total <= 0:
        raise PrometheusError(
            f"{option} {text[:40]!r}: not a duration; write e.g. 30m, 1h30m, 90s or 2d",
            usage=True,
        )
    if not total <= MAX_EPOCH_S:  # inf from a 400-digit number, too
        raise PrometheusError(
            f"{option} {text[:40]!r}: a duration longer than {MAX_EPOCH_S:.0f} s "
            "(year 9999); write e.g. 30m, 1h30m, 90s or 2d",
            usage=True,
        )
    return total


def parse_time(text: str, option: str, *, now: float) -> float:
    """Epoch seconds from RFC 3339 (2026-12-01T10:00:00Z), epoch seconds, `now` or
    `now-DURATION`; between 1970 and the end of 9999."""
    t = _parse_time(text, option, now=now)
    if not 0.0 <= t <= MAX_EPOCH_S:  # NaN and inf too
        raise PrometheusError(
            f"{option} {text[:40]!r}: a time outside 1970-01-01..9999-12-31; write RFC 3339 "
            "(2026-12-01T10:00:00Z), epoch seconds, now or now-30m",
            usage=True,
        )
    return t


def _parse_time(text: str, option: str, *, now: float) -> float:
    s = text.strip()
    if s == "now":
        return now
    if s.startswith("now-"):
        return now - parse_duration(s[4:], option)
    try:
        return float(s)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(s.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            raise PrometheusError(
                f"{option} {text[:40]!r}: say the time zone (a trailing Z for UTC)", usage=True
            )
        return parsed.timestamp()
    except (ValueError, OverflowError):
        raise PrometheusError(
            f"{option} {text[:40]!r}: not a time; write RFC 3339 (2026-12-01T10:00:00Z), "
            "epoch seconds, now or now-30m",
            usage=True,
        ) from None


def parse_range(text: str, option: str, *, now: float) -> tuple[float, float]:
    """`START..END` (each as parse_time) or a duration ending now (`30m`)."""
    if ".." in text:
        a, _, b = text.partition("..")
        start, end = parse_time(a, option, now=now), parse_time(b, option, now=now)
    else:
        end = now
        start = now - parse_duration(text, option)
    if not end > start:
        raise PrometheusError(f"{option} {text!r}: the end is not after the start", usage=True)
    return start, end


def default_step(start: float, end: float) -> float:
    return max(MIN_DEFAULT_STEP_S, math.ceil((end - start) / DEFAULT_WINDOWS))


# --------------------------------------------------------------------------- HTTP


# Full URL, time.monotonic() deadline -> response body; raises TimeoutError when the
# deadline passes first. (Tests may pass their own.)
Fetch = Callable[[str, float], bytes]


def _http_get(url: str, deadline: float) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    root = url.split("/api/v1/", 1)[0]
    with deadline_opener(deadline) as (opener, watchdog):
        try:
            left = max(0.001, deadline - time.monotonic())
            with opener.open(req, timeout=left) as resp:
                body = _bounded_read(resp, url, MAX_RESPONSE_BYTES)
                if resp.length:  # what Content-Length promised and did not come
                    raise http.client.IncompleteRead(body, resp.length)
                return body
        except urllib.error.HTTPError as exc:
            if watchdog.fired:
                raise TimeoutError("the deadline passed") from None
            error_body = b""
            if exc.fp is not None:
                error_body = exc.read(MAX_ERROR_BODY_BYTES)
            raise _http_error(url, exc.code, error_body) from None
        except RedirectRefused as exc:
            raise PrometheusError(
                f"{root} redirected to {escape_text(exc.location[:200])}; serwatt follows "
                "redirects only to http(s) URLs (other schemes are outside its deadline): "
                "give the URL of the API root itself",
                usage=False,
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            # urllib wraps a connect that ran out of time (the watchdog refuses one past the
            # deadline; the connect's own timeout is the time left) in a URLError, and under
            # load that can happen before the watchdog's timer has fired
            if watchdog.fired or isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError):
                raise TimeoutError("the deadline passed") from None
            if isinstance(exc, http.client.HTTPException):
                raise PrometheusError(
                    f"cannot read the answer of {root}: {type(exc).__name__}: "
                    f"{str(reason)[:200]}; check that the server is healthy",
                    usage=False,
                ) from None
            raise PrometheusError(
                f"cannot reach {root}: {str(reason)[:200]}; check the address and that the "
                f"server is up (curl {root}/api/v1/status/buildinfo)",
                usage=False,
            ) from None


def _bounded_read(resp: Any, url: str, limit: int) -> bytes:
    chunks, size = [], 0
    while chunk := resp.read(min(1 << 20, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise PrometheusError(
                f"the answer to {url[:200]} is over {limit} bytes; query a shorter range, a "
                "larger --step or a narrower selector",
                usage=True,
            )
    return b"".join(chunks)


def _http_error(url: str, code: int, body: bytes) -> PrometheusError:
    root = url.split("/api/v1/", 1)[0]
    message = ""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            message = doc["error"][:500]
    except (ValueError, RecursionError):
        message = body[:200].decode("utf-8", "replace")
    if code in (400, 422):
        return PrometheusError(
            f"{root} refused the query ({code}): {message}; check the selector's syntax "
            "and the range",
            usage=True,
        )
    if code == 404:
        return PrometheusError(
            f"{root} has no /api/v1/query_range (404): give the API root of Prometheus "
            "(http://host:9090) or VictoriaMetrics (http://host:8428), with any path prefix",
            usage=True,
        )
    return PrometheusError(f"{root} answered HTTP {code}: {message}", usage=False)


# --------------------------------------------------------------------------- responses


@dataclass(frozen=True)
class Series:
    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]  # (epoch seconds, value), in time order


def _bad(what: str) -> PrometheusError:
    return PrometheusError(
        f"not a Prometheus query_range answer: {what}; is the URL a Prometheus or "
        "VictoriaMetrics API root?",
        usage=False,
    )


def max_json_values() -> int:
    """The JSON values (object keys included) a sound answer within MAX_SERIES,
    MAX_LABELS and MAX_ANSWER_POINTS can hold: per series its object, two keys, the label
    map and the values list, two per label; three per point ([t, "v"]); and the envelope."""
    return MAX_SERIES * (5 + 2 * MAX_LABELS) + 3 * MAX_ANSWER_POINTS + 16


def json_values_bound(body: bytes) -> int:
    """An upper bound on the JSON values (keys included) in `body`, counted without
    parsing: every value but the outermost follows a `[`, `,` or `:`, every key a `{` or
    `,` (these bytes inside strings only make the bound looser)."""
    return sum(body.count(c) for c in (b"[", b"{", b",", b":")) + 1


def parse_matrix(body: bytes) -> list[Series]:
    """A query_range response body -> its series, shape and values checked.

    Refused before parsing when it holds more JSON values than a sound answer could:
    json.loads builds one Python object (50-200 bytes) per value."""
    value_count = json_values_bound(body)
    if value_count > max_json_values():
        raise PrometheusError(
            f"an answer of {len(body)} bytes holding up to {value_count} JSON values, more than "
            f"{MAX_SERIES} series of {MAX_LABELS} labels and {MAX_ANSWER_POINTS} points in "
            "all could; narrow the selector, query a shorter range or a larger --step",
            usage=True,
        )
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise _bad("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise _bad("the body is not a JSON object")
    if doc.get("status") != "success":
        error = doc.get("error")
        said = str(error)[:500] if error else f"status {doc.get('status')!r}"
        raise PrometheusError(f"the query failed: {said}", usage=False)
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise _bad("data.resultType is not 'matrix'")
    result = data.get("result")
    if not isinstance(result, list):
        raise _bad("data.result is not a list")
    if len(result) > MAX_SERIES:
        raise PrometheusError(
            f"{len(result)} series in one answer, more than {MAX_SERIES}; narrow the selector",
            usage=True,
        )
    out: list[Series] = []
    total = 0
    for item in result:
        if not isinstance(item, dict):
            raise _bad("a series is not an object")
        metric, values = item.get("metric"), item.get("values")
        if not isinstance(metric, dict) or not isinstance(values, list):
            raise _bad("a series lacks its metric labels or values")
        if len(metric) > MAX_LABELS:
            raise _bad(f"a series has {len(metric)} labels, more than {MAX_LABELS}")
        total += len(values)
        if total > MAX_ANSWER_POINTS:
            raise PrometheusError(
                f"more than {MAX_ANSWER_POINTS} points in one answer; narrow the selector, "
                "query a shorter range or a larger --step",
                usage=True,
            )
        for k, v in metric.items():
            if not (isinstance(k, str) and isinstance(v, str)):
                raise _bad("a label is not a string")
            if len(k) > MAX_LABEL_TEXT or len(v) > MAX_LABEL_TEXT:
                raise _bad(f"a label is longer than {MAX_LABEL_TEXT} characters")
        if len(values) > MAX_POINTS:
            raise _bad(f"a series has {len(values)} points, more than {MAX_POINTS}")
        points = []
        for p in values:
            if not (isinstance(p, list) and len(p) == 2 and isinstance(p[1], str)):
                raise _bad('a point is not [time, "value"]')
            t, v = p
            if isinstance(t, bool) or not isinstance(t, (int, float)):
                raise _bad("a point's time is not a number")
            try:
                value = float(v)
            except ValueError:
                raise _bad(f"a point's value {v[:40]!r} is not a number") from None
            if not (math.isfinite(t) and math.isfinite(value)):
                raise _bad("a point is NaN or infinite")
            points.append((float(t), value))
        points.sort()
        out.append(Series(dict(metric), tuple(points)))
    return out


# --------------------------------------------------------------------------- queries


@dataclass(frozen=True)
class SideQuery:
    """One side of the comparison: a selector over a time range, in steps of step_s."""

    name: str  # "baseline" | "candidate"
    selector: str  # checked by check_selector
    start: float
    end: float
    step_s: float


class PromQL:
    """Range queries against one API root: each within `request_deadline_s`, all of them
    within `report_deadline_s` from construction."""

    def __init__(
        self,
        url: str,
        fetch: Fetch | None = None,
        *,
        request_deadline_s: float = REQUEST_DEADLINE_S,
        report_deadline_s: float = REPORT_DEADLINE_S,
    ) -> None:
        self.url = check_url(url)
        self._fetch = fetch or _http_get
        self.queries: list[str] = []  # every expression sent, for the report's source
        self.request_deadline_s = request_deadline_s
        self.report_deadline_s = report_deadline_s
        self._report_deadline = time.monotonic() + report_deadline_s

    def range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        points = (end - start) / step_s + 1
        if not points <= MAX_POINTS:
            raise PrometheusError(
                f"{points:.0f} points per series (range / step), more than {MAX_POINTS}; "
                "give a larger --step",
                usage=True,
            )
        self.queries.append(expr)
        params = urllib.parse.urlencode(
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        )
        request_deadline = time.monotonic() + self.request_deadline_s
        deadline = min(request_deadline, self._report_deadline)
        try:
            body = self._fetch(f"{self.url}/api/v1/query_range?{params}", deadline)
        except TimeoutError:
            if deadline < request_deadline:
                raise PrometheusError(
                    f"{self.url} did not answer the report's {len(self.queries)} queries "
                    f"within the {self.report_deadline_s:g} s report deadline; check that "
                    "the server is healthy, or query a shorter range, a larger --step or a "
                    "narrower selector",
                    usage=False,
                ) from None
            raise PrometheusError(
                f"{self.url} did not answer {expr[:100]} within the "
                f"{self.request_deadline_s:g} s request deadline (a slow or stalled server); "
                "check that it is healthy, or query a shorter range or a larger --step",
                usage=False,
            ) from None
        return parse_matrix(body)


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
                raise _bad(f"a {field} series has codepath {str(cp)[:40]!r}, not serwatt's")
            key = _run_key(s.labels)
            name = field
            if field == "energy_j":
                src = s.labels.get("source", "")
                if src not in ("rapl", "model"):
                    raise _bad(f"an energy series has source {src[:40]!r}")
                sources.setdefault(key, set()).add(src)
                name = f"energy_j:{src}"
            if field == "gpu_wait_s":
                gpus.add(key)
            way = s.labels.get("direction")
            if way is not None and field in ("samples", "cpu_s"):
                if way not in DIRECTIONS:
                    raise _bad(f"a {field} series has direction {str(way)[:40]!r}")
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
        raise _bad(str(exc)) from None


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
