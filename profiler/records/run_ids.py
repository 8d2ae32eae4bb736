"""Run ids: a target's `run` template rendered into a safe, stable id for its record."""

from __future__ import annotations

import re
import time

NO_UNIT = "nounit"
_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.@:+-]")


def check_run_id(run_id: str) -> str:
    """A run id given by hand: 1-128 characters of letters, digits and _.@:+- ."""
    if not 1 <= len(run_id) <= 128 or _RUN_ID_UNSAFE.search(run_id):
        raise ValueError(
            f"run id {run_id[:40]!r} must be 1-128 characters of letters, digits and _.@:+-"
        )
    return run_id


def format_start_time(epoch_s: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch_s))


def render_run_id(
    template: str, *, target: str, pid: int, start_time: float, unit: str | None, host: str
) -> str:
    """Fill a `run` template (placeholders validated by profiler.service.config) into a safe id."""
    rendered = template.format(
        target=target,
        pid=pid,
        start_time=format_start_time(start_time),
        unit=unit or NO_UNIT,
        host=host,
    )
    return _RUN_ID_UNSAFE.sub("_", rendered)
