"""The call-site prefilter (profiler/classify/prefilter.py CallsitePrefilter): a leaf's source file
is parsed only when its text can hold a call-site match. It must skip parses where it
can and never change a classification: every test here compares a Classifier with the
prefilter against one without it (`callsite_prefilter=False`, which parses every file).
"""

from __future__ import annotations

import ast
import json
import shutil
import sysconfig
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serwatt.collectors.samples import Frame, Sample
from serwatt.profiler.classify import source_index
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.codepaths import Classification
from serwatt.profiler.classify.prefilter import import_roots, required_words
from serwatt.profiler.classify.rules import load_rules
from tests.workloads.harness import samples_from_dump, samples_from_speedscope

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pyspy"


def _pair(**options: object) -> tuple[Classifier, Classifier]:
    return (
        Classifier.default(**options),
        Classifier.default(callsite_prefilter=False, **options),
    )


def _settled(classifier: Classifier, sample: Sample) -> Classification:
    """classify() once its sources are loaded. A load not done in SOURCE_WAIT_S answers
    NOT_READY ("other", low, not cached) by design; under a loaded parallel run a big
    live file (torch's _pytree.py) takes that long on one side only."""
    give_up = time.monotonic() + 60.0
    while time.monotonic() < give_up:
        before = classifier.stats.sources_not_ready
        got = classifier.classify(sample)
        if classifier.stats.sources_not_ready == before:
            return got
        time.sleep(0.05)
    raise AssertionError(f"sources still not ready after 60 s: {sample}")


def _same_every_line(path: Path, on: Classifier, off: Classifier) -> None:
    n = len(path.read_text().splitlines())
    for line in range(1, n + 1):
        for name in ("f", "<listcomp>"):  # a plain frame and a comprehension's own frame
            frames = (Frame(name, str(path), line),)
            assert on.classify_frames(frames) == off.classify_frames(frames), (path, line)
            assert on.explain(frames) == off.explain(frames), (path, line)


# ------------------------------------------------------------------ recorded samples


def test_recorded_fixtures_classify_the_same_with_and_without_prefilter(tmp_path: Path) -> None:
    """Every real recorded sample (dumps and speedscope, 3.10/3.11/3.12), with the
    capture-time sources behind a fake /proc/<pid>/root, as in test_classify_fixtures."""
    samples = []
    for p in sorted(FIXTURES.glob("*.json")):
        doc = json.loads(p.read_text())
        for path, copy in doc["sources"].items():
            dst = tmp_path / path.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(FIXTURES / copy, dst)
        for dump in doc["dumps"]:
            samples.extend(s for s in samples_from_dump(dump) if s.frames)
        if "speedscope" in doc:
            samples.extend(s for s in samples_from_speedscope(doc["speedscope"]) if s.frames)
    assert len(samples) > 300
    on, off = _pair()
    for s in samples:
        assert on.classify(s, proc_root=tmp_path) == off.classify(s, proc_root=tmp_path), s
        assert on.explain(s.frames, proc_root=tmp_path) == off.explain(
            s.frames, proc_root=tmp_path
        ), s
    # the same samples without the fake root: stdlib/site-packages leaves read live
    on2, off2 = _pair()
    for s in samples:
        assert _settled(on2, s) == _settled(off2, s), s
    assert on.stats.source_parses <= off.stats.source_parses
    assert on2.stats.sources_prefiltered > 0, "no leaf file was skipped"
    assert on2.stats.source_parses < off2.stats.source_parses


