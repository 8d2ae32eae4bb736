"""The daemon's ledger: monotonic counters, published as immutable snapshots.

The sampling side (profiler/service/daemon.py) is the only writer. It adds what each window
measured and then publishes a snapshot; the Prometheus side (profiler/service/exporter.py)
only ever reads the latest snapshot, so a scrape never computes, never blocks on
sampling and never sees a half-applied window.

Counters only go up (a negative increment is a bug and raises ValueError) and a
series, once created, is never dropped while the daemon lives: a target that left
the config keeps its totals and shows `up 0`, so `rate()` stays correct.

Labels are bounded by construction: `target` must be a registered (configured)
target name, `codepath` must belong to profiler.classify.codepaths.CODEPATHS and
`direction` to its series_directions (profiler/classify/direction.py: encode, decode,
unknown; `other` unknown only), `gpu` is an index, `source` and `kind` are short
identifiers. A pid appears only in the per-target process list (the
`serwatt_target_info` metric).
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from serwatt.profiler import __version__
from serwatt.profiler.attribution.window import DirectedFigures, DirectedTotals
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import CODEPATH_DIRECTIONS

# `kind` and `source` label values: short identifiers, never free text.
_IDENT = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


@dataclass(frozen=True)
class TargetProcess:
    pid: int
    python: str  # "3.11.7", or "unknown" until a window reported it
    # what weighed its last window's CPU: kernel (the scheduler timeline) or estimate
    # (profiler/sampling/kernel_cpu.py); "unknown" until a window reported it
    cpu_source: str = "unknown"


@dataclass(frozen=True)
class TargetState:
    name: str
    configured: bool  # False once a reload removed it (its totals are kept)
    processes: tuple[TargetProcess, ...]
    # the config's static labels (targets[].labels), on every per-target series
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def up(self) -> bool:
        return bool(self.processes)


@dataclass(frozen=True)
class CollectorState:
    """What the daemon's last use of one signal source said."""

    up: bool
    duration_s: float
    detail: str = ""  # e.g. "rapl: unavailable: permission", shown on the landing page


def _frozen(d: Mapping) -> Mapping:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class LedgerSnapshot:
    """Every exported value at one instant. Mappings are read-only copies."""

    taken_at: float  # epoch seconds
    version: str
    targets: tuple[TargetState, ...]
    samples: Mapping[tuple[str, str, str], int]  # (target, codepath, direction)
    cpu_s: Mapping[tuple[str, str, str], float]  # (target, codepath, direction)
    energy_j: Mapping[tuple[str, str, str, str], float]  # (target, codepath, direction, source)
    node_cpu_energy_j: Mapping[str, float]  # source
    unattributed_energy_j: Mapping[str, float]  # source
    gpu_idle_s: Mapping[str, float]  # gpu index
    gpu_wait_s: Mapping[tuple[str, str, str, str], float]  # (target, codepath, direction, gpu)
    gpu_wait_energy_j: Mapping[tuple[str, str, str, str], float]  # (same)
    sampler_errors: Mapping[tuple[str, str], int]  # (target, kind)
    collectors: Mapping[str, CollectorState] = field(default_factory=dict)
    windows: int = 0  # windows applied so far (all targets)
    # the daemon's own CPU seconds by part: "daemon" (its process), "samplers" (py-spy)
    self_cpu_s: Mapping[str, float] = field(default_factory=dict)
    sample_rate_hz: float = 0.0  # the rate windows run at now (the CPU budget may lower it)
    cpu_budget_cores: float | None = None  # None: no budget configured
    # profile pushes to Pyroscope that failed or were dropped, by kind (pyroscope_push.py)
    push_errors: Mapping[str, int] = field(default_factory=dict)


