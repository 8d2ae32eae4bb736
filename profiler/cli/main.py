"""serwatt's command line: each subcommand lives in its own module exposing
`configure(parser)` and `run(args) -> int`; modules are imported only when their
subcommand runs, so `serwatt many verify` does not pay for py-spy or NVML imports.

Exit codes (a contract): 0 ok, 1 runtime failure, 2 usage / bad input, 78 bad config.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from serwatt.profiler import __version__
from serwatt.profiler.exitcodes import EXIT_USAGE

# A reader that closed the pipe early (`serwatt many inspect F | head`): exit as a process
# killed by SIGPIPE reports, the shell's 128 + 13, quietly.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE

# What `serwatt --help` opens with: what serwatt is, for someone who has not read the README.
DESCRIPTION = """\
serwatt: how much CPU, energy and GPU idle time your training job spends on
serialization (pickle, json, torch.save, protobuf, ...), by codepath and direction.

It samples Python stacks with py-spy, reads CPU time from procfs, energy from RAPL
and GPU busy/idle from NVML, and attributes them to serialization codepaths: for one
command (`serwatt profile`) or for every matching process on a node (`serwatt daemon`).
"""

EPILOG = """\
examples:
  serwatt profile -- python train.py        profile one job and print the table
  serwatt demo                              torch.save against .many, end to end
  serwatt COMMAND --help                    a command's options and examples
