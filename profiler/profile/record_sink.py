"""The run-record sink of a `serwatt profile` session: every window into a run record."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiler.attribution.window import attribute_window, energy_record, gpu_record
from profiler.records.host import fingerprint
from profiler.records.run_ids import format_start_time
from profiler.records.store import Recorder
from profiler.sampling.window import WindowReport


class RecordSink:
    """Session observer (profiler/session.py) that records a `serwatt profile` session as
    one run in a record file, in the daemon's format.

    Opening the file happens in the constructor, so a bad --record path fails before
    profiling starts. `energy` is the session's profiler.energy.EnergyObserver, if any:
    each window's joules and GPU-wait are attributed from its tracker (place this observer
    after it, so the tracker is already started).
    """

    def __init__(
        self,
        path: Path,
        *,
        target: str = "profile",
        run_id: str | None = None,
        energy: Any = None,
        host: Mapping | None = None,
        config: Mapping | None = None,
    ) -> None:
        self.recorder = Recorder(path)
        self.path = self.recorder.path
        self.target = target
        self.run_id = run_id
        self.energy = energy
        self._host = host
        self._config = dict(config or {})
        self._started = False
        self.windows = 0
        self.errors: list[str] = []

    def _sources(self) -> dict[str, Any]:
        if self.energy is None:
            return {"energy": "unavailable: not measured by this session", "gpu": "unavailable"}
        tracker = self.energy.tracker
        status = getattr(self.energy, "status", {}) or {}
        out: dict[str, Any] = {"energy": getattr(tracker, "energy_source", None)}
        for name, st in status.items():
            out[f"{name}_up"] = bool(getattr(st, "up", False))
            if getattr(st, "reason", None):
                out[f"{name}_reason"] = st.reason
        return out

    def on_start(self, info: Any) -> None:
        if self._started:
            return
        started_at = float(getattr(info, "started_at", time.time()))
        root_pid = getattr(info, "root_pid", 0)
        if self.run_id is None:
            self.run_id = f"{self.target}-{format_start_time(started_at)}-{root_pid}"
        config = {
            "mode": "serwatt profile",
            "command": getattr(info, "command", None),
            "rate_hz": getattr(info, "rate_hz", None),
            "window_s": getattr(info, "window_s", None),
            **self._config,
        }
        host = self._host
        if host is None:
            # The energy tracker already probed NVML: reuse it rather than probe twice.
            tracker = getattr(self.energy, "tracker", None)
            nvml = getattr(tracker, "nvml", None)
            nvml_off = tracker is not None and getattr(tracker, "nvml_mode", None) == "off"
            host = fingerprint(
                nvml_status=nvml.probe() if nvml is not None and not nvml_off else None
            )
            if nvml_off:
                host["gpu_source"] = "unavailable: off (NVML disabled for this session)"
        self.recorder.start_run(
            self.run_id,
            self.target,
            host=host,
            config=config,
            sources=self._sources(),
            started_at=started_at,
        )
        self._started = True

    def on_window(self, report: WindowReport) -> None:
        if not self._started:
            self.on_start(
                type("Info", (), {"started_at": report.started_at, "root_pid": report.pid})()
            )
        energy = gpu = None
        if self.energy is not None:
            try:
                we = self.energy.tracker.window(report.started_at, report.ended_at)
                ta = None if we.source == "unavailable" else attribute_window(report, we)
                energy, gpu = energy_record(we, ta), gpu_record(ta)
            except Exception as exc:  # the window is still recorded, without joules
                self.errors.append(f"energy for window at {report.started_at:.0f}: {exc}")
                energy = {"source": "unavailable", "reason": f"attribution failed: {exc}"}
        assert self.run_id is not None
        self.recorder.append_window(self.run_id, report, energy=energy, gpu=gpu)
        self.windows += 1

    def finish(self) -> dict[str, Any]:
        try:
            if self._started and self.run_id is not None:
                self.recorder.finish_run(self.run_id, time.time())
        finally:
            self.recorder.close()
        # Nothing for the profile document: the record is its own output.
        return {}
