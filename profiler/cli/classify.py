"""`serwatt classify`: what the codepath rules make of every thread of one stack snapshot.

`--pid PID` takes one `py-spy dump --json` of a live process (its sources read through
/proc/PID/root); `DUMP.json` reads a saved one. For each thread: its codepath, the rule
and confidence, and the frame that decided (or why nothing matched). Frame and thread
names come from the target: they are printed escaped.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from serwatt.collectors.pyspy import (
    NotPython,
    PtraceDenied,
    PySpy,
    SamplingError,
    TargetGone,
    UnsupportedPython,
)
from serwatt.collectors.pyspy.dump import DumpError, DumpThread, parse_dump
from serwatt.profiler import safeio
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.rules import RuleError
from serwatt.profiler.cli.argtypes import PID_MAX_LIMIT, Number
from serwatt.profiler.cli.main import UsageError
from serwatt.profiler.exitcodes import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME
from serwatt.profiler.terminal_escape import escape_text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "serwatt classify --pid PID [--rules FILE]... [--pyspy PATH]\n"
        "       serwatt classify DUMP.json [--rules FILE]... [--proc-root DIR]"
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--pid", type=Number(int, min=1, max=PID_MAX_LIMIT),
        help="take one `py-spy dump --json` of this running Python process",
    )  # fmt: skip
    src.add_argument("dump", nargs="?", type=Path, help="a saved `py-spy dump --json` file")
    parser.add_argument(
        "--rules", type=Path, action="append", default=[], metavar="FILE",
        help="an extra rule file (repeatable), as the daemon's classify.rules_files",
    )  # fmt: skip
    parser.add_argument(
        "--proc-root", type=Path, metavar="DIR",
        help="read the sources the frames name under this root (default: /proc/PID/root "
        "with --pid, the host's paths for a dump file)",
    )  # fmt: skip
    parser.add_argument(
        "--pyspy", type=Path, metavar="PATH", help="py-spy binary (default: the one installed)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        classifier = Classifier.from_files(args.rules)
    except RuleError as exc:
        print(f"serwatt classify: {escape_text(str(exc), backslash=False)}", file=sys.stderr)
        return EXIT_CONFIG
    proc_root = args.proc_root
    if args.pid is not None:
        try:
            text = PySpy(args.pyspy).dump_json(args.pid)
        except (TargetGone, NotPython, UnsupportedPython, PtraceDenied) as exc:
            raise UsageError(str(exc)) from None  # a --pid serwatt cannot read: bad input
        except SamplingError as exc:
            shown = escape_text(str(exc), backslash=False)
            print(f"serwatt classify: error: {shown}", file=sys.stderr)
            return EXIT_RUNTIME
        proc_root = proc_root or Path(f"/proc/{args.pid}/root")
    else:
        try:  # the one bounded open of a file argument: a FIFO or device is refused
            text = safeio.read_bounded(args.dump, max_bytes=safeio.MAX_JSON_BYTES).decode()
        except (safeio.InputFileError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {args.dump}: {exc}") from None
    try:
        threads = parse_dump(text)
    except DumpError as exc:
        raise UsageError(str(exc)) from None
    for thread in threads:
        print("\n".join(explained(classifier, thread, proc_root)))
    return EXIT_OK


def explained(classifier: Classifier, thread: DumpThread, proc_root: Path | None) -> list[str]:
    """A thread's classification and the frame that decided it, escaped for a terminal."""
    ex = classifier.explain(thread.frames, proc_root=proc_root)
    c = ex.classification
    lines = [
        f"thread {escape_text(thread.tid)} '{escape_text(thread.name)}': {c.codepath}"
        f"  rule={c.rule_id or '-'}  confidence={c.confidence}"
    ]
    if ex.frame_index is not None:
        f = thread.frames[ex.frame_index]
        where = f"{f.filename}:{f.line}" if not f.module else os.path.basename(f.module)
        lines.append(
            f"    decided by frame {ex.frame_index}: {escape_text(f.name)} "
            f"({escape_text(where)}) [{escape_text(ex.how)}]"
        )
    else:
        lines.append(f"    {escape_text(ex.how)}")
    return lines
