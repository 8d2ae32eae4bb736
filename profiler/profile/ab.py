"""`serwatt ab`: run a baseline and a candidate command N times each under `serwatt profile
--record`, interleaved, and say what each run did; the report is built from the record.

Each run is a real `python -m serwatt profile --record DB --run-id ab-<start>-<side>-<k>
--checkpoints DIR -- CMD`. The run plan is ABAB... (`interleaved`) or a seeded shuffle
(`random`), so a load drift over the A/B spreads over both sides instead of reading as a
difference. Before each run a `prepare` command runs (hyperfine's --prepare).

Checkpoint directories: with `--checkpoints DIR`, a command holding `{dir}` gets a directory
of its own per run pair (DIR/ab-<start>/<side>-<k>, made here), so no run reads another's
files; a command without `{dir}` has every run use DIR itself. A file counts as written by
a run when its (inode, size, mtime) under the directory is new after the run (names that
start with '.' (DCP's `.metadata` aside) or end in '.tmp' are temp files, TensorBoard's
event files are a logger's; `checkpoint_glob` names the files that count instead, as
`serwatt profile --checkpoint-glob`).

Restore: with `resume_args`, every run is followed by the same command with those arguments
appended, recorded on the same side as `...-<k>-resumed`. With `cold_restore` the run's
checkpoint files are fsynced and dropped from the page cache (posix_fadvise DONTNEED) before
it starts; either way `mincore` then says how much of each file is cached, and the restore
is labelled `cold`, `warm` or `partly cached (x%)` from the files the resumed run opened.
That a resumed run read a checkpoint at all is taken from its record: `serwatt profile
--checkpoints` records every open of a file under DIR for reading (inotify IN_OPEN followed
by IN_CLOSE_NOWRITE), with serwatt's own receipt reads left out. A resumed run with no such
open measured no restore, and the A/B stops.

`swap="torch"`: the candidate is the baseline's own command with PYTHONPATH leading to
profiler/profile/swap (a sitecustomize that replaces torch.save and torch.load with
profiler.many.torch_compat, in the job and its Python children), set through `env` so the
profiler itself runs without it. Each candidate run must leave `.many` files (magic bytes);
after the first baseline run its torch.save files are read for what the drop-in cannot
write (pickled objects other than tensors, storages and OrderedDicts).

Ctrl-C: the runs are in sessions of their own, so a terminal's Ctrl-C reaches serwatt
alone; the A/B stops after the current run and says it is partial. A second Ctrl-C
interrupts the current run too. A run that fails (exit code not 0) stops the A/B with its
exit code, run id and stderr tail; what the record holds stays.

The checkpoint directory's files are snapshotted by checkpoint_files.py, the page cache
read and evicted by page_cache.py, and the baseline's torch.save files scanned for what
the swap cannot write by pickle_scan.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serwatt.profiler.exitcodes import EXIT_RUNTIME, EXIT_USAGE
from serwatt.profiler.profile.checkpoint_files import (
    by_format,
    snapshot,
    written_files,
    written_paths,
)
from serwatt.profiler.profile.page_cache import cache_label, cache_state
from serwatt.profiler.profile.pickle_scan import swap_problems
from serwatt.profiler.records.run_ids import format_start_time
from serwatt.profiler.records.store import Recorder, RecordError
from serwatt.profiler.safeio import InputFileError, read_bounded, read_json
from serwatt.profiler.terminal_escape import escape_text

SIDES = ("baseline", "candidate")
ORDERS = ("interleaved", "random")
SWAPS = ("torch",)
DIR_PLACEHOLDER = "{dir}"
SWAP_DIR = Path(__file__).resolve().parent / "swap"
SWAP_ENV = "SERWATT_SWAP"
SWAP_LOG_ENV = "SERWATT_SWAP_LOG"  # swap/sitecustomize.py's log of what went where
TAIL_BYTES = 4096  # of each run's stderr, kept for a failure's message
RESUMED = "resumed"
MAX_SWAP_LOG_BYTES = 64 << 20  # a line per save of every process of a run


class AbError(Exception):
    """The A/B cannot go on: one line for the user, and the exit code to leave with."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class AbOptions:
    """What `serwatt ab` was asked; commands are argument lists (shlex-split)."""

    baseline: tuple[str, ...]
    candidate: tuple[str, ...]  # the baseline's own with swap="torch"
    repeats: int
    record: Path
    order: str = "interleaved"
    seed: int | None = None
    swap: str | None = None
    prepare: tuple[str, ...] = ()
    resume_args: tuple[str, ...] = ()
    cold_restore: bool = False
    checkpoints: Path | None = None
    checkpoint_glob: str | None = None  # the names under DIR that are checkpoints (fnmatch)
    python: str = sys.executable  # runs `-m profiler profile`


