"""`serwatt profile --checkpoints DIR` on a directory the job controls (issue 21, finding 5):
a file that is not a checkpoint is read once, not every window (remembered by device,
inode, size and mtime); what is remembered and the messages kept are bounded; the count
of files not anchored is printed when the run ends. A planted FIFO or link is never read.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from serwatt.profiler import many
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.profile import record_sink
from serwatt.profiler.profile.record_sink import RecordSink
from serwatt.profiler.profile.session import SessionInfo
from tests.records.test_recorder import window

JUNK = 3000
T0 = 1_800_000_000.0


@pytest.fixture()
def reads(monkeypatch) -> list[str]:
    """The paths the sink asked read_receipts for (the real read_receipts answers)."""
    seen: list[str] = []
    real = record_sink.read_receipts

    def counted(path):  # type: ignore[no-untyped-def]
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(record_sink, "read_receipts", counted)
    return seen


def _sink(tmp_path: Path, ckpt: Path) -> RecordSink:
    sink = RecordSink(tmp_path / "runs.sqlite", run_id="run-1", host={}, checkpoints=ckpt)
    sink.on_start(SessionInfo(1, "train", T0, 50.0, 5.0, Path("/proc")))
    return sink


def _window(sink: RecordSink, i: int) -> None:
    sink.on_window(AttributedWindow(report=window(pid=1, t0=T0 + 5 * i, seed=i)))


def test_a_file_that_is_not_a_checkpoint_is_read_once_not_every_window(
    tmp_path: Path, reads: list[str], capsys
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for i in range(JUNK):
        (ckpt / f"junk-{i:05d}.many").write_bytes(b"not a checkpoint")
    many.save(ckpt / "real.many", {"w": torch.zeros(4)})
    sink = _sink(tmp_path, ckpt)
    _window(sink, 0)
    assert len(reads) == JUNK + 1
    for i in range(1, 4):
        _window(sink, i)
    assert len(reads) == JUNK + 1, f"{len(reads) - JUNK - 1} re-reads in three windows"
    (ckpt / "junk-00007.many").write_bytes(b"rewritten, still not one")  # a new version
    _window(sink, 4)
    assert reads[JUNK + 1 :] == [str(ckpt / "junk-00007.many")]

    assert sink.checkpoint_failures == JUNK + 1  # every version counted once
    assert len(sink.errors) <= record_sink.MAX_ERROR_MESSAGES
    assert len(sink.recorder.receipts("run-1")) == 1  # the real checkpoint is anchored
    sink.finish()
    err = capsys.readouterr().err
    assert f"{JUNK + 1} checkpoint file(s) in {ckpt} not anchored" in err, err
    assert err.count("\n") == 1


def test_what_is_remembered_follows_the_directory(tmp_path: Path, reads: list[str]) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    sink = _sink(tmp_path, ckpt)
    for i in range(5):  # a job that writes junk and deletes it, window after window
        for j in range(200):
            (ckpt / f"junk-{i}-{j}.many").write_bytes(b"x" * (j + 1))
        _window(sink, i)
        for j in range(200):
            (ckpt / f"junk-{i}-{j}.many").unlink()
    assert sink.remembered_files() <= 200
    sink.finish()


def test_a_planted_fifo_or_link_is_not_read(tmp_path: Path, reads: list[str]) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.mkfifo(ckpt / "stall.many")
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's secret")
    (ckpt / "leak.many").symlink_to(secret)
    sink = _sink(tmp_path, ckpt)
    _window(sink, 0)
    assert reads == []
    assert sink.checkpoint_failures == 2
    assert all("not a regular file" in e for e in sink.errors), sink.errors
    sink.finish()