def test_stdlib_serializer_modules_every_line_the_same() -> None:
    """Real library files, both kinds: ones that call serializers (parsed) and ones that
    only mention them (skipped); every line, as a plain and a comprehension frame."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [
        stdlib / "multiprocessing" / "queues.py",  # relative import of ForkingPickler
        stdlib / "multiprocessing" / "connection.py",
        stdlib / "json" / "tool.py",
        stdlib / "shelve.py",  # from pickle import Pickler, Unpickler
        stdlib / "copyreg.py",  # mentions pickle, calls no serializer
        stdlib / "textwrap.py",  # no serializer at all
        stdlib / "queue.py",
    ]
    on, off = _pair()
    for f in files:
        _same_every_line(f, on, off)
    assert on.stats.sources_prefiltered >= 2  # textwrap, queue at least
    assert on.stats.source_parses < off.stats.source_parses


# ------------------------------------------------------------------ table


CASES = [
    # (source, line, parsed with the prefilter?, expected codepath)
    ("import pickle\nx = pickle.dumps(1)\n", 2, True, "pickle"),
    ("from pickle import loads as thaw\ny = thaw(b'')\n", 2, True, "pickle"),
    ("import pickle as pk\np = pk.Pickler(f)\np.dump(x)\n", 3, True, "pickle"),
    ("import \\\n    json\nout = json.dumps(\n    obj,\n)\n", 4, True, "json"),
    ("import msgpack\nclass P(msgpack.Packer):\n    pass\nb = P().pack(1)\n", 4, True, "msgpack"),
    ("def f(msg):\n    return msg.SerializeToString()\n", 2, True, "protobuf"),  # no import
    ("x = [1, 2]\ny = sorted(x)\n", 2, False, "other"),
    # mentions serializers only in comments/strings, imports none of them
    (
        "# see native_functions.yaml, numpy.save and pickle.dumps\ns = 'json.dumps'\n",
        2,
        False,
        "other",
    ),
    ("import os\n# yaml.safe_load(x) is not called here\nos.getcwd()\n", 3, False, "other"),
    # imports a serializer but never names a rule's call: nothing to match
    ("import json\nx = json.JSONDecodeError\nfoo(x)\n", 3, False, "other"),
    # `re` is bound by an import, `dumps` is written, but no rule is `re.dumps`
    ("import re\ndumps = re.compile\nv = dumps('x')\n", 3, False, "other"),
    ("import yaml\ndata = yaml.safe_load(text)\n", 2, True, "yaml"),
]


def test_table_parses_only_when_a_match_is_possible(tmp_path: Path) -> None:
    for k, (src, line, parsed, codepath) in enumerate(CASES):
        path = tmp_path / f"case{k}.py"
        path.write_text(src)
        on, off = _pair()
        frames = (Frame("f", str(path), line),)
        got = on.classify_frames(frames)
        assert got == off.classify_frames(frames), src
        assert got.codepath == codepath, src
        assert on.stats.source_parses == (1 if parsed else 0), src
        assert on.stats.sources_prefiltered == (0 if parsed else 1), src
        assert on.explain(frames) == off.explain(frames), src


def test_relative_import_inside_a_package_is_parsed(tmp_path: Path) -> None:
    """`from .reduction import ForkingPickler` in package `multiprocessing`: the name's
    root comes from the file's package, not its text."""
    pkg = tmp_path / "multiprocessing"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    src = pkg / "q.py"
    src.write_text("from .reduction import ForkingPickler\nb = ForkingPickler.loads(obj)\n")
    on, off = _pair()
    frames = (Frame("put", str(src), 2),)
    assert on.classify_frames(frames).codepath == "pickle"
    assert on.classify_frames(frames) == off.classify_frames(frames)
    assert on.stats.source_parses == 1


