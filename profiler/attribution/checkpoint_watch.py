"""A checkpoint directory watched over a run: file events under DIR (collectors/fsevents.py),
the run's processes' CPU and storage reads over time (collectors/proccounters.py), the
closed episodes, and at the end the checkpoints and restores they identify
(profiler/attribution/checkpoints.py).

The watch starts when it is made (before the job writes, so no file is missed) and stops
at finish(). `serwatt profile --checkpoints DIR` (profiler/profile/checkpoint_sink.py) and
the daemon's `targets[].checkpoints` (profiler/service/daemon.py) both use it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serwatt.collectors.fsevents import WatchProcess
from serwatt.collectors.proccounters import CPU_SOURCE, ProcessCounters
from serwatt.profiler.attribution.checkpoints import LAZY_HEAD_BYTES, Matched, file_is_lazy, match
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.classify.target_files import open_source

IDENTIFIED_BY_EVENTS = "file events"
MAX_EPISODES = 200_000  # episodes kept for matching; the rest are counted


def file_head(path: str) -> bytes | None:
    """A checkpoint file's first LAZY_HEAD_BYTES, through the open of files a job controls
    (profiler/classify/target_files.py: regular files only, no link followed as the last
    component, none of its directories' links into a FUSE mount, which is never asked:
    a FUSE request never answered leaves the thread unkillable); None when it is gone,
    on FUSE or cannot be read (then its format is told from its name)."""
    try:
        fd = open_source(path, follow_last=False)
    except OSError:
        return None
    try:
        return os.pread(fd, LAZY_HEAD_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def is_lazy_file(path: str) -> bool:
    """A restored file's format from its first bytes (the drop-in's `.many` named
    `ckpt.pt` is lazy); from its name when it is gone or cannot be read."""
    return file_is_lazy(path, file_head(path))


class CheckpointWatch:
    """See the module docstring. Raises OSError from the constructor when DIR cannot be
    watched."""

    def __init__(
        self,
        directory: Path,
        *,
        glob: str | None = None,
        procfs: Path = Path("/proc"),
        wait_ready: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.glob = glob
        self.watch = WatchProcess(self.directory, glob=glob)
        self.counters = ProcessCounters(procfs)
        self._episodes: list[Episode] = []
        self.episodes_dropped = 0
        self.root_pid: int | None = None
        self.result: Matched | None = None
        self.events: Sequence[Any] = ()
        self.watch.start(wait=wait_ready)  # False: the daemon's loop (WatchProcess.start)

    def track(self, pid: int) -> None:
        """Poll this process's CPU and reads from now on; the first is the run's root,
        whose storage reads are the run's."""
        if self.root_pid is None:
            self.root_pid = pid
        self.counters.add(pid)

    def add_episodes(self, episodes: Sequence[Episode]) -> None:
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
            head_of=self._own_head,
            root=self.directory,
        )
        self.events = events
        return self.result

    def _own_head(self, path: str) -> bytes | None:
        # serwatt's read of the file, not a restore: the watch (shared with the target's
        # other runs, still watching) is told
        with self.watch.own_open(path):
            return file_head(path)

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
            "file_events": len(self.events),
            "events_dropped": w.dropped,
            "kernel_overflows": w.overflows,
            "unwatched_dirs": w.unwatched_dirs,
            "episodes_dropped": self.episodes_dropped,
            "cpu_source": CPU_SOURCE,
        }
