"""A process's cumulative CPU and storage reads, polled on a thread: figures between any two
times of a run.

`/proc/<pid>/stat` utime + stime is the CPU of every thread of the process, exited ones
included (a serializer's short-lived hashing threads leave no per-thread row to read), in
clock ticks: a figure between two times is good to about two ticks plus what the process
ran in one poll interval at each end. `/proc/<pid>/io` read_bytes is what the process made
the kernel fetch from storage (page-cache hits are not counted), readable by root and the
process's own user.

Each pid keeps at most `max_points` polls (the oldest are dropped): a figure that needs a
dropped poll is None, never a guess.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from serwatt.collectors import procstat
from serwatt.collectors.series import interpolate

POLL_S = 0.02
MAX_POINTS = 200_000  # per pid: about 66 minutes at POLL_S
IO_SOURCE = "procfs /proc/<pid>/io read_bytes (storage reads; page-cache hits not counted)"
CPU_SOURCE = "procfs /proc/<pid>/stat utime+stime (every thread, exited ones included)"


@dataclass
class _Series:
    t: deque[float]
    cpu_s: deque[float]
    read_bytes: deque[float | None]
    io_error: str | None = None


class ProcessCounters:
    """Polls the pids it is told about until stop()."""

    def __init__(
        self,
        procfs: Path = Path("/proc"),
        *,
        poll_s: float = POLL_S,
        max_points: int = MAX_POINTS,
    ) -> None:
        self.procfs = procfs
        self.poll_s = poll_s
        self.max_points = max_points
        self._series: dict[int, _Series] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serwatt-proc-counters", daemon=True)
        self._started = False

    def add(self, pid: int) -> None:
        with self._lock:
            if pid not in self._series:
                m = self.max_points
                self._series[pid] = _Series(deque(maxlen=m), deque(maxlen=m), deque(maxlen=m))
        self._poll(pid)
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._started:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                pids = list(self._series)
            for pid in pids:
                self._poll(pid)

    def _poll(self, pid: int) -> None:
        files = procstat.ProcessFiles(pid, self.procfs)
        try:
            st = files.stat()
        except (procstat.ProcessGone, procstat.ProcessUnreadable, ValueError):
            return
        t = time.time()
        cpu = (st.utime_ticks + st.stime_ticks) / procstat.CLOCK_TICKS_PER_S
        rb: float | None = None
        error = None
        try:
            for line in files.read("io").decode("ascii", "replace").splitlines():
                if line.startswith("read_bytes:"):
                    rb = float(int(line.split(":", 1)[1]))
        except procstat.ProcessUnreadable as exc:
            error = f"unavailable: {exc}"
        except (procstat.ProcessGone, ValueError):
            pass
        with self._lock:
            s = self._series[pid]
            s.t.append(t)
            s.cpu_s.append(cpu)
            s.read_bytes.append(rb)
            if error is not None:
                s.io_error = error

    def _between(self, pid: int, t0: float, t1: float, which: str) -> float | None:
        with self._lock:
            s = self._series.get(pid)
            if s is None:
                return None
            values = s.cpu_s if which == "cpu" else s.read_bytes
            # a zombie's stat still reads, its io does not: only polls that read count
            pts = [(t, float(v)) for t, v in zip(s.t, values, strict=True) if v is not None]
        if len(pts) < 2 or t1 < t0:
            return None
        a, b = interpolate(pts, t0), interpolate(pts, t1)  # None outside the polls
        return None if a is None or b is None else max(0.0, b - a)

    def cpu_s(self, pid: int, t0: float, t1: float) -> float | None:
        """The process's CPU seconds (all threads) between two epoch times; None if not
        polled over that span."""
        return self._between(pid, t0, t1, "cpu")

    def read_bytes(self, pid: int, t0: float, t1: float) -> float | None:
        """Bytes the process read from storage between two epoch times; None if unknown."""
        return self._between(pid, t0, t1, "io")

    def run_read_bytes(self, pid: int) -> tuple[float | None, str]:
        """(bytes read from storage from the first poll to the last, source or reason)."""
        with self._lock:
            s = self._series.get(pid)
            if s is None or not s.t:
                return None, "unavailable: the process was never polled"
            if s.io_error is not None:
                return None, s.io_error
            read = [v for v in s.read_bytes if v is not None]
            if not read:
                return None, "unavailable: /proc/<pid>/io not readable"
            first, last = read[0], read[-1]
            if len(s.t) == self.max_points:
                return None, "unavailable: the run outlasted the polls kept"
            return last - first, IO_SOURCE
