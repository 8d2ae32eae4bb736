"""Attribution of one window's energy and GPU idle time to a target's codepaths.

Pure functions: numbers in, frozen results out; no clocks, files or hardware.

Package energy (joules), per window and target:

    E        measured package energy (RAPL), or the model's estimate (source: model)
    E_dyn    the dynamic part. RAPL: E x u, with u = node busy CPU s / node total CPU s
             over the window (/proc/stat). Model: its own (TDP - idle) x u x wall part.
    E_idle   E - E_dyn: what the node draws regardless of work. Charged to nobody:
             it stays in the `unattributed` residual (as Kepler does); charging idle
             power to whoever happens to run would make a quiet job look expensive.
    share    target CPU s / node busy CPU s (clamped to [0, 1]: per-thread and
             node-wide CPU clocks tick separately, so the ratio can overshoot)
    E_target E_dyn x share
    E_cp     E_target x codepath CPU s / max(sum of codepath CPU s, target CPU s)
    unattributed = E - sum(E_cp) = E_idle + other processes' dynamic energy
                   + target CPU time that no sample landed on.

So `sum(codepaths) + unattributed == E` always, nothing is negative, and nothing
attributed exceeds what was measured. CPU time is not power (frequency, AVX, memory
stalls differ by code): this is a proportional split, stated as such.

GPU-wait seconds, per (target, GPU, codepath): a GPU the target uses was idle while
the target's sampled threads were in that codepath. Each sample of a thread stands
for [t, t + 1/rate) of that thread. At any instant:
- if some thread of the target is in a serialization codepath, the GPU's idle time
  at that instant counts once (not once per thread), split equally among the
  distinct serialization codepaths present (two threads in pickle count once; one
  in pickle and one in json split the instant half/half);
- else if some thread was sampled (in `other`), it counts to `other`;
- else (no sample covers the instant) it is `unattributed`.
GPU idle time comes from NVML utilisation intervals: an interval busy b% for d s
contributes d x (1 - b/100) idle seconds, spread evenly over the interval (NVML
does not say where inside its sample period the GPU idled). So
`sum(wait) + unattributed == GPU idle s` over the window. GPU idle energy is the
GPU's energy over the same pieces times their idle fraction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from serwatt.collectors.series import interpolate
from serwatt.profiler.classify.codepaths import CODEPATHS, SERIALIZATION_CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS, UNKNOWN
from serwatt.profiler.sampling.window import TimedLabel

_SERIALIZATION = frozenset(SERIALIZATION_CODEPATHS)


@dataclass(frozen=True)
class EnergyAttribution:
    source: str  # "rapl" | "model"
    total_j: float
    dynamic_j: float
    idle_j: float
    target_share: float
    target_j: float
    codepaths_j: Mapping[str, float]  # every codepath in CODEPATHS
    unattributed_j: float  # total_j - sum(codepaths_j); >= 0
    # The residual's parts, for the reader who asks "where did the rest go?"
    unattributed_idle_j: float
    unattributed_other_processes_j: float
    unattributed_target_unsampled_j: float


def attribute_energy(
    *,
    total_j: float,
    dynamic_j: float,
    target_cpu_s: float,
    node_busy_cpu_s: float,
    codepath_cpu_s: Mapping[str, float],
    source: str,
) -> EnergyAttribution:
    """Split one window's package energy; see the module docstring for the model."""
    if not (math.isfinite(total_j) and total_j >= 0):
        raise ValueError(f"total_j must be finite and >= 0, got {total_j}")
    total = float(total_j)
    dyn = min(total, max(0.0, float(dynamic_j)))
    target_cpu = max(0.0, float(target_cpu_s))
    busy = max(float(node_busy_cpu_s), target_cpu)
    share = 0.0 if busy <= 0 else min(1.0, target_cpu / busy)
    target_j = dyn * share
    cp_cpu = {cp: max(0.0, float(codepath_cpu_s.get(cp, 0.0))) for cp in CODEPATHS}
    denom = max(math.fsum(cp_cpu.values()), target_cpu)
    if denom <= 0:
        cps = dict.fromkeys(CODEPATHS, 0.0)
    else:
        cps = {cp: target_j * (v / denom) for cp, v in cp_cpu.items()}
    attributed = math.fsum(cps.values())
    if attributed > target_j:  # rounding only: take the excess from the largest share
        top = max(cps, key=lambda k: cps[k])
        cps[top] = max(0.0, cps[top] - (attributed - target_j))
        attributed = math.fsum(cps.values())
    unattributed = max(0.0, total - attributed)
    return EnergyAttribution(
        source=source,
        total_j=total,
        dynamic_j=dyn,
        idle_j=total - dyn,
        target_share=share,
        target_j=target_j,
        codepaths_j=cps,
        unattributed_j=unattributed,
        unattributed_idle_j=total - dyn,
        unattributed_other_processes_j=dyn - target_j,
        unattributed_target_unsampled_j=max(0.0, target_j - attributed),
    )


