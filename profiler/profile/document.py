"""The `serwatt.profile/1` document and the `serwatt profile` table.

Share and its interval. `share` of a codepath is its CPU seconds over the
target's measured CPU seconds (all profiled processes, all threads). Samples are
autocorrelated (a thread stays in `pickle.dumps` for many consecutive samples), so
a binomial interval over samples would be far too narrow; and at the default CPU
budget (5-8 Hz) a short run has few samples, where a symmetric interval is too narrow
for a small share and a codepath with no sample would get [0, 0]. serwatt uses the
*Korn-Graubard* interval (Korn & Graubard 1998, Survey Methodology 24, 193): an exact
(Clopper-Pearson) interval on an effective sample count measured by *batch means*.
Per-codepath CPU seconds are binned by host time (1 s bins, all targets together),
consecutive bins are merged into K <= 30 batches of equal length, and with c_k the
codepath's CPU and x_k the total CPU of batch k,

    share = sum c_k / sum x_k
    se^2  = sum (c_k - share * x_k)^2 / (K (K - 1)) / mean(x_k)^2
    n     = (sum w)^2 / sum w^2 over the samples' CPU weights w (Kish's effective count)
    n_eff = min(n, share (1 - share) / se^2)    (n when se is 0: no sample, or all)
    n_df  = n_eff * min(1, (t_{0.975, n-1} / t_{0.975, K-1})^2)
    ci95  = Clopper-Pearson of n_df * share successes in n_df trials

The samples' count caps n_eff, so no spread in the batches never gives a zero width
(0 of n: [0, 1 - 0.025^(1/n)]); dependence the batches see lowers it, and the t ratio
pays for estimating se from K batches. Batches much longer than the workload's phases make
batches nearly independent; a workload whose phases last longer than a batch (e.g. a
checkpoint every minute in a 2-minute profile) gets an interval that is too narrow:
profile longer. With fewer than 2 batches there is no interval, and the document's
`share_ci95_too_short` (and the table's first line) says why. The interval is sampling
error only: where the target waited for a CPU as long as it ran, the CPU weighing's bias
outgrew it, and `share_ci95_contended` (and a first line) says so. Coverage measured against
a workload's own timing: bench/profile_coverage.py, docs/benchmarks.md.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import numpy as np

from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS
from serwatt.profiler.intervals import clopper_pearson, t_quantile
from serwatt.profiler.profile.accumulator import Accumulator
from serwatt.profiler.profile.energy_sink import ProfileEnergy
from serwatt.profiler.profile.processes import (
    WALL_METHOD,
    codepath_processes,
    main_pid,
    main_thread_wall_s,
    role,
)
from serwatt.profiler.profile.session import SessionResult

SCHEMA = "serwatt.profile/1"
MAX_BATCHES = 30
# The document lists at most this many episodes (the earliest-closed first), then says how
# many it left out: a day-long profile of a job that pickles every step must stay readable.
MAX_DOC_EPISODES = 1000
# The document lists at most this many unmapped threads (the most CPU first).
MAX_DOC_UNMAPPED_THREADS = 100
UNMAPPED_METHOD = (
    "live threads with measured CPU (procfs) that no py-spy sample maps to (native threads: "
    "OpenMP, CUDA, NCCL helpers; Python threads py-spy could not map), each its own CPU, "
    "plus exited threads' CPU (the process's CPU less its live threads') that no sample of "
    "a thread without a live CPU count took; counted in other's cpu_s, never spread over "
    "other threads' samples"
)
CI_METHOD = (
    "Korn-Graubard: Clopper-Pearson on an effective sample count, the samples' (Kish, by "
    "CPU weight) lowered by batch means over time (1 s CPU bins merged into <= 30 equal "
    "batches, ratio estimator) and by t_{n-1}/t_{K-1}"
)
# fewer batches than this (1 s bins): no interval, and the document says the run is too short
MIN_BATCHES = 2
# fewer effective samples than this (after the t ratio): a share's interval spans +-20 pp or
# more at a 50% share, and the document says the run is too short for its intervals
MIN_INTERVAL_SAMPLES = 20.0
# run-queue wait per CPU-second at or over which the document says the shares may be
# biased beyond their intervals: on a loaded 2-CPU VM (2-15 s per CPU-s) the estimate
# weighing put `other` +13.5 pp over in-process truth; runs under 1 s per CPU-s covered
# 49 of 50 codepath-runs (docs/benchmarks.md, issue 46 ask 7)
CONTENDED_WAIT_PER_CPU = 1.0


def batches(
    bins: Mapping[int, Mapping[str, float]], max_batches: int = MAX_BATCHES
) -> list[dict[str, float]]:
    """Merge time bins (index -> codepath -> cpu_s; missing indexes are empty bins)
    into at most `max_batches` contiguous batches of (nearly) equal length."""
    if not bins:
        return []
    lo, hi = min(bins), max(bins)
    n = hi - lo + 1
    k = min(max_batches, n)
    out: list[dict[str, float]] = [{} for _ in range(k)]
    for b, row in bins.items():
        j = min(k - 1, (b - lo) * k // n)
        for cp, v in row.items():
            out[j][cp] = out[j].get(cp, 0.0) + v
    return out


def share_ci95(
    batch_rows: list[dict[str, float]], codepath: str, *, samples: float
) -> tuple[float, float] | None:
    """The Korn-Graubard 95% interval of `codepath`'s CPU share (module doc); `samples`:
    the effective count of the samples behind the batches (Accumulator.effective_samples).
    None with fewer than MIN_BATCHES batches, no CPU or no sample."""
    k = len(batch_rows)
    if k < MIN_BATCHES or not samples > 0:
        return None
    c = [row.get(codepath, 0.0) for row in batch_rows]
    x = [sum(row.values()) for row in batch_rows]
    total = sum(x)
    if total <= 0:
        return None
    r = min(1.0, max(0.0, sum(c) / total))
    xbar = total / k
    var = sum((ci - r * xi) ** 2 for ci, xi in zip(c, x, strict=True)) / (k * (k - 1))
    se2 = var / (xbar * xbar)
    n_eff = min(samples, r * (1 - r) / se2) if se2 > 0 else samples
    n_df = n_eff * _t_ratio(samples, k)
    if not n_df > 0:  # a share rounded to 0 or 1 beside a spread: no information
        return (0.0, 1.0)
    return clopper_pearson(min(n_df, n_df * r), n_df)


def _t_ratio(samples: float, k: int) -> float:
    """(t_{n-1} / t_{K-1})^2, at most 1: se from K batches is itself uncertain."""
    if samples <= 1:
        return 1.0
    return min(1.0, (t_quantile(samples - 1) / t_quantile(k - 1)) ** 2)


def too_short(batch_rows: list[dict[str, float]], samples: float, duration_s: float) -> str | None:
    """Why the run is too short for its share intervals (no interval, or one at least
    +-20 pp wide for want of samples), or None."""
    if not samples > 0:
        return None  # nothing sampled: the table says so in its own first line
    k = len(batch_rows)
    more = (
        "profile longer (--duration), or sample faster (a larger --cpu-budget, or "
        "--cpu-budget off with --rate)"
    )
    if k < MIN_BATCHES:
        return (
            f"{duration_s:.1f} s gave {k} one-second batch(es) and the share intervals "
            f"need {MIN_BATCHES}: {more}"
        )
    n_df = samples * _t_ratio(samples, k)
    if n_df < MIN_INTERVAL_SAMPLES:
        return (
            f"{n_df:.0f} effective samples in {duration_s:.1f} s (under "
            f"{MIN_INTERVAL_SAMPLES:.0f}), so a share's 95% interval spans +-20 pp or more: "
            f"{more}"
        )
    return None


def contended(runqueue_wait_s: float, cpu_s: float) -> str | None:
    """Why the shares may be biased beyond their intervals (the target waited for a CPU at
    least as long as it ran), or None."""
    if not cpu_s > 0 or runqueue_wait_s / cpu_s < CONTENDED_WAIT_PER_CPU:
        return None
    return (
        f"the target waited {runqueue_wait_s / cpu_s:.1f} s in the run queue per CPU-second "
        f"it ran: on a node this contended the CPU weighing is biased beyond the share "
        f"intervals (docs/benchmarks.md, issue 46 ask 7): profile on a quieter node, or weigh "
        f"by the scheduler's timeline (--kernel-timeline)"
    )


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def add_energy(doc: dict[str, Any], energy: ProfileEnergy) -> dict[str, Any]:
    """Write the energy sink's sections into a document: `energy`, `gpus`, `nvml`, and
    each codepath's energy_j, energy_source, gpu_wait_s and gpu_idle_j."""
    doc["energy"] = copy.deepcopy(energy.energy)
    doc["gpus"] = copy.deepcopy(energy.gpus)
    if energy.nvml is not None:
        doc["nvml"] = dict(energy.nvml)
    for cp, figures in energy.codepaths.items():
        row = doc["codepaths"][cp]
        row.update({k: v for k, v in vars(figures).items() if k != "by_direction"})
        for d, (energy_j, wait_s) in figures.by_direction.items():
            row.setdefault("direction", {}).setdefault(d, {}).update(
                energy_j=energy_j, gpu_wait_s=wait_s
            )
    return doc


