"""`serwatt` in the test's own process: `profiler.cli.main.main()` with an argv, its exit
code and what it printed. It saves an interpreter start and serwatt's imports (0.9-2 s
a run of `runs list` on the 2-vCPU VM under load), and a traceback is an exception
here. Each command keeps one subprocess test that runs `python -m serwatt` as a user
does."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from serwatt.profiler.cli.main import main


@dataclass(frozen=True)
class Ran:
    """The fields of subprocess.CompletedProcess the tests read."""

    returncode: int
    stdout: str
    stderr: str


def serwatt(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """main(argv) as `serwatt ARGV...` would run; argparse's exits (usage errors: 2,
    --help: 0) are exit codes, as they are for the console script."""
    capsys.readouterr()  # only this run's output
    saved = sys.argv  # main() rewrites it
    try:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.argv = saved
    out = capsys.readouterr()
    return Ran(code, out.out, out.err)