def overlap_factor(attributed_j: float, dynamic_j: float) -> float:
    """The one rule for joules attributed to several target windows over one span (a
    daemon slot's targets, a profile's process tree): together they never take more than
    the node's dynamic joules over it, the part the model shares out (idle is charged to
    nobody). Past it, because the targets' and the node's CPU clocks tick separately or
    the windows were read over slightly different spans, every part is scaled by this
    same factor, so the parts keep their proportions; otherwise it is 1."""
    bound = max(0.0, dynamic_j)
    if not attributed_j > bound:
        return 1.0
    return bound / attributed_j


def scaled_energy(e: EnergyAttribution, factor: float) -> EnergyAttribution:
    """`e` with its target's joules scaled by `factor` (overlap_factor); what no longer
    goes to the target goes to the residual, as other processes' part."""
    if factor == 1.0:
        return e
    target_j = e.target_j * factor
    cps = {cp: j * factor for cp, j in e.codepaths_j.items()}
    attributed = math.fsum(cps.values())
    return replace(
        e,
        target_share=e.target_share * factor,
        target_j=target_j,
        codepaths_j=cps,
        unattributed_j=max(0.0, e.total_j - attributed),
        unattributed_other_processes_j=max(0.0, e.dynamic_j - target_j),
        unattributed_target_unsampled_j=max(0.0, target_j - attributed),
    )


@dataclass(frozen=True)
class IdleSpan:
    """GPU utilisation over (t0, t1]: busy_frac of the time busy. Mirrors
    collectors.nvml.UtilInterval so this module stays free of collectors' state."""

    t0: float
    t1: float
    busy_frac: float


@dataclass(frozen=True)
class GpuWaitAttribution:
    gpu_index: int
    window_s: float
    covered_s: float  # time with GPU utilisation data
    idle_s: float  # GPU idle seconds in the window (data-covered part)
    wait_s: Mapping[str, float]  # every codepath in CODEPATHS
    unattributed_s: float  # idle while no target sample covered the instant
    idle_energy_j: Mapping[str, float] | None  # GPU energy during wait_s, per codepath
    unattributed_idle_energy_j: float | None
    # each codepath's wait_s by direction (encode / decode / unknown): an instant's share
    # of a codepath is split evenly among its directions running then; sums to wait_s
    wait_by_direction_s: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


