"""CPU weighting: turning classified samples into CPU seconds (pure functions).

Samples are not CPU seconds. A sample says where a thread *was*; /proc says how
much CPU each thread *used*. The model, per window and per thread:

    cpu_s(sample i) = delta_cpu_s(thread) * w_i / sum_j w_j     (j over the thread's samples)

- `delta_cpu_s(thread)` is the thread's measured CPU delta over the window
  (collectors.procstat: schedstat ns when live, else utime+stime ticks).
- `w_i` is how busy the thread was around the time of sample i: its measured CPU
  utilisation (0..1) over [t_i - h, t_i + h], read from a cumulative per-thread CPU
  series polled during the window. Without a series every w_i is 1 (uniform).

When the window has on-CPU samples (a second py-spy run without --idle, which
drops a thread whose /proc state is not R), a thread's CPU goes to its on-CPU
samples, uniformly: each is one look at the thread while it ran. This is what
makes threads sharing the GIL come out right: a thread waiting for the GIL is
off-CPU at whatever Python line it waits on (often a function entry such as
json.dumps), and only on-CPU samples exclude those moments. Threads with CPU but no
on-CPU sample fall back to their --idle samples, weighted as below.

So an idle sample (thread asleep in a wait) takes CPU only to the extent that the
thread really used CPU around that moment: a thread that slept the whole window
gives its samples ~0 CPU no matter how many there are; a thread that alternated
pickling and sleeping gives its CPU to the pickling samples, not to the sleep
samples. If every w_i is 0 while delta > 0 (usage too short to show in the series),
the delta falls back to uniform so no measured CPU is dropped.

Threads py-spy saw but serwatt could not map to a kernel tid share a pool: the CPU
of the process's kernel threads that no sample maps to, spread uniformly over the
unmapped samples. With no unmapped samples, that CPU (native threads: OpenMP,
CUDA, NCCL helpers, threads that are not Python) goes to `other`, which is where
the target's CPU outside every sampled Python stack belongs.

Run-queue wait (`runqueue_weights`). A thread that is runnable but waiting for a CPU
is in state R, so the on-CPU run samples it too, at the line it will resume at.
After a wakeup that is the line it blocked on (the sleep, the queue get), so on an
oversubscribed CPU a thread's CPU leaks onto its blocking lines. Per thread, schedstat
gives the window's run-queue wait D but not which samples were waits; the --idle run
shows where the thread was blocked: a leaf line whose wall time (its --idle samples)
exceeds its R-state time (its on-CPU samples) by more than twice the Poisson noise of
the --idle count is a blocking line, blocked for the difference. D goes to the
blocking lines in proportion to that, at most each line's R-state time, and an
on-CPU sample there keeps the running part of its weight. Waits from preemption (any
line, in proportion to running) are left where they are: they do not move shares.

Wall seconds per codepath = samples x (window wall time / ticks): time some thread
spent there, counted per thread (two threads in pickle for 1 s give 2 s).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collectors.samples import Sample
from profiler.classify.codepaths import CODEPATHS, Classification
from profiler.sampling.window import CodepathWindow


@dataclass(frozen=True)
class CpuSeries:
    """Cumulative CPU seconds of one thread at host times (both ascending)."""

    t: tuple[float, ...]
    cpu_s: tuple[float, ...]

    def at(self, when: float) -> float:
        """Cumulative CPU at `when`, linearly interpolated, clamped to the ends."""
        if not self.t:
            return 0.0
        if when <= self.t[0]:
            return self.cpu_s[0]
        if when >= self.t[-1]:
            return self.cpu_s[-1]
        i = bisect.bisect_right(self.t, when)
        t0, t1 = self.t[i - 1], self.t[i]
        c0, c1 = self.cpu_s[i - 1], self.cpu_s[i]
        if t1 <= t0:
            return c1
        return c0 + (c1 - c0) * (when - t0) / (t1 - t0)

    def utilisation(self, when: float, half_width_s: float) -> float:
        lo, hi = when - half_width_s, when + half_width_s
        lo = max(lo, self.t[0]) if self.t else lo
        hi = min(hi, self.t[-1]) if self.t else hi
        if hi <= lo:
            return 0.0
        return max(0.0, (self.at(hi) - self.at(lo)) / (hi - lo))


@dataclass(frozen=True)
class Weighting:
    cpu_s: tuple[float, ...]  # per sample, aligned with the input samples
    unmapped_pool_s: float  # CPU of unmatched kernel threads given to unmapped samples
    unsampled_cpu_s: float  # measured CPU no sample could take (goes to `other`)


def _leaf_line(s: Sample) -> tuple[str, int] | None:
    return (s.frames[0].filename, s.frames[0].line) if s.frames else None


def runqueue_weights(
    on_cpu: Sequence[Sample],
    idle: Sequence[Sample],
    *,
    on_cpu_rate_hz: float,
    idle_rate_hz: float,
    wait_per_tid_s: Mapping[int, float],
) -> tuple[list[float], float]:
    """Per on-CPU sample, the running part (0..1) of the R-state time it stands for;
    and the run-queue seconds taken off blocking lines (model in the module doc)."""
    out = [1.0] * len(on_cpu)
    if on_cpu_rate_hz <= 0 or idle_rate_hz <= 0:
        return out, 0.0
    r_lines: dict[int, dict[tuple[str, int] | None, list[int]]] = {}
    for i, s in enumerate(on_cpu):
        if s.tid is not None:
            r_lines.setdefault(s.tid, {}).setdefault(_leaf_line(s), []).append(i)
    idle_counts: dict[int, Counter] = {}
    for s in idle:
        if s.tid in r_lines:
            idle_counts.setdefault(s.tid, Counter())[_leaf_line(s)] += 1
    taken = 0.0
    for tid, lines in r_lines.items():
        wait_s = wait_per_tid_s.get(tid, 0.0)
        if wait_s <= 0:
            continue
        blocked: dict[tuple[str, int] | None, float] = {}
        for line, n_idle in idle_counts.get(tid, Counter()).items():
            r_s = len(lines.get(line, ())) / on_cpu_rate_hz
            b = n_idle / idle_rate_hz - r_s
            if line is not None and n_idle >= 2 and b > 2 * math.sqrt(n_idle) / idle_rate_hz:
                blocked[line] = b
        total_b = sum(blocked.values())
        for line, b in blocked.items():
            idx = lines.get(line, [])
            if not idx:
                continue
            r_s = len(idx) / on_cpu_rate_hz
            d = min(r_s, wait_s * b / total_b)
            taken += d
            for i in idx:
                out[i] = 1.0 - d / r_s
    return out, taken


def distribute_cpu(
    samples: Sequence[Sample],
    cpu_per_tid_s: Mapping[int, float],
    *,
    series: Mapping[int, CpuSeries] | None = None,
    half_width_s: float = 0.25,
    prior: Sequence[float] | None = None,
) -> Weighting:
    """Each sample's share of its thread's measured CPU delta (model in the module doc).
    prior: per-sample weights (aligned with samples) for threads without a CPU series,
    e.g. `runqueue_weights`; None: 1 each."""
    if prior is not None and len(prior) != len(samples):
        raise ValueError("prior must align with samples")
    by_tid: dict[int | None, list[int]] = {}
    for i, s in enumerate(samples):
        tid = s.tid if (s.tid is not None and s.tid in cpu_per_tid_s) else None
        by_tid.setdefault(tid, []).append(i)
    out = [0.0] * len(samples)
    for tid, idx in by_tid.items():
        if tid is None:
            continue
        delta = cpu_per_tid_s[tid]
        if delta <= 0 or not idx:
            continue
        ser = series.get(tid) if series else None
        weights = [prior[i] for i in idx] if prior is not None else [1.0] * len(idx)
        if sum(weights) <= 0:
            weights = [1.0] * len(idx)
        if ser is not None and len(ser.t) >= 2:
            weights = [ser.utilisation(samples[i].t, half_width_s) for i in idx]
            if sum(weights) <= 0:
                weights = [1.0] * len(idx)
        total_w = sum(weights)
        for i, w in zip(idx, weights, strict=True):
            out[i] = delta * w / total_w
    sampled_tids = {t for t in by_tid if t is not None}
    leftover = sum(v for t, v in cpu_per_tid_s.items() if t not in sampled_tids)
    pool = 0.0
    unmapped = by_tid.get(None, [])
    if unmapped and leftover > 0:
        share = leftover / len(unmapped)
        for i in unmapped:
            out[i] = share
        pool = leftover
        leftover = 0.0
    return Weighting(cpu_s=tuple(out), unmapped_pool_s=pool, unsampled_cpu_s=leftover)


def codepath_windows(
    classifications: Sequence[Classification],
    cpu_s: Sequence[float],
    *,
    total_cpu_s: float,
    wall_s: float,
    ticks: int,
    cpu_classifications: Sequence[Classification] | None = None,
) -> dict[str, CodepathWindow]:
    """Aggregate per codepath; every codepath present; CPU no sample took goes to `other`.

    Samples, wall and low-confidence counts come from `classifications` (the --idle
    samples). CPU comes from `cpu_s` aligned with `cpu_classifications` when given
    (the samples that carried the CPU: on-CPU samples), else with `classifications`.
    The codepaths' cpu_s sum to `total_cpu_s` exactly (up to float rounding), so
    shares over the target's CPU sum to 1 with `other`.
    """
    cpu_labels = cpu_classifications if cpu_classifications is not None else classifications
    if len(cpu_labels) != len(cpu_s):
        raise ValueError("classifications and cpu_s must align")
    tick_s = wall_s / ticks if ticks > 0 else 0.0
    samples = dict.fromkeys(CODEPATHS, 0)
    cpu = dict.fromkeys(CODEPATHS, 0.0)
    low = dict.fromkeys(CODEPATHS, 0)
    for c in classifications:
        cp = c.codepath if c.codepath in samples else "other"
        samples[cp] += 1
        if c.low_confidence:
            low[cp] += 1
    for c, w in zip(cpu_labels, cpu_s, strict=True):
        cp = c.codepath if c.codepath in cpu else "other"
        cpu[cp] += w
    assigned = sum(cpu.values())
    cpu["other"] += max(0.0, total_cpu_s - assigned)
    return {
        cp: CodepathWindow(
            samples=samples[cp],
            cpu_s=cpu[cp],
            wall_s=samples[cp] * tick_s,
            low_confidence_samples=low[cp],
        )
        for cp in CODEPATHS
    }
