"""Whole checkpoints as `.many` state trees: round trips, names, sharing, bad leaves, hostile
trees."""

from __future__ import annotations

import math
import os
import re
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
import torch

from serwatt.profiler.many import ManyFormatError, load, save, verify
from serwatt.profiler.many.format import HEADER_SIZE, parse_header
from serwatt.profiler.many.state import (
    MAX_DEPTH,
    STATE_KEY,
    load_state,
    open_state,
    save_state,
    slot_name,
)
from serwatt.profiler.many.writer import slot_source, write_file
from tests.many.test_many import NUMPY_DTYPES  # every numpy dtype FORMAT.md lists
from tests.many_trees import assert_same_tree

TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.uint16,
    torch.int16,
    torch.uint32,
    torch.int32,
    torch.uint64,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


def _random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (max(1, math.prod(shape)) * 16,), dtype=torch.uint8, generator=g)
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = math.prod(shape)
    t = raw[: n * itemsize].view(dtype).reshape(shape).clone()
    return t if dtype != torch.bool else t.view(torch.uint8).remainder(2).bool()


def _trained_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=(0.9, 0.95),
        amsgrad=True,
    )
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(5, 6)).pow(2).mean().backward()
        opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "iter_num": 4,
        "config": {"lr": 1e-2, "betas": (0.9, 0.95), "compile": False, "name": "mlp"},
    }


# -- round trips -----------------------------------------------------------------------------


def test_every_torch_and_numpy_dtype_round_trips(tmp_path: Path) -> None:
    state: dict[str, Any] = {"torch": {}, "numpy": {}}
    for i, dt in enumerate(TORCH_DTYPES):
        name = str(dt).removeprefix("torch.")
        state["torch"][name] = [
            _random_tensor(dt, (3, 5), i),
            _random_tensor(dt, (), i + 100),
            _random_tensor(dt, (0, 4), i),
        ]
    rng = np.random.default_rng(1)
    for dt in NUMPY_DTYPES:
        raw = rng.integers(0, 256, 64, dtype=np.uint8)
        arr = raw[: 4 * np.dtype(dt).itemsize].view(dt) if dt is not np.bool_ else raw[:4] > 100
        state["numpy"][np.dtype(dt).name] = (arr.reshape(2, 2), np.zeros((0,), dtype=dt), dt(1))
    state["numpy"]["big-endian"] = np.arange(6, dtype=">i4")
    save_state(tmp_path / "s.many", state)
    got = load_state(tmp_path / "s.many", verify=True)
    want = dict(state)
    # Big-endian input is stored little-endian (FORMAT.md): it comes back native.
    want["numpy"] = dict(state["numpy"], **{"big-endian": np.arange(6, dtype="<i4")})
    assert_same_tree(got, want)
    assert got["torch"]["bfloat16"][0].dtype == torch.bfloat16


def test_scalars_containers_and_key_types_round_trip(tmp_path: Path) -> None:
    meta: OrderedDict[str, Any] = OrderedDict([("", {"version": 1}), ("0", {"version": 2})])
    od: OrderedDict[str, Any] = OrderedDict([("z", 1), ("a", torch.ones(2))])
    od._metadata = meta  # type: ignore[attr-defined]
    state = {
        "floats": [math.inf, -math.inf, math.nan, -0.0, 0.0, 1e-310, 1.5, 1e300, 2.0],
        "ints": [0, -1, 2**63, -(2**70), 10**100],
        "others": [True, False, None, "", "ünïcødé ✓", "a\x00b"],
        "tuple": (1, (2.0, [3]), ()),
        "empty": {"l": [], "t": (), "d": {}},
        "keys": {3: "int", "3": "str", -7: "neg", "a.b": "dot", "%2E": "pct", "": "empty"},
        "ordered": od,
        7: {"nested": {"deeper": {"deepest": [np.float64(0.5), torch.tensor(3)]}}},
    }
    save_state(tmp_path / "s.many", state, metadata={"step": 12})
    loaded = open_state(tmp_path / "s.many")
    assert_same_tree(loaded.tree, state)
    assert loaded.metadata == {"step": 12}
    assert list(loaded.tree["keys"]) == [3, "3", -7, "a.b", "%2E", ""]
    assert type(loaded.tree["ordered"]) is OrderedDict
    assert loaded.tree["ordered"]._metadata == meta


