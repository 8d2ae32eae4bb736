"""The run-record sink of a `serwatt profile` session: every window into a run record.

With --checkpoints DIR it also anchors the receipts of the run's `.many` files. DIR is
the job's, so what it holds is hostile: each window lists it once (at most
MAX_CHECKPOINT_ENTRIES entries), reads only regular files (a planted FIFO would block, a
link would make root read its target), and reads each file version once: one that is not
a checkpoint is remembered by (device, inode, size, mtime) like one that is, so 20 000
junk files cost a read each once, not every window. What is remembered is what DIR holds
now, and the problems kept are the first MAX_ERROR_MESSAGES of a count printed at the end.

The record is opened, whole, before the job starts; whatever still makes it fail once the
job runs (a full disk, a query past its deadline) stops the recording, not the session:
the job is never left running unprofiled, the other outputs are written, and the end
says what the record missed.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.tracker import EnergyTracker
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.many import ManyError
from serwatt.profiler.many.verify import read_receipts
from serwatt.profiler.profile.session import SessionInfo
from serwatt.profiler.terminal_escape import escape_text

if TYPE_CHECKING:
    from serwatt.profiler.profile.checkpoint_sink import CheckpointSink
from serwatt.profiler.records.host import fingerprint
from serwatt.profiler.records.run_ids import format_start_time
from serwatt.profiler.records.run_sink import RunSink
from serwatt.profiler.records.sources import run_sources
from serwatt.profiler.records.store import Recorder, RecordError

MAX_ERROR_MESSAGES = 10  # problems kept word for word; the rest are counted
MAX_CHECKPOINT_ENTRIES = 100_000  # directory entries looked at per window

_FileVersion = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns)


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
        checkpoint_sink: CheckpointSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """clock: the host's epoch time, which stamps the run's end (the session's own;
        the replay harness's is fake)."""
        self._clock = clock
        self.recorder = Recorder(path)
        self.path = self.recorder.path
        self.target = target
        self.run_id = run_id
        self.tracker = tracker
        self._host = host
        self._config = dict(config or {})
        self._started = False
        self._run: RunSink | None = None
        self.windows = 0
        self.errors: list[str] = []  # the first MAX_ERROR_MESSAGES problems
        self.energy_failures = 0  # windows recorded without joules
        self.checkpoint_failures = 0  # file versions in `checkpoints` not anchored
        self.checkpoints = checkpoints
        # the watch of `checkpoints`, when the session has one: its matches are stored at
        # the end, and this sink's own reads of receipts are not taken for the job's
        self.checkpoint_sink = checkpoint_sink
        # `.many` file versions already read (a file rewritten in place is a new version):
        # anchored, or not a checkpoint; each lists only versions DIR still holds
        self._anchored: set[_FileVersion] = set()
        self._failed: set[_FileVersion] = set()
        self._over_entries = False
        self.failure: RecordError | None = None  # the first; nothing is recorded after it
        self.unrecorded = 0  # windows not recorded since

    def _sources(self) -> dict[str, Any]:
        if self.tracker is None:
            return run_sources("unavailable: not measured by this session", {})
        return run_sources(self.tracker.energy_source, self.tracker.probe())

    def _fingerprint(self) -> dict[str, Any]:
        tracker = self.tracker
        if tracker is None:
            return fingerprint()
        if tracker.mode_of(tracker.nvml) == "off":
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
        try:
            self.recorder.start_run(
                self.run_id,
                self.target,
                host=self._host if self._host is not None else self._fingerprint(),
                config=config,
                sources=self._sources(),
                started_at=info.started_at,
                stacks=True,  # the session folds every window's stacks (session.py)
            )
        except RecordError as exc:
            self.failure = exc
            return
        self._started = True
        self._run = RunSink(self.recorder, self.run_id)  # how the daemon records a window

    def on_window(self, window: AttributedWindow) -> None:
        if self._run is None or self.failure is not None:
            self.unrecorded += 1
            return
        if window.failure is not None:  # the window is still recorded, without joules
            self.energy_failures += 1
            self._problem(f"energy for window at {window.report.started_at:.0f}: {window.failure}")
        try:
            self._run.on_window(window)
            self.windows += 1
            self._anchor_checkpoints()
        except RecordError as exc:
            self.failure = exc
            self.unrecorded += 1

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        if self._run is None or self.failure is not None:
            return
        try:
            self._run.on_episodes(episodes)
        except RecordError as exc:
            self.failure = exc

    def _problem(self, message: str) -> None:
        if len(self.errors) < MAX_ERROR_MESSAGES:
            self.errors.append(message)

    def _listing(
        self, directory: Path
    ) -> tuple[set[_FileVersion], list[tuple[str, _FileVersion, bool]]]:
        """(every `*.many` version in `directory`, those not read yet by name: (path,
        version, regular file?)). Links are not followed (lstat)."""
        present: set[_FileVersion] = set()
        new = []
        with os.scandir(directory) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_CHECKPOINT_ENTRIES:
                    if not self._over_entries:
                        self._over_entries = True
                        self._problem(
                            f"checkpoints {directory}: more than {MAX_CHECKPOINT_ENTRIES} "
                            "entries; each window looks at the first it lists"
                        )
                    break
                if not entry.name.endswith(".many"):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone since the listing
                version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                present.add(version)
                if version not in self._anchored and version not in self._failed:
                    new.append((entry.path, version, stat.S_ISREG(st.st_mode)))
        new.sort()
        return present, new

    def _refuse(self, version: _FileVersion, message: str) -> None:
        self._failed.add(version)
        self.checkpoint_failures += 1
        self._problem(message)

    def _anchor_checkpoints(self) -> None:
        """Store the receipts of the run's `.many` files seen so far (a workload that keeps
        only its newest checkpoints deletes older ones: each window looks again)."""
        if self.checkpoints is None or self.run_id is None:
            return
        try:
            present, new = self._listing(self.checkpoints)
        except OSError as exc:
            self._problem(f"checkpoints {self.checkpoints}: cannot list: {exc}")
            return
        rows = []
        for path, version, regular in new:
            if not regular:  # a FIFO would block the read, a link lead root elsewhere
                self._refuse(version, f"checkpoint {path}: not anchored: not a regular file")
                continue
            try:
                if self.checkpoint_sink is not None:
                    with self.checkpoint_sink.watch.own_open(path):
                        receipt, prev = read_receipts(path)
                else:
                    receipt, prev = read_receipts(path)
            except (OSError, ManyError) as exc:  # half-written or hostile: not anchored
                self._refuse(version, f"checkpoint {path}: not anchored: {exc}")
                continue
            self._anchored.add(version)
            rows.append((str(receipt), None if prev is None else str(prev), path))
        # what DIR no longer holds is forgotten, so what is remembered follows DIR
        self._anchored &= present
        self._failed &= present
        self.recorder.append_receipts(self.run_id, rows)

    def _store_checkpoints(self) -> None:
        """The checkpoints and restores the watch identified (the checkpoint sink finished
        first: profiler/cli/profile.py orders the sinks)."""
        sink = self.checkpoint_sink
        if sink is None or sink.result is None:
            return
        assert self.run_id is not None
        read_bytes, source = sink.run_read_bytes()
        self.recorder.append_checkpoints(
            self.run_id,
            sink.result,
            identity=sink.identity(),
            read_bytes=read_bytes,
            read_bytes_source=source,
        )

    def remembered_files(self) -> int:
        """How many file versions are remembered (anchored or not checkpoints)."""
        return len(self._anchored) + len(self._failed)

    def _print_problems(self) -> None:
        lines = []
        if self.checkpoint_failures:
            lines.append(
                f"{self.checkpoint_failures} checkpoint file(s) in {self.checkpoints} not "
                "anchored (not .many checkpoints, half-written, or not regular files)"
            )
        if self.energy_failures:
            lines.append(f"{self.energy_failures} window(s) recorded without energy")
        if self.failure is not None:
            lines.insert(
                0,
                f"{self.path}: {self.unrecorded} window(s) and the run's end not recorded "
                f"(the profile's other outputs are whole): {self.failure}",
            )
        if lines:
            first = f"; first: {self.errors[0]}" if self.errors else ""
            text = escape_text("; ".join(lines) + first, backslash=False)
            print(f"serwatt profile: record: {text}", file=sys.stderr)

    def finish(self) -> None:
        try:
            if self._started and self.run_id is not None and self.failure is None:
                self._anchor_checkpoints()
                self._store_checkpoints()
                self.recorder.finish_run(self.run_id, self._clock())
        except RecordError as exc:
            self.failure = exc
        finally:
            self.recorder.close()
            self._print_problems()
        if self.failure is not None:
            # said above in full; raised so the pipeline counts it and the run ends
            # non-zero: a run whose record could not be written is no success
            raise self.failure
