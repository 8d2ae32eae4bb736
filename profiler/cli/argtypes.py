"""The argparse type of every numeric option (finite numbers within the option's bounds),
and the check of every output-file option.

`float("nan")` parses, and every comparison with NaN is false, so a bound written as
`if window < 0.5: refuse` let `--window nan` through (and the run profiled nothing);
`float("inf")` and `1e999` pass a lower bound. Here NaN and ±inf are refused outright, and
the bounds are checked in one place, so argparse reports `argument --window: ...` with
exit code 2 before anything starts.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from serwatt.profiler import safeio
from serwatt.profiler.cli.main import UsageError

PID_MAX_LIMIT = 4_194_304  # the kernel's largest pid_max (2**22): the bound of every --pid


class Number:
    """`type=` for an option taking an int or a float: finite, and within the bounds given
    (`min`/`max` inclusive, `above` exclusive). `unit` is named in the messages."""

    def __init__(
        self,
        kind: type[int] | type[float],
        *,
        min: float | None = None,  # noqa: A002 (the bound's own name reads best at call sites)
        max: float | None = None,  # noqa: A002
        above: float | None = None,
        unit: str = "",
    ) -> None:
        self.kind = kind
        self.min, self.max, self.above = min, max, above
        self.unit = f" {unit}" if unit else ""
        self.__name__ = f"finite {kind.__name__}"  # argparse names the type in its errors

    def __call__(self, text: str) -> int | float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        number: int | float = value
        if self.kind is int:
            try:
                number = int(text.strip().replace("_", ""), 10)
            except ValueError:
                raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        self._check_bounds(number, text)
        return number

    def _check_bounds(self, number: float, text: str) -> None:
        def show(bound: float) -> str:
            return f"{bound:g}{self.unit}"

        if self.above is not None and not number > self.above:
            raise argparse.ArgumentTypeError(f"must be greater than {show(self.above)}, got {text}")
        if self.min is not None and not number >= self.min:
            raise argparse.ArgumentTypeError(f"must be at least {show(self.min)}, got {text}")
        if self.max is not None and not number <= self.max:
            raise argparse.ArgumentTypeError(f"must be at most {show(self.max)}, got {text}")


def check_output_option(option: str, path: Path) -> None:
    """Raise UsageError now when the output file an option names could not be written
    safely (profiler/safeio.py), so a run does not do its work and then fail to save it."""
    try:
        safeio.check_output_path(path)
    except safeio.UnsafePathError as exc:  # its message names the path and the fix
        raise UsageError(f"{option} {exc}") from None
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None


SWITCH_CHOICES = ("auto", "required", "off")
# the config file's words for the same switches (collectors.*.enabled, sampler_priority)
_SWITCH_ALIASES = {"true": "required", "false": "off"}


def switch(text: str) -> str:
    """auto | required | off, as the config says them too (true / false accepted)."""
    return _SWITCH_ALIASES.get(text.lower(), text.lower())


def add_report_view_options(parser: argparse.ArgumentParser, cluster_metavar: str) -> None:
    """What an A/B report prints, the same for `serwatt report` and `serwatt ab`: the
    first screen or --full, and the cluster projection only when asked."""
    parser.add_argument(
        "--cluster", type=Path, metavar=cluster_metavar,
        help="project the saving onto a cluster with these assumptions (an estimate; "
        "off unless asked)",
    )  # fmt: skip
    parser.add_argument(
        "--full", action="store_true",
        help="print every detail below the first table (the method, each caveat and warning, "
        "the checkpoint and codepath tables); the JSON and HTML always have them",
    )  # fmt: skip
    parser.add_argument(
        "--project", action="store_true",
        help="project the saving onto the documented default cluster (an estimate)",
    )  # fmt: skip
