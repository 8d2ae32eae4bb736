"""The daemon's clock: the one place it reads time and waits.

The daemon's scheduling (slots, retries, overrun and abandonment, rescans) reads
monotonic seconds, stamps records with epoch seconds, and blocks only in `wait`, so a
test can hand it a clock whose time moves only when the daemon waits, and check the
schedule exactly (tests/daemon_fakes.py).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never steps back (scheduling)."""
        ...

    def time(self) -> float:
        """Epoch seconds (slot edges, records)."""
        ...

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Block until `event` is set or `timeout_s` have passed; True when it is set."""
        ...


class SystemClock:
    """The machine's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(timeout_s)
