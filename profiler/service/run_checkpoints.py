"""The daemon's checkpoint watches: for each open run whose target names a checkpoints
directory (`targets[].checkpoints`), the watch of that directory over the run
(profiler/attribution/checkpoint_watch.py), fed with the run's processes and closed
episodes, and its checkpoints and restores stored in the record when the run ends.

A directory that cannot be watched is logged and its run identified by the heuristic.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from profiler.attribution.checkpoint_watch import CheckpointWatch
from profiler.attribution.episodes import Episode
from profiler.service.config import TargetSpec

log = logging.getLogger("serwatt.daemon")


class RunCheckpoints:
    """run_id -> its CheckpointWatch, for the runs whose target names a directory."""

    def __init__(self, procfs: Path) -> None:
        self._procfs = procfs
        self._watches: dict[str, CheckpointWatch] = {}

    def open(self, run_id: str, spec: TargetSpec | None) -> None:
        """Start watching the run's directory (before its first window is applied)."""
        if spec is None or spec.checkpoints is None or run_id in self._watches:
            return
        try:
            self._watches[run_id] = CheckpointWatch(
                spec.checkpoints, glob=spec.checkpoint_glob, procfs=self._procfs
            )
        except OSError as exc:
            # the run is recorded all the same, its checkpoints by the heuristic
            log.error(
                "run %s: cannot watch checkpoints %s: %s; its checkpoints are identified by "
                "the heuristic",
                run_id,
                spec.checkpoints,
                exc,
            )

    def track(self, run_id: str, pid: int) -> None:
        """A process of the run: its CPU and reads over its checkpoints (every rank's)."""
        if (w := self._watches.get(run_id)) is not None:
            w.track(pid)

    def add_episodes(self, run_id: str, episodes: Sequence[Episode]) -> None:
        if (w := self._watches.get(run_id)) is not None:
            w.add_episodes(episodes)

    def own_pids(self) -> set[int]:
        """The daemon and its watches' children: never targets (a watch's argv names the
        job's directory, which a target's cmdline pattern may match)."""
        pids = {os.getpid()}
        for w in self._watches.values():
            child: int | None = w.watch.pid
            if child is not None:
                pids.add(child)
        return pids

    def store(self, run_id: str, recorder: Any) -> None:
        """The checkpoints and restores the run's watch identified, into its record (the
        run's episodes are all in: called as the run ends)."""
        w = self._watches.pop(run_id, None)
        if w is None:
            return
        try:
            matched = w.finish()
            read_bytes, source = w.run_read_bytes()
            recorder.append_checkpoints(
                run_id, matched, identity=w.identity(), read_bytes=read_bytes,
                read_bytes_source=source,
            )  # fmt: skip
            log.info(
                "run %s: %d checkpoint(s), %d restore(s) from file events in %s",
                run_id,
                len(matched.checkpoints),
                len(matched.restores),
                w.directory,
            )
        except Exception as exc:
            log.error("recording checkpoints of %s failed: %s", run_id, exc)

    def close(self) -> None:
        """Stop every watch's child (the daemon is ending without storing them)."""
        for w in self._watches.values():
            w.watch.stop()
        self._watches.clear()