def test_syntax_error_explained_the_same(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("def f(:\n    pass\n")
    on, off = _pair()
    frames = (Frame("f", str(path), 2),)
    assert on.classify_frames(frames) == off.classify_frames(frames)
    assert on.stats.source_parses == 0  # the classification never needed the parse
    assert on.explain(frames) == off.explain(frames)
    assert "SyntaxError" in on.explain(frames).how


def test_a_regex_calls_rule_turns_the_prefilter_off(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(
        "schema: serwatt.codepaths/1\nrules:\n"
        "  - id: mine.call\n    codepath: pickle\n    layer: callsite\n"
        '    calls: ["re:.*\\\\.freeze"]\n'
    )
    src = tmp_path / "job.py"
    src.write_text("import icebox\nicebox.freeze(x)\n")
    on = Classifier.from_files([rules_file])
    off = Classifier.from_files([rules_file], callsite_prefilter=False)
    frames = (Frame("f", str(src), 2),)
    assert on.classify_frames(frames).codepath == "pickle"
    assert on.classify_frames(frames) == off.classify_frames(frames)
    assert on.stats.sources_prefiltered == 0


def test_required_words_and_import_roots() -> None:
    assert required_words("pickle.Pickler().dump") == ("pickle", {"pickle", "Pickler", "dump"})
    assert required_words("*_pb2.*.FromString") == (None, {"FromString"})
    assert required_words("yaml.*load*") == ("yaml", {"yaml"})
    assert required_words("re:.*") is None
    assert required_words("[ab].x") is None
    assert required_words("*") is None
    text = (
        "import a.b as c, d\nfrom e.f import (g,\n h)\nfrom . import x\n"
        "import \\\n  k\nif 1: import m; import n\n"
    )
    roots = import_roots(text, "pkg.sub")
    assert {"a", "d", "e", "pkg", "k", "m", "n"} <= roots
    assert "f" not in roots and "b" not in roots
    assert import_roots("x = 1\n", None) == set()


def test_builtin_rules_leave_the_prefilter_on() -> None:
    """If a built-in rule became a `re:` or wildcard-only calls pattern, every file would
    be parsed again; this says so."""
    c = Classifier.default()
    assert c._prefilter is not None and not c._prefilter.always
    assert load_rules([], builtin=True).layer("callsite")


# ------------------------------------------------------------------ generated programs

_MODULES = ["pickle", "json", "yaml", "msgpack", "os", "numpy", "google.protobuf.json_format"]
_ATTRS = ["dumps", "loads", "dump", "load", "Pickler", "Packer", "safe_load", "path", "save"]
_LOCALS = ["a", "b", "p", "thaw", "dumps", "msg"]
_METHODS = ["SerializeToString", "ParseFromString", "dump", "load", "pack", "append"]


@st.composite
def _statement(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 7))
    mod = draw(st.sampled_from(_MODULES))
    attr = draw(st.sampled_from(_ATTRS))
    local = draw(st.sampled_from(_LOCALS))
    if kind == 0:
        alias = draw(st.sampled_from(["", f" as {local}"]))
        return f"import {mod}{alias}"
    if kind == 1:
        return f"from {mod} import {attr} as {local}"
    if kind == 2:
        return f"{local} = {mod.split('.')[0]}.{attr}(x)"
    if kind == 3:
        return f"{local}.{draw(st.sampled_from(_METHODS))}(y)"
    if kind == 4:
        return f"z = {local}(\n    {draw(st.sampled_from(_LOCALS))}.{attr}(1),\n)"
    if kind == 5:
        return f"r = [{local}.{attr}(v) for v in w]"
    if kind == 6:
        return f"# {mod}.{attr}({local}) mentioned only"
    return f"def f({local}):\n    return {local}.{attr}(q)"


@pytest.mark.long  # many generated programs; the recorded fixtures' test stays
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_statement(), min_size=1, max_size=8))
def test_generated_programs_classify_the_same(tmp_path: Path, stmts: list[str]) -> None:
    src = "\n".join(stmts) + "\n"
    path = tmp_path / "gen.py"
    path.write_text(src)
    # a fresh pair per example: the file's path is reused with new contents
    on, off = _pair(stat_ttl_s=0.0)
    _same_every_line(path, on, off)


# ------------------------------------------------------------------ bounded parse

_TRICKY = '''\
import pickle

x = """
def not_code():
    pickle.dumps(1)
"""


@decorator
def f(a):
    return pickle.dumps(a)


if x:
    y = 1
else:
    y = 2
try:
    pass
except ValueError:
    pass
finally:
    pass
z = [
1, 2,
]
w = 1 + \\
2
class C:
    """doc
at column 0
"""
'''


def test_parse_source_builds_the_same_tree_as_ast_parse(monkeypatch) -> None:
    """Pieces of whole top-level statements, joined when a cut falls inside a string,
    give exactly ast.parse's tree (line and column attributes included)."""
    monkeypatch.setattr(source_index, "PARSE_CHUNK_LINES", 3)  # cut everywhere it may
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [_TRICKY * 3]
    for name in ("textwrap.py", "pickle.py", "json/decoder.py", "dataclasses.py"):
        texts.append((stdlib / name).read_text(encoding="utf-8"))
    for text in texts:
        assert ast.dump(source_index.parse_source(text), include_attributes=True) == ast.dump(
            ast.parse(text), include_attributes=True
        )


def test_parse_source_raises_the_whole_files_error(monkeypatch) -> None:
    monkeypatch.setattr(source_index, "PARSE_CHUNK_LINES", 2)
    text = "a = 1\nb = 2\nc = 3\ndef f(:\n    pass\nd = 4\n"
    with pytest.raises(SyntaxError) as got:
        source_index.parse_source(text, "x.py")
    with pytest.raises(SyntaxError) as want:
        ast.parse(text, "x.py")
    assert (got.value.msg, got.value.lineno) == (want.value.msg, want.value.lineno)


def test_parse_source_parses_in_pieces(monkeypatch) -> None:
    calls: list[int] = []
    real = ast.parse

    def counting(source: str, *args: object, **kwargs: object) -> ast.AST:
        calls.append(source.count("\n"))
        return real(source, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(source_index.ast, "parse", counting)
    text = "".join(f"v{i} = {i}\n" for i in range(2000))
    source_index.parse_source(text)
    assert len(calls) >= 2000 // source_index.PARSE_CHUNK_LINES
