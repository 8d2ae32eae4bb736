"""Rule files: the built-in file, user files, and every rejection naming file, line, reason."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from serwatt.collectors.samples import Frame
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.codepaths import SERIALIZATION_CODEPATHS
from serwatt.profiler.classify.rules import (
    SCHEMA,
    FunctionPatterns,
    PatternSet,
    RuleError,
    builtin_rules_path,
    load_rules,
    parse_rules_text,
)

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "extra.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_builtin_rules_load_and_cover_every_serialization_codepath() -> None:
    rules = load_rules([builtin_rules_path()])
    assert {r.codepath for r in rules.rules} == set(SERIALIZATION_CODEPATHS)
    ids = [r.id for r in rules.rules]
    assert len(ids) == len(set(ids))
    for layer in ("python", "native", "callsite"):
        assert rules.layer(layer), layer
    assert rules.callbacks.match("persistent_id")
    assert rules.callbacks.match("Obj.__reduce_ex__")
    assert not rules.callbacks.match("_reduce_ex_internal")


def test_packaged_rules_are_the_config_file() -> None:
    packaged = REPO / "profiler" / "codepaths.yaml"
    assert packaged.is_symlink()
    assert packaged.resolve() == (REPO / "configs" / "codepaths.yaml").resolve()
    assert builtin_rules_path().read_text() == (REPO / "configs" / "codepaths.yaml").read_text()


def test_user_rule_adds_a_codepath_without_code(tmp_path: Path) -> None:
    extra = write(
        tmp_path,
        f"""
        schema: {SCHEMA}
        rules:
          - id: team.arrow-ipc
            codepath: other-team
            layer: python
            file: x.py
        """,
    )
    with pytest.raises(RuleError) as err:
        Classifier.from_files([extra])
    assert f"{extra}:4:" in str(err.value)
    assert "unknown codepath 'other-team'" in str(err.value)

    extra = write(
        tmp_path,
        f"""
        schema: {SCHEMA}
        rules:
          - id: team.fastser
            codepath: pickle
            layer: callsite
            calls: ["fastser.encode", "fastser.decode"]
          - id: team.ckpt-writer
            codepath: torch
            layer: python
            file: "mycorp/ckpt/*.py"
            function: ["Writer.flush", "write_*"]
        """,
    )
    c = Classifier.from_files([extra])
    frame = Frame("Writer.flush", "/srv/app/mycorp/ckpt/io.py", 10)
    assert c.classify_frames((frame,)).rule_id == "team.ckpt-writer"
    # Pre-3.11 bare name of the same method.
    bare = Frame("flush", "/srv/app/mycorp/ckpt/io.py", 10)
    assert c.classify_frames((bare,)).codepath == "torch"
    src = tmp_path / "app.py"
    src.write_text("import fastser as fs\n\ndef f(x):\n    return fs.encode(x)\n")
    leaf = Frame("f", str(src), 4)
    assert c.classify_frames((leaf,)).rule_id == "team.fastser"


def test_user_rules_win_on_the_same_frame(tmp_path: Path) -> None:
    extra = write(
        tmp_path,
        f"""
        schema: {SCHEMA}
        rules:
          - id: team.json-is-protobuf
            codepath: protobuf
            layer: python
            file: json/encoder.py
            function: iterencode
            confidence: low
        """,
    )
    frame = Frame("JSONEncoder.iterencode", "/usr/lib/python3.12/json/encoder.py", 258)
    assert Classifier.default().classify_frames((frame,)).codepath == "json"
    got = Classifier.from_files([extra]).classify_frames((frame,))
    assert (got.codepath, got.rule_id, got.confidence) == (
        "protobuf",
        "team.json-is-protobuf",
        "low",
    )


S = "schema: serwatt.codepaths/1\n"
R = S + "rules:\n  - id: a\n    codepath: json\n"  # a rule open at line 3
PY = R + "    layer: python\n"

BAD = [
    # (text, line, reason fragment)
    (S + "rules: [\n", 3, "YAML syntax error"),
    (R + "\tlayer: python\n", 5, "YAML syntax error"),
    ("schema: serwatt.codepaths/9\n", 1, "unsupported schema 'serwatt.codepaths/9'"),
    ("rules: []\n", 1, "missing `schema: serwatt.codepaths/1`"),
    ("", 1, "empty rule file"),
    (S + "rulez: []\n", 2, "unknown top-level key 'rulez'"),
    (S + "rules:\n  - codepath: json\n    layer: python\n    file: a.py\n", 3, "rule has no `id`"),
    (S + "rules:\n  - id: a\n    codepath: jsonn\n", 4, "unknown codepath 'jsonn'"),
    (S + "rules:\n  - id: a\n    codepath: other\n", 4, "`other` is what unmatched samples get"),
    (PY + "    file: a.py\n    functoin: f\n", 7, "unknown key 'functoin'"),
    (PY + "    file: a.py\n    function: 're:foo(('\n", 7, "bad regex in function"),
    (PY + "    file: a.py\n" + R.split("rules:\n")[1], 7, "duplicate id 'a' (first at"),
    (R + "    layer: pythn\n    file: a.py\n", 5, "unknown layer 'pythn'"),
    (R + "    file: a.py\n", 3, "has no `layer`"),
    (PY, 3, "needs `file`"),
    (R + "    layer: native\n", 3, "needs `module` or `symbol`"),
    (R + "    layer: callsite\n", 3, "needs `calls` or `methods`"),
    (PY + "    file: []\n", 6, "file is an empty list"),
    (PY + "    file: {x: 1}\n", 6, "file must be a string"),
    (PY + "    file: a.py\n    confidence: medium\n", 7, "confidence must be high or low"),
    (PY + "    file: a.py\n    direction: sideways\n", 7, "direction must be encode, decode or"),
    (S + "rules:\n  - id: 'a b'\n    codepath: json\n", 3, "bad id 'a b'"),
    (R + "    id: b\n", 5, "duplicate key 'id'"),
    (S + "rules: {a: 1}\n", 2, "`rules` must be a list"),
    (S + "rules:\n  - just-a-string\n", 3, "a rule must be a mapping"),
    (S + "callbacks: ['re:[']\n", 2, "bad regex in callbacks"),
]


@pytest.mark.parametrize("text, line, reason", BAD, ids=[b[2][:30] for b in BAD])
def test_bad_rule_files_name_file_line_and_reason(
    tmp_path: Path, text: str, line: int, reason: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(RuleError) as err:
        Classifier.from_files([path])
    assert err.value.path == str(path)
    assert err.value.line == line, str(err.value)
    assert reason in err.value.reason, str(err.value)
    assert str(err.value).startswith(f"{path}:{line}: ")


def test_duplicate_id_of_a_builtin_rule_is_rejected(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        schema: {SCHEMA}
        rules:
          - id: pickle.call
            codepath: pickle
            layer: callsite
            calls: mypickle.dumps
        """,
    )
    with pytest.raises(RuleError) as err:
        Classifier.from_files([path])
    assert err.value.line == 3 and "duplicate id 'pickle.call'" in err.value.reason
    assert "codepaths.yaml:" in err.value.reason  # says where the first one is


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="no such rule file"):
        load_rules([tmp_path / "nope.yaml"])
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(RuleError, match="cannot read rule file"):
        load_rules([binary])