@dataclass(frozen=True)
class PlannedRun:
    index: int  # 1-based, in the order run
    side: str
    k: int  # repeat number on its side, 1-based
    resumed: bool
    run_id: str
    directory: Path | None
    command: tuple[str, ...]  # the job's, {dir} filled in


@dataclass
class RunOutcome:
    run: PlannedRun
    exit_code: int
    wall_s: float
    checkpoint_files: int | None  # None: no directory watched
    many_files: int | None
    stderr_tail: str
    restores: int | None = None  # resumed runs: files opened for reading, from the record
    # what the run wrote under DIR, by format: {"many"|"torch"|"other": [files, bytes]}
    written: dict[str, list[int]] | None = None
    # --swap candidate runs: the sitecustomize's log, {"many"|"torch": [files, bytes]}
    swap_saves: dict[str, list[int]] | None = None
    # serwatt's own CPU over the run (its process and py-spy runs, cores), from the
    # profile's document; None: not measured
    serwatt_cpu_cores: float | None = None
    restore_cache: str | None = None  # cold | warm | partly cached (x%)
    cached_fraction: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run_id": self.run.run_id,
            "side": self.run.side,
            "k": self.run.k,
            "resumed": self.run.resumed,
            "exit_code": self.exit_code,
            "checkpoint_files": self.checkpoint_files,
            "many_files": self.many_files,
            "wall_s": round(self.wall_s, 3),
            "directory": str(self.run.directory) if self.run.directory is not None else None,
        }
        if self.written is not None:
            out["written"] = self.written
        if self.swap_saves is not None:
            out["swap_saves"] = self.swap_saves
        out["serwatt_cpu_cores"] = self.serwatt_cpu_cores
        if self.run.resumed:
            out |= {
                "restores": self.restores,
                "restore_cache": self.restore_cache,
                "cached_fraction": self.cached_fraction,
            }
        return out


@dataclass
class AbResult:
    start: str
    plan: list[PlannedRun]
    outcomes: list[RunOutcome] = field(default_factory=list)
    interrupted: bool = False

    def run_ids(self, side: str) -> list[str]:
        return [o.run.run_id for o in self.outcomes if o.run.side == side and o.exit_code == 0]


def run_order(repeats: int, order: str, seed: int | None) -> list[tuple[str, int]]:
    """(side, k) for every repeat of both sides in the order they run: ABAB... or a
    shuffle by `random.Random(seed)`, so one seed always gives one order."""
    pairs = [(side, k) for k in range(1, repeats + 1) for side in SIDES]
    if order == "random":
        random.Random(seed).shuffle(pairs)
    elif order != "interleaved":
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    return pairs


def split_command(text: str, option: str) -> tuple[str, ...]:
    """A command given as one string, split as a POSIX shell would (no shell runs it)."""
    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:
        raise AbError(f"{option}: cannot split {text!r} into arguments: {exc}") from None
    if not argv:
        raise AbError(
            f"{option}: the command is empty; give the job's command, e.g. "
            f"{option} 'python train.py'"
        )
    return argv


def _uses_dir(argv: Sequence[str]) -> bool:
    return any(DIR_PLACEHOLDER in a for a in argv)


def _filled(argv: Sequence[str], directory: Path | None) -> tuple[str, ...]:
    if directory is None:
        return tuple(argv)
    return tuple(a.replace(DIR_PLACEHOLDER, str(directory)) for a in argv)


