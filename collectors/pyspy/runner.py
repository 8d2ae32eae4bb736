"""Sampling Python stacks with py-spy, one window at a time.

py-spy cannot stream: `record` writes its file once, when the window ends. So a
window is one `py-spy record` process run against one pid, always with
`--nonblocking --idle --threads --full-filenames` (never -F/--nolineno: call-site
rules need line numbers). It stops by itself after `-d` seconds' worth of ticks,
when the target exits, or on SIGINT (which still writes the file; SIGTERM would lose
it); SIGKILL only after a grace period.

Why speedscope, and how samples get a time (measured with py-spy 0.4.3, see
docs/sampling.md):
- `chrometrace` emits B/E events only when a thread's stack *changes*; repeated
  identical samples emit nothing, so per-sample counts are not in the file.
- `raw` has counts but no order and no time.
- `speedscope` has, per thread, the ordered list of every sample (exact counts),
  but no absolute time.
Counts are what CPU weighting needs, so serwatt records speedscope and gives each
sample a host time by spreading the thread's samples over the measured sampling
span: the span starts when py-spy prints its "Sampling process" banner (printed
after attaching, just before its sampling loop starts) and ends when it prints
"Stopped sampling"/"Wrote". py-spy's ticks are a Poisson process (exponential
intervals, timer.rs), so the k-th of N ticks lies near k/N of the span with a
standard deviation of about span*sqrt(p(1-p)/N), p = k/N: at most span/(2*sqrt(N)).

Thread ids: py-spy names a thread by its kernel tid when it knows it (3.11+ reads
PyThreadState.native_thread_id) and by the hex pthread_t otherwise (<3.11 in
nonblocking mode). For the latter serwatt maps pthread_t to tid by reading glibc's
`struct pthread` through /proc/<pid>/mem at an offset it first validates on the
live threads (every mapped tid must exist and be distinct); then "MainThread" ->
pid; then a unique kernel `comm` name; otherwise the thread stays unmapped and is
counted.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from serwatt.collectors import procstat, sched
from serwatt.collectors.pyspy.chrometrace import RawChanges
from serwatt.collectors.pyspy.plan import SamplingPlan
from serwatt.collectors.pyspy.speedscope import (
    WindowSamples,
    assemble_samples,
    parse_speedscope,
    parse_status,
)
from serwatt.collectors.pyspy.threads import map_threads

# The timing run's file is read only up to this size (a window's chrometrace of a few
# busy threads at 400 Hz is a few MB).
MAX_CHANGES_BYTES = 256 * 1024 * 1024
# record_window's default: the --idle run alone, at py-spy's default rate
IDLE_RUN_ONLY = SamplingPlan()
PYSPY_FLAGS = ("--nonblocking", "--idle", "--threads", "--full-filenames")


def pyspy_env() -> dict[str, str]:
    """The environment py-spy runs with: ours without RUST_BACKTRACE/RUST_LIB_BACKTRACE.

    With RUST_BACKTRACE=1 (common in developers' shells) every error py-spy creates and
    handles internally captures a backtrace. Measured on the reference VM, 10 s windows
    at 50 Hz of a one-thread target, two windows each, alternating: 1.60-1.63% of a core
    with it, 1.46-1.47% without."""
    return {
        k: v for k, v in os.environ.items() if k not in ("RUST_BACKTRACE", "RUST_LIB_BACKTRACE")
    }


class SamplingError(Exception):
    """A window could not be sampled. `.kind` is a bounded label (Prometheus
    `serwatt_sampler_errors_total{kind}`)."""

    kind = "sampler_failed"


class TargetGone(SamplingError):
    kind = "target_gone"


class NotPython(SamplingError):
    kind = "not_python"


class UnsupportedPython(SamplingError):
    kind = "unsupported_python"


class PtraceDenied(SamplingError):
    kind = "ptrace_denied"


class PySpyMissing(SamplingError):
    kind = "pyspy_missing"


def find_pyspy() -> Path:
    """py-spy next to the running interpreter (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("py-spy")
    if found:
        return Path(found)
    raise PySpyMissing(
        f"py-spy not found next to {sys.executable} or on PATH: "
        "install it with `pip install 'py-spy>=0.4.3,<0.5'`"
    )


def _classify_failure(pid: int, text: str, procfs: Path) -> SamplingError:
    tail = " | ".join(
        ln.strip() for ln in text.splitlines() if ln.strip().startswith(("Error", "Reason"))
    )
    if "Permission Denied" in text or "Permission denied" in text:
        return PtraceDenied(
            f"no permission to read process {pid}: run as root or grant CAP_SYS_PTRACE, "
            "and check kernel.yama.ptrace_scope (1 allows only descendants, 3 nothing); "
            f"py-spy said: {tail or text.strip()[-200:]}"
        )
    if not procfs.joinpath(str(pid)).exists() or "Check that the process is running" in text:
        return TargetGone(f"no such process: {pid} (it is not running)")
    if "Failed to find python version" in text or "python interpreter" in text.lower():
        return NotPython(
            f"process {pid} is not a Python interpreter py-spy can read ({tail}); "
            "point serwatt at the Python process itself"
        )
    return SamplingError(f"py-spy failed on pid {pid}: {tail or text.strip()[-300:]}")


def precheck(pid: int, procfs: Path = Path("/proc")) -> procstat.PythonKind:
    """Fail fast, before spawning py-spy, on what can be known from procfs."""
    if not procstat.exists(pid, procfs):
        raise TargetGone(f"no such process: {pid} (it is not running)")
    kind = procstat.python_kind(pid, procfs)
    if kind.free_threaded:
        raise UnsupportedPython(
            f"process {pid} runs a free-threaded (no-GIL) CPython {kind.version}t "
            f"({kind.evidence}); py-spy 0.4 cannot read free-threaded builds "
            "(py-spy issue #711): profile it on a regular (GIL) build"
        )
    return kind


# probe(): how long a transient py-spy failure is retried, and the pause between dumps.
PROBE_RETRY_S = 3.0
PROBE_PAUSE_S = 0.05
# A plain threading.Event cannot wake another waiter; a window given one checks it this
# often. A StopEvent wakes the window at once (what the daemon and sessions pass).
STOP_CHECK_S = 0.1
# After py-spy closed its stdout it exits within moments: re-check this often.
EXIT_CHECK_S = 0.02


class StopEvent(threading.Event):
    """A threading.Event whose `set()` also sets the events linked to it.

    A window blocks on one wake event (set by its reader threads on py-spy's banner and
    on end of output); linking that to the caller's stop event lets a stop request wake
    it without the window polling the stop event.
    """

    def __init__(self) -> None:
        super().__init__()
        self._links_lock = threading.Lock()
        self._linked: set[threading.Event] = set()

    def set(self) -> None:
        super().set()
        with self._links_lock:
            linked = list(self._linked)
        for ev in linked:
            ev.set()

    def link(self, ev: threading.Event) -> None:
        with self._links_lock:
            self._linked.add(ev)
        if self.is_set():
            ev.set()

    def unlink(self, ev: threading.Event) -> None:
        with self._links_lock:
            self._linked.discard(ev)


class _Run:
    """One py-spy record process: spawn, timestamp its banner lines, stop, collect."""

    def __init__(
        self,
        spy: PySpy,
        pid: int,
        duration_s: float,
        rate_hz: float,
        out: Path,
        *,
        idle: bool,
        wake: threading.Event | None = None,
        fmt: str = "speedscope",
        on_spawn: Callable[[int], object] | None = None,
    ) -> None:
        self.spy, self.pid, self.duration_s, self.out = spy, pid, duration_s, out
        self.on_spawn = on_spawn
        self.rate_hz = rate_hz
        # set when the supervising loop must look again: banner, end line, end of output
        self.wake = wake if wake is not None else threading.Event()
        self.eof = False
        self.cmd = spy.command(pid, duration_s=duration_s, rate_hz=rate_hz, output=out, fmt=fmt)
        if not idle:
            self.cmd.remove("--idle")
        self.lines: list[str] = []
        self.marks: dict[str, float] = {}
        self.interrupted_at: float | None = None
        self.killed = False
        self.spawned_at = 0.0
        self.exit_at = 0.0
        self.priority_problem: str | None = None

    def start(self) -> None:
        self.spawned_at = time.time()
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                env=pyspy_env(),
            )
        except OSError as exc:
            raise PySpyMissing(f"cannot run py-spy at {self.spy.binary}: {exc}") from exc
        if self.on_spawn is not None:
            # before py-spy starts its sampling thread (it parses its arguments first),
            # so the scheduler timeline sees that thread from its fork
            self.on_spawn(self.proc.pid)
        try:
            # before py-spy attaches (~30 ms of symbol parsing): its threads inherit the nice
            self.priority_problem = self.spy.raise_priority(self.proc.pid)
        except SamplingError:
            self.proc.kill()
            self.proc.wait()
            raise
        self.reader = threading.Thread(target=self._read, name="serwatt-pyspy-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            self.lines.append(line)
            if "Sampling process" in line:
                self.marks.setdefault("start", now)
                self.wake.set()
                # again: threads started since do not inherit the custom slice
                try:
                    self.priority_problem = self.spy.raise_priority(self.proc.pid)
                except SamplingError as exc:  # 'required': the window notes say why
                    self.priority_problem = str(exc)
            elif "Stopped sampling" in line or "Wrote " in line:
                self.marks.setdefault("end", now)
                self.wake.set()
        self.eof = True
        self.wake.set()

    def tick(self, stop: bool) -> float | None:
        """Act on what is due now; return the host time this run next needs looking at
        (None: py-spy has exited or was killed). Between those times nothing is due
        except what sets `wake` (banner, end of output, a stop request)."""
        if self.proc.poll() is not None:
            return None
        now = time.time()
        deadline = self.marks["start"] + self.duration_s if "start" in self.marks else None
        if (stop or (deadline is not None and now >= deadline)) and self.interrupted_at is None:
            self.proc.send_signal(signal.SIGINT)
            self.interrupted_at = now
        grace = self.spy.kill_grace_s
        bound = self.spawned_at + self.duration_s + 30 + grace
        if self.interrupted_at is not None and now - self.interrupted_at > grace:
            self.proc.kill()
            self.killed = True
            return None
        # attach can hang on a stopped target: bound the whole window too
        elif now - self.spawned_at > self.duration_s + 30 + grace:
            self.proc.kill()
            self.killed = True
            return None
        # the checks above are strict (>): look again just past each limit
        due = [bound + 1e-3]
        if self.interrupted_at is not None:
            due.append(self.interrupted_at + grace + 1e-3)
        elif deadline is not None:
            due.append(deadline)
        # (no banner yet: the reader sets `wake` when it comes)
        if self.eof:
            due.append(now + EXIT_CHECK_S)
        return min(due)

    def close(self) -> None:
        """Reap py-spy and close its pipe now. A failed window's error holds these
        objects through a reference cycle (error, traceback, the sampling thread's
        frame, its job), so leaving the pipe to the garbage collector kept it open
        for many windows after each failure (bench/soak.py counts the daemon's fds)."""
        proc = getattr(self, "proc", None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader = getattr(self, "reader", None)
        if reader is not None:
            reader.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def finish(self, procfs: Path, *, max_bytes: int | None = None, raw: bool = False) -> Any:
        if self.proc.poll() is None:
            self.proc.kill()
            self.killed = True
        rc = self.proc.wait()
        self.reader.join(timeout=5)
        self.exit_at = time.time()
        if self.killed:
            raise SamplingError(
                f"py-spy did not stop within {self.spy.kill_grace_s:.0f}s of SIGINT "
                f"on pid {self.pid}; killed it, the window's samples are lost"
            )
        if rc != 0 or not self.out.exists():
            failure = _classify_failure(self.pid, self.text, procfs)
            wrote = self.out.exists() and self.out.stat().st_size > 0
            gone = isinstance(failure, TargetGone) or procstat.exiting(self.pid, procfs)
            if not (gone and wrote):
                raise failure
            # py-spy failed as its target exited, after writing what it had sampled:
            # those samples are the window's (unreadable output still fails below)
        if max_bytes is not None and self.out.stat().st_size > max_bytes:
            raise SamplingError(
                f"py-spy wrote {self.out.stat().st_size} bytes for pid {self.pid}, "
                f"more than {max_bytes}: not read"
            )
        text = self.out.read_text()
        return text if raw else json.loads(text)


class PySpy:
    """Runs py-spy windows. `binary` is injectable so tests can point at any py-spy."""

    def __init__(
        self,
        binary: str | Path | None = None,
        *,
        kill_grace_s: float = 10.0,
        priority: str = "auto",
        on_look: Callable[[], object] | None = None,
    ) -> None:
        """priority: 'auto' | 'required' | 'off': give py-spy a short scheduler slice and
        nice -20 so its samples are not pulled towards the target's system calls
        (collectors/sched.py). 'required' raises SamplingError here when this process
        may not renice. on_look: called each time a window's supervising loop wakes to
        look at its py-spy runs (how often it polls is then observable)."""
        if priority not in sched.MODES:
            raise ValueError(f"priority must be one of {sched.MODES}, got {priority!r}")
        self.binary = Path(binary) if binary is not None else find_pyspy()
        self.kill_grace_s = kill_grace_s
        self.priority = priority
        self.on_look = on_look
        # why py-spy cannot have nice -20 (None: it can, or priority is off)
        self.nice_problem: str | None = None
        if priority != "off":
            self.nice_problem = sched.nice_problem()
            if self.nice_problem and priority == "required":
                raise SamplingError(
                    f"sampler priority is required but not allowed: {self.nice_problem}; "
                    f"{sched.FIX}"
                )

    def raise_priority(self, pyspy_pid: int) -> str | None:
        """Apply the priority mode to a py-spy just started (and again once it has
        started its threads); returns what could not be applied (None: all of it, or
        off by choice). 'required' raises."""
        if self.priority == "off":
            return None
        problems = sched.make_prompt(pyspy_pid, nice=self.nice_problem is None)
        if self.nice_problem:
            problems.insert(0, self.nice_problem)
        problem = "; ".join(problems) or None
        if problem and self.priority == "required":
            raise SamplingError(f"sampler priority is required but failed: {problem}; {sched.FIX}")
        return problem

    def dump_json(
        self, pid: int, *, procfs: Path = Path("/proc"), retry_s: float = PROBE_RETRY_S
    ) -> str:
        """One `py-spy dump --json --nonblocking` of `pid` (collectors/pyspy/dump.py parses
        it), retried as `probe` is. Raises what a window would raise."""
        return self._dump(pid, procfs=procfs, retry_s=retry_s, as_json=True)

    def probe(
        self, pid: int, *, procfs: Path = Path("/proc"), retry_s: float = PROBE_RETRY_S
    ) -> None:
        """`py-spy dump --nonblocking` (~15-40 ms each): raises what a window would raise
        (TargetGone, NotPython, UnsupportedPython, PtraceDenied), before any window runs.

        A nonblocking dump is one snapshot read while the target runs. It can fail on a
        stack that changes under it ("Failed to get stack traces"), or, right after the
        process started, before its interpreter exists (py-spy then says it found no
        interpreter). Measured on the demo workload probed 0-0.3 s after spawning it:
        3-5 failures in 25 single dumps, 1 in 40 and 1 in 60 still after five dumps in
        a row. `serwatt demo` failed that way. So a generic failure, or "not Python"
        from a process whose executable procfs says is Python, is retried for up to
        `retry_s` seconds while the process lives."""
        self._dump(pid, procfs=procfs, retry_s=retry_s, as_json=False)

    def _dump(self, pid: int, *, procfs: Path, retry_s: float, as_json: bool) -> str:
        kind = precheck(pid, procfs)
        deadline = time.monotonic() + retry_s
        cmd = [str(self.binary), "dump", *(["--json"] if as_json else []), "--nonblocking"]
        while True:
            try:
                res = subprocess.run(
                    [*cmd, "--pid", str(pid)],
                    capture_output=True,
                    text=True,
                    errors="replace",
                    timeout=30 + self.kill_grace_s,
                    stdin=subprocess.DEVNULL,
                    env=pyspy_env(),
                )
            except OSError as exc:
                raise PySpyMissing(f"cannot run py-spy at {self.binary}: {exc}") from exc
            except subprocess.TimeoutExpired as exc:
                raise SamplingError(f"py-spy dump of pid {pid} did not finish in time") from exc
            if res.returncode == 0:
                return res.stdout
            failure = _classify_failure(pid, res.stdout + res.stderr, procfs)
            transient = type(failure) is SamplingError or (
                isinstance(failure, NotPython) and kind.is_python
            )
            if not transient or time.monotonic() >= deadline:
                raise failure
            time.sleep(PROBE_PAUSE_S)

    def command(
        self,
        pid: int,
        *,
        duration_s: float,
        rate_hz: float,
        output: Path,
        fmt: str = "speedscope",
    ) -> list[str]:
        rate = max(1, int(round(rate_hz)))
        # -d takes whole seconds; we stop the window ourselves (SIGINT) at duration_s.
        whole = max(1, math.ceil(duration_s) + 1)
        return [
            str(self.binary),
            "record",
            *PYSPY_FLAGS,
            "--format",
            fmt,
            "--rate",
            str(rate),
            "--duration",
            str(whole),
            "--pid",
            str(pid),
            "--output",
            str(output),
        ]

    def record_window(
        self,
        pid: int,
        *,
        duration_s: float,
        plan: SamplingPlan = IDLE_RUN_ONLY,
        stop_event: threading.Event | None = None,
        procfs: Path = Path("/proc"),
        on_spawn: Callable[[int], object] | None = None,
    ) -> WindowSamples:
        """Sample `pid` for `duration_s` (less if the target exits or `stop_event` is set)
        with the py-spy runs `plan` names (collectors/pyspy/plan.py). `on_spawn` is called
        with each py-spy's pid as soon as it is spawned (the scheduler timeline traces it).

        The on-CPU run's samples are `WindowSamples.on_cpu` (py-spy drops a thread whose
        /proc state is not R: asleep, blocked, waiting for the GIL). The stack-change
        run's are `WindowSamples.changes` (every thread's stack changes, timed to the tick
        that first showed them; collectors/pyspy/chrometrace.py); a failure of that run
        alone costs only the changes (a note says why). Each py-spy costs ~20 ms to start
        plus ~0.28 ms per sample (docs/daemon.md).

        Raises TargetGone, NotPython, UnsupportedPython, PtraceDenied, SamplingError.
        """
        if duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        precheck(pid, procfs)
        wake = threading.Event()
        with tempfile.TemporaryDirectory(prefix="serwatt-pyspy-") as tmp:
            idle_run, cpu_run, timing = self._runs(pid, duration_s, plan, Path(tmp), wake, on_spawn)
            runs = [r for r in (idle_run, cpu_run, timing) if r is not None]
            self._run_all(runs, wake, stop_event)
            finished = self._finish_all(pid, runs, timing, procfs)
            for counted in (idle_run, cpu_run):
                if counted is not None and isinstance(finished[id(counted)], SamplingError):
                    raise finished[id(counted)]

        def assemble(run: _Run) -> WindowSamples:
            # A run's span: py-spy's banner to its end line, else spawn to exit.
            return self._assemble(
                pid,
                finished[id(run)],
                run.text,
                started_at=run.marks.get("start", run.spawned_at),
                ended_at=run.marks.get("end", run.exit_at),
                rate_hz=run.rate_hz,
                procfs=procfs,
            )

        result = assemble(idle_run)
        if cpu_run is not None:
            result = self._with_on_cpu(result, assemble(cpu_run), idle_run, cpu_run)
        if timing is not None:
            outcome = finished[id(timing)]
            failed = isinstance(outcome, Exception)
            result = self._with_changes(
                result,
                timing,
                None if failed else outcome,
                str(outcome) if failed else None,
                rate_hz=timing.rate_hz,
            )
        problems = sorted({run.priority_problem for run in runs if run.priority_problem})
        if problems:
            note = (
                f"py-spy ran without its scheduling priority ({'; '.join(problems)}): under "
                "CPU contention its samples gather after the target's system calls "
                "(docs/sampling.md)"
            )
            result = replace(
                result, errors=replace(result.errors, notes=(*result.errors.notes, note))
            )
        return result

    def _runs(
        self,
        pid: int,
        duration_s: float,
        plan: SamplingPlan,
        tmp: Path,
        wake: threading.Event,
        on_spawn: Callable[[int], object] | None = None,
    ) -> tuple[_Run, _Run | None, _Run | None]:
        """The window's py-spy runs, not started: (the --idle run, the on-CPU run, the
        stack-change run), the last two None where the plan has none."""
        idle_run = _Run(
            self, pid, duration_s, plan.idle_run_rate_hz, tmp / "all.json", idle=True, wake=wake
        )
        cpu_run: _Run | None = None
        if plan.on_cpu_run:
            cpu_run = _Run(
                self, pid, duration_s, plan.rate_hz, tmp / "oncpu.json", idle=False, wake=wake
            )
        timing: _Run | None = None
        if plan.timing_rate_hz is not None:
            timing = _Run(
                self, pid, duration_s, plan.timing_rate_hz, tmp / "changes.json",
                idle=True, wake=wake, fmt="chrometrace", on_spawn=on_spawn,
            )  # fmt: skip
        return idle_run, cpu_run, timing

    def _run_all(
        self, runs: list[_Run], wake: threading.Event, stop_event: threading.Event | None
    ) -> None:
        """Start every run (a failed start kills those started) and watch them to the end."""
        linked = isinstance(stop_event, StopEvent)
        if linked:
            stop_event.link(wake)  # type: ignore[union-attr]
        try:
            started: list[_Run] = []
            try:
                for run in runs:
                    run.start()
                    started.append(run)
            except SamplingError:
                for run in started:
                    run.proc.kill()
                    run.proc.wait()
                raise
            self._supervise(runs, wake, stop_event, linked, self.on_look)
        finally:
            if linked:
                stop_event.unlink(wake)  # type: ignore[union-attr]

    @staticmethod
    def _finish_all(
        pid: int, runs: list[_Run], timing: _Run | None, procfs: Path
    ) -> dict[int, Any]:
        """Each run's output (the stack-change run's as raw text), or the SamplingError
        that stands for it, by id(run). Every run is finished (killed if need be, and
        reaped) before any error is raised for one: a run left behind would be a py-spy
        nobody waits for, outside the sampler bound."""
        finished: dict[int, Any] = {}
        try:
            for run in runs:
                try:
                    if run is timing:  # read now, parsed off the sampling path
                        text = run.finish(procfs, max_bytes=MAX_CHANGES_BYTES, raw=True)
                        finished[id(run)] = text
                    else:
                        finished[id(run)] = run.finish(procfs)
                except (SamplingError, ValueError) as exc:
                    if run is not timing and not isinstance(exc, SamplingError):
                        exc = SamplingError(f"py-spy's output for pid {pid} is unreadable: {exc}")
                    finished[id(run)] = exc
        finally:
            for run in runs:
                run.close()
        return finished

    @staticmethod
    def _with_on_cpu(
        result: WindowSamples, cpu: WindowSamples, idle_run: _Run, cpu_run: _Run
    ) -> WindowSamples:
        """The --idle run's window with the on-CPU run's samples."""
        # py-spy knows a thread's run state only when it knows its kernel tid
        # (decimal label; <3.11 in nonblocking mode it does not, and then keeps
        # every sample): only those threads' on-CPU samples mean anything.
        known = {
            tid
            for label, tid in cpu.mapping.tid_of.items()
            if cpu.mapping.method.get(label) == "pyspy"
        }
        on_cpu = tuple(s for s in cpu.samples if s.tid in known)
        if known or idle_run.rate_hz == cpu_run.rate_hz or not cpu.samples:
            return replace(result, on_cpu=on_cpu, on_cpu_errors=cpu.errors)
        # No thread's state was known, so the "on-CPU" run kept every sample
        # of every thread: it is an --idle run at the full rate. Use it as one
        # (the slower --idle run would only cost precision).
        merged = cpu.errors.with_run(result.errors)
        note = (
            "py-spy knew no thread's run state (no kernel tid): cpu on "
            f"--idle-like samples at {cpu_run.rate_hz:g} Hz"
        )
        return replace(cpu, errors=replace(merged, notes=(*merged.notes, note)))

    @staticmethod
    def _with_changes(
        result: WindowSamples, run: _Run, text: Any, problem: str | None, *, rate_hz: float
    ) -> WindowSamples:
        """The window with the timing run's output, to be parsed by `resolve_changes`
        off the sampling path (parsing a window's events takes a good part of a second
        on a busy target, and windows must stay back to back), or a note saying why not.

        ts counts from py-spy's start (its recorder is made before it attaches), so the
        host time of ts 0 is the spawn, give or take py-spy's own start-up (ms). Not the
        banner: that is stamped when serwatt's reader thread gets to the line, which on a
        loaded node was measured up to 0.35 s late; it bounds how late the anchor can be."""
        if problem is not None:
            note = f"no stack-change timing this window ({problem})"
            errors = replace(result.errors, notes=(*result.errors.notes, note))
            return replace(result, errors=errors)
        raw = RawChanges(
            text=str(text),
            anchor=run.spawned_at,
            banner_at=run.marks.get("start", run.exit_at),
            rate_hz=rate_hz,
            pyspy_pid=run.proc.pid,
        )
        return replace(result, changes_raw=raw)

    @staticmethod
    def _supervise(
        runs: list[_Run],
        wake: threading.Event,
        stop_event: threading.Event | None,
        linked: bool,
        on_look: Callable[[], object] | None,
    ) -> None:
        """Block until every py-spy has exited (or one was killed), waking only when
        something is due: a deadline, the banner, end of output, a stop request."""
        while True:
            # cleared before looking, so a wake-up during the look is not lost
            wake.clear()
            stop = stop_event is not None and stop_event.is_set()
            if on_look is not None:
                on_look()
            due = [run.tick(stop) for run in runs]
            if any(run.killed for run in runs):
                return
            pending = [t for t in due if t is not None]
            if not pending:
                return
            timeout = min(pending) - time.time()
            if stop_event is not None and not linked and not stop:
                timeout = min(timeout, STOP_CHECK_S)
            wake.wait(max(0.0, timeout))

    @staticmethod
    def _assemble(
        pid: int,
        doc: dict[str, Any],
        text: str,
        *,
        started_at: float,
        ended_at: float,
        rate_hz: float,
        procfs: Path,
    ) -> WindowSamples:
        tracks = parse_speedscope(doc)
        status = parse_status(text)
        mapping = map_threads(pid, tracks, procfs=procfs)
        return assemble_samples(
            pid,
            tracks,
            status,
            mapping,
            started_at=started_at,
            ended_at=ended_at,
            rate_hz=rate_hz,
            alive_tids=procstat.thread_ids(pid, procfs),
        )
