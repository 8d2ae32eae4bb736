"""`serwatt profile`: profile one process (and its Python children), print the table.

    serwatt profile [--rate HZ] [--json FILE] [--duration S] -- CMD ARGS...
    serwatt profile --pid PID [--duration S] [--json FILE]

With CMD, serwatt launches it, profiles it until it exits (or --duration ends) and
returns its exit code. With --pid it attaches and profiles until the process exits
or --duration ends (Ctrl-C also ends it; the table is still printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from serwatt.collectors.pyspy import (
    DEFAULT_RATE_HZ,
    NotPython,
    PtraceDenied,
    SamplingError,
    TargetGone,
    UnsupportedPython,
)
from serwatt.collectors.source import with_mode
from serwatt.profiler import safeio
from serwatt.profiler.classify import source_store
from serwatt.profiler.cli.argtypes import (
    PID_MAX_LIMIT,
    SWITCH_CHOICES,
    Number,
    check_output_option,
    switch,
)
from serwatt.profiler.cli.main import UsageError
from serwatt.profiler.exitcodes import EXIT_OK, EXIT_RUNTIME
from serwatt.profiler.profile.flamegraph import render_page
from serwatt.profiler.profile.pprof import pprof_bytes
from serwatt.profiler.profile.session import ProfileSession, SessionResult
from serwatt.profiler.profile.setup import ProfileOptions, ProfileSetup, SetupError
from serwatt.profiler.profile.table import render_table, sampled_nothing
from serwatt.profiler.sampling.budget import DEFAULT_BUDGET_SHARE, default_budget_cores
from serwatt.profiler.sampling.collect import (
    TIMING_RATE_FACTOR,
    TIMING_RATE_MAX_HZ,
)
from serwatt.profiler.terminal_escape import escape_text

BAD_INPUT_ERRORS = (TargetGone, NotPython, UnsupportedPython, PtraceDenied)


def _store_dir(text: str) -> Path | None:
    return None if text == "off" else Path(text)


_CORES = Number(float, above=0, max=4096, unit="cores")


OFF = "off"


def _cpu_budget(text: str) -> float | str:
    return OFF if text == OFF else float(_CORES(text))


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rate", type=Number(float, above=0, max=1000, unit="Hz"), default=DEFAULT_RATE_HZ,
        metavar="HZ",
        help=f"samples per second per thread (default {DEFAULT_RATE_HZ:g})",
    )  # fmt: skip
    parser.add_argument(
        "--json", type=Path, metavar="FILE", help="write the serwatt.profile/1 document here"
    )
    parser.add_argument(
        "--pprof", type=Path, metavar="FILE",
        help="write the classified stacks as a pprof profile (gzip'd profile.proto: sample "
        "types cpu, energy, gpu_wait; labels codepath and direction), for `go tool pprof`, "
        "Pyroscope or Parca",
    )  # fmt: skip
    parser.add_argument(
        "--flamegraph", "--html", dest="flamegraph", type=Path, metavar="FILE",
        help="write the run's page, one self-contained HTML file: the table, an "
        "interactive flame graph of the classified stacks (frames coloured by codepath, "
        "width CPU-s) and the episodes over time",
    )  # fmt: skip
    parser.add_argument(
        "--window", type=Number(float, min=0.5, unit="s"), default=5.0, metavar="S",
        help="length of one py-spy window in seconds (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--no-children", action="store_true", help="do not follow Python child processes"
    )
    parser.add_argument(
        "--no-on-cpu-run", dest="on_cpu_run", action="store_false",
        help="one py-spy per window instead of two (halves py-spy's CPU; CPU shares of "
        "threads that share the GIL become less accurate)",
    )  # fmt: skip
    parser.add_argument(
        "--kernel-timeline", action=argparse.BooleanOptionalAction, default=False,
        help="weigh CPU by the kernel's scheduler timeline where it is available (root; "
        "needs the stack-change run), else by the estimates, each window saying which: "
        "docs/sampling.md, cpu_source",
    )  # fmt: skip
    parser.add_argument(
        "--timing-rate", type=Number(float, min=0, max=1000, unit="Hz"), default=None,
        metavar="HZ",
        help="rate of the py-spy run that times episode edges by stack changes (default: "
        f"{TIMING_RATE_FACTOR:g}x --rate, at most {TIMING_RATE_MAX_HZ:g} Hz; 0: no such "
        "run, episodes timed by sample counts)",
    )  # fmt: skip
    parser.add_argument(
        "--pyspy", type=Path, metavar="PATH", help="py-spy binary (default: next to python)"
    )
    parser.add_argument(
        "--sampler-priority", type=switch, choices=SWITCH_CHOICES, default="auto",
        help="give py-spy a 0.1 ms scheduler slice and nice -20 so samples are not pulled "
        "towards the target's system calls on a busy node: auto (apply what is allowed, "
        "note the rest), required, off",
    )  # fmt: skip
    parser.add_argument(
        "--path.procfs", dest="procfs", type=Path, default=Path("/proc"), metavar="DIR",
        help="procfs root (default /proc)",
    )  # fmt: skip
    # energy and GPU-wait (profiler/attribution/tracker.py, docs/energy.md)
    parser.add_argument(
        "--path.sysfs", dest="sysfs", type=Path, default=Path("/sys"), metavar="DIR",
        help="sysfs root for RAPL powercap zones (default /sys)",
    )  # fmt: skip
    parser.add_argument(
        "--tdp", type=Number(float), metavar="W",  # > 0: checked in profile/setup.py
        help="node CPU TDP in watts for the energy model used when RAPL is unavailable",
    )  # fmt: skip
    # one flag per source that has a config mode (collectors/source.py SOURCES): --rapl...
    for src in with_mode():
        parser.add_argument(
            f"--{src.mode_option}", dest=src.mode_option, type=switch, choices=SWITCH_CHOICES,
            default="auto",
            help=f"{src.label}: auto (when it is unavailable, {src.without}), required, off "
            "(the config's true/false also work)",
        )  # fmt: skip
    parser.add_argument(
        "--source-store", type=_store_dir, default=source_store.default_dir(), metavar="DIR|off",
        help="where what indexing the target's Python files found is kept, so the next run "
        "does not read and parse them again (default %(default)s; "
        "off: nowhere)",
    )  # fmt: skip
    parser.add_argument(
        "--by", choices=("codepath", "process"), default="codepath",
        help="table rows: per codepath (default), or per codepath with a row per process "
        "(pid, role main/worker, command) under each; the JSON always has both",
    )  # fmt: skip
    parser.add_argument(
        "--hide-zero", action="store_true",
        help="table rows: leave out the codepaths whose every figure is zero (the JSON "
        "keeps them)",
    )  # fmt: skip


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "serwatt profile [--rate HZ] [--json FILE] [--duration S] -- CMD ARGS...\n"
        "       serwatt profile --pid PID [--duration S] [--json FILE]"
    )
    parser.add_argument(
        "--pid", type=Number(int, min=1, max=PID_MAX_LIMIT),
        help="attach to this running Python process",
    )  # fmt: skip
    parser.add_argument(
        "--duration", type=Number(float, above=0, unit="s"), metavar="S",
        help="stop profiling after S s",
    )  # fmt: skip
    parser.add_argument(
        "--cpu-budget", type=_cpu_budget, default=None, metavar="CORES|off",
        help="the most CPU serwatt and its py-spy runs may use, in cores: after every window "
        "length the measured use sets the next windows' rates, every run lowered in "
        # argparse %-formats help texts: the percent sign is doubled
        f"proportion, never above --rate (default: {100 * DEFAULT_BUDGET_SHARE:g}%% of the CPUs "
        f"serwatt may run on, {default_budget_cores():g} here; off when --rate is given; "
        "off: always --rate)",
    )  # fmt: skip
    add_common_options(parser)
    # --rate given means that rate: the default budget applies only to the default rate
    parser.set_defaults(rate=None)
    parser.add_argument(
        "--record", type=Path, metavar="FILE",
        help="also append this session as a run to a run-record file (see `serwatt runs`)",
    )  # fmt: skip
    parser.add_argument(
        "--checkpoints", type=Path, metavar="DIR",
        help="the job's checkpoint directory: watched (inotify) from before the command starts "
        "until it exits, so a checkpoint is a file completed under DIR and a restore a read of "
        "one; with --record the receipts of its .many files are anchored in the run record "
        "(serwatt report --checkpoints DIR checks the chain against them)",
    )  # fmt: skip
    parser.add_argument(
        "--checkpoint-glob", metavar="GLOB",
        help="with --checkpoints: the file names that are checkpoints (fnmatch; default: names "
        "that do not start with '.' and do not end in '.tmp', so temp files do not count; "
        "DCP's .metadata does)",
    )  # fmt: skip
    parser.add_argument(
        "--run-id", metavar="ID",
        help="with --record: the run's id (default profile-<start time>-<pid>); "
        "name A/B runs so `serwatt report --baseline ID --candidate ID` reads them",
    )  # fmt: skip
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")


def validate_common(args: argparse.Namespace) -> ProfileSetup:
    """What the options' types (profiler/cli/argtypes.py) cannot check alone, then the
    session's parts opened (profiler/profile/setup.py), before any process starts."""
    if args.json is not None:
        parent = args.json.resolve().parent
        if not parent.is_dir():
            raise UsageError(f"--json {args.json}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise UsageError(f"--json {args.json}: directory {parent} is not writable")
        check_output_option("--json", args.json)
    for option in ("pprof", "flamegraph"):
        path = getattr(args, option, None)
        if path is not None:
            check_output_option(f"--{option}", path)
    if args.pyspy is not None and not (args.pyspy.is_file() and os.access(args.pyspy, os.X_OK)):
        raise UsageError(f"--pyspy {args.pyspy}: not an executable file")
    try:
        setup = ProfileSetup.open(profile_options(args))
    except SetupError as exc:
        raise UsageError(str(exc)) from None
    if setup.source_store is not None and setup.source_store.problem is not None:
        print(f"serwatt: note: {escape_text(setup.source_store.problem)}", file=sys.stderr)
    return setup


def _budget_cores(args: argparse.Namespace) -> float | None:
    """--cpu-budget as given; not given: the default share of the CPUs at the default
    rate, none when --rate was given (`serwatt demo` has no budget)."""
    if "cpu_budget" not in args:
        return None
    if args.cpu_budget is not None:
        return None if args.cpu_budget == OFF else float(args.cpu_budget)
    return default_budget_cores() if args.rate is None else None


def profile_options(args: argparse.Namespace) -> ProfileOptions:
    """The typed options of a command line that has add_common_options' (and maybe
    configure's --record, --run-id, --checkpoints, --checkpoint-glob)."""
    return ProfileOptions(
        rate_hz=DEFAULT_RATE_HZ if args.rate is None else args.rate,
        cpu_budget_cores=_budget_cores(args),
        window_s=args.window,
        timing_rate_hz=args.timing_rate,
        on_cpu_run=args.on_cpu_run,
        kernel_timeline=args.kernel_timeline,
        follow_children=not args.no_children,
        pyspy=args.pyspy,
        sampler_priority=args.sampler_priority,
        procfs=args.procfs,
        sysfs=args.sysfs,
        tdp_w=args.tdp,
        modes={str(s.mode_option): getattr(args, str(s.mode_option)) for s in with_mode()},
        record=getattr(args, "record", None),
        run_id=getattr(args, "run_id", None),
        checkpoints=getattr(args, "checkpoints", None),
        checkpoint_glob=getattr(args, "checkpoint_glob", None),
        source_store=args.source_store,
    )


def write_outputs(
    doc: dict[str, Any], args: argparse.Namespace, result: SessionResult | None = None
) -> int:
    """The --json file (and the stack files) first, then the table: a reader that closes
    stdout early (`| head`) ends the table, not the document."""
    rc = EXIT_OK
    table = render_table(
        doc,
        by_process=getattr(args, "by", "codepath") == "process",
        hide_zero=getattr(args, "hide_zero", False),
    )
    if result is not None and getattr(args, "pprof", None) is not None:
        data = pprof_bytes(
            result.stacks,
            started_at=result.info.started_at,
            duration_s=result.ended_at - result.info.started_at,
            rate_hz=result.info.rate_hz,
        )
        rc = _write_file("--pprof", args.pprof, data) or rc
    if result is not None and getattr(args, "flamegraph", None) is not None:
        page = render_page(
            result.stacks,
            title=f"pid {doc['target']['pid']}: {doc['target']['command'][:120]}",
            summary=f"{doc['duration_s']:.1f} s, {doc['cpu_s']:.2f} CPU-s sampled in "
            f"{len(result.stacks)} distinct stacks; frame width: CPU-s",
            table=table,
            episodes=result.episodes,
            started_at=result.info.started_at,
            duration_s=result.ended_at - result.info.started_at,
        )
        rc = _write_file("--flamegraph", args.flamegraph, page.encode("utf-8")) or rc
    if args.json is not None:
        text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
        try:
            safeio.write_text(args.json, text)
        except OSError as exc:
            # lose no data: the document goes to stderr when the file cannot be written
            shown = escape_text(f"cannot write {args.json}: {exc}", backslash=False)
            print(f"serwatt profile: {shown}", file=sys.stderr)
            print(text, file=sys.stderr)
            rc = EXIT_RUNTIME
    print(table)
    if sampled_nothing(doc):
        # a table of zeros that exits 0 reads as "no serialization" in a script
        print(
            "serwatt profile: error: nothing was sampled (see the table's first line)",
            file=sys.stderr,
        )
        return EXIT_RUNTIME
    return rc


def _write_file(option: str, path: Path, data: bytes) -> int:
    try:
        safeio.write_bytes(path, data)
    except OSError as exc:
        shown = escape_text(f"{option}: cannot write {path}: {exc}", backslash=False)
        print(f"serwatt profile: {shown}", file=sys.stderr)
        return EXIT_RUNTIME
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if args.pid is not None and cmd:
        raise UsageError("give either --pid PID or -- CMD ARGS..., not both")
    if args.pid is None and not cmd:
        raise UsageError(
            "missing command: use `serwatt profile -- CMD ARGS...` or `serwatt profile --pid PID`"
        )
    setup = validate_common(args)
    if args.pid is not None:
        return _profile_pid(args, setup)
    return _profile_command(args, cmd, setup)


def run_session(
    session: ProfileSession, child: subprocess.Popen[bytes] | None = None
) -> SessionResult:
    """Run a session so that Ctrl-C (SIGINT) and SIGTERM end it gracefully: the
    windows stop, what was sampled is classified and the table/JSON still come out.
    SIGTERM is passed on to a command serwatt launched (a terminal's Ctrl-C already
    reaches it through the process group)."""

    def on_signal(signum: int, frame: object) -> None:
        session.stop()
        if signum == signal.SIGTERM and child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return session.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _profile_pid(args: argparse.Namespace, setup: ProfileSetup) -> int:
    session = setup.session(args.pid, duration_s=args.duration)
    try:
        result = run_session(session)
    except BAD_INPUT_ERRORS as exc:
        raise UsageError(str(exc)) from exc
    except SamplingError as exc:
        print(f"serwatt profile: error: {escape_text(str(exc), backslash=False)}", file=sys.stderr)
        return EXIT_RUNTIME
    rc = write_outputs(setup.document(result), args, result)
    return delivery_rc(result) or rc


def delivery_rc(result: SessionResult) -> int:
    """A run whose windows did not all reach its sinks (a record that could not be
    written) ends with the error said and a non-zero exit, after its outputs."""
    problem = result.delivery_problem()
    if problem is None:
        return EXIT_OK
    print(f"serwatt profile: error: {escape_text(problem, backslash=False)}", file=sys.stderr)
    return EXIT_RUNTIME


def _profile_command(args: argparse.Namespace, cmd: list[str], setup: ProfileSetup) -> int:
    exe = cmd[0]
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise UsageError(f"command not found or not executable: {exe}")
    elif shutil.which(exe) is None:
        raise UsageError(f"command not found: {exe} (not on PATH)")
    try:
        proc = subprocess.Popen(cmd)
    except OSError as exc:
        raise UsageError(f"cannot run {exe}: {exc}") from exc
    session = setup.session(
        proc.pid,
        command=" ".join(cmd),
        proc=proc,
        duration_s=args.duration,
        root_may_be_wrapper=True,
    )
    try:
        result = run_session(session, proc)
    except BAD_INPUT_ERRORS as exc:
        _stop_child(proc)
        raise UsageError(str(exc)) from exc
    except SamplingError as exc:
        # raised once the session is over (the command's first window never sampled):
        # the command itself is not stopped for a failure of serwatt's
        print(f"serwatt profile: error: {escape_text(str(exc), backslash=False)}", file=sys.stderr)
        proc.wait()
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        _stop_child(proc)
        raise
    rc = write_outputs(setup.document(result), args, result)
    rc = delivery_rc(result) or rc
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        _stop_child(proc)
        code = proc.wait()
    if rc != EXIT_OK:
        return rc
    # a command killed by signal N exits like a shell reports it: 128 + N
    return 128 - code if code < 0 else code


def _stop_child(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
