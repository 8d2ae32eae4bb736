"""Are the runs comparable? Host fingerprint, serwatt version, sampling rate and sources.

Every run of both sides is compared with every other (repeats on one side must match
too): CPU model, sockets, the GPUs (their names, as a multiset), kernel, serwatt version,
sampling rate, energy source, GPU source and how checkpoints were identified. Each field
with more than one value is a `Mismatch` that names the values and the runs that have
each. The report refuses (`ReportRefused`, listing every mismatch) unless the caller
allows mismatches, and then each mismatch becomes a caveat printed at the top of the
report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from serwatt.profiler.report.inputs import RunInput
from serwatt.profiler.terminal_escape import escape_text

SIDE_NAMES = ("baseline", "candidate")


@dataclass(frozen=True)
class Mismatch:
    """One field on which the runs differ: values maps each value (as shown) to run ids."""

    field: str
    values: tuple[tuple[str, tuple[str, ...]], ...]

    def __str__(self) -> str:
        shown = "; ".join(f"{value} ({', '.join(runs)})" for value, runs in self.values)
        return f"{self.field} differs: {shown}"

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "values": {value: list(runs) for value, runs in self.values}}


class ReportRefused(Exception):
    """The runs are not comparable; `mismatches` lists every difference found."""

    def __init__(self, mismatches: Sequence[Mismatch]) -> None:
        self.mismatches = tuple(mismatches)
        lines = [f"the runs are not comparable ({len(self.mismatches)} mismatch(es)):"]
        lines += [f"  {m}" for m in self.mismatches]
        lines.append("compare runs from like hosts and settings, or allow the mismatches")
        self.lines = tuple(lines)
        super().__init__("\n".join(lines))

    def shown(self) -> str:
        """The message for a terminal: one line per mismatch, each escaped on its own (run
        ids, host names and versions come from outside), so a value's own line break or
        control character is written out, never the message's line structure."""
        return "\n".join(escape_text(line, backslash=False) for line in self.lines)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _gpu_names(run: RunInput) -> Any:
    gpus = run.host.get("gpus") or []
    names = []
    for g in gpus:
        names.append(str(g.get("name")) if isinstance(g, dict) else str(g))
    return sorted(names)


FIELDS: tuple[tuple[str, Callable[[RunInput], Any]], ...] = (
    ("host.cpu_model", lambda r: r.host.get("cpu_model")),
    ("host.sockets", lambda r: r.host.get("sockets")),
    ("host.gpus", _gpu_names),
    ("host.kernel", lambda r: r.host.get("kernel")),
    ("serwatt_version", lambda r: r.serwatt_version),
    ("rate_hz", lambda r: r.rate_hz),
    ("energy_source", lambda r: r.energy_source),
    ("gpu_source", lambda r: r.gpu_source),
    # a side whose checkpoints are the files written against one whose are guessed from
    # episodes compares two different counts (imports and log lines pass for checkpoints)
    (
        "checkpoints identified by",
        lambda r: "file events" if r.checkpoints is not None else "heuristic (no --checkpoints)",
    ),
    # the stack-change run's rate sets the episodes' resolution_s: stalls timed at two
    # rates are not the same measurement
    ("config.timing_rate_hz (stack-change run)", lambda r: r.config.get("timing_rate_hz")),
)


# Differences that may move the numbers but do not make them incomparable: each one found
# is a warning in the report (`warnings`, scope "comparability"), never a refusal. The
# command line is compared within each side only (_commands): the sides differ in it by
# design.
WARN_FIELDS: tuple[tuple[str, Callable[[RunInput], Any]], ...] = (
    ("host.logical_cpus", lambda r: r.host.get("logical_cpus")),
    ("host.memory_bytes", lambda r: r.host.get("memory_bytes")),
    ("host.hypervisor", lambda r: r.host.get("hypervisor")),
    ("host.cpu_governor", lambda r: r.host.get("cpu_governor")),
    ("host.python (serwatt's)", lambda r: r.host.get("python")),
    ("host.python_implementation", lambda r: r.host.get("python_implementation")),
    ("host.packages.torch", lambda r: (r.host.get("packages") or {}).get("torch")),
    ("host.packages.numpy", lambda r: (r.host.get("packages") or {}).get("numpy")),
    ("target pythons", lambda r: r.config.get("target_pythons")),
    ("config.window_s", lambda r: r.config.get("window_s")),
    ("config.cpu_budget_cores", lambda r: r.config.get("cpu_budget_cores")),
)
# How far the 1-minute load average (at the start, or over the run) may differ between
# runs before it is a warning: a busy machine's run-queue waits lengthen every stall.
LOAD_SPREAD = 1.0


def _start_load(run: RunInput) -> float | None:
    la = run.host.get("load_average")
    if isinstance(la, (list, tuple)) and la:
        first = la[0]
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            return float(first)
    return None


def load_over_run(run: RunInput) -> float | None:
    """The mean of the host's 1-minute load average at the end of each of the run's windows
    (recorded since schema 6); None when no window holds one (an older record, Prometheus)."""
    loads = [w.load_1min for w in run.windows if w.load_1min is not None]
    return sum(loads) / len(loads) if loads else None


