"""torch_compat: the torch.save / torch.load drop-in, on real model and AdamW state."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from serwatt.profiler.many import ManyFormatError, Receipt, verify
from serwatt.profiler.many import torch_compat as ckpt
from tests.many_trees import assert_same_tree


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    )


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(12, 8, generator=g), torch.randn(12, 4, generator=g)


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        x, y = _batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(7)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.05)
    return model, opt


@pytest.mark.parametrize(
    "load_kwargs",
    [
        {},
        {"map_location": "cpu", "weights_only": True},
        {"map_location": torch.device("cpu"), "weights_only": False, "mmap": True},
        {"map_location": {"cuda:0": "cpu"}},
        {"map_location": lambda storage, loc: storage},
        {"map_location": lambda storage, loc: storage.clone()},
    ],
    ids=["plain", "cpu-str", "device", "dict", "identity-fn", "copying-fn"],
)
def test_resumed_training_matches_an_uninterrupted_run_bit_for_bit(
    tmp_path: Path, load_kwargs: dict[str, Any]
) -> None:
    model, opt = _fresh()
    reference = _train(model, opt, range(12))

    model, opt = _fresh()
    before = _train(model, opt, range(5))
    path = tmp_path / "ckpt.many"
    receipt = ckpt.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "iter_num": 5,
            "config": {"lr": 3e-3, "betas": (0.9, 0.95)},
        },
        path,
    )
    assert isinstance(receipt, Receipt) and verify(path) == []
    del model, opt

    checkpoint = ckpt.load(path, **load_kwargs)
    model, opt = _fresh()
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])
    after = _train(model, opt, range(checkpoint["iter_num"], 12))
    assert before + after == reference
    assert checkpoint["config"]["betas"] == (0.9, 0.95)
    # Training wrote through the loaded tensors (AdamW updates its state in place): the file
    # is untouched, because loaded tensors live on a private copy-on-write mapping.
    assert verify(path) == []


def test_same_contents_as_torch_save_and_load(tmp_path: Path) -> None:
    model, opt = _fresh()
    _train(model, opt, range(3))
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}
    torch.save(state, tmp_path / "ref.pt")
    ckpt.save(state, tmp_path / "ckpt.many")
    assert_same_tree(ckpt.load(tmp_path / "ckpt.many"), torch.load(tmp_path / "ref.pt"))


def test_file_objects_read_and_write_at_their_position(tmp_path: Path) -> None:
    buf = io.BytesIO()
    buf.write(b"prefix")
    ckpt.save({"a": torch.arange(3), "n": 1}, buf)
    ckpt.save({"b": np.ones(2), "n": 2}, buf)
    buf.seek(6)
    first = ckpt.load(buf)
    second = ckpt.load(buf)
    assert buf.read() == b""
    assert_same_tree(first, {"a": torch.arange(3), "n": 1})
    assert_same_tree(second, {"b": np.ones(2), "n": 2})
    with open(tmp_path / "f.many", "wb") as f:
        ckpt.save([torch.ones(2, dtype=torch.bfloat16)], f)
    with open(tmp_path / "f.many", "rb") as f:
        got = ckpt.load(f, weights_only=True)
    assert verify(tmp_path / "f.many") == []
    assert_same_tree(got, [torch.ones(2, dtype=torch.bfloat16)])
    got[0].add_(1)  # a file object's image is private memory
    with open(tmp_path / "f.many", "rb") as f:
        assert float(ckpt.load(f)[0][0]) == 1.0


def test_a_copying_map_location_callable_gives_tensors_off_the_mapping(tmp_path: Path) -> None:
    w = torch.randn(4, 4)
    ckpt.save({"a": w, "tied": w.detach()}, tmp_path / "c.many")
    got = ckpt.load(tmp_path / "c.many", map_location=lambda s, loc: s.clone())
    assert torch.equal(got["a"], w)
    assert got["a"].untyped_storage().data_ptr() == got["tied"].untyped_storage().data_ptr()
    seen = []
    ckpt.load(tmp_path / "c.many", map_location=lambda s, loc: seen.append(loc))
    assert seen == ["cpu"]  # one storage (stored once), saved from the CPU


def test_truncated_and_foreign_files_are_explained(tmp_path: Path) -> None:
    state = {"w": torch.ones(3)}
    torch.save(state, tmp_path / "old.pt")
    with pytest.raises(ManyFormatError, match="looks like a torch.save file .* torch.load"):
        ckpt.load(tmp_path / "old.pt")
    with open(tmp_path / "old.pt", "rb") as f, pytest.raises(ManyFormatError, match="torch.save"):
        ckpt.load(f)
    buf = io.BytesIO()
    ckpt.save(state, buf)
    cut = io.BytesIO(buf.getvalue()[:-100])
    with pytest.raises(ManyFormatError, match="file_length"):
        ckpt.load(cut)


def test_what_is_not_supported_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"state\['model'\]: torch\.nn\.modules"):
        ckpt.save({"model": _model()}, tmp_path / "m.many")
    with pytest.raises(TypeError, match="pickle_module is not supported"):
        ckpt.save({}, tmp_path / "m.many", pickle_module=object())
    ckpt.save({}, tmp_path / "m.many", pickle, 2)  # torch.save's positional defaults pass
    with pytest.raises(TypeError, match="pickle_load_args"):
        ckpt.load(tmp_path / "m.many", fix_imports=True)
    assert ckpt.load(tmp_path / "m.many", encoding="latin1") == {}
    with pytest.raises(TypeError, match="map_location must be"):
        ckpt.load(tmp_path / "m.many", map_location=3)
    with pytest.raises(TypeError, match="not a storage or None"):
        ckpt.save({"w": torch.ones(1)}, tmp_path / "w.many")
        ckpt.load(tmp_path / "w.many", map_location=lambda s, loc: 5)
    with pytest.raises(TypeError, match="binary file object"):
        ckpt.load(12)
