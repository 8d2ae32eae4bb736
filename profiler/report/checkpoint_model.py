"""The checkpoint model under the cluster projection (projection.py): Daly's interval
and lost fraction, what one side measured (SideMeasurement, CheckpointSize), the scaling
of one node's stall to the cluster, and each side's restart time.

Scaling to the cluster (`scaled_delta`): the node's measured stall is scaled to the
bytes each GPU checkpoints, `state_bytes_per_gpu` S. With the checkpoint files' sizes
known (a `--checkpoints` watch) δ = δ_node × S / bytes measured: the stall taken as
linear in bytes, through zero; when a side's files span two or more sizes (the largest at
least SIZE_SPREAD times the smallest) a least-squares line stall = a + b·bytes is fitted
instead and δ = δ_node × (a + bS) / mean stall. Without sizes δ stays one node's.
- Synchronous side: every rank writes at once, so δ ≥ S × gpus / storage_write_gb_s (the
  storage bandwidth bound); the larger of the two is used and named (`bound`).
- Asynchronous side (the main thread's stall ends before the file is durable, as with
  many.Checkpointer or DCP async_save): δ is the copy, and the next checkpoint cannot
  begin before the background write ends, so τ ≥ that write: the measured background
  time (stall's end to the file event) scaled by S / bytes, and at least the bandwidth
  bound. `bound` says which binds: measured stall, storage bandwidth or background write.
The slowest rank sets a synchronous stall, so when ranks vary this is a lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from serwatt.profiler.report.cluster import ClusterConfig

# a side's checkpoint sizes are fitted (intercept and slope) when the largest is at least
# this many times the smallest; closer sizes cannot separate the two
SIZE_SPREAD = 1.5
# a side is asynchronous when most of its files were written by another thread than the
# one that stalled (seen in the samples), or when its median background time (stall's end
# to the file event) exceeds the checkpoints' resolution by more than the watch's stamp
# slack. The tail alone misses a short background write: many.Checkpointer's 64 MB write
# and fsync ends 40-70 ms after its copy here, inside resolution plus slack.
ASYNC_SLACK_S = 0.05


# --------------------------------------------------------------------------- the model


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints, seconds."""
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def lost_fraction(interval_s: float, delta_s: float, mtbf_s: float, restart_s: float) -> float:
    """Expected fraction of wall time not spent on new work (Daly's complete model)."""
    if interval_s <= 0:
        # τ -> 0 with δ = 0: only restarts are lost
        return 1.0 - math.exp(-restart_s / mtbf_s)
    wall_per_work = (
        mtbf_s
        * math.exp(restart_s / mtbf_s)
        * math.expm1((interval_s + delta_s) / mtbf_s)
        / interval_s
    )
    return 1.0 - 1.0 / wall_per_work


@dataclass(frozen=True)
class CheckpointSize:
    """One checkpoint file of a side: its bytes, the main thread's stall over it, and the
    time from the stall's end to the file event (None: not known), within resolution_s;
    written_apart: the file's writer was another thread than the one that stalled."""

    bytes: float
    stall_s: float
    async_tail_s: float | None
    resolution_s: float
    written_apart: bool = False


@dataclass(frozen=True)
class SideMeasurement:
    """What the runs of one side measured, for the projection.

    delta_s: the stall per checkpoint (mean), None when the side has no checkpoint
    episodes (`unavailable` says why); delta_basis: what δ is (GPU-wait or wall time of
    the training thread's checkpoint episodes); host_energy_j_per_checkpoint and its
    source (rapl | model | unavailable: why); restore_s: the mean measured restore, None
    when none was recorded; checkpoints: the side's checkpoint files with bytes and stall
    known (empty without a --checkpoints watch), for scaling δ to the cluster.
    """

    side: str
    runs: tuple[str, ...]
    delta_s: float | None
    delta_basis: str
    episodes: int
    codepath: str | None
    host_energy_j_per_checkpoint: float | None
    energy_source: str
    restore_s: float | None
    unavailable: str | None = None
    checkpoints: tuple[CheckpointSize, ...] = ()


def lost_parts(
    interval_s: float, delta_s: float, mtbf_s: float, restart_s: float
) -> dict[str, float]:
    """The lost fraction in three parts that sum to it, added in this order: restart
    (1 − e^{−R/M}, the model with τ → 0 and δ = 0), rework after failures (the model at
    the same τ with δ = 0, less the restart part) and checkpoint stalls (the rest)."""
    restart = 1.0 - math.exp(-restart_s / mtbf_s)
    no_stall = lost_fraction(interval_s, 0.0, mtbf_s, restart_s) if interval_s > 0 else restart
    total = lost_fraction(interval_s, delta_s, mtbf_s, restart_s)
    return {"stall": total - no_stall, "rework": no_stall - restart, "restart": restart}


