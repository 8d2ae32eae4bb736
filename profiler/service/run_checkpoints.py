"""The daemon's checkpoint watches: for each open run whose target names a checkpoints
directory (`targets[].checkpoints`), the watch of that directory over the run
(profiler/attribution/checkpoint_watch.py), fed with the run's processes and closed
episodes, and its checkpoints and restores stored in the record when the run ends.

The directory is the job's, and what it holds may never answer (a FUSE mount it serves),
so nothing here waits on it from the daemon's main loop: a watch is opened without
waiting for its child to list the directory (collectors/fsevents.py), every run of one
target shares that target's one watching child (not one interpreter per process), and a
run's checkpoints are matched on a worker owned by its target (profiler/owned_io.py),
waited on at most STORE_WAIT_S. A directory that cannot be watched, a watch that never
came up and a match that did not finish in time are logged, counted against the target
(`serwatt_sampler_errors_total{kind="checkpoint_watch"}`) and the run's checkpoints are
identified by the heuristic.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from serwatt.collectors import fsevents
from serwatt.profiler.attribution.checkpoint_watch import CheckpointWatch
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.owned_io import OwnedWorkers, Stuck
from serwatt.profiler.service.config import TargetSpec

log = logging.getLogger("serwatt.daemon")

# How long the main loop waits for a run's checkpoints to be matched as the run ends
# (the watch's last events read, the files' first bytes): milliseconds for a directory
# that answers; a target whose match is still stuck from before is not waited on.
STORE_WAIT_S = 5.0
# How long the daemon's stop waits for every watching child to end before killing it.
CLOSE_WAIT_S = 3.0
WATCH_ERROR = "checkpoint_watch"  # the sampler-error kind of a run left to the heuristic
_MATCHERS = OwnedWorkers(per_owner=1, name="serwatt-checkpoint-match")


class RunCheckpoints:
    """run_id -> its CheckpointWatch, for the runs whose target names a directory.

    `on_error(target, kind)`: called (on the main thread) when a run of `target` is left
    to the heuristic."""

    def __init__(self, procfs: Path, on_error: Callable[[str, str], None] | None = None) -> None:
        self._procfs = procfs
        self._on_error = on_error
        self._watches: dict[str, CheckpointWatch] = {}
        self._targets: dict[str, str] = {}  # run_id -> target

    def _failed(self, run_id: str, why: str) -> None:
        target = self._targets.get(run_id, "?")
        log.error(
            "run %s: checkpoints not watched: %s; its checkpoints are identified by the heuristic",
            run_id,
            why,
        )
        if self._on_error is not None and run_id in self._targets:
            self._on_error(target, WATCH_ERROR)

    def open(self, run_id: str, spec: TargetSpec | None) -> None:
        """Start watching the run's directory (before its first window is applied);
        returns at once, whatever the directory does."""
        if spec is None or spec.checkpoints is None or run_id in self._watches:
            return
        self._targets[run_id] = spec.name
        try:
            self._watches[run_id] = CheckpointWatch(
                spec.checkpoints,
                glob=spec.checkpoint_glob,
                procfs=self._procfs,
                wait_ready=False,
            )
        except OSError as exc:
            self._failed(run_id, f"cannot watch {spec.checkpoints}: {exc}")
            self._targets.pop(run_id, None)

    def wait_ready(self, run_id: str, timeout_s: float) -> bool:
        """Whether the run's watch is up, waiting at most `timeout_s` (tests, status)."""
        w = self._watches.get(run_id)
        return w is not None and w.watch.wait_ready(timeout_s)

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
        target = self._targets.get(run_id, "?")
        try:
            if w is None:
                return
            if not w.watch.wait_ready(0.0):
                w.watch.stop()  # never up: nothing to match; ends the child if last
                self._failed(run_id, w.watch.error or "the watch did not start")
                return

            def finish() -> tuple[Any, tuple[int | None, str]]:
                return w.finish(), w.run_read_bytes()

            try:
                matched, (read_bytes, source) = _MATCHERS.call(
                    target, finish, STORE_WAIT_S, what=f"checkpoints of {run_id}"
                )
            except Stuck as exc:
                self._failed(run_id, str(exc))
                return
            except Exception as exc:
                log.error("recording checkpoints of %s failed: %s", run_id, exc)
                return
            try:
                recorder.append_checkpoints(
                    run_id, matched, identity=w.identity(), read_bytes=read_bytes,
                    read_bytes_source=source,
                )  # fmt: skip
            except Exception as exc:
                log.error("recording checkpoints of %s failed: %s", run_id, exc)
                return
            log.info(
                "run %s: %d checkpoint(s), %d restore(s) from file events in %s",
                run_id,
                len(matched.checkpoints),
                len(matched.restores),
                w.directory,
            )
        finally:
            self._targets.pop(run_id, None)

    def close(self) -> None:
        """Stop every watch's child (the daemon is ending without storing them), all
        together, a child stuck in its directory killed after CLOSE_WAIT_S."""
        fsevents.close_all(CLOSE_WAIT_S)
        for w in self._watches.values():
            w.counters.stop()
        self._watches.clear()
        self._targets.clear()
