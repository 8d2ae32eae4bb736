"""The run-record sink of a `serwatt profile` session: every window into a run record."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from profiler.attribution.episodes import Episode
from profiler.attribution.tracker import EnergyTracker
from profiler.attribution.window import AttributedWindow
from profiler.many import ManyError
from profiler.many.verify import read_receipts
from profiler.profile.session import SessionInfo
from profiler.records.host import fingerprint
from profiler.records.run_ids import format_start_time
from profiler.records.store import Recorder


class RecordSink:
    """Session sink (profiler/profile/session.py) that records a `serwatt profile` session
    as one run in a record file, in the daemon's format.

    Opening the file happens in the constructor, so a bad --record path fails before
    profiling starts. `tracker` is the session's energy tracker, if any: its sources go
    into the run, and its NVML probe into the host fingerprint.
    """

    def __init__(
        self,
        path: Path,
        *,
        target: str = "profile",
        run_id: str | None = None,
        tracker: EnergyTracker | None = None,
        host: Mapping | None = None,
        config: Mapping | None = None,
        checkpoints: Path | None = None,
    ) -> None:
        self.recorder = Recorder(path)
        self.path = self.recorder.path
        self.target = target
        self.run_id = run_id
        self.tracker = tracker
        self._host = host
        self._config = dict(config or {})
        self._started = False
        self.windows = 0
        self.errors: list[str] = []
        # `.many` files of the run, by (path, mtime, size) already anchored: a file rewritten
        # in place under the same name is a new checkpoint
        self.checkpoints = checkpoints
        self._seen: set[tuple[str, int, int]] = set()

    def _sources(self) -> dict[str, Any]:
        if self.tracker is None:
            return {"energy": "unavailable: not measured by this session", "gpu": "unavailable"}
        out: dict[str, Any] = {"energy": self.tracker.energy_source}
        for name, st in self.tracker.probe().items():
            out[f"{name}_up"] = bool(st.up)
            if st.reason:
                out[f"{name}_reason"] = st.reason
        return out

    def _fingerprint(self) -> dict[str, Any]:
        tracker = self.tracker
        if tracker is None:
            return fingerprint()
        if tracker.nvml_mode == "off":
            host = fingerprint()
            host["gpu_source"] = "unavailable: off (NVML disabled for this session)"
            return host
        # The energy tracker already probed NVML: reuse it rather than probe twice.
        return fingerprint(nvml_status=tracker.nvml.probe())

    def on_start(self, info: SessionInfo) -> None:
        if self.run_id is None:
            self.run_id = f"{self.target}-{format_start_time(info.started_at)}-{info.root_pid}"
        config = {
            "mode": "serwatt profile",
            "command": info.command,
            "rate_hz": info.rate_hz,
            "window_s": info.window_s,
            **self._config,
        }
        self.recorder.start_run(
            self.run_id,
            self.target,
            host=self._host if self._host is not None else self._fingerprint(),
            config=config,
            sources=self._sources(),
            started_at=info.started_at,
        )
        self._started = True

    def on_window(self, window: AttributedWindow) -> None:
        if window.failure is not None:  # the window is still recorded, without joules
            self.errors.append(
                f"energy for window at {window.report.started_at:.0f}: {window.failure}"
            )
        assert self.run_id is not None, "on_start comes first"
        self.recorder.append_window(
            self.run_id, window.report, energy=window.energy_record(), gpu=window.gpu_record()
        )
        self.windows += 1
        self._anchor_checkpoints()

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        assert self.run_id is not None, "on_start comes first"
        self.recorder.append_episodes(self.run_id, episodes)

    def _anchor_checkpoints(self) -> None:
        """Store the receipts of the run's `.many` files seen so far (a workload that keeps
        only its newest checkpoints deletes older ones: each window looks again)."""
        if self.checkpoints is None or self.run_id is None:
            return
        rows = []
        for path in sorted(self.checkpoints.glob("*.many")):
            try:
                st = path.stat()
                key = (str(path), st.st_mtime_ns, st.st_size)
                if key in self._seen:
                    continue
                receipt, prev = read_receipts(path)
            except (OSError, ManyError) as exc:  # half-written or hostile: not anchored
                self.errors.append(f"checkpoint {path}: not anchored: {exc}")
                continue
            self._seen.add(key)
            rows.append((str(receipt), None if prev is None else str(prev), str(path)))
        self.recorder.append_receipts(self.run_id, rows)

    def finish(self) -> None:
        try:
            if self._started and self.run_id is not None:
                self._anchor_checkpoints()
                self.recorder.finish_run(self.run_id, time.time())
        finally:
            self.recorder.close()