def test_root_may_be_a_leaf_or_a_list(tmp_path: Path) -> None:
    for obj in (torch.arange(4), 3.25, None, [torch.zeros(1), "x"], np.arange(3)):
        save_state(tmp_path / "r.many", obj)
        assert_same_tree(load_state(tmp_path / "r.many"), obj)
    assert list(load(tmp_path / "r.many")) == ["%root"]


def test_model_and_adamw_state_dicts_round_trip_exactly(tmp_path: Path) -> None:
    state = _trained_state()
    save_state(tmp_path / "ckpt.many", state)
    got = load_state(tmp_path / "ckpt.many", verify=True)
    assert_same_tree(got, state)
    groups = got["optimizer"]["param_groups"]
    assert groups[0]["betas"] == (0.9, 0.95) and type(groups[0]["betas"]) is tuple
    assert groups[0]["amsgrad"] is True and groups[0]["foreach"] is None
    assert groups[0]["params"] == [0, 1] and groups[1]["params"] == [2, 3]
    assert sorted(got["optimizer"]["state"]) == [0, 1, 2, 3]
    assert set(got["optimizer"]["state"][3]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    names = list(load(tmp_path / "ckpt.many"))
    assert "optimizer.state.3.exp_avg" in names
    assert "model.0%2Eweight" in names  # the model key "0.weight" keeps its dot, escaped


def test_slot_names_are_unique_and_distinguish_key_types() -> None:
    assert slot_name(("optimizer", "state", 3, "exp_avg")) == "optimizer.state.3.exp_avg"
    assert slot_name(("a.b",)) == "a%2Eb"
    assert slot_name(("a", "b")) == "a.b"
    assert slot_name(("3",)) == "%33" and slot_name((3,)) == "3"
    assert slot_name(("-1",)) == "%2D1" and slot_name((-1,)) == "-1"
    assert slot_name(("",)) == "%" and slot_name(()) == "%root"
    assert slot_name(("100%",)) == "100%25"
    paths = [("a.b",), ("a", "b"), ("3",), (3,), ("",), ("%",), ("%25",), ("x", ""), ("x.",)]
    assert len({slot_name(p) for p in paths}) == len(paths)


def test_loaded_tensors_are_private_copy_on_write(tmp_path: Path) -> None:
    path = tmp_path / "s.many"
    save_state(path, {"w": torch.arange(10.0), "a": np.arange(4)})
    got = load_state(path)
    got["w"].add_(1.0)
    got["a"][0] = 99
    assert verify(path) == []
    again = load_state(path)
    assert torch.equal(again["w"], torch.arange(10.0))
    assert again["a"].tolist() == [0, 1, 2, 3]


def test_as_numpy_needs_no_torch_objects(tmp_path: Path) -> None:
    save_state(
        tmp_path / "s.many", {"w": torch.arange(3.0), "b": torch.ones(2, dtype=torch.bfloat16)}
    )
    got = load_state(tmp_path / "s.many", as_numpy=True)
    assert type(got["w"]) is np.ndarray and got["w"].tolist() == [0.0, 1.0, 2.0]
    assert got["b"].dtype == np.uint16 and got["b"].tolist() == [0x3F80, 0x3F80]


def test_parameters_and_requires_grad_round_trip(tmp_path: Path) -> None:
    p = torch.nn.Parameter(torch.randn(3))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    leaf = torch.zeros(2, requires_grad=True)
    save_state(tmp_path / "s.many", {"p": p, "frozen": frozen, "leaf": leaf})
    got = load_state(tmp_path / "s.many")
    assert type(got["p"]) is torch.nn.Parameter and got["p"].requires_grad
    assert type(got["frozen"]) is torch.nn.Parameter and not got["frozen"].requires_grad
    assert type(got["leaf"]) is torch.Tensor and got["leaf"].requires_grad and got["leaf"].is_leaf
    assert_same_tree(got, {"p": p, "frozen": frozen, "leaf": leaf})


def test_non_contiguous_tensors_keep_their_values(tmp_path: Path) -> None:
    base = torch.arange(24.0).reshape(4, 6)
    z = torch.randn(3, dtype=torch.complex64)
    state = {"t": base.t(), "every_other": torch.arange(10)[::2], "conj": z.conj()}
    save_state(tmp_path / "s.many", state)
    got = load_state(tmp_path / "s.many")
    assert torch.equal(got["t"], base.t()) and got["t"].is_contiguous()
    assert torch.equal(got["every_other"], torch.arange(0, 10, 2))
    assert torch.equal(got["conj"], z.conj().resolve_conj()) and not got["conj"].is_conj()


# -- shared storage --------------------------------------------------------------------------


def test_identical_views_are_stored_once_and_come_back_sharing(tmp_path: Path) -> None:
    w = torch.randn(4, 4)
    tied_a, tied_b = w.detach(), w.detach()  # what state_dict() gives for tied weights
    arr = np.arange(8.0)
    state = {"a": tied_a, "b": tied_b, "same": [w, w], "np": arr, "np_view": arr.view()}
    save_state(tmp_path / "s.many", state)
    assert sorted(load(tmp_path / "s.many")) == ["a", "np"]
    got = load_state(tmp_path / "s.many")
    assert got["a"] is not got["b"]
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()
    assert got["same"][0] is got["same"][1]
    assert got["same"][0].data_ptr() == got["a"].data_ptr()
    got["a"][0, 0] = 42.0
    assert float(got["b"][0, 0]) == 42.0 and float(got["same"][1][0, 0]) == 42.0
    assert np.shares_memory(got["np"], got["np_view"])
    got["np"][0] = -1.0
    assert got["np_view"][0] == -1.0


def test_a_tensor_and_its_numpy_view_share_one_slot(tmp_path: Path) -> None:
    t = torch.arange(5, dtype=torch.int32)
    save_state(tmp_path / "s.many", {"t": t, "n": t.numpy()})
    assert list(load(tmp_path / "s.many")) == ["t"]
    got = load_state(tmp_path / "s.many")
    got["t"][2] = 77
    assert type(got["n"]) is np.ndarray and got["n"][2] == 77


def test_disjoint_views_of_one_storage_come_back_as_separate_tensors(tmp_path: Path) -> None:
    flat = torch.arange(10.0)
    state = {"first": flat[:4], "rest": flat[4:]}
    save_state(tmp_path / "s.many", state)
    got = load_state(tmp_path / "s.many")
    assert torch.equal(got["first"], flat[:4]) and torch.equal(got["rest"], flat[4:])
    assert got["first"].untyped_storage().data_ptr() != got["rest"].untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "make",
    [
        lambda w: {"w": w, "row": w[1]},
        lambda w: {"w": w, "t": w.t()},
        lambda w: {"w": w, "flat": w.view(-1)},
        lambda w: {"w": w, "as_int": w.view(torch.int32)},
        lambda w: {"w": w, "np_slice": w.numpy()[1:]},
    ],
    ids=["row", "transpose", "reshape", "dtype-view", "numpy-slice"],
)
def test_partially_aliased_views_are_refused(tmp_path: Path, make: Any) -> None:
    with pytest.raises(ValueError, match="different views of overlapping memory"):
        save_state(tmp_path / "s.many", make(torch.randn(3, 3)))
    assert not (tmp_path / "s.many").exists()


