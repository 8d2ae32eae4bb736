"""Classification of recorded REAL py-spy outputs (tests/fixtures/pyspy/).

The fixtures were captured by `python -m tests.workloads.capture` from real workloads
(tests/workloads/serializers.py) under CPython 3.10 (bare frame names), 3.12
(qualnames) and the project's 3.11 venv (torch, numpy, safetensors, .many). The
workload source at capture time is served through a fake `/proc/<pid>/root`, the
same path the daemon reads container targets through.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from serwatt.collectors.samples import Frame, Sample
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.codepaths import CODEPATHS, Classification
from tests.workloads.harness import samples_from_dump, samples_from_speedscope

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pyspy"
FILES = sorted(FIXTURES.glob("*.json"))


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    return Classifier.default()


@pytest.fixture(scope="module")
def proc_root(pyspy_proc_root: Path) -> Path:
    return pyspy_proc_root


_ROOTS = ("<module>", "_bootstrap", "Thread._bootstrap")


def _partial(s: Sample) -> bool:
    """A stack py-spy could not read to its root (nonblocking mode): outer frames lost."""
    return s.frames[-1].name not in _ROOTS


def _classified(
    doc: dict, classifier: Classifier, proc_root: Path | None, key: str = "dumps"
) -> list[tuple[Sample, Classification]]:
    out = []
    for dump in doc[key]:
        for s in samples_from_dump(dump):
            if s.frames:
                out.append((s, classifier.classify(s, proc_root=proc_root)))
    return out


def test_fixtures_cover_every_codepath_and_both_naming_styles() -> None:
    expects = {_load(p.name)["expect"] for p in FILES}
    assert expects == set(CODEPATHS), f"missing: {set(CODEPATHS) - expects}"
    pythons = {_load(p.name)["python"][:4] for p in FILES}
    assert {"3.10", "3.12", "3.11"} <= pythons
    names_310 = {
        f["name"] for d in _load("py310-json_dumps.json")["dumps"] for t in d for f in t["frames"]
    }
    names_312 = {
        f["name"] for d in _load("py312-json_dumps.json")["dumps"] for t in d for f in t["frames"]
    }
    assert "iterencode" in names_310 and "JSONEncoder.iterencode" not in names_310
    assert "JSONEncoder.iterencode" in names_312


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_recorded_sample_lands_in_its_codepath(
    path: Path, classifier: Classifier, proc_root: Path
) -> None:
    doc = _load(path.name)
    everything = _classified(doc, classifier, proc_root)
    # A partial stack lost its outer frames, so its outermost scope may be an inner
    # serializer (json under protobuf's json_format); it must still be in the set.
    assert all(c.codepath in CODEPATHS for _, c in everything)
    results = [(s, c) for s, c in everything if not _partial(s)]
    assert len(results) >= 6
    counts = Counter(c.codepath for _, c in results)
    expect = doc["expect"]
    # Nothing lands in a serializer it is not running.
    assert set(counts) <= {expect, "other"}, counts
    if expect == "other":
        assert counts["other"] == len(results), counts
        return
    # Most samples are inside the serializer; what is not is the workload's own loop
    # (e.g. `buf = io.BytesIO()` freeing the last buffer), never a library frame.
    if doc["kind"] == "mp_queue":
        # Most of an mp.Queue round trip is pipe I/O and waiting (other); the feeder
        # thread's ForkingPickler.dumps and Queue.get's loads are pickle.
        assert counts["pickle"] >= 0.2 * len(results), counts
        waits = ("serializers.py", "multiprocessing/connection.py", "threading.py")
    elif doc["kind"] != "pickle_ambiguous":
        assert counts[expect] >= 0.6 * len(results), counts
        waits = ("serializers.py",)
    else:
        waits = ("serializers.py",)
    for s, c in results:
        if c.codepath == "other":
            assert s.frames[0].filename.endswith(waits), s.frames[:3]
    if doc["kind"] == "pickle_ambiguous":
        # List building (`make`) is other; the pickling line mixes both: low confidence.
        assert counts["pickle"] >= 1 and counts["other"] >= 1, counts
        for s, c in results:
            if c.codepath == "pickle":
                assert c.confidence == "low" and c.ambiguous, (s.frames[0], c)
            else:  # list building: make(), or the comprehension's own frame (<3.12)
                assert s.frames[0].name.endswith(("make", "<listcomp>")), s.frames[0]


@pytest.mark.parametrize(
    "name, rule_ids, confidence",
    [
        ("py310-pickle_alias.json", {"pickle.call"}, "high"),  # import pickle as pk
        ("py312-pickle_alias.json", {"pickle.call"}, "high"),
        (
            "py310-pickle_from_alias.json",
            {"pickle.call"},
            "high",
        ),  # from-import alias (thaw)
        ("py312-pickle_from_alias.json", {"pickle.call"}, "high"),
        ("py310-pickle_multiline.json", {"pickle.call"}, "high"),  # call over 4 lines
        ("py312-pickle_multiline.json", {"pickle.call"}, "high"),
        ("py310-pickle_persistent_id.json", {"pickle.call"}, "high"),  # Pickler subclass
        ("py312-pickle_persistent_id.json", {"pickle.call"}, "high"),
        ("py310-pickle_pure_python.json", {"pickle.pure-python"}, "high"),
        ("py312-pickle_pure_python.json", {"pickle.pure-python"}, "high"),
        ("py310-protobuf_serialize.json", {"protobuf.method"}, "high"),  # msg.SerializeToString()
        ("py312-protobuf_serialize.json", {"protobuf.method"}, "high"),
        ("py310-protobuf_parse.json", {"protobuf.call", "protobuf.method"}, "high"),
        ("py312-protobuf_parse.json", {"protobuf.call", "protobuf.method"}, "high"),
        ("py310-msgpack_unpackb.json", {"msgpack.call"}, "high"),  # Cython, no Python frame
        ("py312-msgpack_unpackb.json", {"msgpack.call"}, "high"),
        ("py310-msgpack_packb.json", {"msgpack.python"}, "high"),
        ("py310-json_dumps.json", {"json.stdlib"}, "high"),
        ("py310-orjson_roundtrip.json", {"json.call"}, "high"),  # Rust: caller line only
        ("py312-orjson_roundtrip.json", {"json.call"}, "high"),
        ("py312-json_dumps.json", {"json.stdlib"}, "high"),
        ("py310-protobuf_json_format.json", {"protobuf.json-format"}, "high"),
        ("py310-protobuf_python_backend.json", {"protobuf.python-backend"}, "high"),
        ("py312-protobuf_python_backend.json", {"protobuf.python-backend"}, "high"),
        ("py312-protobuf_json_format.json", {"protobuf.json-format"}, "high"),
        ("py310-yaml_dump.json", {"yaml.python"}, "high"),
        ("venv-torch_save.json", {"torch.serialization"}, "high"),
        ("venv-torch_load.json", {"torch.serialization", "torch.weights-only-unpickler"}, "high"),
        ("venv-numpy_save.json", {"numpy.npyio", "numpy.format"}, "high"),
        ("venv-safetensors_save.json", {"safetensors.python"}, "high"),
        ("venv-many_save.json", {"many.arena"}, "high"),
    ],
)
def test_rule_ids_and_confidence(
    name: str, rule_ids: set[str], confidence: str, classifier: Classifier, proc_root: Path
) -> None:
    results = [
        c
        for s, c in _classified(_load(name), classifier, proc_root)
        if c.rule_id and not _partial(s)
    ]
    assert results
    assert {c.rule_id for c in results} <= rule_ids
    assert rule_ids & {c.rule_id for c in results}
    assert {c.confidence for c in results} == {confidence}


def test_callbacks_count_toward_the_serializer_calling_them(
    classifier: Classifier, proc_root: Path
) -> None:
    seen = Counter()
    for name in ("py310-pickle_callbacks.json", "py312-pickle_callbacks.json"):
        for s, c in _classified(_load(name), classifier, proc_root):
            leaf = s.frames[0].name.rsplit(".", 1)[-1]
            python_frames = [f for f in s.frames if f.filename.endswith("serializers.py")]
            in_callback = any(
                f.name.rsplit(".", 1)[-1] in ("__getstate__", "__setstate__") for f in python_frames
            )
            if in_callback:
                seen[leaf] += 1
                assert (c.codepath, c.rule_id) == ("pickle", "pickle.call"), s.frames
    for name in ("py310-pickle_persistent_id.json", "py312-pickle_persistent_id.json"):
        for s, c in _classified(_load(name), classifier, proc_root):
            if s.frames[0].name.endswith("persistent_id"):
                seen["persistent_id"] += 1
                assert c.codepath == "pickle"
    assert seen["persistent_id"] >= 1
    assert sum(v for k, v in seen.items() if k != "persistent_id") >= 1, seen


def test_multiprocessing_queue_get_is_a_call_site_in_stdlib(
    classifier: Classifier, proc_root: Path
) -> None:
    """Queue.get runs `_ForkingPickler.loads(res)`, a C call bound through a relative
    import (`from . import context`): the call-site layer resolves it in stdlib code."""
    for name in ("py310-mp_queue.json", "py312-mp_queue.json"):
        gets = [
            c
            for s, c in _classified(_load(name), classifier, proc_root)
            if s.frames[0].filename.endswith("multiprocessing/queues.py")
            and s.frames[0].name.endswith("get")
        ]
        assert gets, name
        assert {(c.codepath, c.rule_id) for c in gets} == {("pickle", "pickle.call")}


def test_torch_reduce_ex_internal_only_under_a_serializer(
    classifier: Classifier, proc_root: Path
) -> None:
    def has_reduce(s: Sample) -> bool:
        return any(f.name.endswith("_reduce_ex_internal") for f in s.frames)

    saved = [(s, c) for s, c in _classified(_load("venv-torch_save.json"), classifier, proc_root)]
    copied = [(s, c) for s, c in _classified(_load("venv-tensor_copy.json"), classifier, proc_root)]
    under_save = [c for s, c in saved if has_reduce(s)]
    alone = [c for s, c in copied if has_reduce(s)]
    assert under_save and alone, "fixtures must contain Tensor._reduce_ex_internal frames"
    assert {c.codepath for c in under_save} == {"torch"}  # outermost: torch.save, not pickle
    assert {c.codepath for c in alone} == {"other"}  # copy.copy(tensor) is not serialization


def test_native_frames_classify_without_python_frames(classifier: Classifier) -> None:
    """Layer B on real `dump --native` stacks: keep only the native frames."""
    expected = {
        "py310-pickle_alias.json": ("pickle", "pickle.native"),
        "py310-json_dumps.json": ("json", "json.native"),
        "py310-protobuf_serialize.json": ("protobuf", "protobuf.upb-native"),
        "py310-msgpack_unpackb.json": ("msgpack", "msgpack.native"),
        # Native-only torch.save stacks also show the C pickler that torch drives;
        # with the Python frames kept, torch is outermost (next test).
        "venv-torch_save.json": ("torch", "torch.native-zip"),
    }
    also = {"venv-torch_save.json": {("pickle", "pickle.native")}}
    for name, (codepath, rule_id) in expected.items():
        hits = Counter()
        for dump in _load(name)["native_dumps"]:
            for s in samples_from_dump(dump):
                native = tuple(f for f in s.frames if f.module)
                if not native:
                    continue
                c = classifier.classify_frames(native)
                hits[(c.codepath, c.rule_id)] += 1
        matched = {k: v for k, v in hits.items() if k[0] == codepath}
        assert matched, (name, hits)
        allowed = {(codepath, r) for _, r in matched} | {("other", None)} | also.get(name, set())
        assert set(hits) <= allowed, hits
        if rule_id is not None:
            assert (codepath, rule_id) in matched, hits


def test_native_and_python_frames_together_keep_outermost(classifier: Classifier) -> None:
    # torch.save stacks with --native include _pickle.so frames; torch is outermost.
    for dump in _load("venv-torch_save.json")["native_dumps"]:
        for s in samples_from_dump(dump):
            if any(f.filename.endswith("torch/serialization.py") for f in s.frames):
                assert classifier.classify(s).codepath == "torch"


def test_call_sites_need_the_source_unknown_stays_other(
    classifier: Classifier, proc_root: Path
) -> None:
    """Without the source (no /proc/<pid>/root copy), a C-serializer caller is other."""
    empty_root = Path("/nonexistent-serwatt-root")
    for name in ("py310-pickle_alias.json", "py312-protobuf_serialize.json"):
        results = _classified(_load(name), Classifier.default(), empty_root)
        assert {c.codepath for _, c in results} == {"other"}
    # Python-frame rules need no source: same answer with or without it.
    without = Classifier.default()
    compared = 0
    for name in ("py312-json_dumps.json", "py310-yaml_dump.json", "venv-torch_save.json"):
        for s, c in _classified(_load(name), classifier, proc_root):
            if c.rule_id in ("json.stdlib", "yaml.python", "torch.serialization"):
                assert without.classify(s, proc_root=empty_root) == c
                compared += 1
    assert compared >= 12


def test_speedscope_recordings_classify_like_dumps(classifier: Classifier, proc_root: Path) -> None:
    for name, expect in (
        ("py312-pickle_alias.json", "pickle"),
        ("py312-json_loads.json", "json"),
        ("py310-protobuf_parse.json", "protobuf"),
    ):
        samples = samples_from_speedscope(_load(name)["speedscope"])
        assert len(samples) >= 20
        counts = Counter(classifier.classify(s, proc_root=proc_root).codepath for s in samples)
        assert set(counts) <= {expect, "other"}, counts
        # The loop's own lines (while/time.time()) are a small share.
        assert counts[expect] >= 0.8 * len(samples), counts


def test_speedscope_through_the_sampler_parser(classifier: Classifier, proc_root: Path) -> None:
    """The same recording parsed by the sampler's own parser (collectors/pyspy.py)."""
    from serwatt.collectors.pyspy import speedscope as pyspy

    doc = _load("py312-pickle_alias.json")["speedscope"]
    tracks = pyspy.parse_speedscope(doc)
    stacks = [st for tr in tracks for st in tr.stacks]
    assert stacks
    labels = Counter(classifier.classify_frames(st, proc_root=proc_root).codepath for st in stacks)
    assert labels["pickle"] >= 0.8 * len(stacks), labels


def test_frames_are_hashable_cache_keys() -> None:
    """Equal frames built separately are one cache key: the second stack is a cache hit
    that returns the first stack's classification, and that classification is right."""
    classifier = Classifier.default()  # its own, so the hit count starts at 0
    first = Frame("dumps", "/x/json/__init__.py", 231)
    second = Frame("dumps", "/x/json/__init__.py", 231)
    assert first is not second and first == second and hash(first) == hash(second)
    got = classifier.classify_frames((first,))
    assert (got.codepath, got.rule_id) == ("json", "json.stdlib"), got
    assert classifier.stats.stack_cache_hits == 0
    assert classifier.classify_frames((second,)) is got
    assert classifier.stats.stack_cache_hits == 1
    # A different line is a different key (call-site rules depend on the line).
    classifier.classify_frames((Frame("dumps", "/x/json/__init__.py", 232),))
    assert classifier.stats.stack_cache_hits == 1
