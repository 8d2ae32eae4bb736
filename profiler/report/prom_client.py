"""PromQL range queries over HTTP against one API root (Prometheus or VictoriaMetrics),
each within a deadline.

The server is hostile. Each request has a total deadline (REQUEST_DEADLINE_S: a socket
timeout bounds one recv only, so a server dripping a byte at a time would hold a request
for ever), and the report's queries together have one (REPORT_DEADLINE_S). The answer's
size is bounded (MAX_RESPONSE_BYTES) before prom_matrix parses it. HTTP and network
failures are `PrometheusError`s naming the problem and the fix.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from serwatt.profiler.deadline_http import RedirectRefused, deadline_opener
from serwatt.profiler.report.prom_args import check_url
from serwatt.profiler.report.prom_error import PrometheusError
from serwatt.profiler.report.prom_matrix import MAX_POINTS, Series, parse_matrix
from serwatt.profiler.terminal_escape import escape_text

MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # one query's JSON; more is refused, not parsed
MAX_ERROR_BODY_BYTES = 64 * 1024  # of an HTTP error's body, only its message is shown
REQUEST_DEADLINE_S = 30.0  # one HTTP request, connect to last byte
REPORT_DEADLINE_S = 300.0  # every query of one report together

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