EPISODE_METHOD = (
    "a thread's consecutive timeline samples in one codepath, gaps up to 2 ticks tolerated, "
    "joined across window gaps (stated as unknown_s); a checkpoint's fsync/replace tail on "
    "the same thread is included and makes it durable; start and end from the stack-change "
    "run when timed_by is 'stack changes' (wall_s within +/- resolution_s, 95%: ln(20) "
    "stack-change periods plus py-spy's lag), else from sample counts (95%: the count noise "
    "of py-spy's Poisson ticks, plus a period and py-spy's lag)"
)


def _episode_counts(episodes: list[Episode], codepath: str) -> dict[str, Any]:
    """A codepath's episode count and the p50 / p95 / max of their durations."""
    walls = sorted(ep.wall_s for ep in episodes if ep.codepath == codepath)
    if not walls:
        return {"episodes": 0, "episode_wall_s": None}
    return {
        "episodes": len(walls),
        "episode_wall_s": {
            "p50": round(float(np.percentile(walls, 50)), 6),
            "p95": round(float(np.percentile(walls, 95)), 6),
            "max": round(walls[-1], 6),
        },
    }


def _episode_json(ep: Episode) -> dict[str, Any]:
    row = {k: getattr(ep, k) for k in ep.__dataclass_fields__}
    for k, v in row.items():
        if isinstance(v, float):
            row[k] = round(v, 6)
    return row


