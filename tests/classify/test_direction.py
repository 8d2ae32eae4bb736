"""Encode and decode told apart (issue 24 §1): the direction a classified sample carries,
read from the names on its stack (profiler/classify/direction.py), on recorded real py-spy
output of every serializer workload (tests/fixtures/pyspy/), and as rule files state it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from serwatt.collectors.samples import Frame
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.direction import combined, name_direction
from serwatt.profiler.classify.rules import parse_rules_text
from tests.workloads.harness import samples_from_dump

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pyspy"

# what each recorded workload runs (tests/workloads/serializers.py): one direction, or
# both (a round trip in one loop), or neither (no serializer)
ONE_WAY = {
    "json_dumps": "encode",
    "json_loads": "decode",
    "msgpack_packb": "encode",
    "msgpack_unpackb": "decode",
    "pickle_alias": "encode",
    "pickle_from_alias": "decode",  # `from pickle import loads as thaw`: the alias resolved
    "pickle_multiline": "encode",
    "pickle_persistent_id": "encode",
    "pickle_pure_python": "encode",
    "pickle_ambiguous": "encode",
    "protobuf_serialize": "encode",
    "protobuf_parse": "decode",
    "protobuf_json_format": "encode",
    "yaml_dump": "encode",
    "torch_save": "encode",
    "torch_load": "decode",
    "numpy_save": "encode",
    "safetensors_save": "encode",
    "many_save": "encode",
}
BOTH_WAYS = {"pickle_callbacks", "mp_queue", "protobuf_python_backend"}
# `orjson.loads(orjson.dumps(x))`: one line calls both, so no sample can say which ran
NEITHER_SAID = {"orjson_roundtrip"}
NO_SERIALIZER = {"compute", "tensor_copy"}
# a thread whose only serializer frame names no direction: `.many`'s hashing pool
# (_hash_slots) runs for a save and for a verifying load alike
UNSAID_FRAMES = {"_hash_slots"}


@pytest.fixture(scope="module")
def classified(pyspy_proc_root: Path) -> dict[str, list]:
    """fixture stem -> [(sample, classification)] of its serializer samples, classified
    through a fake /proc/<pid>/root holding the sources as they were at capture time."""
    root = pyspy_proc_root
    files = sorted(FIXTURES.glob("*.json"))
    classifier = Classifier.default()
    out: dict[str, list] = {}
    for p in files:
        doc = json.loads(p.read_text())
        got = [
            (s, classifier.classify(s, proc_root=root))
            for d in doc["dumps"]
            for s in samples_from_dump(d)
            if s.frames
        ]
        out[p.stem] = [(s, c) for s, c in got if c.codepath != "other"]
    return out


def test_every_recorded_workload_is_in_one_table() -> None:
    kinds = {json.loads(p.read_text())["kind"] for p in FIXTURES.glob("*.json")}
    assert kinds == set(ONE_WAY) | BOTH_WAYS | NEITHER_SAID | NO_SERIALIZER


def test_each_sample_of_a_one_way_workload_carries_its_direction(classified) -> None:
    for stem, got in classified.items():
        kind = stem.split("-", 1)[1]
        if kind not in ONE_WAY:
            continue
        assert got, stem
        for s, c in got:
            if s.frames[0].name in UNSAID_FRAMES:
                assert c.direction == "unknown", (stem, s.frames[:4], c)
            else:
                assert c.direction == ONE_WAY[kind], (stem, s.frames[:6], c)


def test_a_round_trip_shows_both_directions_and_a_mixed_line_neither(classified) -> None:
    for stem, got in classified.items():
        kind = stem.split("-", 1)[1]
        directions = Counter(c.direction for _, c in got)
        if kind in BOTH_WAYS:
            assert directions["encode"] and directions["decode"], (stem, directions)
            assert not directions["unknown"], (stem, directions)
        elif kind in NEITHER_SAID:
            assert set(directions) == {"unknown"}, (stem, directions)


def test_both_directions_of_every_codepath_are_named() -> None:
    # the name each built-in codepath's encode and decode go through (a frame's function,
    # a native symbol, a called name or a method), as py-spy and the call-site index
    # report them
    names = {
        "pickle": ("pickle.dumps", "_Unpickler.load_build"),
        "torch": ("save", "_load"),
        "protobuf": ("SerializeToString", "ParseFromString"),
        "json": ("JSONEncoder.iterencode", "JSONDecoder.raw_decode"),
        "msgpack": ("Packer.pack", "msgpack.Unpacker().unpack"),
        "yaml": ("yaml.safe_dump", "yaml.CLoader().get_single_data"),
        "safetensors": ("safetensors.torch.save_file", "safe_open"),
        "numpy": ("numpy.lib.format.write_array", "read_array"),
        "many": ("Checkpointer._write", "load_state"),
    }
    native = {
        "torch": (
            "caffe2::serialize::PyTorchStreamWriter::writeRecord",
            "caffe2::serialize::PyTorchStreamReader::getRecord",
        ),
        "protobuf": ("upb_Encode", "upb_Decode"),
    }
    for cp, (enc, dec) in [*names.items(), *native.items()]:
        assert (name_direction(enc), name_direction(dec)) == ("encode", "decode"), cp
    for name in ("Checkpointer.checkpoint", "_open_zipfile_writer", "_tensor_to_object", "run"):
        assert name_direction(name) is None, name  # neither, or both: never guessed
    assert combined(["encode", "encode"]) == "encode"
    assert combined(["encode", "decode"]) is None and combined(["encode", None]) is None


def test_a_rule_states_a_direction_its_names_do_not() -> None:
    frame = Frame("_tensor_to_object", "/x/torch/distributed/distributed_c10d.py", 10)
    got = Classifier.default().classify_frames((frame,))
    assert (got.codepath, got.direction) == ("pickle", "decode")  # stated in the rule
    rules = parse_rules_text(
        "schema: serwatt.codepaths/1\n"
        "rules:\n"
        "  - id: team.state\n    codepath: json\n    layer: python\n"
        "    file: team/state.py\n    function: '*'\n    direction: unknown\n"
        "  - id: team.blob\n    codepath: msgpack\n    layer: python\n"
        "    file: team/blob.py\n    function: '*'\n    direction: decode\n"
    )
    cl = Classifier(rules)
    # `unknown` stops the names being read: save_state would otherwise say encode
    assert cl.classify_frames((Frame("save_state", "/a/team/state.py", 3),)).direction == (
        "unknown"
    )
    assert cl.classify_frames((Frame("write_blob", "/a/team/blob.py", 3),)).direction == ("decode")


TWO_WAYS = """
import json, pickle, sys, threading, time

