"""`serwatt profile --pprof FILE`: a real profile of a json job, read back by `go tool
pprof` (Debian's golang-go; `make system-deps`) and by the protobuf runtime."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.profiler.profile.pprof import SAMPLE_TYPES, Profile
from tests.workloads.targets import find_interpreter

REPO = Path(__file__).resolve().parents[2]
PY312 = str(find_interpreter(("3.12.1", "3.13.0", "3.12")))

JSON_JOB = (
    "import json, time\n"
    "d = {'k%d' % i: [i, str(i), {'x': i}] for i in range(300)}\n"
    # 3 s of its own CPU, however busy the machine is
    "until = time.process_time() + 3.0\n"
    "while time.process_time() < until: json.dumps(d)\n"
)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("pprof")
    out, doc_path = tmp / "job.pb.gz", tmp / "job.json"
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", "--rate", "100", "--json", str(doc_path),
         "--pprof", str(out), "--", PY312, "-c", JSON_JOB],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out, json.loads(doc_path.read_text())


def _parse(path: Path):
    prof = Profile()
    prof.ParseFromString(gzip.decompress(path.read_bytes()))
    return prof


def test_the_profile_holds_the_jobs_json_stacks_with_the_tables_cpu(profiled) -> None:
    path, doc = profiled
    prof = _parse(path)
    st = list(prof.string_table)
    assert [(st[t.type], st[t.unit]) for t in prof.sample_type] == [
        (t, u) for t, u, _, _ in SAMPLE_TYPES
    ]
    cpu_i = [st[t.type] for t in prof.sample_type].index("cpu")
    by_codepath: dict[str, float] = {}
    for s in prof.sample:
        labels = {st[lb.key]: st[lb.str] for lb in s.label}
        assert set(labels) == {"codepath", "direction"}
        by_codepath[labels["codepath"]] = by_codepath.get(labels["codepath"], 0) + s.value[cpu_i]
    # the stacks' CPU of the json codepath is the table's json CPU (the same carriers):
    # equal up to the nanosecond rounding of each stack
    # (over many stacks: how much CPU the table gives json is the weighing's business, and
    # a contended node reads it low, 0.79 of the job's 3 s beside two busy loops)
    json_cpu_s = doc["codepaths"]["json"]["cpu_s"]
    assert doc["codepaths"]["json"]["samples"] >= 50 and json_cpu_s > 0, doc["codepaths"]["json"]
    assert by_codepath["json"] / 1e9 == pytest.approx(
        json_cpu_s, abs=1e-6 * len(prof.sample) + 1e-5
    )
    functions = {st[f.name]: st[f.filename] for f in prof.function}
    assert functions.get("dumps", "").endswith("json/__init__.py"), functions


@pytest.mark.skipif(shutil.which("go") is None, reason="needs golang-go (make system-deps)")
def test_go_tool_pprof_top_lists_the_json_frames_with_their_cpu(profiled) -> None:
    path, doc = profiled
    r = subprocess.run(
        ["go", "tool", "pprof", "-top", "-sample_index=cpu", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    # "  flat  flat%   sum%        cum   cum%" rows: json.dumps' own frames, with cum CPU
    cum = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*[\d.]+\w*\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)(\w*)\s+[\d.]+%\s+(\S+)", line)
        if m:  # a flat of 0 has no unit; a cum here always has one
            unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]
            cum[m.group(3)] = float(m.group(1)) * unit
    for frame in ("dumps", "JSONEncoder.encode", "JSONEncoder.iterencode"):
        assert frame in cum, r.stdout
    # the job spends its time in json.dumps: its cum CPU is the json codepath's, less the
    # samples taken on the calling line before dumps' frame began (json by the call-site
    # rule, without a dumps frame): 0.99-1.0 of it in runs here
    json_cpu_s = doc["codepaths"]["json"]["cpu_s"]
    assert 0.95 * json_cpu_s <= cum["dumps"] <= json_cpu_s + 0.01, (cum["dumps"], json_cpu_s)
    tags = subprocess.run(
        ["go", "tool", "pprof", "-tags", str(path)], capture_output=True, text=True, timeout=120
    )
    assert "codepath" in tags.stdout and "json" in tags.stdout and "direction" in tags.stdout


def test_stacks_are_bounded_and_what_is_cut_is_counted() -> None:
    from serwatt.collectors.samples import Frame, Sample
    from serwatt.profiler.classify.codepaths import Classification
    from serwatt.profiler.sampling.stacks import (
        MAX_FRAMES,
        OVERFLOW_FRAME,
        TRUNCATED_FRAME,
        fold_stacks,
    )

    def sample(i: int, depth: int = 2) -> Sample:
        frames = tuple(Frame(f"f{i}_{d}", "/x.py", d) for d in range(depth))
        return Sample(pid=1, tid=1, thread_id=1, thread_name=None, t=0.0, frames=frames)

    samples = [sample(i) for i in range(10)] + [sample(99, depth=MAX_FRAMES + 5)]
    labels = [Classification("json", direction="encode")] * len(samples)
    folded = fold_stacks(samples, labels, samples, labels, [0.1] * len(samples), cap=4)
    assert len(folded) == 5  # 4 kept, the rest under one overflow stack
    over = folded[((OVERFLOW_FRAME,), "json", "encode")]
    assert over.samples == 7 and over.cpu_s == pytest.approx(0.7)
    deep = fold_stacks(samples[-1:], labels[:1], [], [], [])
    ((frames, _, _),) = deep
    assert len(frames) == MAX_FRAMES + 1 and frames[-1] == TRUNCATED_FRAME


def test_equal_stacks_of_distinct_frame_objects_are_one_stack() -> None:
    from serwatt.collectors.samples import Frame, Sample
    from serwatt.profiler.classify.codepaths import Classification
    from serwatt.profiler.sampling.stacks import fold_stacks

    def sample() -> Sample:  # new Frame objects each time, as two parsers make them
        frames = (Frame("dumps", "/j.py", 3), Frame("main", "/m.py", 9))
        return Sample(pid=1, tid=1, thread_id=1, thread_name=None, t=0.0, frames=frames)

    samples = [sample() for _ in range(3)]
    labels = [Classification("json", direction="encode")] * 3
    folded = fold_stacks(samples, labels, samples, labels, [0.25] * 3)
    assert len(folded) == 1
    (tally,) = folded.values()
    assert tally.samples == 3 and tally.cpu_s == pytest.approx(0.75)
