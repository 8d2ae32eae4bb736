"""Run records (profiler.records) turned into the report's inputs (profiler.report.inputs).

The one place the report meets SQLite: everything after this reads RunInput only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records.reader import RecordedEpisode
from serwatt.profiler.records.store import Recorder, RunDetail, WindowRecord
from serwatt.profiler.report.inputs import (
    CheckpointInput,
    CodepathFigures,
    DirectionFigures,
    EpisodeInput,
    RestoreInput,
    RunInput,
    WindowInput,
)

ENERGY_SOURCES = ("rapl", "model")


def _energy_source(detail: RunDetail) -> tuple[str, str | None]:
    """The run's energy source and, when unavailable, why."""
    records = [w.energy_record for w in detail.windows if w.energy_record is not None]
    sources = Counter(e.source for e in records)
    measured = [s for s in sources if s in ENERGY_SOURCES]
    if len(measured) == 1:
        return str(measured[0]), None
    if len(measured) > 1:
        return "unavailable", f"windows mix energy sources ({', '.join(sorted(measured))})"
    reasons = [e.reason for e in records if e.reason]
    if reasons:
        return "unavailable", reasons[0]
    return "unavailable", str(detail.sources.get("energy") or "no energy was recorded")


def _run_restore_s(restores: Sequence[RestoreInput]) -> tuple[float, ...]:
    timed = [r.wall_s for r in restores if r.wall_s is not None]
    return (sum(timed),) if timed else ()


def _rate_hz(detail: RunDetail) -> float:
    configured = detail.config.get("rate_hz") or detail.config.get("sample_rate_hz")
    if isinstance(configured, (int, float)) and not isinstance(configured, bool):
        return float(configured)
    rates = Counter(w.rate_hz for w in detail.windows)
    return float(rates.most_common(1)[0][0]) if rates else 0.0


def _figures(row: dict[str, Any]) -> CodepathFigures:
    return CodepathFigures(
        samples=int(row.get("samples") or 0),
        cpu_s=float(row.get("cpu_s") or 0.0),
        wall_s=float(row.get("wall_s") or 0.0),
        energy_j=row.get("energy_j"),
        gpu_wait_s=row.get("gpu_wait_s"),
    )


def _window_input(w: WindowRecord) -> WindowInput:
    return WindowInput(
        started_at=w.started_at,
        ended_at=w.ended_at,
        cpu_s=w.cpu_s,
        codepaths={cp: _figures(dict(w.codepaths[cp])) for cp in CODEPATHS if w.codepaths.get(cp)},
        energy_source=w.energy_record.source if w.energy_record is not None else None,
        pid=w.pid,
        load_1min=w.load_1min,
    )


_EPISODE_INPUT_FIELDS = tuple(f.name for f in fields(EpisodeInput))


def _episode_input(e: RecordedEpisode) -> EpisodeInput:
    """A recorded episode, as its writer was given it, as report input: the fields the
    report takes, None where an older writer did not record them (RecordedEpisode)."""
    values = {name: e[name] for name in _EPISODE_INPUT_FIELDS}
    # an unknown thread (no kernel tid) is not taken for the training thread
    values["main_thread"] = bool(values["main_thread"])
    return EpisodeInput(**values)


def run_input(detail: RunDetail) -> RunInput:
    """One recorded run as report input (raises report.InputError on a damaged record)."""
    s = detail.summary
    energy_source, energy_reason = _energy_source(detail)
    windows = tuple(_window_input(w) for w in detail.windows)
    episodes = None
    if detail.episodes is not None:
        episodes = tuple(_episode_input(e) for e in detail.episodes)
    watched = detail.checkpoint_events
    checkpoints = restores = None
    if watched is not None:
        checkpoints = tuple(CheckpointInput(**c) for c in watched["checkpoints"])
        restores = tuple(RestoreInput(**r) for r in watched["restores"])
    return RunInput(
        run_id=s.run_id,
        host=dict(detail.host),
        serwatt_version=s.serwatt_version,
        rate_hz=_rate_hz(detail),
        energy_source=energy_source,
        energy_reason=energy_reason,
        gpu_source=str(detail.host.get("gpu_source") or "unavailable: not recorded"),
        started_at=s.started_at,
        ended_at=s.ended_at if s.ended_at is not None else s.last_seen_at,
        windows=windows,
        episodes=episodes,
        checkpoints=checkpoints,
        restores=restores or (),
        # one restore per run: every checkpoint file it read back, their timed loads summed
        # (a run's small json reads are not restores of their own to average with its
        # optimizer's load)
        restore_s=_run_restore_s(restores or ()),
        unmatched_episodes=watched["unmatched_episodes"] if watched else None,
        read_bytes=watched["read_bytes"] if watched else None,
        read_bytes_source=watched["read_bytes_source"] if watched else None,
        directions=None
        if detail.directions is None
        else {
            cp: {d: DirectionFigures(t.samples, t.cpu_s) for d, t in parts.items()}
            for cp, parts in detail.directions.items()
        },
        stacks=None if detail.stacks is None else detail.stacks.stacks,
        stacks_merged=0 if detail.stacks is None else detail.stacks.merged,
        config={
            **detail.config,
            "target_pythons": ", ".join(sorted({w.python for w in detail.windows if w.python})),
        },
    )


def load_runs(recorder: Recorder, run_ids: Sequence[str]) -> list[RunInput]:
    """The named runs, in the order given; KeyError names a run the file does not hold."""
    return [run_input(recorder.run(run_id)) for run_id in run_ids]
