"""`serwatt demo`: profile the built-in mixed workload for ~20 s and print the table.

The workload (profiler/workloads/demo.py) runs in a separate Python process, the
same way a training script would, and is profiled through the same session as
`serwatt profile -- python -m profiler.workloads.demo`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from collectors.pyspy import SamplingError
from profiler.cli.main import UsageError
from profiler.cli.profile import (
    BAD_INPUT_ERRORS,
    add_common_options,
    document,
    make_classifier,
    make_pyspy,
    run_session,
    sinks,
    validate_common,
    write_outputs,
)
from profiler.exitcodes import EXIT_RUNTIME
from profiler.profile.session import ProfileSession


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=20.0, metavar="S",
        help="how long the workload runs (default 20)",
    )  # fmt: skip
    add_common_options(parser)


def run(args: argparse.Namespace) -> int:
    validate_common(args)
    spy = make_pyspy(args)
    classifier = make_classifier()
    cmd = [sys.executable, "-m", "profiler.workloads.demo", "--duration", f"{args.duration:g}"]
    print(f"serwatt demo: profiling `{' '.join(cmd)}` at {args.rate:g} Hz", file=sys.stderr)
    proc = subprocess.Popen(cmd)
    session = ProfileSession(
        proc.pid,
        classifier=classifier,
        rate_hz=args.rate,
        window_s=args.window,
        command="python -m profiler.workloads.demo",
        pyspy=spy,
        procfs=args.procfs,
        tracker=args.tracker,
        sinks=sinks(args),
        follow_children=not args.no_children,
        root_exit_check=lambda: proc.poll() is not None,
        on_cpu_run=args.on_cpu_run,
    )
    try:
        result = run_session(session, proc)
    except BAD_INPUT_ERRORS as exc:
        proc.kill()
        proc.wait()
        raise UsageError(str(exc)) from exc
    except SamplingError as exc:
        # serwatt's own sampling failed (not the user's input): say so, stop the workload
        proc.kill()
        proc.wait()
        print(f"serwatt demo: error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    finally:
        if proc.poll() is None:
            proc.wait()
    rc = write_outputs(document(result, args), args)
    if proc.returncode != 0:
        print(f"serwatt demo: the workload exited with {proc.returncode}", file=sys.stderr)
        return EXIT_RUNTIME
    return rc
