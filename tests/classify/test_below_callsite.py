"""Issue 22 item 2: a Python frame below an unambiguous serializer call-site line is
inside that serializer's call (a C serializer has no frame: the reduce functions it
runs stack directly on its caller's line). Recorded-style stacks, leaf first, against
real sources: the stdlib's multiprocessing/queues.py and small files in tmp_path."""

from __future__ import annotations

import multiprocessing.queues
import multiprocessing.reduction
from pathlib import Path

import pytest

from serwatt.collectors.samples import Frame
from serwatt.profiler.classify.classifier import Classifier

QUEUES = multiprocessing.queues.__file__
REDUCTION = multiprocessing.reduction.__file__
TORCH_RED = "/venv/lib/python3.11/site-packages/torch/multiprocessing/reductions.py"
SHARER = str(Path(QUEUES).with_name("resource_sharer.py"))
CONNECTION = str(Path(QUEUES).with_name("connection.py"))


def _line_of(path: str, text: str) -> int:
    lines = Path(path).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


LOADS_LINE = _line_of(QUEUES, "return _ForkingPickler.loads(res)")
DUMPS_LINE = _line_of(QUEUES, "obj = _ForkingPickler.dumps(obj)")
CALLER = Frame("_MultiProcessingDataLoaderIter._try_get_data", "/job/dataloader.py", 1291)


@pytest.fixture
def classifier() -> Classifier:
    return Classifier.default()


def test_the_fd_handshake_under_queue_get_loads_is_pickle(classifier: Classifier) -> None:
    # rebuild_storage_fd -> DupFd.detach -> Client -> answer_challenge, as sampled
    frames = (
        Frame("answer_challenge", CONNECTION, 1000),
        Frame("Client", CONNECTION, 520),
        Frame("_ResourceSharer.get_connection", SHARER, 86),
        Frame("DupFd.detach", SHARER, 57),
        Frame("rebuild_storage_fd", TORCH_RED, 513),
        Frame("Queue.get", QUEUES, LOADS_LINE),
        CALLER,
    )
    got = classifier.explain(frames)
    assert got.classification.codepath == "pickle"
    assert got.classification.rule_id == "pickle.call+below"
    assert got.classification.confidence == "high"
    assert got.frame_index == 5 and "inside the call" in got.how


def test_the_leaf_on_the_same_line_keeps_its_own_rule(classifier: Classifier) -> None:
    got = classifier.classify_frames((Frame("Queue.get", QUEUES, LOADS_LINE), CALLER))
    assert (got.codepath, got.rule_id) == ("pickle", "pickle.call")


def test_a_deeper_rule_of_the_same_codepath_names_it(classifier: Classifier) -> None:
    frames = (
        Frame("ForkingPickler.dumps", REDUCTION, 51),
        Frame("Queue._feed", QUEUES, DUMPS_LINE),
        Frame("Thread.run", "/usr/lib/python3.11/threading.py", 982),
    )
    got = classifier.classify_frames(frames)
    assert (got.codepath, got.rule_id) == ("pickle", "pickle.multiprocessing")


def _stack(tmp_path: Path, line: str, callee: str = "helper") -> tuple[Frame, ...]:
    src = tmp_path / "job.py"
    src.write_text(f"import pickle\nimport json\n\n\ndef run(a, b, self):\n    {line}\n")
    return (Frame(callee, str(tmp_path / "lib.py"), 3), Frame("run", str(src), 6))


@pytest.mark.parametrize(
    "line",
    [
        "return pickle.loads(a)",
        "x = pickle.dumps(a, protocol=pickle.HIGHEST_PROTOCOL)",
        "pickle.dump(a, b, 5)",
    ],
)
def test_an_unambiguous_line_encloses_deeper_frames(
    tmp_path: Path, classifier: Classifier, line: str
) -> None:
    (tmp_path / "lib.py").write_text("def helper():\n    x = 1\n    return x\n")
    got = classifier.classify_frames(_stack(tmp_path, line))
    assert (got.codepath, got.rule_id) == ("pickle", "pickle.call+below")


@pytest.mark.parametrize(
    "line",
    [
        "return pickle.loads(a) + helper(b)",  # another call: it may be the caller
        "return pickle.loads(str(a))",  # a trivial call can run __str__
        "return pickle.dumps(self.state)",  # a property getter runs before the call
        "return pickle.dumps(a[0])",  # __getitem__
        "return pickle.dumps(a) + json.dumps(b)",  # two serializers
        "return [pickle.dumps(x) for x in a]",  # a comprehension
        "return self.msg.SerializeToString()",  # a method on an unresolved receiver
    ],
)
def test_an_ambiguous_line_stays_as_it_was(
    tmp_path: Path, classifier: Classifier, line: str
) -> None:
    (tmp_path / "lib.py").write_text("def helper():\n    x = 1\n    return x\n")
    got = classifier.classify_frames(_stack(tmp_path, line))
    assert got.codepath == "other" and got.rule_id is None


def test_a_line_without_a_serializer_encloses_nothing(
    tmp_path: Path, classifier: Classifier
) -> None:
    (tmp_path / "lib.py").write_text("def helper():\n    x = 1\n    return x\n")
    got = classifier.classify_frames(_stack(tmp_path, "return helper(a)"))
    assert got.codepath == "other"


def test_a_deeper_scope_of_another_codepath_is_inside_the_outer_call(
    tmp_path: Path, classifier: Classifier
) -> None:
    # json.dumps run by a reduce function under pickle.dumps: the outermost scope decides
    frames = (
        Frame("JSONEncoder.iterencode", "/usr/lib/python3.11/json/encoder.py", 258),
        Frame("helper", str(tmp_path / "lib.py"), 3),
        *_stack(tmp_path, "return pickle.dumps(a)")[1:],
    )
    got = classifier.classify_frames(frames)
    assert (got.codepath, got.rule_id) == ("pickle", "pickle.call+below")
