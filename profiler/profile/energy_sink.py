"""The energy sink of a `serwatt profile` session: joules and GPU-wait in the profile document."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from serwatt.profiler.attribution.apportion import GpuWaitAttribution
from serwatt.profiler.attribution.tracker import (
    ENERGY_METHOD,
    GPU_WAIT_METHOD,
    TrackerReport,
    WindowEnergy,
)
from serwatt.profiler.attribution.window import AttributedWindow, DirectedTotals
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS


def _r(v: float | None, nd: int = 6) -> float | None:
    return None if v is None else round(v, nd)


@dataclass
class _GpuAcc:
    """One GPU's running totals over a profile."""

    index: int
    uuid: str | None
    name: str | None
    up: bool = True
    reason: str | None = None
    used: bool = False
    covered_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    energy_j: float | None = None
    energy_source: str | None = None
    sample_period_s: float | None = None
    clock: Any = None
    wait_s: dict[str, float] | None = None
    unattributed_wait_s: float = 0.0
    idle_j: dict[str, float] | None = None
    idle_j_missing: bool = False


@dataclass(frozen=True)
class CodepathEnergy:
    """One codepath's joules and GPU-wait over a profile (None: not measured)."""

    energy_j: float | None = None
    energy_source: str | None = None
    gpu_wait_s: float | None = None
    gpu_idle_j: float | None = None
    # direction -> (energy_j, gpu_wait_s), each None where the codepath's is
    by_direction: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileEnergy:
    """The energy sections of a profile document (serwatt.profile/1: `energy`, `gpus`,
    `nvml`) and each codepath's energy fields."""

    energy: dict[str, Any]
    gpus: list[dict[str, Any]] = field(default_factory=list)
    codepaths: Mapping[str, CodepathEnergy] = field(default_factory=dict)
    nvml: dict[str, Any] | None = None


