"""The command line's PromQL arguments, checked: the API root, label-matcher selectors,
durations, times, ranges and the default step.

Each check returns the normalised value or raises a `PrometheusError` (usage=True) whose
message names the problem and the fix. Times are epoch seconds between 1970 and the end of
9999 (Prometheus' timestamps are milliseconds since 1970).
"""

from __future__ import annotations

import math
import re
import urllib.parse
from datetime import datetime

from serwatt.profiler.report.prom_error import PrometheusError

# Epoch seconds a --range may name: RFC 3339's years 0001-9999 less what is before 1970
# (Prometheus' timestamps are milliseconds since 1970).
MAX_EPOCH_S = 253_402_300_799.0
DEFAULT_WINDOWS = 30  # default step: the range in this many windows, and
MIN_DEFAULT_STEP_S = 60.0  # at least this long (several daemon windows and scrapes)

_MATCHER = re.compile(
    r"""\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*"""
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


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
