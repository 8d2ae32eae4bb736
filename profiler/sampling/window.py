"""What one sampling window of one target yields, after classification and CPU weighting.

This is the hand-off between sampling (collectors/pyspy + collectors/procstat +
profiler/classify + profiler/sampling/weighting) and everything downstream: energy and
GPU-wait attribution (profiler/attribution), the ledger and exporter, the
recorder, and the `serwatt profile` table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from serwatt.collectors.samples import SamplerErrors
from serwatt.profiler.sampling.stacks import StackKey, StackTally


@dataclass(frozen=True)
class DirectionWindow:
    """One direction's part (encode / decode / unknown) of a codepath's window."""

    samples: int = 0
    cpu_s: float = 0.0


@dataclass(frozen=True)
class CodepathWindow:
    """One codepath's share of one window of one target.

    samples: classified samples (all threads, --idle included).
    cpu_s: measured per-thread CPU deltas distributed over that thread's samples.
    wall_s: samples x (window wall time / sampling ticks): time some thread spent here.
    low_confidence_samples: samples whose rule fired with low confidence.
    direction: each of encode / decode / unknown (profiler/classify/direction.py): its
        samples and CPU, which sum to the codepath's (the CPU no sample took, in
        `other`, is `unknown`'s).
    """

    samples: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    low_confidence_samples: int = 0
    direction: Mapping[str, DirectionWindow] = field(default_factory=dict)


@dataclass(frozen=True)
class TimedLabel:
    """A classified sample reduced to what GPU-wait attribution needs."""

    t: float  # epoch seconds
    tid: int | None
    thread_id: int
    codepath: str
    active: bool | None = None
    cpu_s: float = 0.0  # this sample's share of its thread's measured CPU (sampling/weighting.py)
    low_confidence: bool = False
    # set on timeline samples whose innermost Python frame is at a durability call:
    # "sync" (os.fsync/fdatasync/sync) or "rename" (os.rename/replace, which pathlib's
    # rename/replace call); "" otherwise (profiler/classify/durability.py)
    durability: str = ""
    direction: str = "unknown"  # encode / decode / unknown (profiler/classify/direction.py)
    # on timeline and stack-change samples: the call of the job's own save function the
    # thread is in, "" when none (profiler/classify/saver.py)
    saver: str = ""


@dataclass(frozen=True)
class UnmappedThread:
    """A live thread of the target with CPU in the window and no sample to carry it
    (a native thread: OpenMP, CUDA, NCCL helpers; a Python thread py-spy could not map).
    Its CPU is counted in `other` and shown as its own row (sampling/weighting.py)."""

    tid: int
    name: str  # /proc/<pid>/task/<tid>/comm, as the target set it
    cpu_s: float


@dataclass(frozen=True)
class WindowReport:
    pid: int
    started_at: float  # epoch seconds
    ended_at: float  # epoch seconds
    rate_hz: float
    cpu_s: float  # the target's measured CPU time in the window (all threads)
    codepaths: Mapping[str, CodepathWindow]  # every codepath in CODEPATHS present
    timeline: tuple[TimedLabel, ...] = ()
    errors: SamplerErrors = field(default_factory=SamplerErrors)
    python: str | None = None  # e.g. "3.11.7"
    exited: bool = False  # the target exited during this window
    # the samples that carried the CPU (on-CPU samples when py-spy's second, non-idle
    # run was made, else the timeline's samples), each with its cpu_s
    cpu_timeline: tuple[TimedLabel, ...] = ()
    # spacing of the timeline's tick times (the --idle run: window wall / its ticks);
    # 0.0: not known (then 1 / rate_hz)
    timeline_period_s: float = 0.0
    # classification that could not use a source file: "classify_timeout" (1: some
    # file was not loaded by the window's deadline), "source_too_costly" (files given
    # up past the CPU budget); their samples are `other`, low confidence
    classify_errors: Mapping[str, int] = field(default_factory=dict)
    # each thread's codepath at each change of its stack, from the stack-change run
    # (collectors/pyspy/chrometrace.py); a label holds until the thread's next change or
    # `changes_end`. None: no such run this window. changes_period_s: its tick period.
    changes: tuple[TimedLabel, ...] | None = None
    changes_period_s: float = 0.0
    changes_end: float = 0.0
    changes_clock_s: float = 0.0  # how far their host times may be off (one offset)
    # each thread's cumulative CPU seconds at the window's CPU polls, (t, s) ascending:
    # the CPU of a thread between two instants, measured (kernel tid -> points)
    thread_cpu_s: Mapping[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # the CPU no sample carried, part of `other`'s: per live thread (the `unmapped
    # threads` row), and exited threads' CPU that no sample of a thread without a live
    # CPU count could take
    unmapped_threads: tuple[UnmappedThread, ...] = ()
    exited_unsampled_cpu_s: float = 0.0
    # the classified stacks, folded and bounded (profiler/sampling/stacks.py): what the
    # flame graph and the pprof export are made of
    stacks: Mapping[StackKey, StackTally] = field(default_factory=dict)
    # what weighed the CPU: "kernel" (each thread's on-CPU intervals from the scheduler
    # timeline inside its stack spans: profiler/sampling/kernel_cpu.py) or "estimate"
    # (py-spy's R state and /proc polls: profiler/sampling/weighting.py)
    cpu_source: str = "estimate"
    # seconds the target's threads waited in a run queue in the window (schedstat
    # run_delay; 0.0 without schedstat): how contended the node was for it
    runqueue_wait_s: float = 0.0

    @property
    def wall_s(self) -> float:
        return max(0.0, self.ended_at - self.started_at)