def unmapped_threads_section(acc: Accumulator) -> dict[str, Any]:
    """The `unmapped_threads` section: CPU no sample carried, part of `other`'s cpu_s."""
    rows = sorted(acc.unmapped.items(), key=lambda kv: (-kv[1][1], kv[0]))
    threads_s = sum(v for _, v in acc.unmapped.values()) + acc.unmapped_untracked_cpu_s
    total = threads_s + acc.unmapped_exited_cpu_s
    return {
        "cpu_s": round(total, 6),
        "share": round(total / acc.total_cpu_s, 6) if acc.total_cpu_s > 0 else 0.0,
        "counted_in": "other",
        "threads_cpu_s": round(threads_s, 6),
        "exited_cpu_s": round(acc.unmapped_exited_cpu_s, 6),
        "threads": [
            {"pid": pid, "tid": tid, "name": name, "cpu_s": round(cpu, 6)}
            for (pid, tid), (name, cpu) in rows[:MAX_DOC_UNMAPPED_THREADS]
        ],
        "threads_total": len(rows),
        # threads past the session's bound (MAX_UNMAPPED_THREADS): their CPU, unnamed
        "untracked_cpu_s": round(acc.unmapped_untracked_cpu_s, 6),
        "threads_listed": min(len(rows), MAX_DOC_UNMAPPED_THREADS),
        "method": UNMAPPED_METHOD,
    }


