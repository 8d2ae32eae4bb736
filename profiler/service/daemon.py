"""`serwatt daemon --config FILE`: the per-node service.

The daemon runs on its own clock in *slots*. A slot starts one py-spy window for
each tracked process (at most `max_concurrent_samplers` at once, least recently
sampled first), waits for them, then applies the slot: energy over the slot is
attributed to the windows' codepaths, every window is appended to the run record,
the ledger's counters advance and a new snapshot is published for the exporter.
Slots are back to back, so the node energy counter covers the daemon's whole life
and the part no codepath received is exported as unattributed.

Between and during slots the main thread re-scans /proc (new ranks, restarts,
exits), handles SIGHUP (reload; a bad new config is logged and the running one
kept) and SIGTERM (py-spy windows are stopped with SIGINT so their samples are
kept, the slot is recorded, runs are closed, exit 0), and pings the systemd
watchdog. Only the main thread touches the recorder and the tracked-process table;
sampling threads only run `sample_window` and hand back a report or an error.

A target that vanished, refused ptrace or is not Python never stops the daemon: it
is counted in `serwatt_sampler_errors_total{target,kind}` and retried later
(ptrace, not Python) or forgotten (gone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import sys
import threading
from typing import Any

from serwatt.collectors import mounts
from serwatt.collectors.pyspy import PySpy, SamplingError
from serwatt.profiler import __version__
from serwatt.profiler.attribution.pipeline import WindowPipeline, WindowRejected
from serwatt.profiler.attribution.tracker import EnergyTracker
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.exitcodes import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME
from serwatt.profiler.records.run_sink import RunSink
from serwatt.profiler.records.store import Recorder, RecordError
from serwatt.profiler.sampling.budget import RateGovernor
from serwatt.profiler.sampling.retry import TARGET_KINDS
from serwatt.profiler.sampling.window import WindowReport
from serwatt.profiler.service.clock import Clock, SystemClock
from serwatt.profiler.service.collector_health import run_collector
from serwatt.profiler.service.config import Config, ConfigError, load_config
from serwatt.profiler.service.daemon_parts import (
    _FIXED_FIELDS,
    _bound_at_start,
    _host_fingerprint,
    _OwnCpu,
    _Tracked,
)
from serwatt.profiler.service.discovery import discover
from serwatt.profiler.service.energy_side import EnergySide, RequiredCollectorMissing
from serwatt.profiler.service.exporter import MetricsServer, make_registry
from serwatt.profiler.service.ledger import Ledger, TargetProcess
from serwatt.profiler.service.plan import (
    IDLE_RUN_RATE_HZ,  # noqa: F401 (re-exported: the daemon's --idle run rate)
    daemon_plan,
    daemon_retry,
)
from serwatt.profiler.service.pools import (
    ClassifierPool,
    PySpyWindows,
    Sampler,
    SamplerPool,
    SamplingJob,
)
from serwatt.profiler.service.pyroscope_push import ProfileEncoder, PushSink, PyroscopePusher
from serwatt.profiler.service.run_checkpoints import RunCheckpoints
from serwatt.profiler.service.sdnotify import SdNotifier
from serwatt.profiler.service.window_sinks import CheckpointsSink, LedgerSink

log = logging.getLogger("serwatt.daemon")

# SIGTERM: how long in-flight windows get to hand back their samples (py-spy is
# sent SIGINT by the sampler when its stop event is set).
STOP_GRACE_S = 4.0
# A window that runs this long past its nominal end is told to stop; one that
# still has not returned ABANDON_AFTER_S later is given up on (counted, its
# thread still holds a sampler slot until it ends).
OVERRUN_S = 15.0
ABANDON_AFTER_S = 15.0
# Retention runs at startup and then this often (runs age by days; hourly is plenty).
RETENTION_EVERY_S = 3600.0
# Retry delay for a process that refused sampling for a reason that may change
# (ptrace permission, a process that is not Python yet, a sampler failure).
RETRY_REFUSED_S = 60.0


def setup_logging(level: str) -> None:
    # journald timestamps each line itself; keep the line short and greppable.
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="serwatt[%(process)d] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


# --------------------------------------------------------------------------- daemon


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        notifier: SdNotifier | None = None,
        nvml_backend: Any = None,
        clock: Clock | None = None,
        sampler: Sampler | None = None,
        kill_grace_s: float | None = None,
        overrun_s: float = OVERRUN_S,
        abandon_after_s: float = ABANDON_AFTER_S,
        energy_tracker: EnergyTracker | None = None,
        profile_encoder: ProfileEncoder | None = None,
    ) -> None:
        """nvml_backend: a collectors.nvml backend for the energy tracker (None: the real
        pynvml one); tests replay recorded GPU timelines through it. clock: where the
        daemon reads time and waits (None: the system's); sampler: what runs a window
        (None: py-spy, PySpyWindows), so the schedule can be tested in fake time.
        kill_grace_s: how long a py-spy that ignores its SIGINT lives before SIGKILL
        (None: collectors.pyspy's default). overrun_s, abandon_after_s: see OVERRUN_S.
        energy_tracker: the node's energy tracker (None: one made from the config); the
        replay harness (tests/replay/) passes one over recorded readings in fake time.
        profile_encoder: what turns a period's stacks into the pprof the `pyroscope:`
        push sends (the CLI passes profiler/profile's; None: a config with `pyroscope:`
        is refused)."""
        self.config = config
        self._nvml_backend = nvml_backend
        self._energy_tracker = energy_tracker
        self._clock: Clock = clock or SystemClock()
        self._sampler = sampler
        self._kill_grace_s = kill_grace_s
        self._overrun_s = overrun_s
        self._abandon_after_s = abandon_after_s
        self.notifier = notifier or SdNotifier()
        self.ledger = Ledger(clock=self._clock.time)
        self._wake = threading.Event()
        self._stop_requested = False
        self._reload_requested = False
        self._tracked: dict[tuple[int, float], _Tracked] = {}
        self._open_runs: dict[str, str] = {}  # run_id -> target
        # the watches of the runs whose target names a checkpoints directory
        self._checkpoints = RunCheckpoints(config.path_procfs, self._target_error)
        self._next_rescan = 0.0
        self._next_retention = 0.0
        self._pool = SamplerPool(config.max_concurrent_samplers, self._wake.set)
        self._governor = RateGovernor(config.cpu_budget_cores, config.sample_rate_hz)
        self._abandoned: list[SamplingJob] = []
        self._in_flight: set[tuple[int, float]] = set()  # keys with a window running
        # every window started; the exit log line sets it beside the applied and failed
        # ones, so a window lost between them shows (bench/soak.py checks the sum)
        self._windows_started = 0
        self._classifiers: ClassifierPool = None  # type: ignore[assignment]
        self._recorder: Any = None
        # attribution's consumers and the episodes of every tracked process (its windows
        # come in order); its tracker is the energy side's, once started
        self._pipeline = WindowPipeline()
        self._energy: EnergySide | None = None
        self._server: MetricsServer | None = None
        self._host: dict[str, Any] = {}
        self._profile_encoder = profile_encoder
        self._pusher: PyroscopePusher | None = None

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, handler)
            for sig, handler in (
                (signal.SIGTERM, self._on_stop),
                (signal.SIGINT, self._on_stop),
                (signal.SIGHUP, self._on_reload),
            )
        }
        try:
            code = self._start()
            if code != EXIT_OK:
                self._close()
                return code
            try:
                self._loop()
            finally:
                self._shutdown()
            return EXIT_OK
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @property
    def address(self) -> str | None:
        """HOST:PORT the exporter listens on (with `listen` port 0, the port the kernel
        picked); None until it listens."""
        server = self._server
        return server.address if server is not None else None

    def _on_stop(self, signum: int, _frame: Any) -> None:
        self._stop_requested = True
        self._wake.set()

    def _on_reload(self, signum: int, _frame: Any) -> None:
        self._reload_requested = True
        self._wake.set()

    def _start(self) -> int:
        cfg = self.config
        try:
            self._classifiers = ClassifierPool(cfg)
        except Exception as exc:
            log.error("cannot load codepath rules %s: %s", [str(p) for p in cfg.rules_files], exc)
            return EXIT_CONFIG
        if self._sampler is None:
            try:
                pyspy = (
                    PySpy(priority=cfg.sampler_priority)
                    if self._kill_grace_s is None
                    else PySpy(priority=cfg.sampler_priority, kill_grace_s=self._kill_grace_s)
                )
            except SamplingError as exc:
                log.error("sampler_priority: %s", exc)
                return EXIT_CONFIG
            if pyspy.nice_problem:
                log.warning(
                    "py-spy runs without nice -20 (%s): on a busy node its samples may "
                    "gather after the targets' system calls (docs/sampling.md)",
                    pyspy.nice_problem,
                )
            # every window folds its classified stacks: the run record keeps them for the
            # A/B page's differential flame graph, and the Pyroscope push sends them
            self._sampler = PySpyWindows(pyspy, cfg.path_procfs, keep_stacks=True)
        try:
            self._energy = EnergySide(
                cfg, self._clock, nvml_backend=self._nvml_backend, tracker=self._energy_tracker
            )
            self._pipeline.tracker = self._energy.tracker
        except RequiredCollectorMissing as exc:
            log.error("%s", exc)
            return EXIT_CONFIG
        try:
            self._recorder = Recorder.for_dir(cfg.record_dir)
            self._apply_retention()
        except (RecordError, OSError) as exc:
            log.error(
                "cannot open run records in %s: %s (fix record.dir or its permissions)",
                cfg.record_dir,
                exc,
            )
            return EXIT_RUNTIME
        self._host = _host_fingerprint(cfg, self._energy.nvml_status if self._energy else None)
        self.ledger.set_targets(
            (t.name for t in cfg.targets), {t.name: t.labels for t in cfg.targets}
        )
        self._set_sampling()
        if self._energy is not None:
            self._energy.declare(self.ledger)
        try:
            self._server = MetricsServer(
                cfg.listen,
                make_registry(self.ledger.snapshot),
                self.ledger.snapshot,
                clock=self._clock.time,
            )
        except (OSError, ValueError) as exc:
            log.error(
                "cannot listen on %s: %s (is another serwatt running? change `listen`)",
                cfg.listen,
                exc,
            )
            return EXIT_RUNTIME
        if cfg.pyroscope is not None:
            if self._profile_encoder is None:
                log.error("pyroscope: this daemon was started without a profile encoder")
                return EXIT_CONFIG
            self._pusher = PyroscopePusher(
                cfg.pyroscope,
                self._profile_encoder,
                self.ledger,
                target_labels={t.name: t.labels for t in cfg.targets},
                started_at=self._clock.time(),
                wall_clock=self._clock.time,
            )
            self._pusher.start()
        self._rescan()
        self.ledger.publish()
        self._server.start()
        log.info(
            "serwatt %s listening on http://%s/metrics: %d target(s), %g Hz, %g s windows, "
            "records in %s",
            __version__,
            self._server.address,
            len(cfg.targets),
            cfg.sample_rate_hz,
            cfg.window_s,
            self._recorder.path,
        )
        self.notifier.ready(self._status_line())
        return EXIT_OK

    def _close(self) -> None:
        if self._pusher is not None:
            self._pusher.close()
        self._checkpoints.close()
        if self._energy is not None:
            self._energy.close()
        if self._recorder is not None:
            self._recorder.close()
        if self._server is not None:
            self._server.close()

    # ------------------------------------------------------------------ main loop

    def _loop(self) -> None:
        mark = _OwnCpu.now(self._clock)
        # Each slot starts where the last one ended, so the time spent applying a slot
        # is in the next one and the node energy counter misses no span.
        slot_start = self._clock.time()
        while not self._stop_requested:
            jobs = self._start_windows()
            self._wait_slot(jobs, slot_start)
            slot_end = self._clock.time()
            try:
                self._apply_slot(jobs, slot_start, slot_end)
                if self._pusher is not None:  # queues the period's profiles; never waits
                    self._pusher.tick(slot_end, self._governor.rate_hz)
            except Exception:
                # A bug applying one slot must not stop the node's profiling (nor make
                # systemd restart-loop us): log it loudly and go on with the next slot.
                log.exception("applying a slot failed; its windows are lost")
            mark = self._account_own_cpu(mark, sampled=bool(jobs))
            self.ledger.publish()
            self.notifier.status(self._status_line())
            slot_start = slot_end

    def _account_own_cpu(self, mark: _OwnCpu, *, sampled: bool) -> _OwnCpu:
        """Count the slot's own CPU and let the budget set the next windows' rate."""
        now = _OwnCpu.now(self._clock)
        daemon_s, samplers_s = now.daemon_s - mark.daemon_s, now.samplers_s - mark.samplers_s
        wall_s = now.wall_s - mark.wall_s
        self.ledger.add_self_cpu("daemon", max(0.0, daemon_s))
        self.ledger.add_self_cpu("samplers", max(0.0, samplers_s))
        # A slot without windows says nothing about what sampling costs.
        if sampled and wall_s > 0:
            was = self._governor.over_budget
            rate = self._governor.observe(max(0.0, daemon_s + samplers_s) / wall_s)
            if self._governor.over_budget and not was:
                log.warning("cpu_budget_cores cannot be met: %s", self._governor.over_budget)
            log.debug(
                "slot used %.4f cores; next windows at %g Hz",
                (daemon_s + samplers_s) / wall_s,
                rate,
            )
        self._set_sampling()
        return now

    def _set_sampling(self) -> None:
        self.ledger.set_sampling(
            rate_hz=self._governor.rate_hz, budget_cores=self.config.cpu_budget_cores
        )

    def _tick(self) -> None:
        """What the main thread does while it waits: signals, rescans, watchdog."""
        if self._reload_requested:
            self._reload_requested = False
            self._reload()
        if self._clock.monotonic() >= self._next_rescan:
            self._rescan()
            mounts.close_idle()  # the mount tables of namespaces no target uses any more
            self.ledger.publish()
        if self._clock.monotonic() >= self._next_retention:
            try:
                self._apply_retention()
            except Exception as exc:  # a full disk must not stop the sampling
                log.error("retention in %s failed: %s", self.config.record_dir, exc)
        self.notifier.watchdog()

    def _apply_retention(self) -> None:
        self._next_retention = self._clock.monotonic() + RETENTION_EVERY_S
        days = self.config.retention_days
        deleted = self._recorder.apply_retention(days)
        if deleted:
            log.info("retention: deleted %d run(s) last seen over %g days ago", deleted, days)

    def _wait(self, timeout_s: float) -> None:
        wd = self.notifier.watchdog_interval_s
        step = min(0.5, wd / 3) if wd else 0.5
        self._clock.wait(self._wake, max(0.0, min(step, timeout_s)))
        self._wake.clear()

    def _wait_slot(self, jobs: list[SamplingJob], slot_start: float) -> None:
        cfg_window = self.config.window_s
        if not jobs:
            # Nothing to sample: an idle slot, ended early as soon as a re-scan or a
            # reload brings a process to sample (new ranks start being sampled at once).
            end = self._clock.monotonic() + cfg_window
            while not self._stop_requested and self._clock.monotonic() < end:
                self._tick()
                if self._pool.free() and any(
                    t.retry_at <= self._clock.monotonic() for t in self._tracked.values()
                ):
                    return
                self._wait(end - self._clock.monotonic())
            return
        told_to_stop = False
        while True:
            pending = [j for j in jobs if not j.done.is_set()]
            if not pending:
                return
            now = self._clock.monotonic()
            if self._stop_requested:
                self._stop_jobs(pending)
                return
            overrun_s = self._overrun_s
            overrun = [j for j in pending if now > j.started_mono + j.window_s + overrun_s]
            if overrun and not told_to_stop:
                for j in overrun:
                    log.warning("window of pid %d overran by %gs: stopping it", j.pid, overrun_s)
                    j.stop.set()
                told_to_stop = True
            late = [
                j
                for j in pending
                if now > j.started_mono + j.window_s + overrun_s + self._abandon_after_s
            ]
            if late and len(late) == len(pending):
                for j in late:
                    log.error("window of pid %d did not return: abandoned", j.pid)
                    self._abandoned.append(j)
                return
            self._tick()
            self._wait(1.0)

    def _stop_jobs(self, pending: list[SamplingJob]) -> None:
        for j in pending:
            j.stop.set()
        deadline = self._clock.monotonic() + STOP_GRACE_S
        for j in pending:
            self._clock.wait(j.done, max(0.0, deadline - self._clock.monotonic()))

    # ------------------------------------------------------------------ windows

    def _start_windows(self) -> list[SamplingJob]:
        cfg = self.config
        now = self._clock.monotonic()
        ready = [t for t in self._tracked.values() if t.retry_at <= now]
        ready.sort(key=lambda t: t.last_sampled_at)
        jobs = []
        for t in ready[: self._pool.free()]:
            t.last_sampled_at = now
            job = SamplingJob(
                key=t.key,
                target=t.proc.target,
                run_id=t.proc.run_id,
                pid=t.proc.pid,
                window_s=cfg.window_s,
                plan=daemon_plan(
                    self._governor.rate_hz,
                    self._governor.scaled(cfg.timing_rate_hz) if cfg.timing_rate_hz > 0 else None,
                ),
                started_mono=now,
            )
            # bound now: a reload while the window runs changes neither
            classifiers, sampler = self._classifiers, self._sampler

            def work(j: SamplingJob, classifiers=classifiers, sampler=sampler) -> WindowReport:
                with classifiers.borrow() as classifier:
                    return sampler(j, classifier)

            self._pool.submit(job, work)
            self._in_flight.add(job.key)
            jobs.append(job)
        self._windows_started += len(jobs)
        return jobs

    def _apply_slot(self, jobs: list[SamplingJob], slot_start: float, slot_end: float) -> None:
        for j in jobs:
            self._in_flight.discard(j.key)
        reports = [(j, j.report) for j in jobs if j.done.is_set() and j.report is not None]
        run_collector(
            self.ledger,
            "pyspy",
            lambda: self._count_sampler_faults(jobs),
            lambda faults: {
                "pyspy": (
                    faults == 0,
                    f"{len(reports)} window(s) ok, {faults} sampler fault(s) last slot",
                )
            },
            monotonic=self._clock.monotonic,
        )
        energy = None
        if self._energy is not None:
            energy = self._energy.slot(slot_start, slot_end, [r for _, r in reports], self.ledger)
        windows = [
            energy.windows[i] if energy is not None else AttributedWindow(report)
            for i, (_, report) in enumerate(reports)
        ]
        run_collector(
            self.ledger,
            "recorder",
            lambda: self._apply_windows([j for j, _ in reports], windows),
            lambda failed: {
                "recorder": (
                    (True, f"{len(reports)} window(s) appended last slot")
                    if failed is None
                    else (False, f"append failed: {failed}")
                )
            },
            monotonic=self._clock.monotonic,
        )
        self._forget_unmatched()
        self._update_target_processes()
        # (published by the loop, once the slot's own CPU is counted too)

    def _count_sampler_faults(self, jobs: list[SamplingJob]) -> int:
        """Count the slot's failed windows; returns those that were serwatt's own fault."""
        faults = 0
        for j in jobs:
            if not j.done.is_set():
                self.ledger.add_sampler_error(j.target, "window_timeout")
                faults += 1
            elif j.error is not None and not self._on_window_error(j):
                faults += 1
        return faults

    def _run_sinks(self, run_id: str) -> tuple[CheckpointsSink, RunSink]:
        """Where a run's closed episodes go: its checkpoint watch, then its record."""
        return (CheckpointsSink(self._checkpoints, run_id), RunSink(self._recorder, run_id))

    def _apply_windows(
        self, jobs: list[SamplingJob], windows: list[AttributedWindow]
    ) -> Exception | None:
        """Each window into the ledger and the record; the last append failure, if any."""
        failed: Exception | None = None
        for j, window in zip(jobs, windows, strict=True):
            report = window.report
            try:
                sinks: tuple[Any, ...] = (
                    LedgerSink(self.ledger, j.target),
                    *self._run_sinks(j.run_id),
                )
                if self._pusher is not None:
                    sinks += (PushSink(self._pusher, j.target),)
                delivery = self._pipeline.deliver(window, sinks)
            except WindowRejected as exc:
                # A malformed report must not take the daemon down; it is not counted.
                self.ledger.add_sampler_error(j.target, "bad_report")
                log.error("window of %s pid %d rejected: %s", j.target, j.pid, exc)
                continue
            for failure in delivery.failures:
                # counted by the pipeline; counters are still exported, and the record
                # says what it missed in the log
                failed = failure.error
                log.error("recording window of %s pid %d failed: %s", j.run_id, j.pid, failure)
            tracked = self._tracked.get(j.key)
            if tracked is not None:
                tracked.refused = None
                tracked.faults = 0
                if report.python:
                    tracked.python = report.python
                tracked.cpu_source = report.cpu_source
                if report.exited:
                    self._forget(j.key, reason="exited")
        return failed

    def _on_window_error(self, job: SamplingJob) -> bool:
        """Count a failed window; True when the target caused it (not serwatt's sampler)."""
        err = job.error
        kind = getattr(err, "kind", None)
        if not isinstance(kind, str):
            kind = "internal"
            log.error("sampling pid %d raised", job.pid, exc_info=err)
        self.ledger.add_sampler_error(job.target, kind)
        tracked = self._tracked.get(job.key)
        if tracked is None:
            return kind in TARGET_KINDS
        own_fault = kind not in TARGET_KINDS
        decided = daemon_retry(self.config.window_s, RETRY_REFUSED_S).after(
            kind, in_a_row=tracked.faults + 1 if own_fault else 1
        )
        if decided.action == "forget":
            self._forget(job.key, reason="gone")
        elif not own_fault:
            # Not Python (yet), ptrace refused: the target is down; retry later, never spin.
            level = logging.INFO if tracked.refused == kind else logging.WARNING
            log.log(level, "pid %d (%s): %s: %s", job.pid, job.target, kind, err)
            tracked.refused = kind
            tracked.retry_at = self._clock.monotonic() + decided.after_s
        else:
            # serwatt's own sampling failed (py-spy killed or crashed): retry at once,
            # then back off while it keeps failing.
            tracked.faults += 1
            log.warning(
                "pid %d (%s): %s (%d in a row, next try in %gs): %s",
                job.pid,
                job.target,
                kind,
                tracked.faults,
                decided.after_s,
                err,
            )
            tracked.retry_at = self._clock.monotonic() + decided.after_s
        return not own_fault

    # ------------------------------------------------------------------ discovery

    def _rescan(self) -> None:
        cfg = self.config
        self._next_rescan = self._clock.monotonic() + cfg.rescan_s
        target_errors: dict[tuple[str, str], int] = {}
        found = run_collector(
            self.ledger,
            "discovery",
            lambda: discover(
                cfg.targets,
                cfg.path_procfs,
                exclude_pids=self._checkpoints.own_pids(),
                target_errors=target_errors,
            ),
            lambda found: {"discovery": (True, f"{len(found)} process(es) matched")},
            monotonic=self._clock.monotonic,
        )
        for (target, kind), n in target_errors.items():
            self._target_error(target, kind, n)  # its pid file: that target's
        if found is None:
            return  # keep sampling what we know; /metrics and the landing page say why
        seen = set()
        for proc in found:
            key = (proc.pid, proc.start_time)
            seen.add(key)
            if key in self._tracked:
                continue
            try:
                self._open_run(proc)
            except Exception as exc:
                log.error("cannot start run %s for pid %d: %s", proc.run_id, proc.pid, exc)
                continue
            self._tracked[key] = _Tracked(proc)
            self._checkpoints.track(proc.run_id, proc.pid)
            log.info("tracking %s pid %d as run %s", proc.target, proc.pid, proc.run_id)
        for key, tracked in self._tracked.items():
            tracked.unmatched = key not in seen
        self._forget_unmatched()
        self._update_target_processes()

    def _target_error(self, target: str, kind: str, count: int = 1) -> None:
        """What a target's own files cost it (its pid file, its checkpoint watch)."""
        with contextlib.suppress(ValueError):  # a target a reload removed meanwhile
            self.ledger.add_sampler_error(target, kind, count)

    def _forget_unmatched(self) -> None:
        # A process with a window in flight is forgotten once its window is applied
        # (its samples belong to its run, which must still be open then), before the
        # next slot could start another.
        gone = [k for k, t in self._tracked.items() if t.unmatched and k not in self._in_flight]
        for key in gone:
            self._forget(key, reason="no longer matches or exited")

    def _open_run(self, proc: Any) -> None:
        if proc.run_id in self._open_runs:
            return
        sources = self._energy.sources() if self._energy is not None else {}
        self._recorder.start_run(
            proc.run_id,
            proc.target,
            host=self._host,
            config=dict(self.config.raw),
            sources=sources,
            started_at=self._clock.time(),
            # a sampler that folds no stacks (an injected one) records runs as without
            # stacks, never as runs whose stacks were empty
            stacks=bool(getattr(self._sampler, "keep_stacks", False)),
        )
        self._open_runs[proc.run_id] = proc.target
        spec = next((t for t in self.config.targets if t.name == proc.target), None)
        self._checkpoints.open(proc.run_id, spec)

    def _forget(self, key: tuple[int, float], *, reason: str) -> None:
        tracked = self._tracked.pop(key, None)
        if tracked is None:
            return
        run_id = tracked.proc.run_id
        log.info("forgetting %s pid %d (%s)", tracked.proc.target, tracked.proc.pid, reason)
        self._finish_episodes(tracked.proc)
        if any(t.proc.run_id == run_id for t in self._tracked.values()):
            return  # other ranks still write this run
        if self._open_runs.pop(run_id, None) is not None:
            self._checkpoints.store(run_id, self._recorder)
            try:
                self._recorder.finish_run(run_id, self._clock.time())
            except Exception as exc:
                log.error("cannot finish run %s: %s", run_id, exc)

    def _update_target_processes(self) -> None:
        by_target: dict[str, list[TargetProcess]] = {t.name: [] for t in self.config.targets}
        for t in self._tracked.values():
            if t.refused is None and t.proc.target in by_target:
                by_target[t.proc.target].append(TargetProcess(t.proc.pid, t.python, t.cpu_source))
        for name, procs in by_target.items():
            self.ledger.set_target_processes(name, procs)

    # ------------------------------------------------------------------ reload

    def _reload(self) -> None:
        path = self.config.source_path
        log.info("SIGHUP: reloading %s", path)
        try:
            new = load_config(path)
            classifiers = (
                ClassifierPool(new) if new.rules_files != self.config.rules_files else None
            )
        except ConfigError as exc:
            log.error("reload rejected, keeping the running config:\n%s", exc)
            self.notifier.status(f"reload of {path} rejected: {len(exc.problems)} problem(s)")
            return
        except Exception as exc:
            log.error("reload rejected, keeping the running config: rules: %s", exc)
            return
        old = self.config
        was, now = _bound_at_start(old), _bound_at_start(new)
        for name in was:
            if now[name] != was[name]:
                log.warning(
                    "reload: %s changed (%r -> %r); it takes effect on restart",
                    name,
                    was[name],
                    now[name],
                )
        new = dataclasses.replace(new, **{n: getattr(old, n) for n in _FIXED_FIELDS})
        self.config = new
        if classifiers is not None:
            self._classifiers = classifiers
        self._pool.limit = new.max_concurrent_samplers
        self._governor.reconfigure(new.cpu_budget_cores, new.sample_rate_hz)
        self._set_sampling()
        setup_logging(new.log_level)
        self.ledger.set_targets(
            (t.name for t in new.targets), {t.name: t.labels for t in new.targets}
        )
        if self._pusher is not None:
            self._pusher.set_targets({t.name: t.labels for t in new.targets})
        if self._energy is not None:
            self._energy.declare(self.ledger)
        if new.retention_days != old.retention_days:
            # at once, not at the next hourly run: a shorter retention is often a full disk
            try:
                self._apply_retention()
            except Exception as exc:
                log.error("retention in %s failed: %s", new.record_dir, exc)
        self._rescan()  # drops processes of removed targets, finds new ones
        self.ledger.publish()
        log.info("reloaded: %d target(s)", len(new.targets))
        self.notifier.status(f"reloaded {path}: {self._status_line()}")

    # ------------------------------------------------------------------ shutdown

    def _finish_episodes(self, proc: Any) -> None:
        """A process's open episodes closed into its run's checkpoint watch and record."""
        for failure in self._pipeline.finish(self._run_sinks(proc.run_id), pid=proc.pid).failures:
            log.error("recording episodes of %s failed: %s", proc.run_id, failure)

    def _shutdown(self) -> None:
        self.notifier.stopping("stopping: closing runs")
        for tracked in self._tracked.values():
            self._finish_episodes(tracked.proc)
        for run_id in list(self._open_runs):
            self._checkpoints.store(run_id, self._recorder)
            try:
                self._recorder.finish_run(run_id, self._clock.time())
            except Exception as exc:
                log.error("cannot finish run %s: %s", run_id, exc)
        self._open_runs.clear()
        self._close()
        snap = self.ledger.snapshot()
        errors = ", ".join(f"{t}/{k}={n}" for (t, k), n in sorted(snap.sampler_errors.items()))
        log.info(
            "stopped: %d window(s) started, %d applied; sampler errors: %s",
            self._windows_started,
            snap.windows,
            errors or "none",
        )

    def _status_line(self) -> str:
        up = sum(1 for t in self._tracked.values() if t.refused is None)
        return f"{up} process(es) sampled for {len(self.config.targets)} target(s)"
