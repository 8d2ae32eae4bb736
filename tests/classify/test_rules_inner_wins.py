"""`inner_wins: true`: a storage-layer rule decides even inside another rule's scope.

The real stacks (DCP over `.many` and over FileSystemWriter) are in tests/many/test_many_dcp.py;
these pin the rule: its parsing, which frame decides when several are marked, native frames,
and that an unmarked inner rule still loses to the outer scope.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from serwatt.collectors.samples import Frame
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.rules import RuleError, load_rules, parse_rules_text

SITE = "/usr/lib/python3/dist-packages"

RULES = """\
schema: serwatt.codepaths/1
rules:
  - id: fw.save
    codepath: torch
    layer: python
    file: "fw/*.py"
    function: [save]
  - id: store.a
    codepath: many
    layer: python
    file: "store_a/*.py"
    inner_wins: true
  - id: store.b
    codepath: safetensors
    layer: python
    file: "store_b/*.py"
    inner_wins: true
  - id: plain.json
    codepath: json
    layer: python
    file: "plainjson/*.py"
  - id: store.native
    codepath: numpy
    layer: native
    module: "libstore*.so"
    inner_wins: yes
"""


def _classifier(text: str = RULES) -> Classifier:
    return Classifier(parse_rules_text(text))


def _stack(*names: str) -> tuple[Frame, ...]:
    """Leaf first: each name is `dir/func`, or `lib:symbol` for a native frame."""
    out = []
    for n in names:
        if ":" in n:
            lib, sym = n.split(":")
            out.append(Frame(sym, "", 0, f"/usr/lib/{lib}"))
        else:
            d, func = n.split("/")
            out.append(Frame(func, f"{SITE}/{d}/mod.py", 10))
    return (*out, Frame("main", "/srv/train.py", 5))


def test_marked_inner_frame_decides_inside_an_outer_scope() -> None:
    c = _classifier()
    got = c.explain(_stack("store_a/write", "fw/save"))
    assert (got.classification.codepath, got.classification.rule_id) == ("many", "store.a")
    assert got.frame_index == 0
    assert got.how == "python, inner_wins inside rule fw.save's scope"
    assert c.classify_frames(_stack("store_a/write", "fw/save")).rule_id == "store.a"


def test_unmarked_inner_frame_still_loses_to_the_outer_scope() -> None:
    c = _classifier()
    got = c.classify_frames(_stack("plainjson/dumps", "fw/save"))
    assert (got.codepath, got.rule_id) == ("torch", "fw.save")
    # The outer scope alone, and the marked layer alone.
    assert c.classify_frames(_stack("fw/save")).rule_id == "fw.save"
    assert c.classify_frames(_stack("store_a/write")).rule_id == "store.a"


def test_outermost_of_several_marked_frames_decides() -> None:
    c = _classifier()
    got = c.explain(_stack("store_a/write", "store_b/flush", "fw/save"))
    assert got.classification.rule_id == "store.b" and got.frame_index == 1
    got = c.explain(_stack("store_b/flush", "store_a/write", "fw/save"))
    assert got.classification.rule_id == "store.a" and got.frame_index == 1
    # An unmarked frame between them changes nothing.
    got = c.explain(_stack("store_a/write", "plainjson/dumps", "fw/save"))
    assert got.classification.rule_id == "store.a"


def test_marked_frame_outermost_itself_decides_as_before() -> None:
    got = _classifier().explain(_stack("fw/save", "store_a/write"))
    assert got.classification.rule_id == "store.a" and got.how == "python"


def test_native_marked_frame_below_the_outer_scope() -> None:
    got = _classifier().explain(_stack("libstore.so:store_put", "fw/save"))
    assert got.classification.rule_id == "store.native"
    assert got.how == "native, inner_wins inside rule fw.save's scope"


@pytest.mark.parametrize(
    ("snippet", "reason"),
    [
        ('    inner_wins: "true"\n', "inner_wins must be true or false in rule 'x'"),
        ("    inner_wins: [true]\n", "inner_wins must be true or false in rule 'x'"),
        ("    inner_wins: 1\n", "inner_wins must be true or false in rule 'x'"),
    ],
)
def test_bad_inner_wins_values_are_rule_errors(snippet: str, reason: str) -> None:
    text = (
        "schema: serwatt.codepaths/1\nrules:\n  - id: x\n    codepath: many\n"
        "    layer: python\n    file: a.py\n" + snippet
    )
    with pytest.raises(RuleError) as err:
        parse_rules_text(text, "u.yaml")
    assert err.value.line == 7 and err.value.reason == reason


def test_inner_wins_on_a_callsite_rule_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "u.yaml"
    p.write_text(
        "schema: serwatt.codepaths/1\nrules:\n  - id: x\n    codepath: json\n"
        "    layer: callsite\n    calls: [fast.dumps]\n    inner_wins: true\n"
    )
    with pytest.raises(RuleError) as err:
        load_rules([p], builtin=True)
    assert err.value.line == 7
    assert "inner_wins applies to python and native rules, not to callsite rule 'x'" in str(
        err.value
    )


def test_false_is_the_default_and_the_builtin_marks_only_many_arena() -> None:
    text = RULES.replace("inner_wins: true", "inner_wins: false").replace("yes", "no")
    c = _classifier(text)
    assert c.classify_frames(_stack("store_a/write", "fw/save")).rule_id == "fw.save"
    marked = [r.id for r in load_rules([], builtin=True).rules if r.inner_wins]
    assert marked == ["many.arena"]