class EnergySink:
    """Session sink (profiler/profile/session.py) adding joules and GPU-wait to a profile.

    Joules and GPU-wait are each window's own attribution (AttributedWindow: the figures
    the run record keeps), summed. Node totals and each GPU's reading are the pipeline's
    readings span by span as windows arrive (AttributedWindow.advance), so a profile of
    any length stays inside the tracker's history. The tracker's status and self-metrics
    come the same way (SessionInfo.tracker at the start, AttributedWindow.tracker with
    each window, the latest kept): the sink never reads the tracker.
    """

    def __init__(self) -> None:
        self._report: TrackerReport | None = None  # the latest the pipeline handed
        self.summary: ProfileEnergy | None = None  # set by finish()
        self._fold = DirectedTotals()  # the windows' joules and GPU-wait by direction
        self._dir_j: dict[str, dict[str, float]] = {}  # by codepath (finish)
        self._parts = {"idle": 0.0, "other_processes": 0.0, "target_unsampled": 0.0}
        self._sources: set[str] = set()
        self._reasons: list[str] = []
        self._notes: list[str] = []
        self._pids: set[int] = set()
        self._first: float | None = None
        self._last: float | None = None
        self._node: dict[str, float] = {}
        self._node_missing: set[str] = set()
        self._per_pkg: dict[int, float] = {}
        self._node_unavailable_s = 0.0
        self._gpus: dict[int, _GpuAcc] = {}

    def on_start(self, info: Any) -> None:
        """The tracker's report at the start (SessionInfo.tracker), until a window's."""
        self._report = getattr(info, "tracker", None) or self._report

    def on_window(self, window: AttributedWindow) -> None:
        if window.tracker is not None:
            self._report = window.tracker
        report = window.report
        self._pids.add(report.pid)
        self._first = (
            report.started_at if self._first is None else min(self._first, report.started_at)
        )
        self._last = report.ended_at if self._last is None else max(self._last, report.ended_at)
        if window.advance is not None:
            self._add_node(window.advance)
            self._add_gpus(window.advance)
        if window.attribution is not None:
            self._add_gpu_wait(window.attribution.gpu_wait)
        self._fold.add(window.by_direction())
        e = window.attribution.energy if window.attribution else None
        if e is not None:
            self._sources.add(e.source)
            self._parts["idle"] += e.unattributed_idle_j
            self._parts["other_processes"] += e.unattributed_other_processes_j
            self._parts["target_unsampled"] += e.unattributed_target_unsampled_j
        elif window.reading is not None and window.reading.reason:
            self._reasons.append(window.reading.reason)
        elif window.failure is not None:
            self._reasons.append(f"attribution failed: {window.failure}")

    def _add_node(self, we: WindowEnergy) -> None:
        """One span of the node's reading (the pipeline's, AttributedWindow.advance)."""
        if we.source == "unavailable" or we.package_j is None:
            self._node_unavailable_s += we.wall_s
            if we.reason:
                self._reasons.append(we.reason)
            return
        self._model = we.model
        for key, val in (
            ("package_j", we.package_j),
            ("dynamic_j", we.dynamic_j),
            ("idle_j", we.idle_j),
            ("dram_j", we.dram_j),
            ("psys_j", we.psys_j),
            ("node_busy_cpu_s", we.node_busy_cpu_s),
            ("node_total_cpu_s", we.node_total_cpu_s),
        ):
            if val is None:
                self._node_missing.add(key)
            else:
                self._node[key] = self._node.get(key, 0.0) + val
        for pkg, j in we.per_package_j.items():
            self._per_pkg[pkg] = self._per_pkg.get(pkg, 0.0) + j
        for note in we.notes:
            if note not in self._notes:
                self._notes.append(note)

    def _gpu(self, index: int) -> _GpuAcc:
        acc = self._gpus.get(index)
        if acc is None:
            acc = self._gpus[index] = _GpuAcc(index, None, None)
        return acc

    def _add_gpus(self, we: WindowEnergy) -> None:
        """Each GPU's reading (coverage, busy and idle time, energy) span by span, as the
        node's energy: the GPU as NVML saw it, whichever process used it (a reading
        lists GPUs only while NVML is up)."""
        for g in we.gpus:
            acc = self._gpu(g.index)
            acc.uuid, acc.name = acc.uuid or g.uuid, acc.name or g.name
            acc.up, acc.reason = g.up, g.reason
            acc.covered_s += g.covered_s
            acc.busy_s += g.busy_s
            acc.idle_s += g.idle_s
            if g.energy_j is not None:
                acc.energy_j = (acc.energy_j or 0.0) + g.energy_j
                acc.energy_source = g.energy_source
            acc.sample_period_s = g.sample_period_s or acc.sample_period_s
            acc.clock = g.clock or acc.clock

    def _add_gpu_wait(self, waits: Sequence[GpuWaitAttribution]) -> None:
        """A window's GPU-wait, as its attribution computed it (the record's figure):
        summed per GPU over the windows of every process that used it."""
        for w in waits:
            acc = self._gpu(w.gpu_index)
            acc.used = True
            acc.wait_s = acc.wait_s or dict.fromkeys(CODEPATHS, 0.0)
            for cp, v in w.wait_s.items():
                acc.wait_s[cp] += v
            acc.unattributed_wait_s += w.unattributed_s
            if w.idle_energy_j is None:
                acc.idle_j_missing = acc.idle_j_missing or w.idle_s > 0
            else:
                acc.idle_j = acc.idle_j or dict.fromkeys(CODEPATHS, 0.0)
                for cp, v in w.idle_energy_j.items():
                    acc.idle_j[cp] += v

    def on_episodes(self, episodes: object) -> None:
        """Episodes carry their own GPU-wait (the session's); nothing to add here."""

    def finish(self) -> ProfileEnergy:
        """The profile's energy sections, once every window has been seen."""
        self.summary = self._finish()
        return self.summary

    def _energy_part(self) -> dict[str, Any]:
        if not self._sources or "package_j" not in self._node:
            reason = self._reasons[0] if self._reasons else "no window was profiled"
            tr = self._report
            if tr is not None and tr.energy_source == "unavailable":
                es = tr.energy_status
                reason = (
                    f"{tr.energy_collector} {es.reason}: {es.detail}; "
                    f"cpu model: {tr.model_status.detail}"
                )
            return {"source": "unavailable", "reason": reason, "package_j": None}
        (source,) = self._sources
        tr = self._report
        assert tr is not None, "every attributed window carries the tracker's report"
        es = tr.energy_status
        total = self._node["package_j"]
        # the windows arrive fitted to the node's joules (attribution.window.RunFit): the
        # record keeps the same figures
        self._dir_j = self._fold.by_codepath(self._fold.energy_j)
        attributed = min(
            math.fsum(j for by_d in self._dir_j.values() for j in by_d.values()), total
        )
        node = {k: (None if k in self._node_missing else _r(v)) for k, v in self._node.items()}
        notes = list(self._notes)
        if self._node_unavailable_s > 0:
            notes.append(
                f"{self._node_unavailable_s:.2f} s of the profile had no energy reading "
                f"({self._reasons[0] if self._reasons else 'unknown'})"
            )
        part: dict[str, Any] = {
            "source": source,
            "reason": es.detail if source == "model" else None,
            "package_j": _r(total),
            "attributed_j": _r(attributed),
            "unattributed_j": _r(max(0.0, total - attributed)),
            "dynamic_j": node.get("dynamic_j"),
            "idle_j": node.get("idle_j"),
            "dram_j": node.get("dram_j"),
            "psys_j": node.get("psys_j"),
            "per_package_j": {str(k): _r(v) for k, v in sorted(self._per_pkg.items())},
            "node_busy_cpu_s": node.get("node_busy_cpu_s"),
            "node_total_cpu_s": node.get("node_total_cpu_s"),
            "window": {"start": self._first, "end": self._last},
            "method": ENERGY_METHOD,
            "notes": notes,
        }
        if source == "model":
            part["reason"] = f"{tr.energy_collector} {es.reason}: {es.detail}"
            part["model"] = getattr(self, "_model", None)
        if source == "rapl" and tr.rapl is not None:
            rs = tr.rapl
            part["rapl"] = {
                "poll_period_s": tr.rapl_poll_period_s,
                "max_safe_period_s": rs.poll_period_s,
                "zones": [
                    {"zone": z.zone_id, "name": z.name, "kind": z.kind, "package": z.package}
                    for z in rs.zones
                ],
                "skipped": [{"zone": s.zone_id, "reason": s.reason} for s in rs.skipped],
                "wraps_corrected": tr.rapl_wraps,
                "max_read_gap_s": round(tr.max_rapl_gap_s, 6),
            }
            fastest = tr.fastest_wrap_s
            if fastest is not None and tr.max_rapl_gap_s > fastest / 2:
                part["notes"].append(
                    f"RAPL reads were {tr.max_rapl_gap_s:.2f} s apart at worst; at "
                    f"the power seen, a counter wraps every {fastest:.2f} s: a wrap may have "
                    "been missed"
                )
        if len(self._pids) == 1:
            # The residual's parts; between windows = py-spy restarts between windows.
            parts = {k: _r(v) for k, v in self._parts.items()}
            rest = part["unattributed_j"] - math.fsum(self._parts.values())
            parts["between_windows"] = _r(max(0.0, rest))
            part["unattributed_parts_j"] = parts
        return part

    def _finish(self) -> ProfileEnergy:
        energy = self._energy_part()
        measured = energy["source"] in ("rapl", "model")
        nv = self._report.gpu_status if self._report is not None else None
        gpus: list[dict[str, Any]] = []
        wait_s: dict[str, float] | None = None
        idle_j: dict[str, float] | None = None
        for acc in sorted(self._gpus.values(), key=lambda a: a.index):
            row: dict[str, Any] = {
                "index": acc.index,
                "uuid": acc.uuid,
                "name": acc.name,
                "up": acc.up,
                "reason": acc.reason,
                "used_by_target": acc.used,
                "covered_s": _r(acc.covered_s),
                "busy_s": _r(acc.busy_s),
                "idle_s": _r(acc.idle_s),
                "energy_j": _r(acc.energy_j),
                "energy_source": acc.energy_source,
                "sample_period_s": _r(acc.sample_period_s),
                "clock": None
                if acc.clock is None
                else {"domain": acc.clock.domain, "offset_s": acc.clock.offset_s},
                "gpu_wait_s": None,
                "unattributed_wait_s": None,
                "gpu_idle_j": None,
            }
            if acc.used and acc.wait_s is not None:
                row["gpu_wait_s"] = {cp: _r(v) for cp, v in acc.wait_s.items()}
                row["unattributed_wait_s"] = _r(acc.unattributed_wait_s)
                wait_s = wait_s or dict.fromkeys(CODEPATHS, 0.0)
                for cp, v in acc.wait_s.items():
                    wait_s[cp] += v
                if acc.idle_j is not None and not acc.idle_j_missing:
                    row["gpu_idle_j"] = {cp: _r(v) for cp, v in acc.idle_j.items()}
                    idle_j = idle_j or dict.fromkeys(CODEPATHS, 0.0)
                    for cp, v in acc.idle_j.items():
                        idle_j[cp] += v
            gpus.append(row)
        if not gpus and nv is not None and nv.up and self._report is not None:
            gpus = [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "up": g.up,
                    "reason": g.reason,
                    "used_by_target": False,
                }  # fmt: skip
                for g in self._report.nvml_gpus
            ]
        dir_wait_s = self._fold.by_codepath(
            {(cp, d): s for (cp, d, _gpu), s in self._fold.gpu_wait_s.items()}
        )
        codepaths = {
            cp: CodepathEnergy(
                energy_j=_r(math.fsum(self._dir_j[cp].values())) if measured else None,
                energy_source=energy["source"] if measured else None,
                gpu_wait_s=_r(wait_s[cp]) if wait_s is not None else None,
                gpu_idle_j=_r(idle_j[cp]) if idle_j is not None else None,
                by_direction={
                    d: (
                        _r(self._dir_j[cp][d]) if measured else None,
                        _r(dir_wait_s[cp][d]) if wait_s is not None else None,
                    )
                    for d in DIRECTIONS
                },
            )
            for cp in CODEPATHS
        }
        return ProfileEnergy(
            energy=energy,
            gpus=gpus,
            codepaths=codepaths,
            nvml=None
            if nv is None
            else {
                "up": nv.up,
                "reason": nv.reason,
                "detail": nv.detail,
                "gpu_wait_method": GPU_WAIT_METHOD,
            },
        )
