"""Hostile rule files (issue 21, finding 10): every rule-file pattern is matched by RE2,
whose time is linear in the text, so no pattern can stall the classifier; a pattern RE2
cannot compile is refused naming the file, line and rule; a rule file has the config's
size bound and must be a regular file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serwatt.profiler.classify.rules import (
    SCHEMA,
    FunctionPatterns,
    PatternSet,
    RuleError,
    load_rules,
)
from serwatt.profiler.classify.rules import parse_rules_text as parse
from serwatt.profiler.yamlcheck import MAX_YAML_BYTES

REPO = Path(__file__).resolve().parents[2]


def _python_rule(function: str, file: str = "x.py") -> str:
    return (
        f"schema: {SCHEMA}\nrules:\n  - id: team.slow\n    codepath: json\n"
        f"    layer: python\n    file: {file}\n    function: '{function}'\n"
    )


def test_a_backtracking_pattern_matches_in_linear_time() -> None:
    """`(a+)+$` against 25 a's and a '!' takes Python's re 2**25 steps (seconds); RE2
    answers at once."""
    (rule,) = parse(_python_rule("re:(a+)+$")).rules
    assert rule.functions is not None
    name = "a" * 25 + "!"
    started = time.perf_counter()
    matched = rule.functions.match(name)
    took = time.perf_counter() - started
    assert not matched
    assert took < 0.05, f"one match took {took:.2f} s"
    assert rule.functions.match("aaaa")


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("re:(a)\\1", "backreferences"),
        ("re:foo(?=bar)", "lookahead"),
        ("re:(?<!x)y", "lookbehind"),
        ("re:(?!<module>).*", "lookahead"),
        ("re:a\\Z", "\\z"),
        ("re:(?>a+)b", "RE2"),
    ],
)
def test_a_pattern_re2_cannot_compile_is_refused_naming_rule_and_line(pattern, words) -> None:
    with pytest.raises(RuleError) as info:
        parse(_python_rule(pattern), "team.yaml")
    message = str(info.value)
    assert message.startswith("team.yaml:7: ")
    assert "'team.slow'" in message and "RE2" in message and words in message, message


def test_a_bad_regex_in_a_top_level_list_names_its_line() -> None:
    text = f"schema: {SCHEMA}\ncallbacks: ['re:(?=x)']\n"
    with pytest.raises(RuleError, match=r"^cb\.yaml:2: .*callbacks.*RE2"):
        parse(text, "cb.yaml")


def test_function_exclusions_say_any_function_but() -> None:
    fp = FunctionPatterns(["!<module>"])
    assert fp.match("save") and fp.match("Pickler.dump") and not fp.match("<module>")
    both = FunctionPatterns(["save*", "Packer.pack", "!save_module"])
    assert both.match("save_state") and both.match("Packer.pack") and both.match("pack")
    assert not both.match("save_module") and not both.match("load")


def test_an_exclusion_outside_function_patterns_is_refused() -> None:
    with pytest.raises(RuleError, match=r"x\.yaml:6: .*function patterns"):
        parse(_python_rule("save", file="'!x.py'"), "x.yaml")


@pytest.mark.parametrize(
    ("pattern", "text", "want"),
    [
        ("*.py", "a/b.py", True),
        ("*.py", "a/b.pyc", False),
        ("a?c", "abc", True),
        ("a?c", "a\nc", True),  # fnmatch's `?` matches a newline too
        ("[!a]x", "bx", True),
        ("[!a]x", "ax", False),
        ("[]]x", "]x", True),
        ("[a-c]", "b", True),
        ("[", "[", True),  # an unclosed bracket is literal, as in fnmatch
        ("a\\b", "a\\b", True),
        ("(x)+", "(x)+", True),
        ("*PyTorchStreamWriter*", "caffe2::serialize::PyTorchStreamWriter::write", True),
    ],
)
def test_globs_keep_fnmatch_meaning(pattern, text, want) -> None:
    import fnmatch

    assert fnmatch.fnmatchcase(text, pattern) is want  # the reference
    assert PatternSet([pattern]).match(text) is want


def test_a_rule_file_over_the_config_bound_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    filler = "# " + "x" * 76 + "\n"
    big.write_text(_python_rule("save") + filler * (4 * 1024 * 1024 // len(filler)))
    started = time.perf_counter()
    with pytest.raises(RuleError) as info:
        load_rules([big])
    assert time.perf_counter() - started < 1.0
    assert f"at most {MAX_YAML_BYTES} bytes" in str(info.value)
    assert str(info.value).startswith(str(big))


def test_a_fifo_rule_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "rules.yaml"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "serwatt", "check-rules", str(fifo)],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert done.returncode == 78, done.stderr
    assert "not a regular file" in done.stderr and done.stderr.count("\n") == 1


def test_the_builtin_rules_compile_under_re2() -> None:
    rules = load_rules([], builtin=True)
    (arena,) = [r for r in rules.rules if r.id == "many.arena"]
    assert arena.functions is not None
    assert arena.functions.match("save") and not arena.functions.match("<module>")
