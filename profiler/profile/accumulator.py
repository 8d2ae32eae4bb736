"""The profile document's accumulator: every window of every target of a session summed
into what the document needs (profiler/profile/document.py). The session
(profiler/profile/session.py) adds each window to it, under its lock."""

from __future__ import annotations

from dataclasses import dataclass, field

from serwatt.collectors.samples import SamplerErrors
from serwatt.profiler.attribution.window import AttributedWindow, DirectedTotals
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.profile.processes import ProcessTally

BIN_S = 1.0  # time resolution of the per-codepath CPU bins used for the share interval
# A target that starts native threads without end must not grow the session's memory.
MAX_UNMAPPED_THREADS = 4096


@dataclass
class Accumulator:
    """Everything the profile document needs, summed over windows and targets."""

    samples: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CODEPATHS, 0))
    cpu_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CODEPATHS, 0.0))
    wall_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CODEPATHS, 0.0))
    low_conf: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CODEPATHS, 0))
    # the windows' figures by codepath x direction: the one fold (attribution/window.py)
    directed: DirectedTotals = field(default_factory=DirectedTotals)
    low_conf_cpu_s: float = 0.0
    total_cpu_s: float = 0.0
    # bin index (BIN_S slices since session start) -> codepath -> cpu_s
    bins: dict[int, dict[str, float]] = field(default_factory=dict)
    # the sum of the samples' CPU weights and of their squares: the share interval's
    # effective sample count, (sum w)^2 / sum w^2 (Kish), so idle samples do not count
    sample_cpu_s: float = 0.0
    sample_cpu_s2: float = 0.0
    # the targets' threads' run-queue wait (schedstat): the node's contention for them
    runqueue_wait_s: float = 0.0
    pyspy_samples: int = 0
    pyspy_errors: int = 0
    partial_stacks: int = 0
    behind_s: float = 0.0
    notes: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)  # SamplingError.kind -> count
    windows: int = 0
    # the `unmapped threads` row, part of `other`'s CPU: (pid, tid) -> (name, cpu_s) for
    # at most MAX_UNMAPPED_THREADS threads (the rest summed in unmapped_untracked_cpu_s),
    # and exited threads' CPU no sample took
    unmapped: dict[tuple[int, int], tuple[str, float]] = field(default_factory=dict)
    unmapped_untracked_cpu_s: float = 0.0
    unmapped_exited_cpu_s: float = 0.0
    # each codepath's figures per process (the per-process view)
    processes: ProcessTally = field(default_factory=ProcessTally)

    @property
    def effective_samples(self) -> float:
        """Kish's effective count of the samples' CPU weights (0 when none carried CPU)."""
        return self.sample_cpu_s**2 / self.sample_cpu_s2 if self.sample_cpu_s2 > 0 else 0.0

    @property
    def dir_samples(self) -> dict[str, dict[str, int]]:
        """codepath -> direction -> samples (profiler/classify/direction.py)."""
        by_cp = self.directed.by_codepath(self.directed.samples)
        return {cp: {d: int(n) for d, n in by_d.items()} for cp, by_d in by_cp.items()}

    @property
    def dir_cpu_s(self) -> dict[str, dict[str, float]]:
        """codepath -> direction -> CPU-seconds."""
        return self.directed.by_codepath(self.directed.cpu_s)

    def add(self, window: AttributedWindow, origin: float) -> None:
        report = window.report
        self.windows += 1
        self.total_cpu_s += report.cpu_s
        self.runqueue_wait_s += report.runqueue_wait_s
        self.directed.add(window.by_direction())
        for cp, w in report.codepaths.items():
            key = cp if cp in self.samples else "other"
            self.samples[key] += w.samples
            self.cpu_s[key] += w.cpu_s
            self.wall_s[key] += w.wall_s
            self.low_conf[key] += w.low_confidence_samples
        sampled_other = 0.0
        per_bin_samples: dict[int, int] = {}
        for lab in report.cpu_timeline or report.timeline:
            b = int((lab.t - origin) // BIN_S)
            cp = lab.codepath if lab.codepath in self.samples else "other"
            row = self.bins.setdefault(b, {})
            row[cp] = row.get(cp, 0.0) + lab.cpu_s
            per_bin_samples[b] = per_bin_samples.get(b, 0) + 1
            self.sample_cpu_s += lab.cpu_s
            self.sample_cpu_s2 += lab.cpu_s * lab.cpu_s
            if cp == "other":
                sampled_other += lab.cpu_s
            if lab.low_confidence:
                self.low_conf_cpu_s += lab.cpu_s
        # CPU no sample took (native threads, exited threads' share) is `other`;
        # spread it over the window's bins by sample count so bins sum to the total.
        residual = report.codepaths["other"].cpu_s - sampled_other
        n = sum(per_bin_samples.values())
        if residual > 0:
            if n:
                for b, k in per_bin_samples.items():
                    row = self.bins.setdefault(b, {})
                    row["other"] = row.get("other", 0.0) + residual * k / n
            else:
                b = int((report.started_at - origin) // BIN_S)
                row = self.bins.setdefault(b, {})
                row["other"] = row.get("other", 0.0) + residual
        for th in report.unmapped_threads:
            where = (report.pid, th.tid)
            if where in self.unmapped or len(self.unmapped) < MAX_UNMAPPED_THREADS:
                self.unmapped[where] = (th.name, self.unmapped.get(where, ("", 0.0))[1] + th.cpu_s)
            else:
                self.unmapped_untracked_cpu_s += th.cpu_s
        self.unmapped_exited_cpu_s += report.exited_unsampled_cpu_s
        self.processes.add(report)
        e: SamplerErrors = report.errors
        self.pyspy_samples += e.pyspy_samples
        self.pyspy_errors += e.pyspy_errors
        self.partial_stacks += e.partial_stacks
        self.behind_s = max(self.behind_s, e.behind_s)
        for note in e.notes:
            self.notes[note] = self.notes.get(note, 0) + 1

    def fail(self, kind: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1
