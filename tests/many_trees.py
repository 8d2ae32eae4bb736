"""Exact comparison of state trees for the `.many` state tests: types, keys, bytes."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np
import torch


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_tree(got: Any, want: Any, path: str = "") -> None:
    """`got` equals `want` exactly: same container and leaf types (int keys stay int, tuples
    stay tuples), same dtype, shape and bytes of every tensor, floats equal bit for bit
    (nan matches nan, -0.0 does not match 0.0)."""
    where = path or "root"
    if isinstance(want, torch.Tensor):
        assert type(got) is type(want), f"{where}: {type(got)} != {type(want)}"
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert tuple(got.shape) == tuple(want.shape), f"{where}: shape"
        assert got.requires_grad == want.requires_grad, f"{where}: requires_grad"
        assert tensor_bytes(got) == tensor_bytes(want), f"{where}: tensor bytes differ"
        return
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, np.ndarray | np.generic):
        assert got.dtype == want.dtype and got.shape == want.shape, f"{where}: dtype/shape"
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()
    elif isinstance(want, dict):
        assert list(got.keys()) == list(want.keys()), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            assert type(k) is type(next(x for x in got if x == k and type(x) is type(k)))
            assert_same_tree(got[k], want[k], f"{path}[{k!r}]")
        if isinstance(want, OrderedDict):
            assert_same_tree(
                getattr(got, "_metadata", None), getattr(want, "_metadata", None), f"{path}._md"
            )
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_tree(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert (math.isnan(got) and math.isnan(want)) or (
            got == want and math.copysign(1, got) == math.copysign(1, want)
        ), f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"
