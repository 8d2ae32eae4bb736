"""The checkpoint sink of a `serwatt profile --checkpoints DIR` session: file events under
DIR, the processes' CPU and storage reads over time, and at the end the checkpoints and
restores they identify (profiler/attribution/checkpoints.py).

The watch starts when the sink is made (before the command is launched, so no file it
writes is missed) and stops at finish(); the counters poll every process the session
profiles. A session without the sink identifies checkpoints by the heuristic (the
report's most-wall-time main-thread codepath), and says so.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collectors.fsevents import WatchProcess
from collectors.proccounters import CPU_SOURCE, ProcessCounters
from profiler.attribution.checkpoints import (
    LAZY_HEAD_BYTES,
    LAZY_NOTE,
    Checkpoint,
    Matched,
    Restore,
    file_is_lazy,
    match,
)
from profiler.attribution.episodes import Episode
from profiler.attribution.window import AttributedWindow
from profiler.profile.session import SessionInfo
from profiler.safeio import read_head

IDENTIFIED_BY_EVENTS = "file events"
IDENTIFIED_BY_HEURISTIC = "heuristic"
HEURISTIC_NOTE = (
    "no --checkpoints DIR: a checkpoint is taken to be a main-thread episode of the codepath "
    "with the most main-thread episode wall time, not a file seen written"
)
MAX_EPISODES = 200_000  # episodes kept for matching; the rest are counted


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def file_head(path: str) -> bytes | None:
    """A checkpoint file's first LAZY_HEAD_BYTES, through the bounded open; None when it
    is gone or cannot be read."""
    try:
        return read_head(path, LAZY_HEAD_BYTES)
    except OSError:
        return None


def is_lazy_file(path: str) -> bool:
    """A restored file's format from its first bytes (the drop-in's `.many` named
    `ckpt.pt` is lazy); from its name when it is gone or cannot be read."""
    return file_is_lazy(path, file_head(path))


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


class CheckpointSink:
    """Session sink (profiler/profile/session.py): see the module docstring.

    Raises OSError from the constructor when DIR cannot be watched."""

    def __init__(
        self, directory: Path, *, glob: str | None = None, procfs: Path = Path("/proc")
    ) -> None:
        self.directory = Path(directory)
        self.glob = glob
        self.watch = WatchProcess(self.directory, glob=glob)
        self.counters = ProcessCounters(procfs)
        self._episodes: list[Episode] = []
        self.episodes_dropped = 0
        self.root_pid: int | None = None
        self.result: Matched | None = None
        self.watch.start()

    def track(self, pid: int) -> None:
        """Poll this process's CPU and reads from now on (the launched command, at once)."""
        if self.root_pid is None:
            self.root_pid = pid
        self.counters.add(pid)

    def on_start(self, info: SessionInfo) -> None:
        self.track(info.root_pid)

    def on_window(self, window: AttributedWindow) -> None:
        self.counters.add(window.report.pid)

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        room = MAX_EPISODES - len(self._episodes)
        self._episodes.extend(episodes[: max(0, room)])
        self.episodes_dropped += max(0, len(episodes) - max(0, room))

    def finish(self) -> Matched:
        events = self.watch.stop()
        self.counters.stop()
        self.result = match(
            events,
            self._episodes,
            cpu_s=self.counters.cpu_s,
            read_bytes=self.counters.read_bytes,
            head_of=file_head,
        )
        self.events = events
        return self.result

    def run_read_bytes(self) -> tuple[int | None, str]:
        if self.root_pid is None:
            return None, "unavailable: no process was profiled"
        value, source = self.counters.run_read_bytes(self.root_pid)
        return (None if value is None else int(value)), source

    def identity(self) -> dict[str, Any]:
        w = self.watch
        return {
            "identified_by": IDENTIFIED_BY_EVENTS,
            "dir": os.fspath(self.directory),
            "glob": self.glob,
            "file_events": len(getattr(self, "events", ())),
            "events_dropped": w.dropped,
            "kernel_overflows": w.overflows,
            "unwatched_dirs": w.unwatched_dirs,
            "episodes_dropped": self.episodes_dropped,
            "cpu_source": CPU_SOURCE,
        }

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
