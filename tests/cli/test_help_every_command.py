"""`--help` and an unknown option for every subcommand, found by walking the parser, so a
new subcommand (or a nested action such as `many verify`) is covered without editing this
file. Each answers with its own usage, never a traceback or the top-level usage."""

from __future__ import annotations

import argparse

import pytest

from serwatt.profiler.cli.main import SUBCOMMANDS, build_parser
from tests.serwatt_cli import serwatt


def _command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _command_paths(sub, (*prefix, name))


PATHS = sorted(_command_paths(build_parser(configure_all=True)))


def test_the_walk_finds_every_subcommand_and_nested_actions() -> None:
    tops = {p[0] for p in PATHS}
    assert tops == set(SUBCOMMANDS)
    assert ("many", "verify") in PATHS and ("runs", "list") in PATHS


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_help_exits_0_with_its_own_usage(capsys: pytest.CaptureFixture[str], path) -> None:
    ran = serwatt(capsys, *path, "--help")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(f"usage: serwatt {' '.join(path)}"), ran.stdout[:200]
    assert "Traceback" not in ran.stderr


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_unknown_option_exits_2_with_its_own_usage(
    capsys: pytest.CaptureFixture[str], path
) -> None:
    ran = serwatt(capsys, *path, "--no-such-option")
    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    # its own usage: `serwatt profile --bogus` printed `usage: serwatt [-h] [--version] ...`
    assert ran.stderr.startswith(f"usage: serwatt {' '.join(path)}"), ran.stderr[:300]
    assert f"serwatt {' '.join(path)}: error:" in ran.stderr
    assert "Traceback" not in ran.stderr


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_subcommand_has_a_description_and_examples(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    out = serwatt(capsys, name, "--help").stdout
    description = out.split("\n\n")[1]
    assert len(description) > 40 and not description.lstrip().startswith(
        ("positional", "options")
    ), out[:400]
    examples = out[out.index("\nexamples:\n") :].splitlines()[1:]
    assert any(line.strip().startswith(f"serwatt {name}") for line in examples), out[-600:]


def test_top_level_help_says_what_serwatt_is(capsys: pytest.CaptureFixture[str]) -> None:
    ran = serwatt(capsys, "--help")
    assert ran.returncode == 0
    first = ran.stdout.split("\n\n")[1]
    assert first.startswith("serwatt: how much CPU, energy and GPU idle time"), first
    assert "dispatcher" not in ran.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_names_subcommands_and_their_options(
    capsys: pytest.CaptureFixture[str], shell: str
) -> None:
    ran = serwatt(capsys, "completion", shell)
    assert ran.returncode == 0, ran.stderr
    for word in ("profile", "check-config", "--cpu-budget", "--swap", "keygen"):
        assert word in ran.stdout, word
