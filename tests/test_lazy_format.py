"""A restored file's format from its first bytes (profiler.attribution.checkpoints.lazy_format,
read by profiler.profile.checkpoint_sink.is_lazy_file): real files written by torch.save,
safetensors, pickle and the `.many` torch drop-in, under names that say otherwise."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from collectors.fsevents import OPENED, FileEvent
from profiler.attribution.checkpoints import LAZY_HEAD_BYTES, lazy_format, match
from profiler.attribution.episodes import Episode
from profiler.many import torch_compat
from profiler.profile.checkpoint_sink import is_lazy_file

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
    m = match(
        opens, [load], cpu_s=lambda *_: 0.0, read_bytes=lambda *_: 0.0, is_lazy=lambda p: lazy
    )
    assert [r.lazy for r in m.restores] == [lazy, lazy]
    assert m.restores[0].episode is load and m.restores[1].episode is None