def attribute_gpu_wait(
    *,
    gpu_index: int,
    timeline: Iterable[TimedLabel],
    sample_period_s: float,
    spans: Iterable[IdleSpan],
    start: float,
    end: float,
    energy_points: Sequence[tuple[float, float]] = (),
    only_active: bool = False,
) -> GpuWaitAttribution:
    """GPU-wait seconds (and GPU idle joules) per codepath for one GPU and one window.

    `timeline` holds the target's classified samples (any thread); with
    `only_active`, samples py-spy marked idle (thread not on CPU) are ignored.
    `energy_points` are (t, cumulative GPU J) polls; without them energy is None.
    """
    if sample_period_s <= 0:
        raise ValueError(f"sample_period_s must be > 0, got {sample_period_s}")
    window_s = max(0.0, end - start)
    events = _coverage_events(timeline, sample_period_s, start, end, only_active)
    gpu = sorted(
        (max(s.t0, start), min(s.t1, end), min(1.0, max(0.0, s.busy_frac)))
        for s in spans
        if min(s.t1, end) > max(s.t0, start)
    )
    cuts = {start, end}
    cuts.update(e[0] for e in events)
    for a, b, _ in gpu:
        cuts.add(a)
        cuts.add(b)
    times = sorted(t for t in cuts if start <= t <= end)
    events.sort(key=lambda e: e[0])

    wait = dict.fromkeys(CODEPATHS, 0.0)
    wait_e = dict.fromkeys(CODEPATHS, 0.0)
    unattributed = unattributed_e = covered = idle_total = 0.0
    have_energy = len(energy_points) >= 2
    energy_missing = not have_energy
    active: dict[str, int] = dict.fromkeys(CODEPATHS, 0)
    by_dir = {cp: dict.fromkeys(DIRECTIONS, 0.0) for cp in CODEPATHS}
    active_dir = {cp: dict.fromkeys(DIRECTIONS, 0) for cp in CODEPATHS}
    ei = gi = 0
    for x, y in zip(times, times[1:], strict=False):
        while ei < len(events) and events[ei][0] <= x:
            _, step, cp_e, d_e = events[ei]
            active[cp_e] += step
            active_dir[cp_e][d_e] += step
            ei += 1
        while gi < len(gpu) and gpu[gi][1] <= x:
            gi += 1
        if y <= x or gi >= len(gpu) or gpu[gi][0] > x:
            continue  # no GPU data here: neither idle nor busy is known
        seg = y - x
        idle_frac = 1.0 - gpu[gi][2]
        covered += seg
        idle = seg * idle_frac
        if idle <= 0:
            continue
        idle_total += idle
        seg_e = 0.0
        if have_energy:
            e0, e1 = interpolate(energy_points, x), interpolate(energy_points, y)
            if e0 is None or e1 is None:
                energy_missing = True
            else:
                seg_e = max(0.0, e1 - e0) * idle_frac
        ser = [cp for cp in SERIALIZATION_CODEPATHS if active[cp] > 0]
        if ser:
            for cp in ser:
                wait[cp] += idle / len(ser)
                wait_e[cp] += seg_e / len(ser)
                _split(by_dir[cp], active_dir[cp], idle / len(ser))
        elif active["other"] > 0:
            wait["other"] += idle
            wait_e["other"] += seg_e
            _split(by_dir["other"], active_dir["other"], idle)
        else:
            unattributed += idle
            unattributed_e += seg_e
    return GpuWaitAttribution(
        gpu_index=gpu_index,
        window_s=window_s,
        covered_s=covered,
        idle_s=idle_total,
        wait_s=wait,
        unattributed_s=unattributed,
        idle_energy_j=None if energy_missing else wait_e,
        unattributed_idle_energy_j=None if energy_missing else unattributed_e,
        wait_by_direction_s=by_dir,
    )


def _coverage_events(
    timeline: Iterable[TimedLabel],
    sample_period_s: float,
    start: float,
    end: float,
    only_active: bool,
) -> list[tuple[float, int, str, str]]:
    """+1 / -1 events (t, step, codepath, direction) where each sample's [t, t + period)
    begins and ends inside [start, end]; several threads may overlap."""
    events: list[tuple[float, int, str, str]] = []
    for lab in timeline:
        if only_active and lab.active is False:
            continue
        a, b = max(lab.t, start), min(lab.t + sample_period_s, end)
        if b > a:
            cp = lab.codepath if lab.codepath in CODEPATHS else "other"
            d = lab.direction if lab.direction in DIRECTIONS else UNKNOWN
            events.append((a, 1, cp, d))
            events.append((b, -1, cp, d))
    return events


def _split(into: dict[str, float], running: Mapping[str, int], seconds: float) -> None:
    directions = [d for d, n in running.items() if n > 0]
    for d in directions:
        into[d] += seconds / len(directions)


def gpus_used_by(target_pids: Iterable[int], gpu_pids: Mapping[int, Iterable[int]]) -> list[int]:
    """Indices of the GPUs whose NVML compute-process list contains a target pid."""
    pids = set(target_pids)
    return sorted(i for i, ps in gpu_pids.items() if pids & set(ps))
