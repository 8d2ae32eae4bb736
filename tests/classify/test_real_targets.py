"""Real py-spy against real Python processes, on CPython 3.10 (bare frame names) and
3.12 (qualnames), classified through /proc/<pid>/root as the daemon does.

Target venvs (.venv-targets/py310, py312, with protobuf (upb), msgpack, pyyaml, orjson) are
built by `make target-venvs` or on first use here; without them the test fails and
says how to build them. torch.save/torch.load run on the project venv (3.11, CPU torch).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.classify.classifier import Classifier
from tests.workloads import harness, targets
from tests.workloads.serializers import EXPECT

DUMPS = 6

KINDS = [
    "pickle_alias",
    "pickle_from_alias",
    "pickle_multiline",
    "pickle_callbacks",
    "pickle_pure_python",
    "json_dumps",
    "json_loads",
    "orjson_roundtrip",
    "protobuf_serialize",
    "protobuf_parse",
    "protobuf_python_backend",
    "msgpack_packb",
    "msgpack_unpackb",
]


@pytest.fixture(scope="module", params=["py310", "py312"])
def target(request: pytest.FixtureRequest) -> tuple[str, Path]:
    try:
        return request.param, targets.ensure_target(request.param)
    except targets.TargetUnavailable as exc:
        pytest.fail(f"target interpreter {request.param} unavailable: {exc}")


def _sample_and_classify(python: Path, kind: str) -> Counter[tuple[str, str | None]]:
    classifier = Classifier.default()
    counts: Counter[tuple[str, str | None]] = Counter()
    with harness.running(python, kind) as pid:
        proc_root = Path(f"/proc/{pid}/root")
        for _ in range(DUMPS):
            for s in harness.samples_from_dump(harness.dump(pid)):
                if s.frames:
                    c = classifier.classify(s, proc_root=proc_root)
                    counts[(c.codepath, c.rule_id)] += 1
    return counts


def _check(counts: Counter[tuple[str, str | None]], expect: str) -> None:
    by_codepath = Counter()
    for (codepath, _), n in counts.items():
        by_codepath[codepath] += n
    total = sum(by_codepath.values())
    assert total >= DUMPS // 2, counts
    assert set(by_codepath) <= {expect, "other"}, counts
    # The loop's own lines can take a sample; the serializer takes most.
    assert by_codepath[expect] >= 0.5 * total, counts


@pytest.mark.parametrize("kind", KINDS)
def test_serializer_lands_in_its_codepath(target: tuple[str, Path], kind: str) -> None:
    _name, python = target
    _check(_sample_and_classify(python, kind), EXPECT[kind])


def test_multiprocessing_queue(target: tuple[str, Path]) -> None:
    """mp.Queue: the feeder thread's ForkingPickler.dumps and Queue.get's C loads
    (a call site in stdlib code, bound by a relative import) are pickle; pipe I/O and
    waits are other."""
    _name, python = target
    classifier = Classifier.default()
    by_rule: Counter[tuple[str, str | None]] = Counter()
    with harness.running(python, "mp_queue") as pid:
        proc_root = Path(f"/proc/{pid}/root")
        for _ in range(40):
            for s in harness.samples_from_dump(harness.dump(pid)):
                if s.frames:
                    c = classifier.classify(s, proc_root=proc_root)
                    by_rule[(c.codepath, c.rule_id)] += 1
            if by_rule[("pickle", "pickle.call")] and by_rule[("pickle", "pickle.multiprocessing")]:
                break
    assert {cp for cp, _ in by_rule} <= {"pickle", "other"}, by_rule
    assert by_rule[("pickle", "pickle.call")] >= 1, by_rule  # Queue.get
    assert by_rule[("pickle", "pickle.multiprocessing")] >= 1, by_rule  # feeder thread


@pytest.mark.parametrize("kind", ["torch_save", "torch_load"])
def test_torch_on_the_project_venv(kind: str) -> None:
    import sys

    counts = _sample_and_classify(Path(sys.executable), kind)
    _check(counts, "torch")
    assert {r for (cp, r) in counts if cp == "torch"} <= {
        "torch.serialization",
        "torch.weights-only-unpickler",
    }


def test_target_interpreters_are_before_and_after_3_11(target: tuple[str, Path]) -> None:
    import subprocess

    name, python = target
    out = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    version = (int(out[0]), int(out[1]))
    assert version < (3, 11) if name == "py310" else version >= (3, 12)


@pytest.mark.parametrize(
    "kind, expect", [("pickle_alias", "pickle"), ("protobuf_serialize", "protobuf")]
)
def test_end_to_end_through_sample_window(target: tuple[str, Path], kind: str, expect: str) -> None:
    """The sampler (py-spy speedscope window + per-thread CPU) with this classifier."""
    from serwatt.profiler.sampling.collect import sample_window

    _name, python = target
    with harness.running(python, kind) as pid:
        report = sample_window(
            pid,
            duration_s=1.5,
            plan=SamplingPlan(rate_hz=50, on_cpu_run=True),
            classifier=Classifier.default(),
        )
    samples = {cp: w.samples for cp, w in report.codepaths.items()}
    total = sum(samples.values())
    assert total >= 20, samples
    assert samples[expect] >= 0.6 * total, samples
    assert {cp for cp, n in samples.items() if n} <= {expect, "other"}, samples
    assert report.codepaths[expect].cpu_s > report.codepaths["other"].cpu_s


def test_explain_command_on_a_live_process(
    target: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`serwatt classify --pid P`: real py-spy dump, reasons per thread."""
    from serwatt.profiler.cli.main import main

    _name, python = target
    out = ""
    with harness.running(python, "protobuf_serialize") as pid:
        # A nonblocking dump can race the target, or catch the loop's own line: retry.
        for _ in range(10):
            assert main(["classify", "--pid", str(pid)]) == 0
            out = capsys.readouterr().out
            if "protobuf  rule=protobuf.method" in out:
                break
    assert "protobuf  rule=protobuf.method" in out, out
    assert "[callsite]" in out