def _load_spread(
    runs: Sequence[RunInput], name: str, get: Callable[[RunInput], float | None]
) -> list[Mismatch]:
    loads = {r.run_id: v for r in runs if (v := get(r)) is not None}
    if loads and max(loads.values()) - min(loads.values()) > LOAD_SPREAD:
        return [Mismatch(name, tuple((f"{v:.2f}", (run,)) for run, v in loads.items()))]
    return []


def _differences(
    runs: Sequence[RunInput], fields: Sequence[tuple[str, Callable[[RunInput], Any]]]
) -> list[Mismatch]:
    """Each field with more than one value among `runs`, the runs of each value named."""
    out = []
    for name, get in fields:
        by_value: dict[str, list[str]] = {}
        for run in runs:
            by_value.setdefault(_show(get(run)), []).append(run.run_id)
        if len(by_value) > 1:
            out.append(Mismatch(name, tuple((v, tuple(ids)) for v, ids in by_value.items())))
    return out


def _checkpoint_dir(run: RunInput, command: str) -> str | None:
    """The run's watched checkpoint directory: as recorded, or, in a record from before
    serwatt kept it, the deepest directory above all its checkpoint files that its
    command names."""
    recorded = run.config.get("checkpoint_dir")
    if recorded:
        return str(recorded)
    paths = [PurePosixPath(c.path) for c in run.checkpoints or ()]
    if not paths:
        return None
    common = PurePosixPath(os.path.commonpath([str(p.parent) for p in paths]))
    for directory in (common, *common.parents):
        if str(directory) not in ("/", ".") and str(directory) in command:
            return str(directory)
    return None


def workload_command(run: RunInput) -> str | None:
    """The run's recorded command with its own checkpoint directory written `{dir}`
    (`serwatt ab` gives every run its own); None when the record holds no command."""
    command = run.config.get("command")
    if not command:
        return None
    directory = _checkpoint_dir(run, command)
    return command.replace(directory, "{dir}") if directory else command


def _commands(side: Sequence[RunInput], name: str) -> list[Mismatch]:
    """The workload commands of one side's runs, when they differ. A run that read a
    checkpoint back and whose command is another's with arguments appended is that run's
    resume (`serwatt ab --resume-args`), the same workload."""
    commands = {r.run_id: c for r in side if (c := workload_command(r)) is not None}
    starts = set(commands.values())
    by_value: dict[str, list[str]] = {}
    for run in side:
        command = commands.get(run.run_id)
        if command is None:
            continue
        resumes = run.restores and any(
            command.startswith(other + " ") for other in starts if other != command
        )
        if not resumes:
            by_value.setdefault(command, []).append(run.run_id)
    if len(by_value) < 2:
        return []
    return [Mismatch(name, tuple((v, tuple(ids)) for v, ids in by_value.items()))]


def differences(sides: Sequence[Sequence[RunInput]]) -> list[Mismatch]:
    """What differs among the runs of `sides` without making them incomparable
    (WARN_FIELDS; the 1-minute load average, at the start and over the run, when it
    spreads over LOAD_SPREAD: a load that rose during one run is missed by its start
    alone; and the workload command within each side)."""
    runs = [r for side in sides for r in side]
    return [
        *_differences(runs, WARN_FIELDS),
        *_load_spread(runs, "host.load_average (1 min, at start)", _start_load),
        *_load_spread(
            runs, "load over the run (mean 1-min load at its windows' ends)", load_over_run
        ),
        *(
            m
            for i, side in enumerate(sides)
            for m in _commands(side, f"workload command ({SIDE_NAMES[i]} runs)")
        ),
    ]


def mismatches(runs: Sequence[RunInput]) -> list[Mismatch]:
    """Every compared field on which the runs do not all agree, in FIELDS order."""
    return _differences(runs, FIELDS)


def check(runs: Sequence[RunInput], *, allow_mismatch: bool) -> list[Mismatch]:
    """The mismatches among `runs`; raises ReportRefused if any and not allow_mismatch."""
    found = mismatches(runs)
    if found and not allow_mismatch:
        raise ReportRefused(found)
    return found


def interleaving(baseline: Sequence[RunInput], candidate: Sequence[RunInput]) -> dict[str, Any]:
    """The order the runs started in (A baseline, B candidate): interleaved (ABAB) spreads
    drift over both sides, blocked (AABB) lets it pass for a difference."""
    runs = sorted(
        [(r.started_at, "A", r.run_id) for r in baseline]
        + [(r.started_at, "B", r.run_id) for r in candidate]
    )
    order = "".join(k for _t, k, _id in runs)
    switches = sum(a != b for a, b in zip(order, order[1:], strict=False))
    if len(order) <= 2:
        kind = "one run per side: neither interleaved nor blocked"
    elif switches == 1:
        kind = "blocked (AABB): drift between the halves would pass for a difference"
    elif switches == len(order) - 1:
        kind = "interleaved (ABAB)"
    else:
        kind = "partly interleaved"
    return {"order": order, "runs": [i for _t, _k, i in runs], "kind": kind}
