"""Numeric options take finite numbers only (issue 21, finding 9).

`--window nan` passed `window < 0.5` (every comparison with NaN is false) and the run
profiled nothing and exited 0. Every numeric option of every subcommand is parsed by one
argparse type (profiler/cli/argtypes.py), so NaN and ±inf are a usage error (exit 2)
naming the option, before any process starts.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from serwatt.profiler.cli import argtypes
from serwatt.profiler.cli.main import SUBCOMMANDS, main
from serwatt.profiler.exitcodes import EXIT_USAGE

REPO = Path(__file__).resolve().parents[2]


def serwatt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serwatt", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _profile_refuses(
    tmp_path: Path, option: str, value: str, run: Callable[..., tuple[Any, str]]
) -> None:
    marker = tmp_path / "ran"
    code, err = run(
        "profile", "--nvml", "off", f"{option}={value}", "--",
        sys.executable, "-c", f"open({str(marker)!r}, 'w')",
    )  # fmt: skip
    assert code == EXIT_USAGE, (code, err)
    assert f"argument {option}: " in err and "finite" in err, err
    assert "Traceback" not in err
    assert not marker.exists()  # nothing was started


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999"])
@pytest.mark.parametrize("option", ["--window", "--duration"])
def test_profile_refuses_a_non_finite_window_or_duration(
    tmp_path: Path, option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process, through the entry point's main()."""

    def run(*args: str) -> tuple[int | str | None, str]:
        try:
            code: int | str | None = main(list(args))
        except SystemExit as exc:
            code = exc.code
        return code, capsys.readouterr().err

    _profile_refuses(tmp_path, option, value, run)


def test_the_serwatt_command_refuses_a_nan_window(tmp_path: Path) -> None:
    """The same end to end, once: `python -m serwatt` in a process of its own."""

    def run(*args: str) -> tuple[int, str]:
        r = serwatt(*args)
        return r.returncode, r.stderr

    _profile_refuses(tmp_path, "--window", "nan", run)


def _parsers(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _subcommand_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for name, spec in SUBCOMMANDS.items():
        parser = argparse.ArgumentParser(prog=f"serwatt {name}")
        importlib.import_module(spec.module).configure(parser)
        yield from _parsers(parser, f"serwatt {name}")


def test_every_numeric_option_uses_the_finite_number_type() -> None:
    plain = [
        f"{path} {action.option_strings or action.dest}: type={action.type.__name__}"
        for path, parser in _subcommand_parsers()
        for action in parser._actions
        if action.type in (float, int, complex)
    ]
    assert plain == []


def _numeric_options() -> list[tuple[str, str]]:
    return [
        (path, action.option_strings[-1])
        for path, parser in _subcommand_parsers()
        for action in parser._actions
        if isinstance(action.type, argtypes.Number)
    ]


def test_the_options_that_take_numbers_are_the_ones_expected() -> None:
    # a guard on the guard above: it would pass over a CLI with no numeric option at all
    assert set(_numeric_options()) >= {
        ("serwatt profile", "--window"), ("serwatt profile", "--duration"),
        ("serwatt profile", "--rate"), ("serwatt profile", "--timing-rate"),
        ("serwatt profile", "--tdp"), ("serwatt profile", "--pid"),
        ("serwatt demo", "--duration"), ("serwatt demo", "--size"),
        ("serwatt demo", "--steps"), ("serwatt demo", "--every"), ("serwatt demo", "--window"),
    }  # fmt: skip


@pytest.mark.parametrize(("path", "option"), _numeric_options())
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_numeric_option_refuses_non_finite_values(
    path: str, option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = dict(_subcommand_parsers())[path]
    with pytest.raises(SystemExit) as info:
        parser.parse_args([f"{option}={value}"])
    assert info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"argument {option}: " in err and "finite" in err, err


def test_the_type_keeps_its_bounds_and_names_them() -> None:
    window = argtypes.Number(float, min=0.5, unit="s")
    assert window("0.5") == 0.5 and window(" 2 ") == 2.0
    with pytest.raises(argparse.ArgumentTypeError, match=r"at least 0\.5 s, got 0\.4"):
        window("0.4")
    rate = argtypes.Number(float, above=0, max=1000, unit="Hz")
    with pytest.raises(argparse.ArgumentTypeError, match="greater than 0 Hz"):
        rate("0")
    with pytest.raises(argparse.ArgumentTypeError, match="at most 1000 Hz"):
        rate("1000.5")
    count = argtypes.Number(int, min=1)
    assert count("40") == 40
    with pytest.raises(argparse.ArgumentTypeError, match="a whole number"):
        count("4.5")
    with pytest.raises(argparse.ArgumentTypeError, match="finite"):
        count("nan")
