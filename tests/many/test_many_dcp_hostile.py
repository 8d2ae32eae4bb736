"""A `.many` DCP checkpoint directory made by an attacker: a `.metadata.many` that declares a
key a byte item whose bytes are a pickle that runs a shell command, and metadata with values
torch cannot build. Single process, real `dcp.save` / `dcp.load`.

A byte item is what DCP's planner unpickles (`torch.load(weights_only=False)`), so the reader
hands none over unless the caller passes `allow_pickle=True`, and never one where the
caller's state dict holds a tensor. The payload writes a marker file: the test proves the
command never ran, not only that an error came back.
"""

from __future__ import annotations

import io
import json
import os
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from serwatt.profiler import many  # noqa: E402
from serwatt.profiler.many.dcp import (  # noqa: E402
    METADATA_FILE,
    ManyStorageReader,
    ManyStorageWriter,
    decode_metadata,
)

DCP_KEY = "serwatt.dcp"


class _RunsShell:
    """Pickles as a call to os.system: unpickling it runs the command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (self.command,)


def _save(path: Path, state: dict[str, Any]) -> None:
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(state, storage_writer=ManyStorageWriter(path))


def _load(path: Path, state: dict[str, Any], **kw: Any) -> dict[str, Any]:
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(state, storage_reader=ManyStorageReader(path, **kw))
    return state


def _manifest(path: Path) -> dict[str, Any]:
    with many.load(path / METADATA_FILE) as m:
        return json.loads(json.dumps(m.metadata[DCP_KEY]))


def _plant_pickle(ckpt: Path, key: str, marker: Path) -> None:
    """Rewrite `ckpt` so `key` is a byte item whose bytes run `touch marker` when unpickled.

    Everything is re-sealed as a writer would: the rank file's receipt is the one the new
    `.metadata.many` records, so receipts and `verify=True` find nothing wrong."""
    buf = io.BytesIO()
    torch.save(_RunsShell(f"touch {shlex.quote(str(marker))}"), buf)
    rank = ckpt / "rank0.many"
    receipt = many.save(rank, {key: np.frombuffer(buf.getvalue(), dtype=np.uint8)})
    doc = _manifest(ckpt)
    doc["state_dict_metadata"] = {key: {"kind": "bytes"}}
    doc["storage_data"] = [
        {
            "fqn": key,
            "offset": None,
            "index": None,
            "file": "rank0.many",
            "slot": key,
            "receipt": str(receipt),
        }
    ]
    doc["planner_data"] = {"dict": [[key, {"tuple": [key]}]]}
    many.save(ckpt / METADATA_FILE, {}, metadata={DCP_KEY: doc})


# -- finding 2: a byte item never reaches the unpickler by default ---------------------------


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("allow_pickle", [False, True])
def test_a_byte_item_declared_for_a_tensor_key_never_runs_code(
    tmp_path: Path, verify: bool, allow_pickle: bool
) -> None:
    ckpt, marker = tmp_path / "ckpt", tmp_path / "pwned"
    _save(ckpt, {"w": torch.arange(4.0)})
    _plant_pickle(ckpt, "w", marker)
    assert all(many.verify(ckpt / name) == [] for name in os.listdir(ckpt))
    # The caller holds a tensor at 'w': a byte item there is refused even with allow_pickle.
    with pytest.raises(CheckpointException, match=r"ManyFormatError.*'w'.*byte item"):
        _load(ckpt, {"w": torch.zeros(4)}, verify=verify, allow_pickle=allow_pickle)
    assert not marker.exists(), "the checkpoint's pickle ran"


def test_a_byte_item_for_a_non_tensor_key_needs_allow_pickle(tmp_path: Path) -> None:
    ckpt, marker = tmp_path / "ckpt", tmp_path / "pwned"
    _save(ckpt, {"step": 3})
    _plant_pickle(ckpt, "step", marker)
    with pytest.raises(CheckpointException, match=r"ManyFormatError.*'step'.*allow_pickle=True"):
        _load(ckpt, {"step": 0}, verify=True)
    assert not marker.exists(), "the checkpoint's pickle ran"


def test_trusted_byte_items_load_with_allow_pickle(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, {"w": torch.arange(4.0), "step": 3, "config": {"lr": 0.5, "name": "tiny"}})
    template = {"w": torch.zeros(4), "step": 0, "config": {"lr": 0.0, "name": ""}}
    with pytest.raises(CheckpointException, match="allow_pickle=True"):
        _load(ckpt, dict(template))
    got = _load(ckpt, dict(template), verify=True, allow_pickle=True)
    assert torch.equal(got["w"], torch.arange(4.0))
    assert got["step"] == 3 and got["config"] == {"lr": 0.5, "name": "tiny"}


def test_tensor_only_checkpoints_load_without_allow_pickle(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)})
    got = _load(ckpt, {"w": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.bfloat16)})
    assert torch.equal(got["w"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(got["b"], torch.ones(2, dtype=torch.bfloat16))


# -- finding 11: metadata torch cannot materialize ------------------------------------------


def _set(field: str, value: Any) -> Any:
    def mutate(md: dict[str, Any]) -> None:
        md[field] = value

    return mutate


def _chunk(offsets: list[int], sizes: list[int]) -> Any:
    def mutate(md: dict[str, Any]) -> None:
        md["chunks"] = [[offsets, sizes]]

    return mutate


IMPOSSIBLE = [
    ("size 2**70", lambda md: (_set("size", [2**70])(md), _chunk([0], [4])(md)), r"'w' size"),
    ("size -1", lambda md: (_set("size", [-1])(md), _chunk([0], [0])(md)), r"'w' size"),
    ("size 2**63", lambda md: (_set("size", [2**63])(md), _chunk([0], [4])(md)), r"'w' size"),
    (
        "numel overflow",
        lambda md: (_set("size", [2**40, 2**40])(md), _chunk([0, 0], [1, 1])(md)),
        r"'w' size",
    ),
    ("chunk offset -1", _chunk([-1], [4]), r"'w' chunk"),
    ("chunk size 2**70", _chunk([0], [2**70]), r"'w' chunk"),
    ("qint8", _set("dtype", "qint8"), r"'w'.*dtype 'qint8'"),
    ("quint4x2", _set("dtype", "quint4x2"), r"'w'.*dtype 'quint4x2'"),
    ("float8_e4m3fn", _set("dtype", "float8_e4m3fn"), r"'w'.*dtype 'float8_e4m3fn'"),
    ("float8_e5m2", _set("dtype", "float8_e5m2"), r"'w'.*dtype 'float8_e5m2'"),
    ("uint1", _set("dtype", "uint1"), r"'w'.*dtype 'uint1'"),
    ("complex32", _set("dtype", "complex32"), r"'w'.*dtype 'complex32'"),
    (
        "int requires_grad",
        lambda md: (_set("dtype", "int64")(md), _set("requires_grad", True)(md)),
        r"'w'.*requires_grad",
    ),
    ("channels_last 1-D", _set("memory_format", "channels_last"), r"'w'.*channels_last"),
]


@pytest.mark.parametrize(("what", "mutate", "match"), IMPOSSIBLE, ids=[c[0] for c in IMPOSSIBLE])
def test_impossible_metadata_values_are_refused_naming_the_field(
    tmp_path: Path, what: str, mutate: Any, match: str
) -> None:
    _save(tmp_path, {"w": torch.arange(4.0)})
    doc = _manifest(tmp_path)
    mutate(doc["state_dict_metadata"]["w"])
    with pytest.raises(many.ManyFormatError, match=match):
        decode_metadata(doc)
    many.save(tmp_path / METADATA_FILE, {}, metadata={DCP_KEY: doc})
    with pytest.raises(many.ManyFormatError, match=match):
        ManyStorageReader(tmp_path).read_metadata()


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"offset": [-1]}, "storage_data 'w'.*offset"),
        ({"offset": [2**70]}, "storage_data 'w'.*offset"),
        ({"index": -1}, "storage_data 'w'.*index"),
        ({"index": 2**70}, "storage_data 'w'.*index"),
    ],
)
def test_impossible_storage_indexes_are_refused(
    tmp_path: Path, entry: dict[str, Any], match: str
) -> None:
    _save(tmp_path, {"w": torch.arange(4.0)})
    doc = _manifest(tmp_path)
    doc["storage_data"][0].update(entry)
    with pytest.raises(many.ManyFormatError, match=match):
        decode_metadata(doc)


def test_every_dtype_many_stores_round_trips_through_the_metadata(tmp_path: Path) -> None:
    """The dtype check refuses only what .many cannot hold: each of its dtypes still loads."""
    names = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32"]
    names += ["float64", "bfloat16", "complex64", "complex128", "uint16", "uint32", "uint64"]
    state = {n: torch.ones(3, dtype=getattr(torch, n)) for n in names}
    _save(tmp_path, state)
    got = _load(tmp_path, {n: torch.zeros(3, dtype=getattr(torch, n)) for n in names})
    for n in names:
        assert got[n].dtype == state[n].dtype and torch.equal(got[n], state[n]), n
