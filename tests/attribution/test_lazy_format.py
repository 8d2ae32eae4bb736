"""A restored file's format from its first bytes (profiler.attribution.checkpoints.lazy_format,
read by profiler.profile.checkpoint_sink.is_lazy_file): real files written by torch.save,
safetensors, pickle and the `.many` torch drop-in, under names that say otherwise; and
whether a written file's bytes rule out a text encoder as its writer (binary_head)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from serwatt.collectors.fsevents import OPENED, WRITTEN, FileEvent
from serwatt.profiler.attribution.checkpoints import (
    FILE_EVENT_ONLY,
    LAZY_HEAD_BYTES,
    binary_head,
    lazy_format,
    match,
)
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.many import torch_compat
from serwatt.profiler.profile.checkpoint_sink import file_head, is_lazy_file

STATE = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.zeros(4)}


def _files(tmp_path: Path) -> dict[str, tuple[Path, bool]]:
    """name -> (a file of that format under a misleading name, whether it is lazy)."""
    many = tmp_path / "ckpt.pt"  # what `serwatt ab --swap torch` leaves: .many bytes, .pt name
    torch_compat.save(STATE, str(many), prev=None)
    zipped = tmp_path / "model.many"  # a torch.save zip under a lazy suffix
    torch.save(STATE, zipped)
    st = tmp_path / "weights.bin"
    save_file(STATE, str(st))
    pk = tmp_path / "state.safetensors"
    pk.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    return {"many": (many, True), "zip": (zipped, False), "st": (st, True), "pickle": (pk, False)}


def test_each_format_is_told_by_its_bytes_not_its_name(tmp_path: Path) -> None:
    for name, (path, lazy) in _files(tmp_path).items():
        head = path.read_bytes()[:LAZY_HEAD_BYTES]
        assert lazy_format(head) is lazy, name
        assert is_lazy_file(str(path)) is lazy, name


def test_bytes_too_short_to_tell_fall_back_to_the_name(tmp_path: Path) -> None:
    assert lazy_format(b"") is None and lazy_format(b"\x10\x00") is None
    for name, lazy in (("a.many", True), ("a.safetensors", True), ("a.pt", False)):
        p = tmp_path / name
        p.write_bytes(b"ab")
        assert is_lazy_file(str(p)) is lazy, name
    assert is_lazy_file(str(tmp_path / "gone.many")) is True  # deleted after its open


def test_a_link_or_a_fifo_is_not_opened_and_goes_by_its_name(tmp_path: Path) -> None:
    files = _files(tmp_path)
    link = tmp_path / "latest.pt"
    link.symlink_to(files["many"][0])  # a .many file behind a link: not followed
    assert is_lazy_file(str(link)) is False
    fifo = tmp_path / "pipe.many"
    os.mkfifo(fifo)  # an open that would block forever without O_NONBLOCK
    assert is_lazy_file(str(fifo)) is True


@pytest.mark.parametrize("lazy", [False, True])
def test_match_marks_restores_by_the_format_it_is_given(lazy: bool) -> None:
    load = Episode(
        pid=7, thread=7, codepath="torch", start=10.0, end=10.2, wall_s=0.2, period_s=0.01,
        resolution_s=0.01, cpu_s=0.1, main_thread=True, durable=False,
    )  # fmt: skip
    opens = [
        FileEvent(t=10.05, kind=OPENED, path="/ckpt/ckpt.pt", bytes=1 << 20),
        FileEvent(t=12.0, kind=OPENED, path="/ckpt/other.pt", bytes=1 << 20),  # no episode
    ]
    head = b"\x89MANY\r\n\x1a\x00" if lazy else b"PK\x03\x04\x00\x00\x08\x00\x00"
    m = match(
        opens, [load], cpu_s=lambda *_: 0.0, read_bytes=lambda *_: 0.0, head_of=lambda p: head
    )
    assert [r.lazy for r in m.restores] == [lazy, lazy]
    assert m.restores[0].episode is load and m.restores[1].episode is None


def test_every_binary_format_reads_binary_and_json_or_yaml_text(tmp_path: Path) -> None:
    for name, (path, _) in _files(tmp_path).items():
        assert binary_head(file_head(str(path))), name
    for name, text in (
        ("state.json", json.dumps({"step": 400, "loss": 1.5})),
        ("state.yaml", "step: 400\nloss: 1.5\n"),
        ("utf8.json", json.dumps({"name": "\u00e9t\u00e9"}, ensure_ascii=False)),
        ("cut.json", '{"\u00e9t\u00e9'),  # a UTF-8 sequence cut off by the head's end
    ):
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        assert not binary_head(file_head(str(p))), name
    assert not binary_head(None) and not binary_head(b"")
    assert binary_head(b"ab\xffcd")  # not UTF-8 inside the head


@pytest.mark.parametrize("binary", [True, False])
def test_a_log_line_after_an_unsampled_save_is_not_its_writer(binary: bool) -> None:
    # the save of a zip went unsampled; the job's json summary line, 5 ms after its file
    # event, is the only episode within tolerance
    log_line = Episode(
        pid=7, thread=7, codepath="json", start=20.005, end=20.015, wall_s=0.01,
        period_s=0.01, resolution_s=0.03, cpu_s=0.01, main_thread=True, durable=False,
    )  # fmt: skip
    head = b"PK\x03\x04\x14\x00\x00\x00\x00" if binary else b'{"step": '
    written = [FileEvent(t=20.0, kind=WRITTEN, path="/ckpt/ckpt-400.pt", bytes=4 << 20)]
    m = match(
        written, [log_line], cpu_s=lambda *_: 0.0, read_bytes=lambda *_: 0.0,
        head_of=lambda p: head,
    )  # fmt: skip
    (c,) = m.checkpoints
    if binary:
        assert c.episode is None and c.timed_by == FILE_EVENT_ONLY
        assert m.unmatched == (log_line,)
    else:  # a json checkpoint: the json episode is its writer
        assert c.episode is log_line and c.stall_s == pytest.approx(0.01)