def scaled_delta(cfg: ClusterConfig, m: SideMeasurement, delta_node_s: float) -> dict[str, Any]:
    """The side's δ on the cluster, from its node's δ (this module's docstring): the scaling, the
    bandwidth bound, whether the side is asynchronous and, if so, the least interval its
    background write allows."""
    state = cfg.value("state_bytes_per_gpu")
    bandwidth_s = state * cfg.value("gpus") / (cfg.value("storage_write_gb_s") * 1e9)
    sized = [c for c in m.checkpoints if c.bytes > 0]
    out: dict[str, Any] = {
        "delta_node_s": delta_node_s,
        "state_bytes_per_gpu": state,
        "bandwidth_bound_s": bandwidth_s,
        "bytes_measured": None,
        "sizes": len({c.bytes for c in sized}),
        "intercept_s": None,
        "slope_s_per_byte": None,
    }
    if not sized:
        out["method"], factor = "unscaled", 1.0
        out["note"] = (
            "checkpoint sizes not measured (no --checkpoints watch): one node's stall stands "
            "for every rank's, whatever its state"
        )
    else:
        nbytes = np.array([c.bytes for c in sized], dtype=float)
        stalls = np.array([c.stall_s for c in sized], dtype=float)
        out["bytes_measured"] = float(nbytes.mean())
        out["method"], factor = "proportional", state / float(nbytes.mean())
        out["note"] = (
            f"stall taken as linear in bytes through zero, measured at "
            f"{float(nbytes.mean()):.4g} B per checkpoint"
        )
        if nbytes.max() < SIZE_SPREAD * nbytes.min():
            out["note"] += (
                " (one measured size: it fixes no slope, so the line through zero is assumed)"
            )
        if nbytes.max() >= SIZE_SPREAD * nbytes.min() and float(stalls.mean()) > 0:
            slope, intercept = (float(v) for v in np.polyfit(nbytes, stalls, 1))
            at_state = intercept + slope * state
            if slope > 0 and at_state > 0:
                out["method"], factor = "fit", at_state / float(stalls.mean())
                out["intercept_s"], out["slope_s_per_byte"] = intercept, slope
                out["note"] = (
                    f"stall = {intercept:.4g} s + {slope:.4g} s/B x bytes, fitted over "
                    f"{len(sized)} checkpoints of {nbytes.min():.4g}-{nbytes.max():.4g} B"
                )
            else:
                out["note"] += (
                    f"; a line over {nbytes.min():.4g}-{nbytes.max():.4g} B gave no positive "
                    "stall at state_bytes_per_gpu, so not used"
                )
    machine = cfg.value("machine_stall_factor")
    out["machine_stall_factor"] = machine
    out["machine_note"] = (
        f"× machine_stall_factor {machine:g} (assumed: the measured node's stall per byte on "
        "the cluster's machines)"
    )
    factor *= machine
    scaled = delta_node_s * factor
    out["factor"] = factor
    out["delta_scaled_s"] = scaled
    tails = [c.async_tail_s for c in sized if c.async_tail_s is not None]
    resolution = float(np.median([c.resolution_s for c in sized])) if sized else 0.0
    apart = sum(c.written_apart for c in sized)
    if sized and 2 * apart > len(sized):
        asynchronous = True
        out["mode_source"] = (
            f"measured: {apart} of {len(sized)} files written by another thread than the "
            "one that stalled"
        )
    else:
        asynchronous = bool(tails) and float(np.median(tails)) - resolution > ASYNC_SLACK_S
        out["mode_source"] = (
            "measured: the median time from the stall's end to the file event, against the "
            f"checkpoints' resolution ({apart} of {len(sized)} files written by another thread)"
            if tails
            else "assumed: no file events tell a background write"
        )
    out["mode"] = "asynchronous" if asynchronous else "synchronous"
    if asynchronous:
        write = float(np.median(tails)) * state / float(out["bytes_measured"])
        out["background_write_s"] = write
        out["min_interval_s"] = max(write, bandwidth_s)
        out["delta_s"] = scaled
        out["bound"] = "measured stall"
    else:
        out["background_write_s"] = out["min_interval_s"] = None
        out["delta_s"] = max(scaled, bandwidth_s)
        out["bound"] = "storage bandwidth" if bandwidth_s > scaled else "measured stall"
    return out


def restore_reference(base: SideMeasurement, cand: SideMeasurement) -> float | None:
    """The restore taken as the read inside restart_s: the baseline's, when both sides
    measured one; None otherwise (then no side's R moves)."""
    if base.restore_s is None or cand.restore_s is None:
        return None
    return base.restore_s


def restart_with_restore(
    cfg: ClusterConfig, m: SideMeasurement, reference_s: float | None
) -> tuple[float, str]:
    """R for one side, and how it was formed. restart_s holds one read of the checkpoint
    (its default's source retrieves the checkpoint), so a side's measured restore replaces
    the reference read instead of being added: R = restart_s − reference + restore, at
    least 0."""
    restart = cfg.value("restart_s")
    if reference_s is None or m.restore_s is None:
        why = (
            "restart_s holds one read of the checkpoint; with a restore measured on one side "
            "only, R = restart_s on both"
            if m.restore_s is not None
            else "R = restart_s, which holds one read of the checkpoint"
        )
        return restart, why
    r = max(0.0, restart - reference_s + m.restore_s)
    return r, (
        f"R = restart_s − {reference_s:.6g} s (the baseline's restore, taken as the read "
        f"restart_s holds) + {m.restore_s:.6g} s = {r:.6g} s, the read not counted twice"
    )
