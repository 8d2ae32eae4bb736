"""Call-site reading (profiler/classify/callsite.py, source_index.py, source_cache.py) and
layer C of the classifier on real files."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from serwatt.collectors.samples import Frame
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.source_cache import SourceCache
from serwatt.profiler.classify.source_index import SourceIndex
from serwatt.profiler.classify.target_files import source_path
from tests.daemon_fakes import give_root_creds

SRC = textwrap.dedent(
    """
    import pickle as pk
    import json, msgpack
    from pickle import loads as thaw, dumps
    import google.protobuf.json_format
    from google.protobuf import descriptor_pb2 as d2
    import orjson as oj
    import torch


    def alias(x):
        return pk.dumps(x)


    def from_alias(b):
        return thaw(b)


    def multi(x):
        blob = pk.dumps(
            x,
            protocol=5,
        )
        return blob


    def mixed(xs):
        return pk.dumps([transform(i) for i in xs])


    def wrapped(f, x):
        f.write(pk.dumps(x))


    def trivial(x):
        return len(pk.dumps(x))


    def proto(msg, blob):
        out = msg.SerializeToString()
        m = d2.FileDescriptorSet.FromString(blob)
        msg.ParseFromString(blob)
        return out, m


    def shadow(pickle):
        return pickle.dumps(1)


    def local_pickler(buf, x):
        p = pk.Pickler(buf)
        p.dump(x)


    class MyPickler(pk.Pickler):
        pass


    def subclass(buf, x):
        MyPickler(buf).dump(x)


    def conflict(x):
        return json.dumps(pk.loads(x))


    def rust(x):
        return oj.dumps(x)


    def nested_import(x):
        import msgpack as mp
        return mp.unpackb(x)


    def unknown(x):
        return frobnicate(x)


    def gen(xs):
        return pk.dumps(list(transform(i) for i in xs))


    def torch_inline(t):
        torch.save(t, "/tmp/x")


    def safetensors_read(path):
        from safetensors import safe_open
        with safe_open(path, "pt") as fh:
            return fh.get_tensor("w")


    def callback_mixed(objs):
        return pk.dumps([o.__getstate__() for o in objs])
    """
).lstrip("\n")


def line_of(text: str, needle: str) -> int:
    for i, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return i
    raise AssertionError(needle)


@pytest.fixture()
def src_file(tmp_path: Path) -> Path:
    path = tmp_path / "app" / "train.py"
    path.parent.mkdir()
    path.write_text(SRC)
    return path


def test_aliases_are_resolved() -> None:
    idx = SourceIndex(SRC)
    names = {c.name for c in idx.calls_at(line_of(SRC, "return pk.dumps(x)")).calls}
    assert names == {"pickle.dumps"}
    assert {c.name for c in idx.calls_at(line_of(SRC, "return thaw(b)")).calls} == {"pickle.loads"}
    ser = idx.calls_at(line_of(SRC, "msg.SerializeToString()")).calls
    assert [(c.name, c.method, c.imported) for c in ser] == [
        ("msg.SerializeToString", "SerializeToString", False)
    ]
    fs = idx.calls_at(line_of(SRC, "FromString(blob)")).calls
    assert fs[0].name == "google.protobuf.descriptor_pb2.FileDescriptorSet.FromString"
    assert fs[0].imported
    assert idx.calls_at(line_of(SRC, "oj.dumps")).calls[0].name == "orjson.dumps"
    assert idx.calls_at(line_of(SRC, "mp.unpackb")).calls[0].name == "msgpack.unpackb"


def test_parameter_shadows_an_import() -> None:
    idx = SourceIndex("import pickle\n" + SRC)
    (call,) = idx.calls_at(1 + line_of(SRC, "return pickle.dumps(1)")).calls
    assert call.name == "pickle.dumps" and not call.imported


def test_local_and_subclass_picklers() -> None:
    idx = SourceIndex(SRC)
    calls = idx.calls_at(line_of(SRC, "p.dump(x)")).calls
    assert [c.name for c in calls] == ["pickle.Pickler().dump"]
    calls = idx.calls_at(line_of(SRC, "MyPickler(buf).dump(x)")).calls
    by_name = {c.name: c for c in calls}
    assert set(by_name) == {"pickle.Pickler().dump", "pickle.Pickler"}
    assert by_name["pickle.Pickler"].receiver and not by_name["pickle.Pickler().dump"].receiver


def test_multiline_call_covers_each_of_its_lines() -> None:
    idx = SourceIndex(SRC)
    start = line_of(SRC, "blob = pk.dumps(")
    for line in range(start, start + 4):
        assert [c.name for c in idx.calls_at(line).calls] == ["pickle.dumps"], line
    assert idx.calls_at(start + 4).calls == ()


def test_comprehension_calls_are_nested() -> None:
    idx = SourceIndex(SRC)
    lc = idx.calls_at(line_of(SRC, "transform(i) for i in xs])"))
    assert lc.comprehension
    nested = {c.name: c.nested for c in lc.calls}
    assert nested == {"pickle.dumps": False, "transform": True}


def test_source_index_rejects_python2() -> None:
    with pytest.raises(SyntaxError):
        SourceIndex("print 'hello'\n")


def test_coding_cookie_is_honoured(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    path.write_bytes(b"# -*- coding: latin-1 -*-\nimport pickle\nx = '\xe9'\npickle.dumps(x)\n")
    cache = SourceCache()
    index, error, _ = cache.get(str(path))
    assert error is None and index is not None
    assert index.calls_at(4).calls[0].name == "pickle.dumps"


def test_source_path_goes_through_proc_root() -> None:
    assert source_path("/srv/app.py", Path("/proc/42/root")) == "/proc/42/root/srv/app.py"
    assert source_path("/srv/app.py", None) == "/srv/app.py"
    assert source_path("<frozen importlib._bootstrap>", None) is None
    assert source_path("relative.py", Path("/proc/42/root")) is None
    assert source_path("/usr/lib/x.so", None) is None


CASES = [
    # (function's needle, codepath, rule_id, confidence, ambiguous)
    ("return pk.dumps(x)", "pickle", "pickle.call", "high", False),
    ("return thaw(b)", "pickle", "pickle.call", "high", False),
    ("protocol=5,", "pickle", "pickle.call", "high", False),  # inside a multi-line call
    ("return pk.dumps([transform", "pickle", "pickle.call", "low", True),
    ("f.write(pk.dumps(x))", "pickle", "pickle.call", "low", True),
    ("return len(pk.dumps(x))", "pickle", "pickle.call", "high", False),  # len is trivial
    ("msg.SerializeToString()", "protobuf", "protobuf.method", "high", False),
    ("FromString(blob)", "protobuf", "protobuf.call", "high", False),
    ("msg.ParseFromString(blob)", "protobuf", "protobuf.method", "high", False),
    ("return pickle.dumps(1)", "other", None, "high", False),  # `pickle` is a parameter
    ("p.dump(x)", "pickle", "pickle.call", "high", False),
    ("MyPickler(buf).dump(x)", "pickle", "pickle.call", "high", False),
    ("return json.dumps(pk.loads(x))", "other", None, "low", True),  # two serializers
    ("return oj.dumps(x)", "json", "json.call", "high", False),
    ("return mp.unpackb(x)", "msgpack", "msgpack.call", "high", False),
    ("return frobnicate(x)", "other", None, "high", False),
    ("list(transform(i) for i in xs)", "pickle", "pickle.call", "low", True),
    ('torch.save(t, "/tmp/x")', "torch", "torch.call", "high", False),
    ('return fh.get_tensor("w")', "safetensors", "safetensors.call", "high", False),
]


@pytest.fixture()
def torch_rule(tmp_path: Path) -> Path:
    # torch.save normally shows Python frames (torch/serialization.py); a call-site rule
    # for it is a user rule here, which also proves user call-site rules work.
    path = tmp_path / "torch.yaml"
    path.write_text(
        "schema: serwatt.codepaths/1\n"
        "rules:\n"
        "  - id: torch.call\n"
        "    codepath: torch\n"
        "    layer: callsite\n"
        "    calls: [torch.save, torch.load]\n"
    )
    return path


@pytest.mark.parametrize("needle, codepath, rule_id, confidence, ambiguous", CASES)
def test_leaf_call_sites(
    src_file: Path,
    torch_rule: Path,
    needle: str,
    codepath: str,
    rule_id: str | None,
    confidence: str,
    ambiguous: bool,
) -> None:
    c = Classifier.from_files([torch_rule])
    leaf = Frame("f", str(src_file), line_of(SRC, needle))
    root = Frame("<module>", str(src_file), 1)
    got = c.classify_frames((leaf, root))
    assert (got.codepath, got.rule_id, got.confidence, got.ambiguous) == (
        codepath,
        rule_id,
        confidence,
        ambiguous,
    )


def test_callback_under_a_mixed_line_is_low_confidence(src_file: Path) -> None:
    """`pk.dumps([o.__getstate__() ...])`: the pickler or the list may run __getstate__."""
    c = Classifier.default()
    line = line_of(SRC, "return pk.dumps([o.__getstate__()")
    cb = Frame("Obj.__getstate__", "/srv/model.py", 3)
    got = c.classify_frames((cb, Frame("callback_mixed", str(src_file), line)))
    assert (got.codepath, got.confidence, got.ambiguous) == ("pickle", "low", True)
    clean = Frame("alias", str(src_file), line_of(SRC, "return pk.dumps(x)"))
    got = c.classify_frames((cb, clean))
    assert (got.codepath, got.confidence, got.ambiguous) == ("pickle", "high", False)


def test_comprehension_frame_is_not_the_serializer(src_file: Path) -> None:
    """<3.12: `[f(i) for i in x]` runs in its own frame; that frame is list building."""
    line = line_of(SRC, "return pk.dumps([transform")
    c = Classifier.default()
    outer = Frame("mixed", str(src_file), line)
    comp = Frame("<listcomp>", str(src_file), line)
    assert c.classify_frames((comp, outer)).codepath == "other"
    inner = Frame("transform", str(src_file), 1)
    assert c.classify_frames((inner, comp, outer)).codepath == "other"


def test_reads_through_proc_root(tmp_path: Path) -> None:
    """The file as the target sees it (its mount namespace), not as the host does."""
    root = tmp_path / "root"
    (root / "srv").mkdir(parents=True)
    (root / "srv" / "job.py").write_text("import pickle\n\ndef f(x):\n    return pickle.dumps(x)\n")
    leaf = Frame("f", "/srv/job.py", 4)
    c = Classifier.default()
    assert c.classify_frames((leaf,), proc_root=root).codepath == "pickle"
    assert c.classify_frames((leaf,)).codepath == "other"  # /srv/job.py does not exist here


def test_source_change_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "job.py"
    path.write_text("import pickle\nx = pickle.dumps(1)\n")
    c = Classifier.default(stat_ttl_s=0.0)
    leaf = (Frame("<module>", str(path), 2),)
    assert c.classify_frames(leaf).codepath == "pickle"
    path.write_text("import json\nx = json.dumps(1)\n")
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse clocks
    assert c.classify_frames(leaf).codepath == "json"


def test_source_parsed_once_per_file(src_file: Path) -> None:
    c = Classifier.default()
    for needle, *_ in CASES[:6]:
        c.classify_frames((Frame("f", str(src_file), line_of(SRC, needle)),))
    for needle, *_ in CASES[:6]:
        c.classify_frames((Frame("f", str(src_file), line_of(SRC, needle)),))
    assert c.stats.source_parses == 1
    assert c.stats.stack_cache_hits == 6


def test_stale_source_lowers_confidence(tmp_path: Path) -> None:
    """A file modified after the target started may not be what the target runs."""
    proc = tmp_path / "proc"
    pid_dir = proc / "4242"
    (pid_dir / "root" / "srv").mkdir(parents=True)
    src = pid_dir / "root" / "srv" / "job.py"
    src.write_text("import pickle\n\ndef f(x):\n    return pickle.dumps(x)\n")
    clk = os.sysconf("SC_CLK_TCK")
    btime = 1_000_000
    # The target started 10 s after boot; the file's mtime is far later (now).
    fields = ["S"] + ["0"] * 18 + [str(10 * clk)] + ["0"] * 10
    (pid_dir / "stat").write_text(f"4242 (python) {' '.join(fields)}\n")
    (proc / "stat").write_text(f"cpu 1 2 3\nbtime {btime}\n")
    give_root_creds(pid_dir)  # serwatt reads only what the target could
    c = Classifier.default(proc_fs=proc)
    got = c.classify_frames((Frame("f", "/srv/job.py", 4),), proc_root=pid_dir / "root")
    assert (got.codepath, got.confidence) == ("pickle", "low")
    # Same file, target started after the file was written: high.
    os.utime(src, (btime, btime))
    c2 = Classifier.default(proc_fs=proc)
    got = c2.classify_frames((Frame("f", "/srv/job.py", 4),), proc_root=pid_dir / "root")
    assert (got.codepath, got.confidence) == ("pickle", "high")


@pytest.mark.parametrize("module", ["pickle", "json.encoder", "multiprocessing.queues", "typing"])
def test_every_line_of_real_stdlib_files(module: str) -> None:
    """Real code: every line answers, and every call node is found on its own lines."""
    import ast
    import importlib

    path = Path(importlib.import_module(module).__file__ or "")
    cache = SourceCache()
    index, error, _ = cache.get(str(path))
    assert error is None and index is not None
    n_lines = len(path.read_text().splitlines())
    seen = set()
    for line in range(1, n_lines + 1):
        for call in index.calls_at(line).calls:
            assert call.lineno <= line <= call.end_lineno
            seen.add((call.lineno, call.end_lineno, call.name))
    n_calls = sum(isinstance(n, ast.Call) for n in ast.walk(index.tree))
    assert len(seen) >= 0.9 * n_calls  # distinct (span, name); a few repeat on one line
    assert index.package == (module.rsplit(".", 1)[0] if "." in module else None)


def test_one_file_is_parsed_once_across_paths_and_caches(tmp_path: Path) -> None:
    """A target's frames name files through /proc/<pid>/root, so every process (and the
    daemon's one cache per concurrent window) reaches the same inode by another path."""
    import gc

    from serwatt.profiler.classify import source_cache

    f = tmp_path / "job.py"
    f.write_text("import pickle\nblob = pickle.dumps({})\n")
    via_root = f"/proc/{os.getpid()}/root{f}"
    a, b = SourceCache(), SourceCache()
    index_a, err, _ = a.get(str(f))
    index_b, err_b, _ = b.get(via_root)
    assert err is None and err_b is None and index_a is not None
    assert index_b is index_a
    assert (a.parses, b.parses, b.shared_hits) == (1, 0, 1)
    assert index_b.calls_at(2).calls  # the shared index answers for either path
    # a new version of the file is a new parse, not the old tree
    f.write_text("import json\n\ntext = json.dumps({})\n")
    c = SourceCache()
    index_c, _, _ = c.get(via_root)
    assert index_c is not None and index_c is not index_a and c.parses == 1
    # weak: once no cache holds a version, the process forgets it
    key = next(k for k, v in source_cache._SHARED.items() if v is index_a)
    del a, b, index_a, index_b
    gc.collect()
    assert key not in source_cache._SHARED
