"""A query_range answer (Prometheus or VictoriaMetrics HTTP API) parsed into series,
its shape and size checked.

The server is hostile: what parsing an answer may build is bounded. The JSON values it
can hold are counted in the raw bytes first (max_json_values(), derived from the series,
label and point bounds), since json.loads builds a Python object per value (a 63 MB
answer of empty series took 1.7 GB) before any bound could look at it. Its shape is
checked (status, resultType matrix, label maps of strings, [time, "value"] pairs of
finite numbers), and series and points are bounded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from serwatt.profiler.report.prom_error import PrometheusError, bad_answer

MAX_SERIES = 20_000  # series in one response
MAX_POINTS = 11_000  # points per series: Prometheus' own limit per query_range series
MAX_ANSWER_POINTS = 1_000_000  # points of all series of one response together
MAX_LABELS = 64  # labels of one series
MAX_LABEL_TEXT = 1024  # characters of one label name or value


@dataclass(frozen=True)
class Series:
    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]  # (epoch seconds, value), in time order


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
        raise bad_answer("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise bad_answer("the body is not a JSON object")
    if doc.get("status") != "success":
        error = doc.get("error")
        said = str(error)[:500] if error else f"status {doc.get('status')!r}"
        raise PrometheusError(f"the query failed: {said}", usage=False)
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise bad_answer("data.resultType is not 'matrix'")
    result = data.get("result")
    if not isinstance(result, list):
        raise bad_answer("data.result is not a list")
    if len(result) > MAX_SERIES:
        raise PrometheusError(
            f"{len(result)} series in one answer, more than {MAX_SERIES}; narrow the selector",
            usage=True,
        )
    out: list[Series] = []
    total = 0
    for item in result:
        if not isinstance(item, dict):
            raise bad_answer("a series is not an object")
        metric, values = item.get("metric"), item.get("values")
        if not isinstance(metric, dict) or not isinstance(values, list):
            raise bad_answer("a series lacks its metric labels or values")
        if len(metric) > MAX_LABELS:
            raise bad_answer(f"a series has {len(metric)} labels, more than {MAX_LABELS}")
        total += len(values)
        if total > MAX_ANSWER_POINTS:
            raise PrometheusError(
                f"more than {MAX_ANSWER_POINTS} points in one answer; narrow the selector, "
                "query a shorter range or a larger --step",
                usage=True,
            )
        for k, v in metric.items():
            if not (isinstance(k, str) and isinstance(v, str)):
                raise bad_answer("a label is not a string")
            if len(k) > MAX_LABEL_TEXT or len(v) > MAX_LABEL_TEXT:
                raise bad_answer(f"a label is longer than {MAX_LABEL_TEXT} characters")
        if len(values) > MAX_POINTS:
            raise bad_answer(f"a series has {len(values)} points, more than {MAX_POINTS}")
        points = []
        for p in values:
            if not (isinstance(p, list) and len(p) == 2 and isinstance(p[1], str)):
                raise bad_answer('a point is not [time, "value"]')
            t, v = p
            if isinstance(t, bool) or not isinstance(t, (int, float)):
                raise bad_answer("a point's time is not a number")
            try:
                value = float(v)
            except ValueError:
                raise bad_answer(f"a point's value {v[:40]!r} is not a number") from None
            if not (math.isfinite(t) and math.isfinite(value)):
                raise bad_answer("a point is NaN or infinite")
            points.append((float(t), value))
        points.sort()
        out.append(Series(dict(metric), tuple(points)))
    return out
