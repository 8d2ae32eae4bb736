"""One profile session wired from typed options: py-spy, the classifier, the energy
tracker and the sinks (energy, checkpoint watch, run record), in the order they must open.

`serwatt profile` and `serwatt demo --workload mixed` build a `ProfileOptions` from their
command lines and call `ProfileSetup.open`; nothing else of the wiring lives in the CLI.
Every check that can fail does so here, before any process starts: a `required` energy
collector that is missing, a --record file that is not a run record (nothing in it is
touched), a run id already taken, a checkpoint directory that cannot be watched. Each is
a `SetupError` whose message names the option (the command line's name for it) and the
fix.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serwatt.collectors.pyspy import DEFAULT_RATE_HZ, PySpy, SamplingError, SamplingPlan
from serwatt.collectors.source import MODES, with_mode
from serwatt.profiler.attribution.tracker import EnergyTracker, EnergyUnavailableError
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.source_store import SourceStore
from serwatt.profiler.profile.checkpoint_sink import CheckpointSink, heuristic_section
from serwatt.profiler.profile.document import build_document
from serwatt.profiler.profile.energy_sink import EnergySink
from serwatt.profiler.profile.record_sink import RecordSink
from serwatt.profiler.profile.session import ProfileSession, SessionResult, SessionSink
from serwatt.profiler.records.run_ids import check_run_id
from serwatt.profiler.records.store import RecordError
from serwatt.profiler.sampling.budget import PROFILE_FIX, RateGovernor
from serwatt.profiler.sampling.collect import timing_rate_hz


class SetupError(ValueError):
    """An option that cannot be used: bad input, reported before any process starts."""


@dataclass(frozen=True)
class ProfileOptions:
    """What a profile session is asked to do; each field is the `serwatt profile` option
    of that name (docs/architecture.md lists them)."""

    rate_hz: float = DEFAULT_RATE_HZ
    # the most cores serwatt and its py-spy runs may use (profiler/profile/cpu_budget.py);
    # None: no budget, every window at rate_hz (`serwatt ab`, the demos, direct callers)
    cpu_budget_cores: float | None = None
    window_s: float = 5.0
    # the stack-change run's rate as asked: None for the default at rate_hz, 0 for none
    timing_rate_hz: float | None = None
    on_cpu_run: bool = True
    # CPU by the kernel's scheduler timeline where the window has a stack-change run
    # (docs/sampling.md, cpu_source); where it is not available the estimates weigh and
    # each window says so. Opt-in: with it, the known-pickle CLI test reads 2.6-3.1 pp
    # over its 2 pp bound (docs/benchmarks.md, issue 44 continued)
    kernel_timeline: bool = False
    follow_children: bool = True
    pyspy: Path | None = None
    sampler_priority: str = "auto"
    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    tdp_w: float | None = None
    # each source's `mode_option` (collectors/source.py SOURCES, the command line's
    # --rapl, --nvml...) -> auto | required | off; one not given is auto
    modes: Mapping[str, str] = field(default_factory=dict)
    record: Path | None = None
    run_id: str | None = None
    checkpoints: Path | None = None
    checkpoint_glob: str | None = None
    # where what indexing the target's source files found is kept across runs
    # (profiler/classify/source_store.py); None: nowhere, every file is indexed anew
    source_store: Path | None = None

    def plan(self) -> SamplingPlan:
        timing = timing_rate_hz(self.timing_rate_hz, self.rate_hz)
        return SamplingPlan(
            rate_hz=self.rate_hz,
            on_cpu_run=self.on_cpu_run,
            timing_rate_hz=timing,
            kernel_timeline=self.kernel_timeline and timing is not None,
        )


@dataclass
class ProfileSetup:
    """The opened parts of one session. Sinks run in list order: the energy sink first
    (the document's energy), then the checkpoint sink, which finishes before the record
    sink that stores what it matched."""

    options: ProfileOptions
    pyspy: PySpy
    classifier: Any
    tracker: EnergyTracker
    energy_sink: EnergySink
    checkpoint_sink: CheckpointSink | None = None
    record_sink: RecordSink | None = None
    source_store: SourceStore | None = None

    @classmethod
    def open(cls, options: ProfileOptions) -> ProfileSetup:
        """Probe and open everything the options name, in order; raises SetupError."""
        tracker, energy_sink = _energy(options)
        checkpoint_sink = _checkpoints(options)
        record_sink = _record(options, tracker, checkpoint_sink)
        try:
            spy = PySpy(options.pyspy, priority=options.sampler_priority)
        except SamplingError as exc:
            if record_sink is not None:
                record_sink.recorder.close()
            raise SetupError(str(exc)) from exc
        # a store that cannot be used says why (`problem`) and the session runs without it
        store = SourceStore.open(options.source_store) if options.source_store else None
        return cls(
            options=options,
            pyspy=spy,
            classifier=Classifier.default(source_store=store),
            source_store=store,
            tracker=tracker,
            energy_sink=energy_sink,
            checkpoint_sink=checkpoint_sink,
            record_sink=record_sink,
        )

    def sinks(self) -> list[SessionSink]:
        found = (self.energy_sink, self.checkpoint_sink, self.record_sink)
        return [s for s in found if s is not None]

    def session(
        self,
        pid: int,
        *,
        command: str | None = None,
        proc: subprocess.Popen[bytes] | None = None,
        duration_s: float | None = None,
        root_may_be_wrapper: bool = False,
    ) -> ProfileSession:
        """The session over `pid` (the launched `proc`, when serwatt started it: its exit
        ends the session), for at most `duration_s`."""
        if proc is not None and self.checkpoint_sink is not None:
            self.checkpoint_sink.track(proc.pid)  # a restore at start-up is polled too
        o = self.options
        return ProfileSession(
            pid,
            classifier=self.classifier,
            plan=o.plan(),
            window_s=o.window_s,
            duration_s=duration_s,
            command=command,
            pyspy=self.pyspy,
            procfs=o.procfs,
            tracker=self.tracker,
            sinks=self.sinks(),
            follow_children=o.follow_children,
            root_exit_check=(lambda: proc.poll() is not None) if proc is not None else None,
            root_may_be_wrapper=root_may_be_wrapper,
            governor=(
                None
                if o.cpu_budget_cores is None
                else RateGovernor(o.cpu_budget_cores, o.rate_hz, fix=PROFILE_FIX)
            ),
        )

    def document(self, result: SessionResult) -> dict[str, Any]:
        """The serwatt.profile/1 document of a finished session."""
        doc = build_document(result, energy=self.energy_sink.summary)
        if self.checkpoint_sink is not None:
            doc.update(self.checkpoint_sink.sections())
        else:
            doc.update(heuristic_section())
        return doc


def _energy(o: ProfileOptions) -> tuple[EnergyTracker, EnergySink]:
    if not o.sysfs.is_dir():
        raise SetupError(
            f"--path.sysfs {o.sysfs}: not a directory (give the sysfs root, e.g. /sys)"
        )
    if o.tdp_w is not None and not o.tdp_w > 0:
        raise SetupError(f"--tdp must be > 0 watts, got {o.tdp_w:g}")
    options = [str(s.mode_option) for s in with_mode()]
    for name, mode in o.modes.items():
        if name not in options:
            raise SetupError(
                f"--{name}: no source has that option; give one of {', '.join(options)}"
            )
        if mode not in MODES:
            raise SetupError(f"--{name} {mode}: give one of {', '.join(MODES)}")
    tracker = EnergyTracker(sysfs_root=o.sysfs, procfs_root=o.procfs, tdp_w=o.tdp_w, modes=o.modes)
    try:
        tracker.probe()  # a required collector that is down fails here, before any process
        return tracker, EnergySink()
    except EnergyUnavailableError as exc:
        raise SetupError(str(exc)) from exc


def _checkpoints(o: ProfileOptions) -> CheckpointSink | None:
    if o.checkpoint_glob is not None and o.checkpoints is None:
        raise SetupError("--checkpoint-glob names files under --checkpoints DIR: give it too")
    if o.checkpoints is None:
        return None
    if not o.checkpoints.is_dir():
        raise SetupError(f"--checkpoints {o.checkpoints}: not a directory (create it first)")
    try:
        return CheckpointSink(o.checkpoints, glob=o.checkpoint_glob, procfs=o.procfs)
    except OSError as exc:
        raise SetupError(
            f"--checkpoints {o.checkpoints}: cannot watch it ({exc.strerror or exc}); "
            "check permissions and fs.inotify.max_user_instances"
        ) from None


def _record(
    o: ProfileOptions, tracker: EnergyTracker, checkpoint_sink: CheckpointSink | None
) -> RecordSink | None:
    """The --record file, opened now: a file that is not a run record is bad input, and
    nothing in it is touched."""
    if o.record is None:
        if o.run_id is not None:
            raise SetupError("--run-id names the run --record writes: give --record FILE too")
        return None
    try:
        if o.run_id is not None:
            check_run_id(o.run_id)
        sink = RecordSink(
            o.record,
            run_id=o.run_id,
            tracker=tracker,
            checkpoints=o.checkpoints,
            checkpoint_sink=checkpoint_sink,
            # the stack-change run's rate sets episodes' resolution: the report compares it;
            # the checkpoint directory lets it compare commands that name their own one
            config={
                "timing_rate_hz": o.plan().timing_rate_hz,
                # under a budget the windows ran at or below rate_hz (each window's rate
                # is in its row): the report warns when runs' budgets differ
                "cpu_budget_cores": o.cpu_budget_cores,
                "checkpoint_dir": None if o.checkpoints is None else str(o.checkpoints),
            },
        )
    except ValueError as exc:
        raise SetupError(f"--run-id: {exc}") from exc
    except RecordError as exc:
        raise SetupError(f"--record {o.record}: {exc}") from exc
    if o.run_id is not None and sink.recorder.runs(o.run_id):
        sink.recorder.close()
        raise SetupError(
            f"--run-id {o.run_id}: {o.record} already holds a run of that id; give another "
            "(a repeat of an A/B side is a run of its own)"
        )
    return sink