class Ledger:
    """Mutable counters behind a lock; `snapshot()` hands out immutable copies."""

    def __init__(self, *, version: str = __version__, clock=time.time) -> None:
        self._lock = threading.Lock()
        self._version = version
        self._clock = clock
        self._configured: dict[str, bool] = {}
        self._processes: dict[str, tuple[TargetProcess, ...]] = {}
        self._labels: dict[str, Mapping[str, str]] = {}
        # each target's windows folded by (codepath, direction[, gpu]): the one fold the
        # profile document and the run record read too (attribution/window.py)
        self._folds: dict[str, DirectedTotals] = {}
        # the (target, source) and (target, gpu) whose series exist, 0 until added to
        self._energy_series: set[tuple[str, str]] = set()
        self._gpu_series: set[tuple[str, str]] = set()
        self._node_j: dict[str, float] = {}
        self._unattributed_j: dict[str, float] = {}
        self._gpu_idle_s: dict[str, float] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._collectors: dict[str, CollectorState] = {}
        self._energy_sources: set[str] = set()
        self._gpus: set[str] = set()
        self._windows = 0
        self._self_cpu_s: dict[str, float] = {}
        self._sample_rate_hz = 0.0
        self._cpu_budget_cores: float | None = None
        self._push_errors: dict[str, int] = {}
        self._latest = self._build_snapshot()

    # -- configuration -------------------------------------------------------------

    def set_targets(
        self, names: Iterable[str], labels: Mapping[str, Mapping[str, str]] | None = None
    ) -> None:
        """Declare the configured targets: every codepath series starts at zero.

        labels: per target name, its static labels (targets[].labels, validated by the
        config). A name that disappears from the config keeps its series (counters must
        not vanish) and its last labels; it is marked unconfigured and its process list
        is emptied.
        """
        names = list(names)
        labels = labels or {}
        with self._lock:
            for name in self._configured:
                self._configured[name] = False
            for name in names:
                self._configured[name] = True
                self._labels[name] = _frozen(dict(sorted(labels.get(name, {}).items())))
                self._processes.setdefault(name, ())
                self._energy_series.update((name, source) for source in self._energy_sources)
                self._gpu_series.update((name, gpu) for gpu in self._gpus)
            for name, configured in self._configured.items():
                if not configured:
                    self._processes[name] = ()

    def declare_energy_source(self, source: str) -> None:
        """Zero-fill energy series for `source` ("rapl" or "model") for every target."""
        _check_ident(source, "source")
        with self._lock:
            self._energy_sources.add(source)
            self._node_j.setdefault(source, 0.0)
            self._unattributed_j.setdefault(source, 0.0)
            self._energy_series.update((name, source) for name in self._configured)

    def declare_gpu(self, gpu: int | str) -> None:
        """Zero-fill GPU series for GPU index `gpu` for every target."""
        g = _gpu_label(gpu)
        with self._lock:
            self._gpus.add(g)
            self._gpu_idle_s.setdefault(g, 0.0)
            self._gpu_series.update((name, g) for name in self._configured)

    def set_target_processes(self, target: str, processes: Iterable[TargetProcess]) -> None:
        with self._lock:
            self._require_target(target)
            self._processes[target] = tuple(sorted(processes, key=lambda p: p.pid))

    def set_collector(
        self, collector: str, *, up: bool, duration_s: float, detail: str = ""
    ) -> None:
        _check_ident(collector, "collector")
        with self._lock:
            self._collectors[collector] = CollectorState(bool(up), float(duration_s), detail)

    def set_sampling(self, *, rate_hz: float, budget_cores: float | None) -> None:
        """The rate windows run at now, and the CPU budget that sets it (None: none)."""
        if not (math.isfinite(rate_hz) and rate_hz >= 0):
            raise ValueError(f"sample rate must be finite and >= 0, got {rate_hz!r}")
        with self._lock:
            self._sample_rate_hz = float(rate_hz)
            self._cpu_budget_cores = budget_cores

    # -- counters ------------------------------------------------------------------

    def add_self_cpu(self, part: str, cpu_s: float) -> None:
        """CPU seconds the daemon itself used: part "daemon" (its process) or "samplers"."""
        _check_ident(part, "part")
        _check_increment(cpu_s, "self cpu")
        with self._lock:
            self._self_cpu_s[part] = self._self_cpu_s.get(part, 0.0) + float(cpu_s)

    def add_window(
        self,
        target: str,
        *,
        samples: Mapping[tuple[str, str], int],
        cpu_s: Mapping[tuple[str, str], float],
        energy_j: Mapping[tuple[str, str], float] | None = None,
        energy_source: str | None = None,
        gpu_wait_s: Mapping[tuple[str, str, int | str], float] | None = None,
        gpu_wait_energy_j: Mapping[tuple[str, str, int | str], float] | None = None,
    ) -> None:
        """Add one window of one target. `samples`, `cpu_s` and `energy_j` are keyed by
        (codepath, direction), `gpu_wait_*` by (codepath, direction, gpu)
        (AttributedWindow.by_direction gives them in these shapes).

        Everything is validated before anything is added, so a bad window changes
        nothing.
        """
        energy_j = energy_j or {}
        gpu_wait_s = gpu_wait_s or {}
        gpu_wait_energy_j = gpu_wait_energy_j or {}
        for mapping in (samples, cpu_s, energy_j):
            for pair, v in mapping.items():
                _check_series(pair, 2)
                _check_increment(v, pair[0])
        for gpu_mapping in (gpu_wait_s, gpu_wait_energy_j):
            for triple, v in gpu_mapping.items():
                _check_series(triple, 3)
                _gpu_label(triple[2])
                _check_increment(v, triple[0])
        if energy_j and energy_source is None:
            raise ValueError("energy_j given without its source (rapl or model)")
        if energy_source is not None:
            _check_ident(energy_source, "source")
        figures = DirectedFigures(
            samples={k: int(n) for k, n in samples.items()},
            cpu_s={k: float(v) for k, v in cpu_s.items()},
            energy_j={k: float(v) for k, v in energy_j.items()},
            gpu_wait_s={(cp, d, _gpu_label(g)): float(v) for (cp, d, g), v in gpu_wait_s.items()},
            gpu_wait_energy_j={
                (cp, d, _gpu_label(g)): float(v) for (cp, d, g), v in gpu_wait_energy_j.items()
            },
            energy_source=energy_source,
        )
        with self._lock:
            self._require_target(target)
            if energy_source is not None and energy_source not in self._energy_sources:
                self._energy_sources.add(energy_source)
                self._node_j.setdefault(energy_source, 0.0)
                self._unattributed_j.setdefault(energy_source, 0.0)
            if energy_source is not None:
                self._energy_series.add((target, energy_source))
            self._folds.setdefault(target, DirectedTotals()).add(figures)
            self._windows += 1

    def add_node_energy(self, source: str, *, node_j: float, unattributed_j: float) -> None:
        """Add one interval of node CPU energy and the part no codepath received."""
        _check_ident(source, "source")
        _check_increment(node_j, "node energy")
        _check_increment(unattributed_j, "unattributed energy")
        if unattributed_j > node_j * (1 + 1e-9) + 1e-12:
            raise ValueError(
                f"unattributed energy {unattributed_j} J exceeds node energy {node_j} J"
            )
        with self._lock:
            self._energy_sources.add(source)
            self._node_j[source] = self._node_j.get(source, 0.0) + float(node_j)
            self._unattributed_j[source] = self._unattributed_j.get(source, 0.0) + float(
                unattributed_j
            )

    def add_gpu_idle(self, gpu: int | str, idle_s: float) -> None:
        _check_increment(idle_s, "gpu idle")
        g = _gpu_label(gpu)
        with self._lock:
            self._gpus.add(g)
            self._gpu_idle_s[g] = self._gpu_idle_s.get(g, 0.0) + float(idle_s)

    def add_sampler_error(self, target: str, kind: str, count: int = 1) -> None:
        _check_ident(kind, "kind")
        _check_increment(count, "sampler errors")
        with self._lock:
            self._require_target(target)
            self._errors[(target, kind)] = self._errors.get((target, kind), 0) + int(count)

    def add_push_error(self, kind: str, count: int = 1) -> None:
        """A profile push that failed or was dropped (the push thread adds these; the
        main loop's next publish exports them)."""
        _check_ident(kind, "kind")
        _check_increment(count, "push errors")
        with self._lock:
            self._push_errors[kind] = self._push_errors.get(kind, 0) + int(count)

    # -- snapshots -----------------------------------------------------------------

    def publish(self) -> LedgerSnapshot:
        """Freeze the current counters into the snapshot readers get."""
        with self._lock:
            snap = self._build_snapshot()
            self._latest = snap
        return snap

    def snapshot(self) -> LedgerSnapshot:
        """The latest published snapshot (a reference read: never blocks on writers)."""
        return self._latest

    def _build_snapshot(self) -> LedgerSnapshot:
        targets = tuple(
            TargetState(
                name,
                configured,
                self._processes.get(name, ()),
                self._labels.get(name, MappingProxyType({})),
            )
            for name, configured in sorted(self._configured.items())
        )
        samples: dict[tuple[str, str, str], int] = {}
        cpu_s: dict[tuple[str, str, str], float] = {}
        energy_j: dict[tuple[str, str, str, str], float] = {}
        wait_s: dict[tuple[str, str, str, str], float] = {}
        wait_j: dict[tuple[str, str, str, str], float] = {}
        # a configured target's series exist from the start, 0 until a window adds to them
        for name in self._configured:
            for cp, d in CODEPATH_DIRECTIONS:
                samples[(name, cp, d)] = 0
                cpu_s[(name, cp, d)] = 0.0
        for (name, source), (cp, d) in itertools.product(self._energy_series, CODEPATH_DIRECTIONS):
            energy_j[(name, cp, d, source)] = 0.0
        for (name, g), (cp, d) in itertools.product(self._gpu_series, CODEPATH_DIRECTIONS):
            wait_s[(name, cp, d, g)] = wait_j[(name, cp, d, g)] = 0.0
        for target, fold in self._folds.items():
            samples.update({(target, cp, d): n for (cp, d), n in fold.samples.items()})
            cpu_s.update({(target, cp, d): v for (cp, d), v in fold.cpu_s.items()})
            for source, joules in fold.energy_j_by_source.items():
                energy_j.update({(target, cp, d, source): v for (cp, d), v in joules.items()})
            for (cp, d, gpu), v in fold.gpu_wait_s.items():
                wait_s[(target, cp, d, str(gpu))] = v
            for (cp, d, gpu), v in fold.gpu_wait_energy_j.items():
                wait_j[(target, cp, d, str(gpu))] = v
        return LedgerSnapshot(
            taken_at=self._clock(),
            version=self._version,
            targets=targets,
            samples=_frozen(samples),
            cpu_s=_frozen(cpu_s),
            energy_j=_frozen(energy_j),
            node_cpu_energy_j=_frozen(self._node_j),
            unattributed_energy_j=_frozen(self._unattributed_j),
            gpu_idle_s=_frozen(self._gpu_idle_s),
            gpu_wait_s=_frozen(wait_s),
            gpu_wait_energy_j=_frozen(wait_j),
            sampler_errors=_frozen(self._errors),
            collectors=_frozen(self._collectors),
            windows=self._windows,
            self_cpu_s=_frozen(self._self_cpu_s),
            sample_rate_hz=self._sample_rate_hz,
            cpu_budget_cores=self._cpu_budget_cores,
            push_errors=_frozen(self._push_errors),
        )

    def _require_target(self, target: str) -> None:
        if target not in self._configured:
            raise ValueError(
                f"unknown target {target!r}: targets must be declared with set_targets() "
                "(only configured names may become label values)"
            )


_SERIES = frozenset(CODEPATH_DIRECTIONS)


def _check_series(key: object, size: int) -> None:
    """A (codepath, direction[, gpu]) key of the closed set."""
    if not (isinstance(key, tuple) and len(key) == size):
        raise ValueError(f"series key {key!r} must be (codepath, direction{', gpu' * (size > 2)})")
    cp, d = key[0], key[1]
    if cp not in CODEPATHS:
        raise ValueError(f"codepath {cp!r} is not in the closed set {CODEPATHS}")
    if (cp, d) not in _SERIES:
        raise ValueError(
            f"direction {d!r} is not one codepath {cp!r}'s series carry "
            "(profiler/classify/direction.py series_directions)"
        )


def _check_increment(v: float, what: str) -> None:
    if not (v >= 0):  # also rejects NaN
        raise ValueError(f"counter increment for {what} must be >= 0, got {v!r}")


def _check_ident(value: str, what: str) -> None:
    if not _IDENT.match(value):
        raise ValueError(f"{what} label value {value!r} must match {_IDENT.pattern}")


def _gpu_label(gpu: int | str) -> str:
    g = str(gpu)
    if not g.isdigit():
        raise ValueError(f"gpu label must be a device index, got {gpu!r}")
    return g
