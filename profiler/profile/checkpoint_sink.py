"""The checkpoint sink of a `serwatt profile --checkpoints DIR` session: the run's
checkpoint watch (profiler/attribution/checkpoint_watch.py) fed by the session, and the
profile document's checkpoint sections.

A session without the sink identifies checkpoints by the heuristic (the report's
most-wall-time main-thread codepath), and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serwatt.profiler.attribution.checkpoint_watch import (
    IDENTIFIED_BY_EVENTS,
    CheckpointWatch,
    file_head,
    is_lazy_file,
)
from serwatt.profiler.attribution.checkpoints import LAZY_NOTE, Checkpoint, Restore
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.profile.session import SessionInfo

__all__ = [
    "IDENTIFIED_BY_EVENTS",
    "CheckpointSink",
    "file_head",
    "heuristic_section",
    "is_lazy_file",
]

IDENTIFIED_BY_HEURISTIC = "heuristic"
HEURISTIC_NOTE = (
    "no --checkpoints DIR: a checkpoint is taken to be a main-thread episode of the codepath "
    "with the most main-thread episode wall time, not a file seen written"
)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def episode_json(ep: Episode | None) -> dict[str, Any] | None:
    if ep is None:
        return None
    row = {k: getattr(ep, k) for k in ep.__dataclass_fields__}
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()}


def checkpoint_json(c: Checkpoint) -> dict[str, Any]:
    return {
        "path": c.path,
        "bytes": c.bytes,
        "event_t": round(c.event_t, 6),
        "thread_id": c.thread_id,
        "episode": episode_json(c.episode),
        "stall_s": _round(c.stall_s),
        "stall_thread_id": c.stall.thread if c.stall is not None else None,
        "wall_s": _round(c.stall_s),
        "resolution_s": _round(c.resolution_s),
        "timed_by": c.timed_by,
        "cpu_s_all_threads": _round(c.cpu_s_all_threads),
        "async_tail_s": _round(c.async_tail_s),
    }


def restore_json(r: Restore) -> dict[str, Any]:
    return {
        "path": r.path,
        "bytes": r.bytes,
        "open_t": round(r.open_t, 6),
        "thread_id": r.thread_id,
        "episode": episode_json(r.episode),
        "wall_s": _round(r.wall_s),
        "resolution_s": _round(r.resolution_s),
        "timed_by": r.timed_by,
        "read_bytes": None if r.read_bytes is None else int(r.read_bytes),
        "lazy": r.lazy,
        "note": LAZY_NOTE if r.lazy else None,
    }


def heuristic_section() -> dict[str, Any]:
    """The document's checkpoint sections when no directory was watched."""
    return {
        "checkpoint_identity": {"identified_by": IDENTIFIED_BY_HEURISTIC, "note": HEURISTIC_NOTE},
        "checkpoints": None,
        "unmatched_episodes": None,
        "restores": None,
    }


class CheckpointSink(CheckpointWatch):
    """Session sink (profiler/profile/session.py): the watch, fed with the session's
    processes and episodes. Raises OSError from the constructor when DIR cannot be
    watched."""

    def on_start(self, info: SessionInfo) -> None:
        self.track(info.root_pid)

    def on_window(self, window: AttributedWindow) -> None:
        self.counters.add(window.report.pid)

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        self.add_episodes(episodes)

    def sections(self) -> dict[str, Any]:
        """The profile document's `checkpoints`, `unmatched_episodes`, `restores` and
        `checkpoint_identity` (after finish)."""
        assert self.result is not None, "finish() comes first"
        read_bytes, source = self.run_read_bytes()
        return {
            "checkpoint_identity": self.identity(),
            "checkpoints": [checkpoint_json(c) for c in self.result.checkpoints],
            "unmatched_episodes": len(self.result.unmatched),
            "restores": [restore_json(r) for r in self.result.restores],
            "read_bytes": {"bytes": read_bytes, "source": source},
        }
