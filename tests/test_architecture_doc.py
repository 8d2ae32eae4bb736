"""docs/architecture.md stays current: every package under profiler/ and collectors/ is
named in it, and every `serwatt` subcommand (nested ones included) has a section there
that names each of its options.

The commands and options come from the real parser (`profiler.cli.main.build_parser`),
built in-process, so a subcommand or option added to the CLI without a line in the doc
fails here, and so does a section left behind for a subcommand that is gone.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest

from serwatt.profiler.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
PACKAGE_ROOTS = ("profiler", "collectors")
# `#### \`serwatt runs list\`` opens the section of one command
SECTION = re.compile(r"^#### `(serwatt(?: [a-z][a-z-]*)*)`[ \t]*$", re.MULTILINE)


def packages() -> list[str]:
    """Every package (a directory with __init__.py) under the roots, as `profiler/a/b`."""
    found = []
    for root in PACKAGE_ROOTS:
        for init in sorted((REPO / root).rglob("__init__.py")):
            rel = init.parent.relative_to(REPO)
            if "__pycache__" not in rel.parts:
                found.append(rel.as_posix())
    return found


def named(doc: str, package: str) -> bool:
    """`profiler/a/b` named as a path (`profiler/a/b`, `profiler/a/b/`) or dotted
    (`profiler.a.b`), not merely as the prefix of a longer one (`profiler/a/b2`,
    `profiler.a.b.c`); a module path inside it (`profiler/a/b/c.py`) does not count."""
    path = re.escape(package)
    dotted = re.escape(package.replace("/", "."))
    as_path = rf"(?<![\w/.]){path}(?:/(?![\w.-])|(?![\w/.-]))"
    as_dotted = rf"(?<![\w/.]){dotted}(?!\.?\w)"
    return re.search(as_path, doc) is not None or re.search(as_dotted, doc) is not None


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: p for a in actions for name, p in a.choices.items()}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    """The options of one parser, each by its long form (its first form when it has none);
    -h/--help, which argparse adds to every parser, is left out."""
    opts = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        long = [s for s in action.option_strings if s.startswith("--")]
        opts.append(long[0] if long else action.option_strings[0])
    return opts


def commands(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """`serwatt …` command -> its options, for the top level and every subcommand, nested
    ones included. build_parser adds only the chosen subcommand's options (it imports that
    module alone), so it is built once per top-level subcommand with that name in argv."""
    monkeypatch.setattr(sys, "argv", ["serwatt"])
    top = cli_main.build_parser()
    found = {"serwatt": _options(top)}
    for name in _subcommands(top):
        monkeypatch.setattr(sys, "argv", ["serwatt", name])
        todo = [(f"serwatt {name}", _subcommands(cli_main.build_parser())[name])]
        while todo:
            command, parser = todo.pop()
            found[command] = _options(parser)
            todo += [(f"{command} {n}", p) for n, p in _subcommands(parser).items()]
    return found


def sections(doc: str) -> dict[str, str]:
    """`serwatt …` -> the text of its section, up to the next heading of any level."""
    found = {}
    for match in SECTION.finditer(doc):
        rest = doc[match.end() :]
        end = re.search(r"^#{1,4} ", rest, re.MULTILINE)
        found[match.group(1)] = rest[: end.start()] if end else rest
    return found


def mentions(text: str, option: str) -> bool:
    # `--rate` must not be read off `--timing-rate`, nor `--baseline` off `--baseline-range`
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def test_every_package_is_named() -> None:
    doc = DOC.read_text()
    found = packages()
    assert "profiler/report" in found and "collectors/pyspy" in found  # the walk finds them
    missing = [p for p in found if not named(doc, p)]
    assert not missing, f"packages not named in {DOC.name}: {missing}"


def test_every_subcommand_has_a_section(monkeypatch: pytest.MonkeyPatch) -> None:
    cli = commands(monkeypatch)
    assert {"serwatt profile", "serwatt runs list", "serwatt many keygen"} <= set(cli)
    documented = sections(DOC.read_text())
    missing = sorted(set(cli) - set(documented))
    stale = sorted(set(documented) - set(cli))
    assert not missing and not stale, (
        f"{DOC.name}: commands without a '#### `serwatt …`' section: {missing}; "
        f"sections for commands serwatt does not have: {stale}"
    )


def test_every_option_is_in_its_commands_section(monkeypatch: pytest.MonkeyPatch) -> None:
    cli = commands(monkeypatch)
    assert "--timing-rate" in cli["serwatt profile"] and "--version" in cli["serwatt"]
    documented = sections(DOC.read_text())
    missing = {
        command: [o for o in options if not mentions(documented.get(command, ""), o)]
        for command, options in cli.items()
    }
    missing = {c: opts for c, opts in missing.items() if opts}
    assert not missing, f"options not named in their command's section of {DOC.name}: {missing}"


def test_the_checks_can_fail() -> None:
    """The matchers reject near misses, so a passing test means the names are there."""
    assert named("`profiler/report/` builds", "profiler/report")
    assert named("the `profiler.report` layer.", "profiler/report")
    assert not named("profiler/report/build.py", "profiler/report")
    assert not named("serwatt.profiler.report.build", "profiler/report")
    assert not named("profiler/reports", "profiler/report")
    assert mentions("| `--rate HZ` |", "--rate")
    assert not mentions("`--timing-rate HZ`", "--rate")
    assert not mentions("`--baseline-range RANGE`", "--baseline")
    doc = "#### `serwatt runs list`\n\n`--json`\n\n#### `serwatt runs show`\n\n`--windows`\n"
    assert sections(doc) == {"serwatt runs list": "\n\n`--json`\n\n", "serwatt runs show":
                             "\n\n`--windows`\n"}  # fmt: skip


def test_the_readme_is_a_users_guide_with_at_most_eight_headline_figures() -> None:
    # issue 23 ask 5: at most 200 lines, and a headline table of at most 8 measured
    # figures, each with the command that measures it; the rest live in docs/benchmarks.md
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200, len(text.splitlines())
    table = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]  # less the head
    assert 0 < len(rows) <= 8, rows
    for row in rows:
        command = row.rstrip(" |").rsplit(" | ", 1)[1]
        assert "`" in command, row  # each figure names its command