def _codepath_sections(result: SessionResult, main: int) -> dict[str, Any]:
    """Each codepath's samples, CPU, share with its interval, wall time, directions,
    episodes and processes (energy and GPU-wait None until add_energy fills them)."""
    acc = result.acc
    total = acc.total_cpu_s
    rows = batches(acc.bins)
    commands = {t.pid: t.command for t in result.targets}
    shares: dict[str, float] = {}
    for cp in CODEPATHS:
        if cp != "other":
            shares[cp] = acc.cpu_s[cp] / total if total > 0 else 0.0
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    codepaths: dict[str, Any] = {}
    for cp in CODEPATHS:
        ci = share_ci95(rows, cp, samples=acc.effective_samples)
        n = acc.samples[cp]
        codepaths[cp] = {
            "samples": n,
            "cpu_s": round(acc.cpu_s[cp], 6),
            "share": round(shares[cp], 6) if total > 0 else None,  # of 0 CPU-s: n/a
            "share_ci95": [round(ci[0], 6), round(ci[1], 6)] if ci else None,
            "wall_s": round(acc.wall_s[cp], 6),
            "energy_j": None,
            "gpu_wait_s": None,
            "direction": {
                d: {
                    "samples": acc.dir_samples[cp][d],
                    "cpu_s": round(acc.dir_cpu_s[cp][d], 6),
                    "energy_j": None,
                    "gpu_wait_s": None,
                }
                for d in DIRECTIONS
            },
            "low_confidence_samples": acc.low_conf[cp],
            "low_confidence_share": round(acc.low_conf[cp] / n, 6) if n else 0.0,
            **_episode_counts(result.episodes, cp),
            "main_thread_wall_s": main_thread_wall_s(acc.processes, cp, main),
            "processes": codepath_processes(acc.processes, cp, commands, main),
        }
    return codepaths


def _target_rows(result: SessionResult, main: int) -> list[dict[str, Any]]:
    return [
        {
            "pid": t.pid,
            "command": t.command,
            "role": role(t.pid, main),
            "python": t.python,
            "windows": t.windows,
            "samples": t.samples,
            "cpu_s": round(t.cpu_s, 6),
            "exited": t.exited,
            "error": t.error,
            "windows_lost": t.windows_lost,
        }
        for t in sorted(result.targets, key=lambda t: t.pid)
    ]


def build_document(result: SessionResult, energy: ProfileEnergy | None = None) -> dict[str, Any]:
    """The serwatt.profile/1 document of a session; `energy`: the energy sink's sections."""
    acc = result.acc
    total = acc.total_cpu_s
    main = main_pid(result.info.root_pid, result.targets)
    root = next((t for t in result.targets if t.pid == result.info.root_pid), None)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "target": {
            "pid": result.info.root_pid,
            "python": root.python if root else None,
            "command": result.info.command,
        },
        "started_at": _iso(result.info.started_at),
        "duration_s": round(result.ended_at - result.info.started_at, 3),
        "rate_hz": result.info.rate_hz,
        "cpu_budget": result.cpu_budget,
        "samples": sum(acc.samples.values()),
        "cpu_s": round(total, 6),
        "codepaths": _codepath_sections(result, main),
        "energy": {
            "source": "unavailable",
            "reason": "energy attribution is not enabled for this profile",
            "package_j": None,
        },
        "gpus": [],
        "share_ci95_method": CI_METHOD,
        "share_ci95_samples": round(acc.effective_samples, 3),
        "share_ci95_too_short": too_short(
            batches(acc.bins), acc.effective_samples, result.ended_at - result.info.started_at
        ),
        "runqueue_wait_s": round(acc.runqueue_wait_s, 3),
        "share_ci95_contended": contended(acc.runqueue_wait_s, acc.total_cpu_s),
        "wall_s_method": WALL_METHOD,
        "low_confidence_cpu_share": round(acc.low_conf_cpu_s / total, 6) if total > 0 else 0.0,
        "unmapped_threads": unmapped_threads_section(acc),
        "sampler": {
            "pyspy_samples": acc.pyspy_samples,
            "pyspy_errors": acc.pyspy_errors,
            "partial_stacks": acc.partial_stacks,
            "behind_s": round(acc.behind_s, 3),
            "windows": acc.windows,
            "window_failures": dict(sorted(acc.failures.items())),
            "notes": sorted(acc.notes),
        },
        "episodes": [_episode_json(ep) for ep in result.episodes[:MAX_DOC_EPISODES]],
        "episodes_summary": {
            "total": len(result.episodes),
            "listed": min(len(result.episodes), MAX_DOC_EPISODES),
            "dropped": max(0, len(result.episodes) - MAX_DOC_EPISODES),
            "bound": MAX_DOC_EPISODES,
            "method": EPISODE_METHOD,
        },
        "targets": _target_rows(result, main),
    }
    return add_energy(doc, energy) if energy is not None else doc
