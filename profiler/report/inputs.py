"""What the A/B report is computed from: runs, their windows and their episodes.

These frozen dataclasses are the report's whole input. Whoever reads run records turns
them into these; the report never touches records, SQLite or hardware. Every value is
checked on construction (records are hostile input: a NaN, a negative duration or an
unknown codepath is refused with an `InputError` naming the run, the field and the
value), and float fields are stored as floats so that the receipt's canonical form does
not depend on whether a record said `1` or `1.0`.

Units: seconds (`_s`), joules (`_j`), hertz (`_hz`); timestamps are epoch seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS

ENERGY_SOURCES: tuple[str, ...] = ("rapl", "model", "unavailable")


class InputError(ValueError):
    """A report input that cannot be used; the message names where and what."""


def _number(where: str, name: str, value: Any, *, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: {name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise InputError(f"{where}: {name} must be finite, got {value!r}")
    if minimum is not None and out < minimum:
        raise InputError(f"{where}: {name} must be at least {minimum:g}, got {value!r}")
    return out


def _optional(where: str, name: str, value: Any) -> float | None:
    return None if value is None else _number(where, name, value)


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class CodepathFigures:
    """One codepath's share of one window.

    samples: py-spy samples classified to the codepath; cpu_s: CPU-seconds attributed
    (samples weighted by each thread's procfs CPU); wall_s: sampled wall time in it;
    energy_j: joules attributed (source: the window's `energy_source`), None when the
    window had no energy; gpu_wait_s: seconds a GPU was idle while a host thread was in
    the codepath, None when the window had no GPU data.
    """

    samples: int
    cpu_s: float
    wall_s: float
    energy_j: float | None = None
    gpu_wait_s: float | None = None

    def __post_init__(self) -> None:
        where = "codepath figures"
        if isinstance(self.samples, bool) or not isinstance(self.samples, int):
            raise InputError(f"{where}: samples must be an integer, got {self.samples!r}")
        if self.samples < 0:
            raise InputError(f"{where}: samples must be at least 0, got {self.samples!r}")
        _set(self, "cpu_s", _number(where, "cpu_s", self.cpu_s))
        _set(self, "wall_s", _number(where, "wall_s", self.wall_s))
        _set(self, "energy_j", _optional(where, "energy_j", self.energy_j))
        _set(self, "gpu_wait_s", _optional(where, "gpu_wait_s", self.gpu_wait_s))


@dataclass(frozen=True)
class DirectionFigures:
    """One direction's part (encode / decode / unknown) of one codepath over a run."""

    samples: int
    cpu_s: float

    def __post_init__(self) -> None:
        where = "direction figures"
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 0:
            raise InputError(f"{where}: samples must be a whole number, got {self.samples!r}")
        _set(self, "cpu_s", _number(where, "cpu_s", self.cpu_s))


@dataclass(frozen=True)
class WindowInput:
    """One sampling window of one process.

    started_at, ended_at: epoch seconds; cpu_s: the process's CPU-seconds in the window
    (all codepaths, `other` included); codepaths: figures per codepath of the closed set
    (a codepath that is missing had nothing); energy_source: rapl | model | unavailable,
    None when the window's energy was not given; pid: the process, None when unknown
    (windows of one pid are one autocorrelated series, blocked together); load_1min: the
    host's 1-minute load average at the window's end, None when not recorded.
    """

    started_at: float
    ended_at: float
    cpu_s: float
    codepaths: Mapping[str, CodepathFigures]
    energy_source: str | None = None
    pid: int | None = None
    load_1min: float | None = None

    def __post_init__(self) -> None:
        where = "window"
        _set(self, "started_at", _number(where, "started_at", self.started_at, minimum=None))
        _set(self, "ended_at", _number(where, "ended_at", self.ended_at, minimum=None))
        if self.ended_at < self.started_at:
            raise InputError(
                f"window: ended_at {self.ended_at!r} is before started_at {self.started_at!r}"
            )
        _set(self, "cpu_s", _number(where, "cpu_s", self.cpu_s))
        if self.load_1min is not None:
            _set(self, "load_1min", _number(where, "load_1min", self.load_1min))
        for name, figures in self.codepaths.items():
            if name not in CODEPATHS:
                raise InputError(
                    f"window: unknown codepath {name!r}; known: {', '.join(CODEPATHS)}"
                )
            if not isinstance(figures, CodepathFigures):
                raise InputError(f"window: codepath {name!r} must be CodepathFigures")
        _set(self, "codepaths", MappingProxyType(dict(self.codepaths)))
        if self.energy_source is not None and self.energy_source not in ENERGY_SOURCES:
            raise InputError(
                f"window: energy_source must be one of {', '.join(ENERGY_SOURCES)} or None, "
                f"got {self.energy_source!r}"
            )

    @property
    def wall_s(self) -> float:
        return self.ended_at - self.started_at


@dataclass(frozen=True)
class EpisodeInput:
    """One serialization episode: a thread's uninterrupted stay in one codepath.

    pid, thread (OS thread id); codepath; start, end: epoch seconds; wall_s: its
    duration, within ± resolution_s of the truth (95%; profiler/attribution/episodes.py);
    cpu_s: CPU-seconds the thread spent in it; gpu_wait_s: seconds a GPU the process
    uses was idle during it and gpu_idle_j the joules those GPUs drew meanwhile (None:
    no GPU data); main_thread: the process's main (training) thread; durable: an fsync
    was seen inside the episode. The rest as the profile document has them (None: a record
    from before they were stored): unknown_s, edge_unknown_s (it may have run this much
    longer, unobserved), truncated (sampling started or stopped inside it), samples,
    timed_by, timing_period_s, clock_s, durability_s, host_lag_s, direction, prepared_s
    (its save function's preparation right before it, not in wall_s).
    """

    pid: int
    thread: int
    codepath: str
    start: float
    end: float
    wall_s: float
    resolution_s: float
    cpu_s: float
    gpu_wait_s: float | None
    gpu_idle_j: float | None
    main_thread: bool
    durable: bool
    unknown_s: float = 0.0
    edge_unknown_s: float = 0.0
    truncated: bool = False
    samples: int | None = None
    timed_by: str | None = None
    timing_period_s: float | None = None
    clock_s: float | None = None
    durability_s: float | None = None
    host_lag_s: float | None = None
    direction: str | None = None  # encode | decode | unknown; None: not recorded
    prepared_s: float | None = None

    @property
    def stated_resolution_s(self) -> float:
        """resolution_s widened by the time it may have run unobserved (edge_unknown_s)."""
        return self.resolution_s + self.edge_unknown_s

    @property
    def resolved(self) -> bool:
        """wall_s is within ± resolution_s as stated: no unknown edge, not truncated."""
        return self.edge_unknown_s == 0.0 and not self.truncated

    def __post_init__(self) -> None:
        where = "episode"
        for name in ("pid", "thread"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"{where}: {name} must be an integer, got {value!r}")
        if self.codepath not in CODEPATHS or self.codepath == "other":
            raise InputError(
                f"{where}: codepath must be a serialization codepath, got {self.codepath!r}"
            )
        _set(self, "start", _number(where, "start", self.start, minimum=None))
        _set(self, "end", _number(where, "end", self.end, minimum=None))
        if self.end < self.start:
            raise InputError(f"{where}: end {self.end!r} is before start {self.start!r}")
        for name in ("wall_s", "resolution_s", "cpu_s"):
            _set(self, name, _number(where, name, getattr(self, name)))
        for name in (
            "gpu_wait_s",
            "gpu_idle_j",
            "timing_period_s",
            "clock_s",
            "durability_s",
            "host_lag_s",
            "prepared_s",
        ):
            _set(self, name, _optional(where, name, getattr(self, name)))
        if self.direction is not None and self.direction not in DIRECTIONS:
            raise InputError(
                f"{where}: direction must be one of {', '.join(DIRECTIONS)} or None, "
                f"got {self.direction!r}"
            )
        for name in ("unknown_s", "edge_unknown_s"):
            _set(self, name, _number(where, name, getattr(self, name)))
        if self.samples is not None and (
            isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 0
        ):
            raise InputError(f"{where}: samples must be a whole number or None")
        if self.timed_by is not None and not isinstance(self.timed_by, str):
            raise InputError(f"{where}: timed_by must be text or None")
        for name in ("main_thread", "durable", "truncated"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{where}: {name} must be true or false")


@dataclass(frozen=True)
class CheckpointInput:
    """One checkpoint file a `--checkpoints DIR` watch saw completed
    (profiler/attribution/checkpoints.py): its writer episode (episode_start on thread_id;
    None: file event only) and its stall (the main thread's episode: stall_thread,
    stall_start, stall_s within ± resolution_s); cpu_s_all_threads and async_tail_s None
    when not known."""

    path: str
    bytes: int | None
    event_t: float
    pid: int | None
    thread_id: int | None
    episode_start: float | None
    stall_thread: int | None
    stall_start: float | None
    stall_s: float | None
    resolution_s: float | None
    timed_by: str
    cpu_s_all_threads: float | None
    async_tail_s: float | None

    def __post_init__(self) -> None:
        where = f"checkpoint {self.path!r}"
        _set(self, "event_t", _number(where, "event_t", self.event_t, minimum=None))
        for name in ("episode_start", "stall_start"):
            v = getattr(self, name)
            _set(self, name, None if v is None else _number(where, name, v, minimum=None))
        for name in ("stall_s", "resolution_s", "cpu_s_all_threads", "async_tail_s"):
            _set(self, name, _optional(where, name, getattr(self, name)))


@dataclass(frozen=True)
class RestoreInput:
    """One checkpoint file the run read back: wall_s (None: file event only) within
    ± resolution_s, read_bytes from storage over it, lazy: a format read on first use."""

    path: str
    bytes: int | None
    open_t: float
    pid: int | None
    thread_id: int | None
    episode_start: float | None  # the decode episode's start (None: file event only)
    wall_s: float | None
    resolution_s: float | None
    timed_by: str
    read_bytes: int | None
    lazy: bool

    def __post_init__(self) -> None:
        where = f"restore {self.path!r}"
        _set(self, "open_t", _number(where, "open_t", self.open_t, minimum=None))
        v = self.episode_start
        _set(
            self,
            "episode_start",
            None if v is None else _number(where, "episode_start", v, minimum=None),
        )
        for name in ("wall_s", "resolution_s"):
            _set(self, name, _optional(where, name, getattr(self, name)))


# The recorded settings the report compares (comparability.py); others are not carried.
CONFIG_KEYS = (
    "command",
    "window_s",
    "timing_rate_hz",
    "target_pythons",
    "checkpoint_dir",
    "cpu_budget_cores",
)


def _run_config(where: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The CONFIG_KEYS a record holds, each text (at most 4096 characters) or a finite
    number or None; anything else is refused, naming the key."""
    out: dict[str, Any] = {}
    for key in CONFIG_KEYS:
        if key not in config:
            continue
        v = config[key]
        if v is None or isinstance(v, str):
            out[key] = v if v is None else v[:4096]
        else:
            out[key] = _number(where, f"config.{key}", v, minimum=None)
    return out


@dataclass(frozen=True)
class RunInput:
    """One recorded run.

    host: the run's host fingerprint (profiler.host: cpu_model, sockets, gpus as a list
    of dicts with `name`, kernel, hostname, ...); serwatt_version: the version that
    recorded it; rate_hz: its configured sampling rate; energy_source: rapl | model |
    unavailable (energy_reason says why when unavailable); gpu_source: `nvml` or
    `unavailable: <why>`; started_at, ended_at: epoch seconds; windows: in any order;
    episodes: None for a record that has none (schema 1), else every episode of the run;
    restore_s: measured checkpoint restore (load) durations, seconds, if any; config:
    how the run was made (command, window_s, timing_rate_hz, checkpoint_dir, as recorded;
    target_pythons: the targets' Python versions its windows saw, comma-separated).
    """

    run_id: str
    host: Mapping[str, Any]
    serwatt_version: str
    rate_hz: float
    energy_source: str
    gpu_source: str
    started_at: float
    ended_at: float
    windows: tuple[WindowInput, ...]
    episodes: tuple[EpisodeInput, ...] | None
    restore_s: tuple[float, ...] = ()
    energy_reason: str | None = None
    # None: recorded without a --checkpoints watch (checkpoints identified by the heuristic)
    checkpoints: tuple[CheckpointInput, ...] | None = None
    restores: tuple[RestoreInput, ...] = ()
    unmatched_episodes: int | None = None
    read_bytes: int | None = None
    read_bytes_source: str | None = None
    # how it was run: command, window_s, timing_rate_hz (the stack-change run), ... as
    # recorded; {} when the input names none (Prometheus)
    config: Mapping[str, Any] = field(default_factory=dict)
    # codepath -> direction -> the run's figures (profiler/report/direction.py); None:
    # recorded without directions
    directions: Mapping[str, Mapping[str, DirectionFigures]] | None = None
    # the run's folded stacks, each (frames leaf first as (function, file, line),
    # codepath, direction, samples, cpu_s) (profiler/records/stack_rows.py), and how many
    # new stacks past the record's cap were counted under its overflow stack; None:
    # recorded without stacks. Left out of the receipt while None (receipt.py), so the
    # receipts of runs recorded before stacks still verify.
    stacks: tuple[tuple[tuple[tuple[str, str, int], ...], str, str, int, float], ...] | None = (
        field(default=None, metadata={"receipt": "omit-default"})
    )
    stacks_merged: int = field(default=0, metadata={"receipt": "omit-default"})

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not self.run_id:
            raise InputError(f"run: run_id must be a non-empty string, got {self.run_id!r}")
        where = f"run {self.run_id!r}"
        if not isinstance(self.host, Mapping):
            raise InputError(f"{where}: host must be a mapping")
        for name in ("serwatt_version", "gpu_source"):
            if not isinstance(getattr(self, name), str):
                raise InputError(f"{where}: {name} must be a string")
        _set(self, "rate_hz", _number(where, "rate_hz", self.rate_hz))
        if self.rate_hz <= 0:
            raise InputError(f"{where}: rate_hz must be positive, got {self.rate_hz!r}")
        if self.energy_source not in ENERGY_SOURCES:
            raise InputError(
                f"{where}: energy_source must be one of {', '.join(ENERGY_SOURCES)}, "
                f"got {self.energy_source!r}"
            )
        _set(self, "started_at", _number(where, "started_at", self.started_at, minimum=None))
        _set(self, "ended_at", _number(where, "ended_at", self.ended_at, minimum=None))
        if self.ended_at < self.started_at:
            raise InputError(f"{where}: ended_at is before started_at")
        windows = tuple(self.windows)
        if not all(isinstance(w, WindowInput) for w in windows):
            raise InputError(f"{where}: windows must be WindowInput values")
        _set(self, "windows", tuple(sorted(windows, key=lambda w: (w.started_at, w.pid or 0))))
        if self.episodes is not None:
            episodes = tuple(self.episodes)
            if not all(isinstance(e, EpisodeInput) for e in episodes):
                raise InputError(f"{where}: episodes must be EpisodeInput values or None")
            _set(self, "episodes", tuple(sorted(episodes, key=lambda e: (e.start, e.pid))))
        _set(
            self,
            "restore_s",
            tuple(_number(where, "restore_s[]", v) for v in self.restore_s),
        )
        _set(self, "host", MappingProxyType(dict(self.host)))
        if not isinstance(self.config, Mapping):
            raise InputError(f"{where}: config must be a mapping")
        _set(self, "config", MappingProxyType(_run_config(where, self.config)))
        if self.directions is not None:
            for cp, parts in self.directions.items():
                if cp not in CODEPATHS or not isinstance(parts, Mapping):
                    raise InputError(f"{where}: directions: unknown codepath {cp!r}")
                for d, f in parts.items():
                    if d not in DIRECTIONS or not isinstance(f, DirectionFigures):
                        raise InputError(
                            f"{where}: directions.{cp}: {d!r} must be one of "
                            f"{', '.join(DIRECTIONS)} with DirectionFigures"
                        )
        if self.stacks is not None:
            stacks = []
            for frames, cp, d, samples, cpu_s in self.stacks:
                if cp not in CODEPATHS or d not in DIRECTIONS:
                    raise InputError(f"{where}: stacks: unknown codepath/direction {cp!r}/{d!r}")
                if not all(
                    isinstance(f, tuple) and len(f) == 3 and type(f[2]) is int for f in frames
                ):
                    raise InputError(f"{where}: stacks: frames must be (function, file, line)")
                stacks.append(
                    (tuple(frames), cp, d, int(samples), _number(where, "stacks[].cpu_s", cpu_s))
                )
            _set(self, "stacks", tuple(stacks))

    @property
    def wall_s(self) -> float:
        return self.ended_at - self.started_at