class Ab:
    """One A/B: `check()` the options, then `run()`; `on_run(outcome, result)` hears of each
    run as it ends, `on_start(planned, result)` before it starts."""

    def __init__(
        self,
        opts: AbOptions,
        *,
        on_start: Callable[[PlannedRun, AbResult], None] | None = None,
        on_run: Callable[[RunOutcome, AbResult], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.opts = opts
        self.on_start = on_start or (lambda _p, _r: None)
        self.on_run = on_run or (lambda _o, _r: None)
        self.clock = clock
        self.start = "ab-" + format_start_time(time.time())
        self._stop = False
        self._child: subprocess.Popen[bytes] | None = None
        self._swap_checked = False
        self._swap_logs: Path | None = None  # a private directory: one log per run pair
        self._swap_seen: dict[Path, int] = {}  # log -> lines read by earlier runs

    # ------------------------------------------------------------------ before any run

    def check(self) -> None:
        """Raise AbError for options that cannot make an A/B, before anything runs."""
        o = self.opts
        if o.repeats < 2:
            raise AbError(
                f"--repeats {o.repeats}: no statistics possible from fewer than 2 runs per side "
                "(a side's spread needs two); give --repeats 2 or more"
            )
        if o.swap is not None and o.swap not in SWAPS:
            raise AbError(f"--swap {o.swap}: not one of {', '.join(SWAPS)}")
        if o.checkpoints is None:
            for flag, given in (
                ("--checkpoint-glob", o.checkpoint_glob is not None),
                ("--resume-args", bool(o.resume_args)),
                ("--cold-restore", o.cold_restore),
                ("--swap", o.swap is not None),
            ):
                if given:
                    raise AbError(
                        f"{flag} needs --checkpoints DIR (the job's checkpoint directory)"
                    )
        if o.cold_restore and not o.resume_args:
            raise AbError("--cold-restore evicts the files a resumed run reads: give --resume-args")
        if o.checkpoints is not None:
            self._check_directory(o.checkpoints)
        try:
            with Recorder(o.record) as rec:
                taken = [r.run_id for r in rec.runs() if r.run_id.startswith(self.start + "-")]
        except RecordError as exc:
            raise AbError(f"--record {o.record}: {exc}") from None
        if taken:
            raise AbError(
                f"--record {o.record}: already holds runs named {self.start}-*; "
                "start the A/B again in a second"
            )

    def _check_directory(self, directory: Path) -> None:
        try:
            info = os.stat(directory)
        except OSError as exc:
            raise AbError(f"--checkpoints {directory}: {exc.strerror}; create it first") from None
        if not stat.S_ISDIR(info.st_mode):
            raise AbError(
                f"--checkpoints {directory}: not a directory; give the directory "
                "the job writes its checkpoints into"
            )
        probe = directory / f".{self.start}-probe"
        try:
            os.mkdir(probe, 0o700)
            os.rmdir(probe)
        except OSError as exc:
            raise AbError(
                f"--checkpoints {directory}: not writable ({exc.strerror}); the job "
                "must be able to write its checkpoints there"
            ) from None

    def plan(self) -> list[PlannedRun]:
        o = self.opts
        own_dirs = o.checkpoints is not None and (_uses_dir(o.baseline) or _uses_dir(o.candidate))
        out: list[PlannedRun] = []
        for side, k in run_order(o.repeats, o.order, o.seed):
            directory = o.checkpoints
            if own_dirs and o.checkpoints is not None:
                directory = o.checkpoints / self.start / f"{side}-{k}"
            argv = o.baseline if side == "baseline" else o.candidate
            run_id = f"{self.start}-{side}-{k}"
            command = _filled(argv, directory)
            out.append(PlannedRun(len(out) + 1, side, k, False, run_id, directory, command))
            if o.resume_args:
                resumed = (*command, *_filled(o.resume_args, directory))
                rid = f"{run_id}-{RESUMED}"
                out.append(PlannedRun(len(out) + 1, side, k, True, rid, directory, resumed))
        return out

    # ------------------------------------------------------------------ running

    def run(self) -> AbResult:
        """Every planned run, in order; stops early on Ctrl-C (result.interrupted) or
        raises AbError for a failing run or a check that fails after one."""
        result = AbResult(self.start, self.plan())
        with self._signals():
            for planned in result.plan:
                if self._stop:
                    result.interrupted = True
                    break
                self.on_start(planned, result)
                outcome = self._one(planned)
                result.outcomes.append(outcome)
                self.on_run(outcome, result)
                if outcome.exit_code != 0:
                    if self._stop:  # a second Ctrl-C ended it: partial, not failed
                        result.interrupted = True
                        break
                    raise RunFailed(outcome, result)
                self._after(outcome)
            else:
                result.interrupted = self._stop and len(result.outcomes) < len(result.plan)
        return result

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        def on_signal(signum: int, _frame: object) -> None:
            child = self._child
            if self._stop or signum == signal.SIGTERM:
                if child is not None and child.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(
                            child.pid, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
                        )
            self._stop = True

        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _run_quiet(self, argv: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, str]:
        """Run a command in a session of its own (a terminal's Ctrl-C reaches serwatt only),
        its stdout dropped and the tail of its stderr kept; (exit code, stderr tail)."""
        try:
            child = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return 127, f"cannot run {argv[0]}: {exc.strerror or exc}"
        self._child = child
        tail: deque[bytes] = deque()
        kept = 0
        assert child.stderr is not None
        try:
            stream = child.stderr
            for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):
                tail.append(chunk)
                kept += len(chunk)
                while kept - len(tail[0]) >= TAIL_BYTES:
                    kept -= len(tail.popleft())
            code = child.wait()
        finally:
            child.stderr.close()
            self._child = None
        text = b"".join(tail)[-TAIL_BYTES:].decode("utf-8", "replace")
        return (128 - code if code < 0 else code), text

    def _one(self, planned: PlannedRun) -> RunOutcome:
        o = self.opts
        t0 = self.clock()
        if o.prepare:
            code, err = self._run_quiet(o.prepare)
            if code != 0:
                raise AbError(
                    f"--prepare {shlex.join(o.prepare)} failed before run "
                    f"{planned.run_id} with exit code {code}: {_last_line(err)}",
                    code,
                )
        directory = planned.directory
        cached: dict[str, float] = {}
        if directory is not None:
            if directory != o.checkpoints:
                with contextlib.suppress(FileExistsError):
                    os.makedirs(directory, 0o755)
            if planned.resumed:
                cached = cache_state(directory, evict=o.cold_restore)
        before = snapshot(directory, o.checkpoint_glob) if directory is not None else {}
        job = list(planned.command)
        swap_log = None
        if o.swap is not None and planned.side == "candidate":
            path = os.environ.get("PYTHONPATH")
            swap_log = self._swap_log(planned)
            job = [
                "env",
                f"PYTHONPATH={SWAP_DIR}" + (f":{path}" if path else ""),
                f"{SWAP_ENV}={o.swap}",
                f"{SWAP_LOG_ENV}={swap_log}",
                *job,
            ]
        argv = [
            o.python,
            "-m",
            "serwatt",
            "profile",
            "--record",
            str(o.record),
            "--run-id",
            planned.run_id,
            # each run is a measurement at the full rates, and both sides pay the same
            # cost: the budget that shields a production job would blur the stalls
            "--cpu-budget",
            "off",
        ]
        document = self._private() / f"{planned.run_id}.json"
        argv += ["--json", str(document)]
        if directory is not None:
            argv += ["--checkpoints", str(directory)]
            if o.checkpoint_glob is not None:
                argv += ["--checkpoint-glob", o.checkpoint_glob]
        code, err = self._run_quiet([*argv, "--", *job])
        outcome = RunOutcome(planned, code, self.clock() - t0, None, None, err)
        if directory is not None:
            after = snapshot(directory, o.checkpoint_glob)
            written = written_files(before, after)
            outcome.checkpoint_files = len(written)
            outcome.written = by_format({p: after[p][2] for p in written})
            outcome.many_files = outcome.written["many"][0]
        if swap_log is not None:
            outcome.swap_saves = self._swap_saves(swap_log, planned)
        outcome.serwatt_cpu_cores = _own_cpu_cores(document)
        if planned.resumed and code == 0:
            self._restore(outcome, cached)
        return outcome

    def _swap_log(self, planned: PlannedRun) -> Path:
        """The log file of this run's swap (swap/sitecustomize.py); a resumed run shares its
        pair's, so it may hand back to torch.load the files that run wrote through it."""
        return self._private() / f"{planned.side}-{planned.k}.jsonl"

    def _private(self) -> Path:
        """A directory of this A/B's own (mode 0700) for the swap's logs and the runs'
        documents."""
        if self._swap_logs is None:
            self._swap_logs = Path(tempfile.mkdtemp(prefix=f"serwatt-{self.start}-"))
        return self._swap_logs

    def _swap_saves(self, log: Path, planned: PlannedRun) -> dict[str, list[int]]:
        """This run's saves by where they went, from the log (lines from `seen` on are
        this run's: a resumed run appends to its pair's log). Raises AbError when the swap
        did not apply in one of the job's processes: the sides would be the same thing."""
        try:
            data = read_bounded(log, max_bytes=MAX_SWAP_LOG_BYTES, follow_links=False)
        except InputFileError:
            data = b""
        lines = data.decode("utf-8", "replace").splitlines()
        seen = self._swap_seen.get(log, 0)
        self._swap_seen[log] = len(lines)
        out: dict[str, list[int]] = {"many": [0, 0], "torch": [0, 0]}
        why: list[str] = []
        for line in lines[seen:]:
            try:
                ev = json.loads(line)
                if ev.get("event") == "not_applied":
                    why.append(str(ev.get("why")))
                elif ev.get("event") == "save" and ev.get("to") in out:
                    out[ev["to"]][0] += 1
                    out[ev["to"]][1] += int(ev.get("bytes") or 0)
            except (ValueError, TypeError, AttributeError):
                continue
        if why:
            raise AbError(
                f"--swap {self.opts.swap}: the swap did not apply in {len(why)} of the job's "
                f"processes (run {planned.run_id}): {escape_text(why[0])}; the candidate "
                "would measure the baseline again. Install numpy and blake3 into the job's "
                "environment, or run the job with serwatt's interpreter",
                EXIT_RUNTIME,
            )
        return out

    def _restore(self, outcome: RunOutcome, cached: dict[str, float]) -> None:
        try:
            with Recorder(self.opts.record, readonly=True) as rec:
                events = rec.checkpoint_events(outcome.run.run_id)
        except RecordError as exc:
            raise AbError(f"--record {self.opts.record}: {exc}", EXIT_RUNTIME) from None
        if events is None:
            return
        opened = [str(r["path"]) for r in events.get("restores") or ()]
        outcome.restores = len(opened)
        fractions = [cached[p] for p in opened if p in cached]
        if fractions:
            outcome.cached_fraction = sum(fractions) / len(fractions)
            outcome.restore_cache = cache_label(outcome.cached_fraction)

    def _after(self, outcome: RunOutcome) -> None:
        """The checks a finished run makes possible; AbError stops the A/B."""
        o, run = self.opts, outcome.run
        if run.resumed and outcome.restores == 0:
            raise AbError(
                f"no restore measured: the resumed run opened no file under "
                f"{run.directory} (run {run.run_id}); check --resume-args "
                f"{shlex.join(o.resume_args)}"
            )
        if o.swap is None or run.directory is None:
            return
        if run.side == "baseline" and not self._swap_checked and outcome.checkpoint_files:
            self._swap_checked = True
            damaged, _pickled = swap_problems(written_paths(run.directory, o.checkpoint_glob))
            if damaged:
                raise AbError(
                    f"--swap {o.swap}: {len(damaged)} of the baseline's checkpoint files "
                    f"cannot be checked: {'; '.join(damaged)}"
                )
        if run.side == "candidate" and not run.resumed and not outcome.many_files:
            raise AbError(
                f"the swap took no effect: no .many file written in {run.directory}; "
                "does the job call torch.save?"
            )


def _own_cpu_cores(document: Path) -> float | None:
    """serwatt's own CPU over a run (cores) from its profile document (profiler/profile/
    cpu_budget.py measures it); None when the document or the figure is missing."""
    try:
        doc = read_json(document)
    except (InputFileError, OSError):
        return None
    got = (doc.get("cpu_budget") or {}).get("own_cpu_cores") if isinstance(doc, dict) else None
    return float(got) if isinstance(got, int | float) else None


def perturbation(outcomes: Sequence[RunOutcome], cpus: int | None = None) -> str:
    """How perturbed each side was: serwatt's own CPU (its process and py-spy runs) as a
    share of the node's CPUs, mean and max over the side's runs."""
    n = cpus or os.cpu_count() or 1
    parts = []
    for side in SIDES:
        got = [o.serwatt_cpu_cores for o in outcomes if o.run.side == side]
        known = [g for g in got if g is not None]
        if not known:
            parts.append(f"{side} not measured")
            continue
        mean = sum(known) / len(known)
        parts.append(
            f"{side} {mean:.2f} cores ({mean / n:.0%} of the node's {n} CPUs; "
            f"max {max(known) / n:.0%}; {len(known)} of {len(got)} runs measured)"
        )
    return "serwatt's own CPU while it measured: " + ", ".join(parts)


class RunFailed(AbError):
    """A run exited with a code other than 0: the A/B stops with that code."""

    def __init__(self, outcome: RunOutcome, result: AbResult) -> None:
        super().__init__(
            f"run {outcome.run.run_id} failed with exit code {outcome.exit_code}",
            outcome.exit_code,
        )
        self.outcome = outcome
        self.result = result


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output on stderr)"