def test_empty_tensors_are_never_aliased(tmp_path: Path) -> None:
    state = {"a": torch.empty(0), "b": torch.empty(0, 3)}
    save_state(tmp_path / "s.many", state)
    got = load_state(tmp_path / "s.many")
    assert got["a"].shape == (0,) and got["b"].shape == (0, 3)


# -- what cannot be stored -------------------------------------------------------------------


class _Thing:
    pass


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (
            {"a": [1, {"b": _Thing()}]},
            r"state\['a'\]\[1\]\['b'\]: tests\.many\.test_many_state\._Thing",
        ),
        ({"s": {1, 2}}, r"state\['s'\]: builtins\.set"),
        ({"b": b"bytes"}, r"state\['b'\]: builtins\.bytes"),
        ({"c": 1 + 2j}, r"state\['c'\]: builtins\.complex"),
        ({"size": torch.Size([2, 3])}, r"state\['size'\]: torch\.Size"),
        ({"dt": torch.float32}, r"state\['dt'\]: torch\.dtype"),
        ({"m": torch.nn.Linear(2, 2)}, r"state\['m'\]: torch\.nn\.modules\.linear\.Linear"),
        ({"obj": np.array([object()])}, r"state\['obj'\]: numpy dtype object"),
        ({"k": {(1, 2): 3}}, r"state\['k'\]: key \(1, 2\) is a tuple"),
        ({"k": {True: 3}}, r"state\['k'\]: key True is a bool"),
        ({"sparse": torch.eye(2).to_sparse()}, r"state\['sparse'\]: only dense"),
        ({"meta": torch.empty(2, device="meta")}, r"state\['meta'\]: meta tensors"),
        ({"g": torch.ones(2, requires_grad=True) * 2}, r"state\['g'\]: a non-leaf tensor"),
    ],
)
def test_unstorable_values_are_refused_naming_their_path(
    tmp_path: Path, state: Any, message: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        save_state(tmp_path / "s.many", state)
    assert not (tmp_path / "s.many").exists()


def test_cycles_and_excess_depth_and_size_are_refused(tmp_path: Path) -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(ValueError, match=r"state\[1\]: the container contains itself"):
        save_state(tmp_path / "s.many", loop)
    deep: Any = 0
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper than 64"):
        save_state(tmp_path / "s.many", deep)
    with pytest.raises(ValueError, match="more than 10 nodes"):
        save_state(tmp_path / "s.many", list(range(20)), max_nodes=10)
    with pytest.raises(ValueError, match="reserved"):
        save_state(tmp_path / "s.many", {}, metadata={STATE_KEY: 1})
    assert not (tmp_path / "s.many").exists()


# -- hostile files ---------------------------------------------------------------------------


def _forge(path: Path, tree: Any, slots: int = 1, *, doc: Any = None) -> None:
    """A file that is sound as `.many` but carries the given tree (version 1 unless `doc`)."""
    sources = [slot_source(f"s{i}", np.arange(4, dtype=np.float32)) for i in range(slots)]
    sources.append(slot_source("scalar", np.array(1.0)))
    document = {"version": 1, "root": tree} if doc is None else doc
    write_file(path, sources, metadata={STATE_KEY: document})


def _refs(slots: int = 1) -> list[Any]:
    return [{"N": i} for i in range(slots)] + [{"N": slots, "s": True}]


def _nest(depth: int) -> Any:
    node: Any = {"l": _refs()}
    for _ in range(depth - 1):
        node = {"l": [node]}
    return node


@pytest.mark.parametrize(
    ("tree", "doc", "message"),
    [
        (None, {"version": 2, "root": None}, "state tree version 2 is not 1"),
        (None, {"version": True, "root": None}, "state tree version True is not 1"),
        (None, {"root": None}, "must be an object with 'version' and 'root'"),
        (None, [1, 2], "must be an object with 'version' and 'root'"),
        ({"l": [*_refs(), [1]]}, None, r"at \[2\]: a bare JSON list is not a node"),
        ({"l": [*_refs(), {"x": 1}]}, None, "unknown node with keys"),
        ({"l": [*_refs(), {"N": 9}]}, None, r"slot index 9 is not in \[0, 2\)"),
        ({"l": [*_refs(), {"N": True}]}, None, "slot index True is not in"),
        ({"l": [*_refs(), {"N": 0, "v": -1}]}, None, "view index -1"),
        ({"l": [*_refs(), {"N": 0, "q": 1}]}, None, r"unknown keys in a N leaf: \['q'\]"),
        ({"l": [*_refs(), {"T": 0, "N": 0}]}, None, "unknown keys in a T leaf"),
        ({"l": [*_refs(), {"T": 0, "P": False}]}, None, "flag 'P' must be true"),
        ({"l": [*_refs(), {"N": 0, "v": 1, "s": True}]}, None, "numpy scalar needs a 0-d slot"),
        ({"l": [*_refs(), {"T": 0}]}, None, "view 0 of slot 0 is described two ways"),
        ({"l": [*_refs(), {"N": 0, "s": True}]}, None, "view 0 of slot 0 is described two ways"),
        ({"l": [*_refs(), {"f": "infinity"}]}, None, "non-finite float must be"),
        ({"l": [*_refs(), {"d": [["a", 1], ["a", 2]]}]}, None, "duplicate dict key 'a'"),
        ({"l": [*_refs(), {"d": [[None, 1]]}]}, None, "dict key 'None' is not a str or int"),
        ({"l": [*_refs(), {"d": [[True, 1]]}]}, None, "is not a str or int"),
        ({"l": [*_refs(), {"d": [["a"]]}]}, None, r"must be \[key, node\] pairs"),
        ({"l": [*_refs(), {"d": {"a": 1}}]}, None, "must be a list of"),
        ({"l": [*_refs(), {"l": 5}]}, None, "'l' must hold a list"),
        ({"l": [{"N": 1, "s": True}]}, None, r"slots \['s0'\] are not referenced"),
        (_nest(MAX_DEPTH + 1), None, "nested deeper than 64 containers"),
    ],
)
def test_hostile_trees_are_refused_with_the_problem_named(
    tmp_path: Path, tree: Any, doc: Any, message: str
) -> None:
    path = tmp_path / "h.many"
    _forge(path, tree, doc=doc)
    # Sound as .many, only the tree is hostile: verify reports what load_state refuses.
    assert any(re.search(message, p) for p in verify(path)), verify(path)
    with pytest.raises(ManyFormatError, match=message):
        load_state(path)


def test_trees_at_the_depth_bound_load(tmp_path: Path) -> None:
    _forge(tmp_path / "ok.many", _nest(MAX_DEPTH))
    got = load_state(tmp_path / "ok.many")
    for _ in range(MAX_DEPTH - 1):
        got = got[0]
    assert got[1] == np.float64(1.0)


def test_node_count_bound(tmp_path: Path) -> None:
    _forge(tmp_path / "wide.many", {"l": [*_refs(), *([0] * 5000)]})
    with pytest.raises(ManyFormatError, match="more than 1000 nodes"):
        load_state(tmp_path / "wide.many", max_nodes=1000)
    assert len(load_state(tmp_path / "wide.many")) == 5002


def _forge_table(path: Path, root: str) -> None:
    """A sound file whose state tree's root is the given raw JSON text (table re-sealed)."""
    write_file(path, [slot_source("s0", np.zeros(4))], metadata={"pad": "x" * (len(root) + 64)})
    raw = bytearray(path.read_bytes())
    h = parse_header(bytes(raw[:HEADER_SIZE]), len(raw))
    doc = '{"version":1,"root":' + root + "}"
    table = (
        '{"names":["s0"],"shapes":[[4]],"metadata":{"' + STATE_KEY + '":' + doc + "}}"
    ).encode()
    table = table.ljust(h.table_length)  # JSON allows trailing whitespace
    raw[h.table_offset : h.table_offset + h.table_length] = table
    h = replace(h, table_hash=blake3.blake3(table).digest())
    h = h.with_receipt(bytes(raw[HEADER_SIZE : HEADER_SIZE + 64]))
    raw[:HEADER_SIZE] = h.pack()
    path.write_bytes(bytes(raw))


def test_json_nested_past_the_recursion_limit_is_a_format_error(tmp_path: Path) -> None:
    """100 000 nested lists in the table: refused as ManyFormatError, not a RecursionError."""
    depth = 100_000
    _forge_table(tmp_path / "bomb.many", '{"l":[' * depth + "]}" * depth)
    with pytest.raises(ManyFormatError, match="not valid UTF-8 JSON"):
        load_state(tmp_path / "bomb.many")


def test_json_nan_and_infinity_literals_are_refused(tmp_path: Path) -> None:
    for literal in ("NaN", "Infinity", "-Infinity"):
        _forge_table(tmp_path / "nan.many", '{"l":[{"N":0},' + literal + "]}")
        problems = verify(tmp_path / "nan.many")  # sound as .many: only the tree is bad
        assert any("at [1]: a non-finite float must be" in p for p in problems), problems
        with pytest.raises(ManyFormatError, match=r"at \[1\]: a non-finite float must be"):
            load_state(tmp_path / "nan.many")


def test_plain_many_files_and_foreign_files_are_explained(tmp_path: Path) -> None:
    save(tmp_path / "flat.many", {"w": np.ones(3)})
    with pytest.raises(ManyFormatError, match="holds no state tree .* read it with many.load"):
        load_state(tmp_path / "flat.many")
    (tmp_path / "dir.many").mkdir()
    with pytest.raises(ManyFormatError, match="is a directory"):
        load_state(tmp_path / "dir.many")
    (tmp_path / "short.many").write_bytes(b"\x89MANY")
    with pytest.raises(ManyFormatError, match="truncated"):
        load_state(tmp_path / "short.many")


def test_verify_true_rehashes_and_refuses_a_damaged_slot(tmp_path: Path) -> None:
    path = tmp_path / "s.many"
    save_state(path, {"w": torch.zeros(1024), "step": 3})
    info = load(path).info("w")
    with open(path, "r+b") as f:
        f.seek(info.offset + 17)
        f.write(b"\x01")
    with pytest.raises(ManyFormatError, match="content hash mismatch"):
        load_state(path, verify=True)
    # Without verify the load stays O(slots) and reads no tensor bytes, so it cannot notice.
    assert float(load_state(path)["w"].sum()) != 0.0


def test_save_is_atomic_over_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "s.many"
    save_state(path, {"v": 1, "w": torch.ones(3)})
    with pytest.raises(TypeError):
        save_state(path, {"v": 2, "w": torch.ones(3), "bad": object()})
    assert load_state(path)["v"] == 1
    assert [p for p in os.listdir(tmp_path) if p != "s.many"] == []
