"""`.many` files whose header, table and state tree are each sound on their own but describe
something no loader can build: an empty slot with dimensions whose product overflows, a
`requires_grad` leaf over an integer slot. Every loader must refuse them with a `ManyError`,
and `verify` (and `serwatt many verify`) must report them: verify checks what load needs.

The property test starts from a sound state file and rewrites its shapes, its tree's leaves,
its descriptors' dtype codes and its header bytes, then re-seals it (table hash and receipt,
as anyone can): every loader raises only `ManyError`, and whenever one fails, `verify` lists
a problem.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serwatt.profiler.many import (
    ManyError,
    ManyFormatError,
    RightsError,
    load,
    load_state,
    torch_compat,
    verify,
)
from serwatt.profiler.many.format import DTYPES, HEADER_SIZE, parse_header
from serwatt.profiler.many.state import STATE_KEY, save_state
from serwatt.profiler.many.writer import slot_source, write_file
from tests.many.test_many_hostile import reseal

REPO = Path(__file__).resolve().parents[2]


def _forge_table(path: Path, table: dict[str, Any]) -> None:
    """Replace the name table of `path` with `table` and re-seal (it must fit the padding)."""
    raw = bytearray(path.read_bytes())
    header = parse_header(bytes(raw[:HEADER_SIZE]), len(raw))
    text = json.dumps(table, separators=(",", ":")).encode()
    room = header.state_offset - header.table_offset
    assert len(text) <= room, "forged table does not fit the padding"
    raw[header.table_offset : header.state_offset] = text + bytes(room - len(text))
    struct.pack_into("<Q", raw, 48, len(text))
    path.write_bytes(reseal(raw))


def _state_file(path: Path, slots: list[tuple[str, np.ndarray]], root: Any) -> None:
    write_file(
        path,
        [slot_source(name, value) for name, value in slots],
        metadata={STATE_KEY: {"version": 1, "root": root}, "pad": "x" * 400},
    )


def _loaders(path: Path) -> dict[str, Any]:
    def plain_numpy() -> None:
        with load(path) as ckpt:
            for name in ckpt:
                ckpt[name]

    def plain_torch() -> None:
        with load(path) as ckpt:
            ckpt.to_torch()

    def compat_file() -> None:
        with open(path, "rb") as f:
            torch_compat.load(io.BytesIO(f.read()))

    return {
        "load_state": lambda: load_state(path),
        "load_state(as_numpy)": lambda: load_state(path, as_numpy=True),
        "torch_compat.load(path)": lambda: torch_compat.load(path),
        "torch_compat.load(file)": compat_file,
        "load()[name]": plain_numpy,
        "load().torch(name)": plain_torch,
    }


def _cli_verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serwatt", "many", "verify", str(path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        cwd=REPO,
        timeout=120,
    )


# -- finding 8: huge dimensions around a zero ------------------------------------------------

HUGE_EMPTY_SHAPES = [
    [2**62, 2**62, 0],
    [0, 2**62, 2**62],
    [2**40, 2**40, 0, 2**20],
    [2**63 - 1, 0, 9],
]


@pytest.mark.parametrize("shape", HUGE_EMPTY_SHAPES)
def test_an_empty_slot_with_overflowing_dims_is_refused_everywhere(
    tmp_path: Path, shape: list[int]
) -> None:
    path = tmp_path / "huge.many"
    root = {"d": [["a", {"T": 0}]]}
    _state_file(path, [("a", np.zeros((0,), dtype=np.float32))], root)
    _forge_table(
        path,
        {"names": ["a"], "shapes": [shape], "metadata": {STATE_KEY: {"version": 1, "root": root}}},
    )
    for name, run in _loaders(path).items():
        with pytest.raises(ManyFormatError, match="slot 0 'a': shape"):
            run()
            pytest.fail(f"{name} loaded a {shape} slot")
    problems = verify(path)
    assert any("slot 0 'a': shape" in p for p in problems), problems


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.uint8, np.int32])
@pytest.mark.parametrize("leaf", [{"T": 0, "rg": True}, {"T": 0, "P": True, "rg": True}])
def test_requires_grad_on_a_non_floating_slot_is_refused(
    tmp_path: Path, dtype: Any, leaf: dict[str, Any]
) -> None:
    path = tmp_path / "rg.many"
    _state_file(path, [("a", np.zeros((3,), dtype=dtype))], {"d": [["a", leaf]]})
    for name in ("load_state", "load_state(as_numpy)", "torch_compat.load(path)"):
        with pytest.raises(ManyFormatError, match="requires grad"):
            _loaders(path)[name]()
    problems = verify(path)
    assert any("requires grad" in p for p in problems), problems


def test_requires_grad_on_floating_and_complex_slots_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "ok.many"
    state = {
        "f": torch.zeros(2, requires_grad=True),
        "bf": torch.zeros(2, dtype=torch.bfloat16, requires_grad=True),
        "c": torch.zeros(2, dtype=torch.complex64, requires_grad=True),
        "p": torch.nn.Parameter(torch.ones(3)),
        "ip": torch.nn.Parameter(torch.ones(3, dtype=torch.int64), requires_grad=False),
    }
    save_state(path, state)
    assert verify(path) == []
    got = load_state(path)
    assert [got[k].requires_grad for k in ("f", "bf", "c", "p", "ip")] == [
        True,
        True,
        True,
        True,
        False,
    ]


def test_serwatt_many_verify_fails_both_files(tmp_path: Path) -> None:
    huge = tmp_path / "huge.many"
    root = {"d": [["a", {"T": 0}]]}
    _state_file(huge, [("a", np.zeros((0,), dtype=np.float32))], root)
    _forge_table(
        huge,
        {
            "names": ["a"],
            "shapes": [[2**62, 2**62, 0]],
            "metadata": {STATE_KEY: {"version": 1, "root": root}},
        },
    )
    rg = tmp_path / "rg.many"
    _state_file(rg, [("a", np.zeros((3,), dtype=np.int64))], {"d": [["a", {"T": 0, "rg": True}]]})
    for path, what in ((huge, "shape"), (rg, "requires grad")):
        out = _cli_verify(path)
        assert out.returncode == 1, out.stdout + out.stderr
        assert what in out.stdout and "ok:" not in out.stdout, out.stdout
        assert "Traceback" not in out.stderr, out.stderr


# -- property: only ManyError, and verify fails whenever a loader does ------------------------


@pytest.fixture(scope="module")
def seed_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seed2") / "seed.many"
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3).requires_grad_(True)
    state = {
        "w": weight,
        "p": torch.nn.Parameter(torch.ones(4)),
        "i": torch.arange(4, dtype=torch.int64),
        "b": torch.tensor([True, False]),
        "bf": torch.ones(3, dtype=torch.bfloat16),
        "e": torch.zeros(0, 5),
        "n": np.arange(3, dtype=np.int16),
        "s": np.float64(2.5),
        "nested": [(1, "x", None), {"k": 1.5}],
    }
    save_state(path, state, metadata={"pad": "x" * 600})
    return path


DIMS = st.sampled_from([0, 1, 2, 3, 4, 5, 6, -1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64])
SHAPES = st.one_of(st.lists(DIMS, max_size=5), st.none(), st.integers(), st.text(max_size=3))
LEAF_EDITS = st.lists(
    st.tuples(
        st.integers(0, 20),
        st.sampled_from(["rg", "P", "s", "T->N", "N->T", "slot", "v", "drop"]),
        st.integers(-1, 12),
    ),
    max_size=4,
)
CODES = st.lists(
    st.tuples(st.integers(0, 11), st.sampled_from(sorted(DTYPES)) | st.integers(0, 20)),
    max_size=3,
)
PROPERTY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


def _leaves(node: Any, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        if "T" in node or "N" in node:
            out.append(node)
        else:
            for v in node.values():
                _leaves(v, out)
    elif isinstance(node, list):
        for v in node:
            _leaves(v, out)
    return out


def _edit_leaf(leaf: dict[str, Any], op: str, arg: int) -> None:
    tag = "T" if "T" in leaf else "N"
    if op in ("rg", "P", "s"):
        leaf[op] = True
    elif op == "T->N" and tag == "T":
        leaf["N"] = leaf.pop("T")
    elif op == "N->T" and tag == "N":
        leaf["T"] = leaf.pop("N")
    elif op == "slot":
        leaf[tag] = arg
    elif op == "v":
        leaf["v"] = arg
    elif op == "drop":
        for flag in ("rg", "P", "s"):
            leaf.pop(flag, None)


@PROPERTY
@given(
    shape_edits=st.lists(st.tuples(st.integers(0, 11), SHAPES), max_size=3),
    leaf_edits=LEAF_EDITS,
    code_edits=CODES,
    header_edits=st.lists(st.tuples(st.integers(0, 191), st.integers(0, 255)), max_size=2),
)
def test_mutated_state_files_raise_only_many_errors_and_verify_agrees(
    tmp_path: Path, seed_state: Path, shape_edits, leaf_edits, code_edits, header_edits
) -> None:
    raw = bytearray(seed_state.read_bytes())
    header = parse_header(bytes(raw[:HEADER_SIZE]), len(raw))
    n = header.slot_count
    table = json.loads(bytes(raw[header.table_offset : header.table_end]))
    for i, shape in shape_edits:
        if i < n:
            table["shapes"][i] = shape
    leaves = _leaves(table["metadata"][STATE_KEY]["root"], [])
    for k, op, arg in leaf_edits:
        _edit_leaf(leaves[k % len(leaves)], op, arg)
    for i, code in code_edits:
        if i < n:
            struct.pack_into("<H", raw, HEADER_SIZE + 64 * i + 20, code)
    path = tmp_path / "m.many"
    path.write_bytes(bytes(raw))
    _forge_table(path, table)
    if header_edits:  # the hashed header bytes, then re-sealed: its own checks must hold
        raw = bytearray(path.read_bytes())
        for pos, value in header_edits:
            raw[pos] = value
        path.write_bytes(reseal(raw))

    problems = verify(path)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    for name, run in _loaders(path).items():
        try:
            run()
        except RightsError:
            raise AssertionError("rights are not mutated here") from None
        except ManyError as exc:
            assert problems, f"{name} raised {exc!r} but verify found nothing"
        except Exception as exc:  # noqa: BLE001 - the property is about exactly this
            raise AssertionError(f"{name} raised {type(exc).__name__}: {exc}") from exc


def test_property_seed_is_sound_and_has_each_leaf_kind(seed_state: Path) -> None:
    path = seed_state
    assert verify(path) == []
    got = load_state(path)
    assert got["w"].requires_grad and isinstance(got["p"], torch.nn.Parameter)
    assert got["s"] == np.float64(2.5) and got["e"].shape == (0, 5)
    with load(path) as ckpt:
        kinds = {info.dtype for info in ckpt.slots()}
    assert kinds == {"float32", "int64", "bool", "bfloat16", "int16", "float64"}