data = {str(i): [i, float(i), str(i)] for i in range(20000)}
blob = pickle.dumps(data)
truth = {"encode": 0.0, "decode": 0.0}
go = {w: threading.Event() for w in ("encode", "decode", "done", "exit")}

# each call on a line of its own: a C serializer has no frame, its caller's line names it
def encode():
    go["encode"].wait()
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        t0 = time.thread_time()
        pickle.dumps(data)
        truth["encode"] += time.thread_time() - t0
    go["decode"].set()
    go["exit"].wait()

def decode():
    go["decode"].wait()
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        t0 = time.thread_time()
        pickle.loads(blob)
        truth["decode"] += time.thread_time() - t0
    go["done"].set()
    go["exit"].wait()

# Both threads work one after the other and live past the profile's end (--duration):
# a thread that exits inside a window leaves that window's CPU to the exited-thread
# pool (0.5-0.9 s of the decode thread's went to `other` when it exited with the
# process), and two threads contending for the GIL move CPU between their samples
# (3-8 pp): the CPU weighting's errors (issue 22), not the direction's, which this
# test guards.
threads = [threading.Thread(target=encode), threading.Thread(target=decode)]
for t in threads:
    t.start()
time.sleep(1.0)  # serwatt attaches before the work
go["encode"].set()
go["done"].wait()
with open(sys.argv[1], "w") as f:
    json.dump(truth, f)
time.sleep(5.0)  # the profile ends in here
go["exit"].set()
for t in threads:
    t.join()
"""


@pytest.mark.serial
def test_encode_and_decode_cpu_against_the_threads_own_cpu(tmp_path: Path) -> None:
    """The truth test: pickle.dumps on one thread and pickle.loads on another, each
    thread timing its own CPU in the calls (time.thread_time); the document's encode and
    decode CPU of `pickle` must split as the truth does, within the accuracy goal (2 pp)."""
    import subprocess
    import sys

    (tmp_path / "two_ways.py").write_text(TWO_WAYS)
    out, truth_file = tmp_path / "p.json", tmp_path / "truth.json"
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", "--rate", "100", "--json", str(out),
         "--duration", "8", "--window", "10", "--",
         sys.executable, str(tmp_path / "two_ways.py"), str(truth_file)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    truth = json.loads(truth_file.read_text())
    doc = json.loads(out.read_text())
    way = doc["codepaths"]["pickle"]["direction"]
    assert sum(p["cpu_s"] for p in way.values()) == pytest.approx(
        doc["codepaths"]["pickle"]["cpu_s"], abs=1e-5
    )
    # the stack of every pickle sample names its direction: little or none is unknown
    assert way["unknown"]["cpu_s"] <= 0.02 * doc["codepaths"]["pickle"]["cpu_s"], way
    measured = way["encode"]["cpu_s"] / (way["encode"]["cpu_s"] + way["decode"]["cpu_s"])
    expected = truth["encode"] / (truth["encode"] + truth["decode"])
    assert abs(measured - expected) <= 0.02, (measured, expected, way, truth)
    # and the CPU itself, not only its split: each direction within 10% of the truth
    # (the loop's own lines between calls are `other`, a few percent)
    for d in ("encode", "decode"):
        assert way[d]["cpu_s"] == pytest.approx(truth[d], rel=0.10), (d, way, truth)
    assert doc["codepaths"]["pickle"]["direction"]["encode"]["samples"] > 50
    assert all(e.get("direction") in ("encode", "decode", "unknown") for e in doc["episodes"])
