"""The report's name for profiler/deadline_http.py, which moved below the layers: the
daemon's Pyroscope push (profiler/service/pyroscope_push.py) posts through it too, and
the service layer may not import the report's modules."""

from serwatt.profiler.deadline_http import (
    WEB_SCHEMES,
    RedirectRefused,
    _Watchdog,
    deadline_opener,
)

__all__ = ["WEB_SCHEMES", "RedirectRefused", "_Watchdog", "deadline_opener"]