"""


@dataclass(frozen=True)
class Subcommand:
    module: str
    help: str  # one line, in `serwatt --help`'s list
    description: str  # the head of `serwatt NAME --help`
    examples: tuple[tuple[str, str], ...]  # (command line, what it does)


SUBCOMMANDS: dict[str, Subcommand] = {
    "profile": Subcommand(
        "serwatt.profiler.cli.profile",
        "profile one process (and its Python children)",
        "Launch a command (or attach to a running Python process), sample its stacks until "
        "it exits, and print CPU-seconds, joules and GPU-wait seconds per serialization "
        "codepath. A wrapper that execs Python in the same process (env, pyenv shims, "
        "launchers) is followed.",
        (
            ("serwatt profile -- python train.py --epochs 1", "launch and profile a job"),
            ("serwatt profile --pid 4242 --duration 60", "attach for a minute"),
            (
                "serwatt profile --json out.json --pprof out.pb.gz -- python job.py",
                "also write the document and a pprof profile",
            ),
            (
                "serwatt profile --record runs.sqlite --run-id base-1 -- python job.py",
                "record the run for `serwatt report`",
            ),
        ),
    ),
    "demo": Subcommand(
        "serwatt.profiler.cli.demo",
        "torch.save against .many on a training loop, end to end",
        "Run a small training loop that checkpoints with torch.save and with .many, profile "
        "both, and write their run records and the A/B report.",
        (
            ("serwatt demo", "the default train demo under runs/demo"),
            ("serwatt demo --workload mixed --duration 10", "the mixed serialization demo"),
        ),
    ),
    "daemon": Subcommand(
        "serwatt.profiler.cli.daemon",
        "run the per-node service",
        "Profile every process on the node that the config's targets match, export "
        "Prometheus metrics and record runs. Usually started by systemd (configs/serwatt.service).",
        (
            ("serwatt daemon --config /etc/serwatt/serwatt.yaml", "run with a config file"),
            ("serwatt daemon --example-config > serwatt.yaml", "start from the example config"),
        ),
    ),
    "check-config": Subcommand(
        "serwatt.profiler.cli.check_config",
        "validate a daemon config file",
        "Check a daemon config (YAML) the way the daemon does at start, and print every "
        "problem with the key it is under.",
        (
            ("serwatt check-config /etc/serwatt/serwatt.yaml", "validate a config"),
            ("serwatt check-config -q configs/serwatt.example.yaml", "only errors, for scripts"),
            ("serwatt daemon --example-config | serwatt check-config -", "check piped YAML"),
        ),
    ),
    "classify": Subcommand(
        "serwatt.profiler.cli.classify",
        "explain the codepath of each thread of one snapshot",
        "Take one stack snapshot of a Python process (or read a saved `py-spy dump --json`) "
        "and say, per thread, which codepath it is in and which rule matched.",
        (
            ("serwatt classify --pid 4242", "one snapshot of a running process"),
            ("serwatt classify dump.json --rules my_rules.yaml", "a saved dump, extra rules"),
        ),
    ),
    "check-rules": Subcommand(
        "serwatt.profiler.cli.check_rules",
        "validate codepath rule files",
        "Check codepath rule files (YAML) as the classifier loads them.",
        (("serwatt check-rules my_rules.yaml", "validate one rule file"),),
    ),
    "runs": Subcommand(
        "serwatt.profiler.cli.runs",
        "list and show recorded runs",
        "List the runs in a run-record file (written by `serwatt profile --record` or the "
        "daemon) and show one run's totals.",
        (
            ("serwatt runs list --db runs.sqlite", "one line per run"),
            ("serwatt runs show --db runs.sqlite base-1", "one run's per-codepath totals"),
        ),
    ),
    "report": Subcommand(
        "serwatt.profiler.cli.report",
        "the A/B report: baseline runs against candidate runs",
        "Compare baseline runs with candidate runs (from run records or Prometheus): "
        "per-codepath CPU, energy and GPU-wait, checkpoint stall and restore, with "
        "confidence intervals and a verdict.",
        (
            (
                "serwatt report --db runs.sqlite --baseline b1 b2 --candidate c1 c2",
                "compare recorded runs",
            ),
            (
                "serwatt report --db runs.sqlite --baseline b1 --candidate c1 --html ab.html",
                "also write the HTML page",
            ),
        ),
    ),
    "ab": Subcommand(
        "serwatt.profiler.cli.ab",
        "A/B two commands (or torch.save against .many) in one go",
        "Run a baseline and a candidate command alternately under the profiler, record "
        "every run and print the A/B report.",
        (
            (
                "serwatt ab --baseline 'python job.py' --candidate 'python job.py --fast'",
                "two commands",
            ),
            (
                "serwatt ab --swap torch --checkpoints ckpt -- python train.py",
                "the job's torch.save against .many",
            ),
        ),
    ),
    "many": Subcommand(
        "serwatt.profiler.cli.many",
        "inspect and verify .many checkpoints, make signing keys",
        "Read a .many checkpoint's header and slots, verify its hashes, receipts and "
        "signatures, or make an Ed25519 signing key pair.",
        (
            ("serwatt many inspect ckpt/step-100.many", "header and slot table"),
            ("serwatt many verify ckpt/*.many", "hashes, receipts and the receipt chain"),
            ("serwatt many keygen signing", "write signing and signing.pub"),
        ),
    ),
    "completion": Subcommand(
        "serwatt.profiler.cli.completion",
        "print a shell completion script (bash or zsh)",
        "Print a completion script for bash or zsh, generated from serwatt's own parser "
        "(shtab), so every subcommand and option completes.",
        (
            ("serwatt completion bash > /etc/bash_completion.d/serwatt", "bash, system-wide"),
            ('serwatt completion zsh > "${fpath[1]}/_serwatt"', "zsh"),
            ('eval "$(serwatt completion bash)"', "bash, this shell only"),
        ),
    ),
}


class UsageError(Exception):
    """Bad input from the user: printed as `serwatt: error: …` with exit code 2."""


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an argument it does not know is an error with its own usage.
    argparse hands a subparser's unknown arguments up to the top-level parser, whose usage
    (`serwatt [-h] [--version] COMMAND ...`) says nothing about the subcommand's options."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def examples_text(examples: Sequence[tuple[str, str]]) -> str:
    width = max(len(cmd) for cmd, _ in examples)
    lines = [f"  {cmd:<{width}}  # {what}" if width <= 60 else f"  {cmd}\n      # {what}"
             for cmd, what in examples]  # fmt: skip
    return "examples:\n" + "\n".join(lines)


def build_parser(*, configure_all: bool = False) -> argparse.ArgumentParser:
    """The top-level parser; only the chosen subcommand's module is imported to add its
    options (all of them with `configure_all`, for shell completion)."""
    parser = argparse.ArgumentParser(
        prog="serwatt",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"serwatt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    argv = sys.argv[1:]
    for name, spec in SUBCOMMANDS.items():
        sp = sub.add_parser(
            name,
            help=spec.help,
            description=textwrap.fill(spec.description, 80),
            epilog=examples_text(spec.examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sp.set_defaults(_module=spec.module)
        if configure_all or name in argv[:1]:
            importlib.import_module(spec.module).configure(sp)
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
        from serwatt.profiler.terminal_escape import escape_text

        print(f"serwatt {args.command}: error: {escape_text(str(exc), backslash=False)}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
