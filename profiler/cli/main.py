"""`serwatt` command line: a thin dispatcher.

Each subcommand lives in its own module exposing `configure(parser)` and
`run(args) -> int`; modules are imported only when their subcommand runs, so
`serwatt many verify` does not pay for py-spy or NVML imports.

Exit codes (a contract): 0 ok, 1 runtime failure, 2 usage / bad input, 78 bad config.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys

from profiler import __version__
from profiler.exitcodes import EXIT_USAGE

# A reader that closed the pipe early (`serwatt many inspect F | head`): exit as a process
# killed by SIGPIPE reports, the shell's 128 + 13, quietly.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "profile": ("profiler.cli.profile", "profile one process (and its Python children)"),
    "demo": ("profiler.cli.demo", "torch.save against .many on a training loop, end to end"),
    "daemon": ("profiler.cli.daemon", "run the per-node service"),
    "check-config": ("profiler.cli.check_config", "validate a daemon config file"),
    "classify": ("profiler.cli.classify", "explain the codepath of each thread of one snapshot"),
    "check-rules": ("profiler.cli.check_rules", "validate codepath rule files"),
    "runs": ("profiler.cli.runs", "list and show recorded runs"),
    "report": ("profiler.cli.report", "the A/B report: baseline runs against candidate runs"),
    "ab": ("profiler.cli.ab", "A/B two commands (or torch.save against .many) in one go"),
    "many": ("profiler.cli.many", "inspect and verify .many checkpoints, make signing keys"),
}


class UsageError(Exception):
    """Bad input from the user: printed as `serwatt: error: …` with exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="serwatt", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"serwatt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    argv = sys.argv[1:]
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text)
        sp.set_defaults(_module=module_name)
        # Only the chosen subcommand's module is imported to add its options.
        if name in argv[:1]:
            importlib.import_module(module_name).configure(sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            code = _dispatch(argv)
        finally:
            # here, not at exit, where EPIPE would print "Exception ignored" (also after
            # argparse's --help, which exits through SystemExit)
            sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_broken():
            raise  # a pipe of serwatt's own (a socket, a child's stdin): a real failure
        # nothing more reaches the reader; the interpreter's own flush at exit must not fail
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code


def _stdout_broken() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll says POLLERR on its write end)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(ev & select.POLLERR for _, ev in poller.poll(0))


def _dispatch(argv: list[str] | None) -> int:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:])
    if not getattr(args, "_module", None):
        parser.print_help()
        return EXIT_USAGE
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args))
    except UsageError as exc:
        # a message quotes paths, run ids, labels, server text: escaped for the terminal
        from profiler.many.format import escape_text

        print(f"serwatt {args.command}: error: {escape_text(str(exc), backslash=False)}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