def test_yaml_syntax_error_line_matches_pyyaml(tmp_path: Path) -> None:
    text = "schema: serwatt.codepaths/1\nrules:\n  - id: a\n    codepath: [json\n"
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(text)
    with pytest.raises(RuleError) as err:
        parse_rules_text(text, "x.yaml")
    assert err.value.path == "x.yaml" and err.value.line is not None


def test_function_patterns_bare_and_qualified() -> None:
    fp = FunctionPatterns(["iterencode", "Packer.pack", "re:_iterencode_\\w+"])
    assert fp.match("iterencode")  # <3.11 bare
    assert fp.match("JSONEncoder.iterencode")  # 3.11+ qualname
    assert fp.match("Packer.pack")
    assert fp.match("pack")  # <3.11 bare name of Packer.pack
    assert not fp.match("Other.pack")  # a qualname of another class
    assert fp.match("_make_iterencode.<locals>._iterencode_dict")
    assert not fp.match("encode")


def test_file_patterns_are_path_suffixes() -> None:
    from serwatt.profiler.classify.rules import _suffix_patterns

    ps = _suffix_patterns(["json/encoder.py", "profiler/many/*.py"])
    assert ps.match("/usr/lib/python3.12/json/encoder.py")
    assert ps.match("json/encoder.py")  # py-spy short filename
    assert not ps.match("/srv/myjson/encoder.py")
    assert ps.match("/venv/site-packages/profiler/many/writer.py")


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=20))
def test_glob_patterns_match_themselves_literally(text: str) -> None:
    import glob

    pattern = glob.escape(text)
    if pattern.startswith("re:"):
        pattern = "[r]" + pattern[1:]  # a literal "re:..." glob (documented)
    assert PatternSet([pattern]).match(text)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes_the_loader(text: str) -> None:
    try:
        parse_rules_text(text, "fuzz.yaml")
    except RuleError as exc:
        assert str(exc).startswith("fuzz.yaml")


def test_check_rules_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`serwatt check-rules`: 0 and each file's rule ids, 78 with file:line, 2 for no file."""
    from serwatt.profiler.cli.main import main

    good = write(
        tmp_path,
        f"schema: {SCHEMA}\nrules:\n  - id: team.x\n    codepath: pickle\n"
        "    layer: callsite\n    calls: [fastser.encode]\n",
        "good.yaml",
    )
    assert main(["check-rules", str(good)]) == 0
    assert capsys.readouterr().out == f"ok: {good}: 1 rule(s): team.x\n"
    bad = write(tmp_path, f"schema: {SCHEMA}\nrules:\n  - id: a\n    codepath: nope\n", "bad.yaml")
    assert main(["check-rules", str(good), str(bad)]) == 78
    err = capsys.readouterr().err
    assert err.startswith(f"serwatt check-rules: {bad}:4: unknown codepath 'nope'"), err
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as usage:
        main(["check-rules"])
    assert usage.value.code == 2
    assert "the following arguments are required: FILE" in capsys.readouterr().err
