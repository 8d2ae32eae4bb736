"""The one error of the Prometheus input of the A/B report, and whose fault it is.

Every failure of a query (an argument, the network, the server, an answer of the wrong
shape) is a `PrometheusError` whose message names the problem and the fix; `usage` says
whether it is the caller's input (exit 2) or the server/network (exit 1).
"""

from __future__ import annotations


class PrometheusError(Exception):
    """A query that could not be answered; the message names the problem and the fix.
    usage: True when the caller's input is at fault (exit 2), False for the server or
    the network (exit 1)."""

    def __init__(self, message: str, *, usage: bool) -> None:
        super().__init__(message)
        self.usage = usage


def bad_answer(what: str) -> PrometheusError:
    return PrometheusError(
        f"not a Prometheus query_range answer: {what}; is the URL a Prometheus or "
        "VictoriaMetrics API root?",
        usage=False,
    )
