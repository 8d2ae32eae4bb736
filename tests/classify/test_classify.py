"""The classifier's stack walk: outermost scope, callbacks, native frames, caching."""

from __future__ import annotations

from pathlib import Path

import pytest

from serwatt.collectors.samples import Frame, Sample
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.codepaths import CODEPATHS, OTHER
from tests.daemon_fakes import give_root_creds

STD = "/usr/lib/python3.12"
SITE = "/venv/lib/python3.12/site-packages"


@pytest.fixture(scope="module")
def c() -> Classifier:
    return Classifier.default()


@pytest.fixture()
def user(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(
        "import pickle\n"  # 1
        "import copy\n"  # 2
        "def save(obj):\n"  # 3
        "    return pickle.dumps(obj)\n"  # 4
        "def dup(obj):\n"  # 5
        "    return copy.copy(obj)\n"  # 6
        "def helper(obj):\n"  # 7
        "    return pickle.dumps(make(obj))\n"  # 8
    )
    return path


def test_classify_takes_a_sample(c: Classifier) -> None:
    frames = (Frame("JSONEncoder.iterencode", f"{STD}/json/encoder.py", 258),)
    s = Sample(pid=1, tid=1, thread_id=1, thread_name="MainThread", t=0.0, frames=frames)
    assert c.classify(s).codepath == "json"
    assert c.classify(s, proc_root=Path("/proc/1/root")).codepath == "json"


def test_empty_and_unknown_stacks_are_other(c: Classifier) -> None:
    assert c.classify_frames(()) == OTHER
    assert c.classify_frames((Frame("train_step", "/srv/train.py", 10),)) == OTHER
    assert c.classify_frames((Frame("0x7f00", "", 0, "/lib/libc.so.6"),)) == OTHER


def test_outermost_scope_wins(c: Classifier) -> None:
    # torch.save -> _save -> pickler.dump -> persistent_id, leaf in multiprocessing
    frames = (
        Frame("ForkingPickler.dumps", f"{STD}/multiprocessing/reduction.py", 51),
        Frame("_save.<locals>.persistent_id", f"{SITE}/torch/serialization.py", 1205),
        Frame("_save", f"{SITE}/torch/serialization.py", 1253),
        Frame("save", f"{SITE}/torch/serialization.py", 1003),
        Frame("checkpoint", "/srv/train.py", 8),
        Frame("<module>", "/srv/train.py", 20),
    )
    got = c.classify_frames(frames)
    assert (got.codepath, got.rule_id) == ("torch", "torch.serialization")
    # Drop the torch frames: the multiprocessing pickler is now outermost.
    assert c.classify_frames(frames[:1] + frames[4:]).codepath == "pickle"


def test_json_inside_protobuf_json_format_is_protobuf(c: Classifier) -> None:
    frames = (
        Frame("_make_iterencode.<locals>._iterencode_dict", f"{STD}/json/encoder.py", 406),
        Frame("dumps", f"{STD}/json/__init__.py", 238),
        Frame("_Printer.ToJsonString", f"{SITE}/google/protobuf/json_format.py", 226),
        Frame("MessageToJson", f"{SITE}/google/protobuf/json_format.py", 124),
        Frame("<module>", "/srv/x.py", 1),
    )
    assert c.classify_frames(frames).rule_id == "protobuf.json-format"
    # A partial stack (nonblocking) that lost the outer frames is classified by what is seen.
    assert c.classify_frames(frames[:2]).codepath == "json"


def test_bare_and_qualified_names(c: Classifier) -> None:
    for name in ("raw_decode", "JSONDecoder.raw_decode"):
        assert c.classify_frames((Frame(name, f"{STD}/json/decoder.py", 353),)).codepath == "json"
    for name in ("pack", "Packer.pack"):
        got = c.classify_frames((Frame(name, f"{SITE}/msgpack/fallback.py", 800),))
        assert got.codepath == "msgpack"
    # The module body of a serializer file runs at import, not while serializing.
    assert c.classify_frames((Frame("<module>", f"{SITE}/torch/serialization.py", 1),)) == OTHER


def test_callbacks_count_only_under_a_serializer_line(c: Classifier, user: Path) -> None:
    cb = Frame("Obj.__reduce_ex__", "/srv/model.py", 30)
    inner = Frame("helper", "/srv/model.py", 40)
    caller = Frame("save", str(user), 4)
    got = c.classify_frames((inner, cb, caller))
    assert (got.codepath, got.rule_id, got.confidence) == ("pickle", "pickle.call", "high")
    # The same callback run by copy.copy is not serialization.
    assert c.classify_frames((inner, cb, Frame("dup", str(user), 6))) == OTHER
    # A non-callback function called on the serializer's line (argument evaluation).
    make = Frame("make", "/srv/model.py", 50)
    assert c.classify_frames((make, Frame("helper", str(user), 8))) == OTHER


def test_tensor_reduce_ex_internal_alone_is_other(c: Classifier, user: Path) -> None:
    reduce_internal = Frame("Tensor._reduce_ex_internal", f"{SITE}/torch/_tensor.py", 340)
    reduce_ex = Frame("Tensor.__reduce_ex__", f"{SITE}/torch/_tensor.py", 300)
    copy_frame = Frame("copy", f"{STD}/copy.py", 97)
    frames = (reduce_internal, reduce_ex, copy_frame, Frame("dup", str(user), 6))
    assert c.classify_frames(frames) == OTHER
    under_pickle = (reduce_internal, reduce_ex, Frame("save", str(user), 4))
    assert c.classify_frames(under_pickle).codepath == "pickle"


def test_native_frames(c: Classifier) -> None:
    pickle_so = "/py/lib/python3.11/lib-dynload/_pickle.cpython-311-x86_64-linux-gnu.so"
    frames = (
        Frame("save_dict", "_pickle.c", 3381, pickle_so),
        Frame("_pickle_dumps", "_pickle.c.h", 619, pickle_so),
        Frame("do_dumps", "/srv/unknown-source.py", 11),
    )
    assert c.classify_frames(frames).rule_id == "pickle.native"
    # Stripped shared object: only the module basename survives.
    stripped = Frame("0x7f9303352df3", "", 0, "/usr/lib/_json.cpython-311-x86_64-linux-gnu.so")
    assert c.classify_frames((stripped,)).rule_id == "json.native"
    upb = Frame("upb_Encode", "", 0, f"{SITE}/google/_upb/_message.abi3.so")
    assert c.classify_frames((upb,)).codepath == "protobuf"
    zip_writer = Frame("mz_zip_writer_add_mem_ex_v2", "", 0, f"{SITE}/torch/lib/libtorch_cpu.so")
    assert c.classify_frames((zip_writer,)).rule_id == "torch.native-zip"
    other_torch = Frame("at::native::add", "", 0, f"{SITE}/torch/lib/libtorch_cpu.so")
    assert c.classify_frames((other_torch,)) == OTHER


def test_native_leaf_beats_an_ambiguous_call_site(c: Classifier, user: Path) -> None:
    caller = Frame("helper", str(user), 8)  # pickle.dumps(make(obj)): ambiguous line
    assert c.classify_frames((caller,)).confidence == "low"
    so = "/x/_pickle.cpython-310-x86_64-linux-gnu.so"
    got = c.classify_frames((Frame("save", "_pickle.c", 1, so), caller))
    assert (got.codepath, got.rule_id, got.confidence) == ("pickle", "pickle.native", "high")


def test_every_result_is_in_the_closed_set(c: Classifier, user: Path) -> None:
    stacks = [(Frame("f", str(user), n),) for n in range(0, 12)] + [
        (Frame("x", f"{SITE}/yaml/emitter.py", 1),),
        (Frame("y", f"{SITE}/safetensors/torch.py", 3),),
    ]
    for frames in stacks:
        got = c.classify_frames(frames)
        assert got.codepath in CODEPATHS
        assert (got.rule_id is None) == (got.codepath == "other")


def test_stack_cache_bounded(user: Path) -> None:
    c = Classifier.default(stack_cache_size=4)
    for n in range(20):
        c.classify_frames((Frame("f", str(user), 4), Frame("g", "/srv/x.py", n)))
    assert len(c._stacks) <= 4
    assert c.stats.samples == 20


def test_pid_reuse_forgets_the_old_process(tmp_path: Path) -> None:
    """Same /proc/<pid>/root path, a new process behind it: cached answers are dropped."""
    import os

    proc = tmp_path / "proc"
    pid_dir = proc / "77"
    (pid_dir / "root" / "srv").mkdir(parents=True)
    (proc / "stat").write_text("btime 1000\n")
    give_root_creds(pid_dir)  # serwatt reads only what the target could
    clk = os.sysconf("SC_CLK_TCK")

    def start_process(after_boot_s: int, source: str) -> None:
        fields = ["S"] + ["0"] * 18 + [str(after_boot_s * clk)] + ["0"] * 10
        (pid_dir / "stat").write_text(f"77 (python) {' '.join(fields)}\n")
        src = pid_dir / "root" / "srv" / "job.py"
        src.write_text(source)
        os.utime(src, (900, 900))  # same mtime both times: only the start time tells

    start_process(10, "import pickle\ndef f(x):\n    return pickle.dumps(x)\n")
    c = Classifier.default(proc_fs=proc, stat_ttl_s=0.0)
    leaf = (Frame("f", "/srv/job.py", 3),)
    assert c.classify_frames(leaf, proc_root=pid_dir / "root").codepath == "pickle"
    start_process(20, "import orjson\ndef f(x):\n    return orjson.dumps(x)\n")  # same size
    assert c.classify_frames(leaf, proc_root=pid_dir / "root").codepath == "json"


def test_explain_says_which_frame_and_why(c: Classifier, user: Path) -> None:
    torch_stack = (
        Frame("_save", f"{SITE}/torch/serialization.py", 1253),
        Frame("save", f"{SITE}/torch/serialization.py", 1003),
        Frame("checkpoint", "/srv/train.py", 8),
    )
    ex = c.explain(torch_stack)
    assert (ex.classification.codepath, ex.frame_index, ex.how) == ("torch", 1, "python")
    ex = c.explain((Frame("helper", str(user), 8),))
    assert ex.classification.confidence == "low" and ex.frame_index == 0
    assert "line also makes 1 other call(s)" in ex.how
    ex = c.explain((Frame("f", "/nonexistent/x.py", 3),))
    assert ex.classification == OTHER and "source not readable" in ex.how
    ex = c.explain((Frame("f", "<string>", 3),))
    assert "no readable source path" in ex.how
    ex = c.explain((Frame("save", str(user), 5),))  # `def dup(obj):` line
    assert "no serializer call" in ex.how
    cb = (Frame("Obj.__getstate__", "/srv/m.py", 3), Frame("save", str(user), 4))
    assert "running callback Obj.__getstate__" in c.explain(cb).how


def test_serwatt_classify_on_a_saved_dump(
    tmp_path: Path, user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from serwatt.profiler.cli.main import main

    dump = [
        {
            "pid": 1,
            "thread_id": 140000,
            "thread_name": "MainThread",
            "os_thread_id": 1,
            "frames": [
                {"name": "save", "filename": str(user), "module": None, "line": 4},
                {"name": "<module>", "filename": str(user), "module": None, "line": 9},
            ],
        }
    ]
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(dump))
    assert main(["classify", str(path)]) == 0
    out = capsys.readouterr().out
    assert "thread 1 'MainThread': pickle  rule=pickle.call  confidence=high" in out
    assert f"decided by frame 0: save ({user}:4) [callsite]" in out
    (tmp_path / "bad.json").write_text("{}")
    assert main(["classify", str(tmp_path / "bad.json")]) == 2
    assert "not `py-spy dump --json` output" in capsys.readouterr().err


def test_pure_python_pickle_is_the_stdlib_one(c: Classifier) -> None:
    stdlib = Frame("_Pickler.save_dict", f"{STD}/pickle.py", 990)
    assert c.classify_frames((stdlib,)).rule_id == "pickle.pure-python"
    mine = Frame("load_settings", "/srv/app/mylib/pickle.py", 5)  # a user module named pickle
    assert c.classify_frames((mine,)) == OTHER
