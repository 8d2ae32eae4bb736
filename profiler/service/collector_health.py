"""One wrapper runs every collector read the daemon makes (node_exporter's `execute()`).

It times the read, catches its failure (logged, never raised: a failing collector must
not take the daemon or the scrape down), and sets `serwatt_collector_up` and
`serwatt_collector_duration_seconds` for every collector the read stands for. No call
site sets collector health by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from serwatt.profiler.service.ledger import Ledger

log = logging.getLogger("serwatt.daemon")

T = TypeVar("T")
Health = tuple[bool, str]  # (up, detail)


def run_collector(
    ledger: Ledger,
    name: str,
    read: Callable[[], T],
    judge: Callable[[T], Mapping[str, Health]] | None = None,
    *,
    monotonic: Callable[[], float],
) -> T | None:
    """Run `read`; on success `judge` says each collector's health from what it returned
    (default: `name` up), on failure `name` is down with the error. None on failure.
    monotonic: the daemon's clock (service/clock.py), which times the read."""
    t0 = monotonic()
    try:
        value = read()
    except Exception as exc:
        ledger.set_collector(name, up=False, duration_s=monotonic() - t0, detail=str(exc))
        log.error("collector %s failed: %s", name, exc)
        return None
    publish(ledger, judge(value) if judge is not None else {name: (True, "")}, monotonic() - t0)
    return value


def publish(ledger: Ledger, health: Mapping[str, Health], duration_s: float) -> None:
    """Set each collector's health from one read that took `duration_s` (run_collector's
    last step; also the daemon's start-up probe, made before the ledger exists)."""
    for collector, (up, detail) in health.items():
        ledger.set_collector(collector, up=up, duration_s=duration_s, detail=detail)
