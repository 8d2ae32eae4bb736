"""Record the py-spy fixtures under tests/fixtures/pyspy/ from real workloads.

    .venv/bin/python -m tests.workloads.capture            # everything (about 2 minutes)
    .venv/bin/python -m tests.workloads.capture py310:json_dumps

Each fixture is one JSON file `<target>-<kind>.json` holding py-spy's own output,
unmodified: `dumps` (`py-spy dump --json --nonblocking`, several), optionally
`native_dumps` (`py-spy dump --json --native`) and `speedscope` (`py-spy record
--format speedscope --nonblocking --idle --threads --full-filenames`). The workload
source at capture time is copied to `sources/serializers.py`: tests replay call-site
rules against it through a fake `/proc/<pid>/root`, so later edits to the workload
do not shift the recorded line numbers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.workloads import harness, targets
from tests.workloads.serializers import EXPECT

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pyspy"
DUMPS = 8
MAX_DUMPS = 60


def _leaf_is(suffix: str, name: str):
    def pred(frames: list[dict]) -> bool:
        return (
            bool(frames)
            and frames[0]["filename"].endswith(suffix)
            and (frames[0]["name"].endswith(name))
        )

    return pred


def _has_frame(name: str):
    return lambda frames: any(f["name"].endswith(name) for f in frames)


def _has_native(symbol_prefix: str):
    return lambda frames: any(
        f.get("module") and f["name"].startswith(symbol_prefix) for f in frames
    )


# Stacks a fixture must contain for its test to mean something: keep dumping (real
# py-spy, nothing edited) until one is seen. mp_queue's main thread mostly waits on
# the pipe; Queue.get inside `_ForkingPickler.loads` is the call-site case in stdlib.
REQUIRE = {
    "mp_queue": _leaf_is("multiprocessing/queues.py", "get"),
    "torch_save": _has_frame("_reduce_ex_internal"),
    "tensor_copy": _has_frame("_reduce_ex_internal"),
}
REQUIRE_NATIVE = {"torch_save": _has_native("mz_")}
# Files whose lines the call-site layer reads, copied into sources/ at capture time.
LEAF_SOURCES = ("tests/workloads/serializers.py", "multiprocessing/queues.py")


def _dump_until(pid: int, pred, *, native: bool, n_min: int) -> list:
    dumps: list = []
    while len(dumps) < MAX_DUMPS:
        dumps.append(harness.dump(pid, native=native))
        seen = pred is None or any(pred(t["frames"]) for d in dumps for t in d)
        if len(dumps) >= n_min and seen:
            return dumps
        time.sleep(0.07)
    raise RuntimeError(f"required stack not seen in {MAX_DUMPS} dumps")


# target -> kinds. "venv" is the project venv (3.11, torch/numpy/safetensors).
PLAN: dict[str, list[str]] = {
    "py310": [
        "pickle_alias",
        "pickle_from_alias",
        "pickle_multiline",
        "pickle_ambiguous",
        "pickle_callbacks",
        "pickle_persistent_id",
        "pickle_pure_python",
        "mp_queue",
        "json_dumps",
        "json_loads",
        "orjson_roundtrip",
        "protobuf_serialize",
        "protobuf_parse",
        "protobuf_json_format",
        "protobuf_python_backend",
        "msgpack_packb",
        "msgpack_unpackb",
        "yaml_dump",
        "compute",
    ],
    "py312": [
        "pickle_alias",
        "pickle_from_alias",
        "pickle_multiline",
        "pickle_ambiguous",
        "pickle_callbacks",
        "pickle_persistent_id",
        "pickle_pure_python",
        "mp_queue",
        "json_dumps",
        "json_loads",
        "orjson_roundtrip",
        "protobuf_serialize",
        "protobuf_parse",
        "protobuf_json_format",
        "protobuf_python_backend",
        "msgpack_packb",
        "msgpack_unpackb",
        "yaml_dump",
        "compute",
    ],
    "venv": [
        "torch_save",
        "torch_load",
        "tensor_copy",
        "numpy_save",
        "safetensors_save",
        "many_save",
    ],
}
NATIVE = {
    ("py310", "pickle_alias"),
    ("py310", "json_dumps"),
    ("py310", "protobuf_serialize"),
    ("py310", "msgpack_unpackb"),
    ("venv", "torch_save"),
}
SPEEDSCOPE = {("py312", "pickle_alias"), ("py312", "json_loads"), ("py310", "protobuf_parse")}


def python_for(target: str) -> Path:
    if target == "venv":
        return Path(sys.executable)
    return targets.ensure_target(target)


def pyspy_version() -> str:
    out = subprocess.run([harness.pyspy_binary(), "--version"], capture_output=True, text=True)
    return out.stdout.strip()


def capture(target: str, kind: str) -> Path:
    python = python_for(target)
    version = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    doc: dict[str, object] = {
        "kind": kind,
        "expect": EXPECT[kind],
        "target": target,
        "python": version,
        "pyspy": pyspy_version(),
    }
    with harness.running(python, kind) as pid:
        doc["dumps"] = _dump_until(pid, REQUIRE.get(kind), native=False, n_min=DUMPS)
        if (target, kind) in NATIVE:
            doc["native_dumps"] = _dump_until(pid, REQUIRE_NATIVE.get(kind), native=True, n_min=3)
        if (target, kind) in SPEEDSCOPE:
            with tempfile.TemporaryDirectory() as tmp:
                doc["speedscope"] = harness.record_speedscope(
                    pid, duration_s=1, rate_hz=40, out=Path(tmp) / "out.json"
                )
    sources: dict[str, str] = {}
    for d in [*doc["dumps"], *doc.get("native_dumps", [])]:
        for thread in d:
            for f in thread["frames"]:
                path = f["filename"]
                if path.endswith(LEAF_SOURCES) and path not in sources:
                    rel = "sources/" + (
                        "serializers.py"
                        if path == str(harness.WORKLOAD)
                        else f"{target}-" + path.rsplit("/", 2)[-2] + "-" + path.rsplit("/", 1)[1]
                    )
                    if rel != "sources/serializers.py":
                        shutil.copyfile(path, FIXTURES / rel)
                        # Relative imports resolve through the package's __init__.py.
                        init = Path(path).with_name("__init__.py")
                        if init.exists():
                            init_rel = rel.rsplit("-", 1)[0] + "-__init__.py"
                            shutil.copyfile(init, FIXTURES / init_rel)
                            sources[str(init)] = init_rel
                    sources[path] = rel
    doc["sources"] = sources
    out = FIXTURES / f"{target}-{kind}.json"
    out.write_text(json.dumps(doc, indent=None, separators=(",", ":")) + "\n")
    return out


def main(argv: list[str]) -> int:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / "sources").mkdir(exist_ok=True)
    shutil.copyfile(harness.WORKLOAD, FIXTURES / "sources" / "serializers.py")
    wanted = [tuple(a.split(":", 1)) for a in argv] or [
        (t, k) for t, kinds in PLAN.items() for k in kinds
    ]
    for target, kind in wanted:
        path = capture(target, kind)
        print(f"{path.relative_to(FIXTURES.parents[1])}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
