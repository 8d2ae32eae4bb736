"""`save_state` / `load_state`: a whole checkpoint (nested dicts, lists and tuples of tensors,
numpy arrays and JSON scalars) as one `.many` file.

The tree goes into the name table's metadata under the reserved key `many.state` as a small,
versioned JSON structure; every tensor goes into its own slot, named by its path
(`optimizer.state.3.exp_avg`). Loading maps the file once, privately (copy-on-write), and
rebinds each slot to a tensor over that mapping: O(slots + tree nodes), no tensor bytes read
or copied. Nothing is pickled and nothing from the file is executed. Encoding rules and
bounds: FORMAT.md, section "State trees".

torch is imported only when the tree holds torch tensors, so numpy-only states work without it.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from serwatt.profiler.many.format import BFLOAT16, DTYPES, GRAD_DTYPE_CODES, ManyFormatError
from serwatt.profiler.many.names import show_name
from serwatt.profiler.many.reader import Parsed, open_regular, read_parsed
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.restore import ReadPlan, check_read, plan, read_copy
from serwatt.profiler.many.verify import verified_fd, writable_by_others
from serwatt.profiler.many.writer import _NUMPY_CODES, _torch_code, slot_source, write_file

STATE_KEY = "many.state"
TREE_VERSION = 1
# Real checkpoints nest 3-6 levels and hold O(parameters) nodes; the bounds are far above
# that and far below what would exhaust the stack or memory on a hostile file.
MAX_DEPTH = 64
MAX_NODES = 1 << 22
ROOT_SLOT_NAME = "%root"

_INT_RE = re.compile(r"-?[0-9]+")
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_TENSOR_EXTRA = frozenset({"v", "P", "rg"})
_ARRAY_EXTRA = frozenset({"v", "s"})


class _Attr(str):
    """A path segment naming an attribute (OrderedDict `_metadata`), not a key."""


Path = tuple[Any, ...]


def state_at(path: Path) -> str:
    """Where in the state an error is, as a message's subject: `state['model']['w']`, or
    `the state's root` for the object passed itself."""
    return f"state{format_path(path)}" if path else "the state's root"


def format_path(path: Path) -> str:
    """A path as Python subscripts (`['optimizer']['state'][3]`), for error messages."""
    if not path:
        return "the root"
    parts = []
    for seg in path:
        parts.append(f".{seg}" if isinstance(seg, _Attr) else f"[{seg!r}]")
    return "".join(parts)


_ESCAPED: dict[str, str] = {}  # a checkpoint's keys repeat every call: escaped once
_ESCAPED_MAX = 1 << 16


def _escape(key: str) -> str:
    hit = _ESCAPED.get(key)
    if hit is not None:
        return hit
    s = _escape_new(key)
    if len(_ESCAPED) >= _ESCAPED_MAX:
        _ESCAPED.clear()
    _ESCAPED[key] = s
    return s


def _escape_new(key: str) -> str:
    if key == "":
        return "%"
    s = key.replace("%", "%25").replace(".", "%2E")
    # only a key that starts like an integer can read as one (the test skips the regex,
    # which allocates, for the usual names)
    if (s[0].isdigit() or s[0] == "-") and _INT_RE.fullmatch(s):
        # A string that reads as an integer would collide with an int key: escape its first char.
        s = f"%{ord(s[0]):02X}{s[1:]}"
    return s


def slot_name(path: Path) -> str:
    """The slot name of the tensor at `path`: segments joined by '.' (FORMAT.md, State trees).

    int keys and list indices are written in decimal; str keys with '%' and '.'
    percent-escaped, and with their first character escaped when they read as an integer,
    so names are unique and `3` (int) and `"3"` (str) stay distinct.
    """
    if not path:
        return ROOT_SLOT_NAME
    out = []
    for seg in path:
        if isinstance(seg, _Attr):
            out.append("%" + str(seg))
        elif isinstance(seg, str):
            out.append(_escape(seg))
        else:
            out.append(str(seg))
    return ".".join(out)


# -- flattening (save side) -----------------------------------------------------------------


@dataclass
class StateSlot:
    """One slot of a flattened state: the first tensor/array found for it and its layout."""

    name: str
    value: Any  # torch.Tensor or np.ndarray (numpy scalars as 0-d arrays)
    kind: str  # "torch" or "numpy"
    code: int
    shape: tuple[int, ...]
    length: int


@dataclass
class FlatState:
    """A state tree split into its JSON document and its slots (in slot order)."""

    doc: dict[str, Any]
    slots: list[StateSlot]

    @property
    def layout(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """(dtype code, shape) per slot: what a staging arena must match to be reused."""
        return tuple((s.code, s.shape) for s in self.slots)

    @property
    def nbytes(self) -> int:
        return sum(s.length for s in self.slots)


class _Flattener:
    def __init__(self, max_depth: int, max_nodes: int, devices: bool) -> None:
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.devices = devices  # allow non-CPU torch tensors (the Checkpointer copies them)
        self.nodes = 0
        self.slots: list[StateSlot] = []
        self.paths: list[Path] = []
        self.by_view: dict[tuple[Any, ...], int] = {}
        self.objects: dict[int, tuple[int, int]] = {}  # id(leaf) -> (slot, v)
        self.next_v: list[int] = []
        self.extents: list[tuple[str, int, int, int]] = []  # (device, start, end, slot)
        self.active: set[int] = set()
        self.keep: list[Any] = []  # temporaries whose addresses are in by_view stay alive
        # A tree can hold torch tensors only once torch is imported: no import here, and
        # the two exact classes tested by identity (a checkpoint walks every tensor).
        torch = sys.modules.get("torch")
        self.parameter_type = torch.nn.Parameter if torch is not None else None
        self.tensor_types: tuple[type, ...] = (
            (torch.Tensor, torch.nn.Parameter) if torch is not None else ()
        )
        self.strided = torch.strided if torch is not None else None

    def node(self, x: Any, path: Path, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise ValueError(
                f"state has more than {self.max_nodes} nodes (at {format_path(path)}); "
                "raise max_nodes= if this is intended"
            )
        t = type(x)
        if x is None or t is bool or t is str or t is int:
            return x
        if t is float:
            if math.isfinite(x):
                return x
            return {"f": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if t is dict or t is OrderedDict or t is list or t is tuple:
            return self.container(x, path, depth)
        if t in self.tensor_types:
            return self.tensor(x, path)
        if isinstance(x, np.ndarray | np.generic):
            return self.array(x, path)
        if type(x).__module__.startswith("torch"):
            import torch

            if isinstance(x, torch.Tensor):
                return self.tensor(x, path)
        raise TypeError(
            f"{state_at(path)}: {t.__module__}.{t.__qualname__} cannot be stored in a "
            ".many state (leaves are torch tensors, numpy arrays, int, float, bool, str and "
            "None; containers are dict, OrderedDict, list and tuple). Nothing is pickled: "
            "convert it to one of those first"
        )

    def container(self, x: Any, path: Path, depth: int) -> Any:
        if depth >= self.max_depth:
            raise ValueError(
                f"{state_at(path)}: nested deeper than {self.max_depth} containers; "
                "raise max_depth= if this is intended"
            )
        if id(x) in self.active:
            raise ValueError(f"{state_at(path)}: the container contains itself (a cycle)")
        self.active.add(id(x))
        try:
            if isinstance(x, dict):
                items = []
                for k, v in x.items():
                    if type(k) is not str and type(k) is not int:
                        raise TypeError(
                            f"{state_at(path)}: key {k!r} is a {type(k).__name__}; "
                            "dict keys must be str or int (bool keys would collide with 1/0)"
                        )
                    items.append([k, self.node(v, (*path, k), depth + 1)])
                if type(x) is dict:
                    return {"d": items}
                out: dict[str, Any] = {"o": items}
                meta = getattr(x, "_metadata", None)
                if meta is not None:
                    out["m"] = self.node(meta, (*path, _Attr("_metadata")), depth + 1)
                return out
            tag = "l" if type(x) is list else "t"
            return {tag: [self.node(v, (*path, i), depth + 1) for i, v in enumerate(x)]}
        finally:
            self.active.discard(id(x))

    def array(self, x: np.ndarray | np.generic, path: Path) -> Any:
        scalar = isinstance(x, np.generic)
        arr = np.asarray(x)
        if scalar:
            self.keep.append(arr)
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        code = _NUMPY_CODES.get(dt, 0)
        if not code:
            raise TypeError(
                f"{state_at(path)}: numpy dtype {arr.dtype} has no .many dtype code "
                "(FORMAT.md dtype table)"
            )
        shape = tuple(int(d) for d in arr.shape)
        nbytes = int(arr.nbytes)
        key: tuple[Any, ...] | None = None
        extent = None
        if nbytes:
            ptr = int(arr.__array_interface__["data"][0])
            if arr.flags.c_contiguous:  # keyed as a contiguous tensor is: a numpy view of it
                key = ("cpu", ptr, shape, None, code, False, False)  # shares its slot
                extent = ("cpu", ptr, ptr + nbytes)
            else:
                st = arr.strides
                lo = ptr + sum(min(0, (n - 1) * s) for n, s in zip(shape, st, strict=True))
                hi = ptr + sum(max(0, (n - 1) * s) for n, s in zip(shape, st, strict=True))
                key = ("cpu", ptr, shape, tuple(st), code, False, False)
                extent = ("cpu", lo, hi + arr.itemsize)
        slot, v = self.leaf(x, arr, "numpy", code, shape, nbytes, key, extent, path)
        out: dict[str, Any] = {"N": slot}
        if v:
            out["v"] = v
        if scalar:
            out["s"] = True
        return out

    def tensor(self, x: Any, path: Path) -> Any:
        def where() -> str:  # built only for an error: a checkpoint walks every tensor
            return state_at(path)

        if type(x) not in self.tensor_types:
            raise TypeError(
                f"{where()}: tensor subclass {type(x).__qualname__} is not supported; "
                "pass a plain torch.Tensor (tensor.as_subclass(torch.Tensor))"
            )
        if x.layout is not self.strided or x.is_quantized or x.is_nested:
            raise TypeError(
                f"{where()}: only dense (strided) tensors are supported, not {x.layout}"
                f"{' quantized' if x.is_quantized else ''}{' nested' if x.is_nested else ''}"
            )
        if x.is_cpu:  # is_cpu is a fifth of the cost of device.type and str(device)
            dev = "cpu"
        else:
            device = x.device
            if device.type == "meta":
                raise ValueError(f"{where()}: meta tensors have no data to store")
            if not self.devices:
                raise ValueError(
                    f"{where()} is on {device}; move it to the CPU first (tensor.cpu())"
                )
            dev = str(device)
        requires_grad = x.requires_grad
        if requires_grad and not x.is_leaf:
            raise ValueError(
                f"{where()}: a non-leaf tensor that requires grad (part of an autograd graph); "
                "store tensor.detach()"
            )
        try:
            code = _torch_code(x.dtype)
        except TypeError as exc:
            raise TypeError(f"{where()}: {exc}") from None
        shape = tuple(x.shape)  # torch.Size holds ints
        itemsize = x.element_size()
        nbytes = x.numel() * itemsize
        key = None
        extent = None
        if nbytes:
            ptr = int(x.data_ptr())
            if x.is_contiguous():
                # its strides follow from its shape (a size-1 dim's stride changes no byte
                # it covers), and it spans exactly its bytes
                strides: tuple[int, ...] | None = None
                span = nbytes
            else:
                strides = tuple(s * itemsize for s in x.stride())
                span = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + itemsize
            key = (dev, ptr, shape, strides, code, bool(x.is_conj()), bool(x.is_neg()))
            extent = (dev, ptr, ptr + span)
        slot, v = self.leaf(x, x, "torch", code, shape, nbytes, key, extent, path)
        out: dict[str, Any] = {"T": slot}
        if v:
            out["v"] = v
        if type(x) is self.parameter_type:
            out["P"] = True
        if requires_grad:
            out["rg"] = True
        return out

    def leaf(
        self,
        obj: Any,
        value: Any,
        kind: str,
        code: int,
        shape: tuple[int, ...],
        nbytes: int,
        key: tuple[Any, ...] | None,
        extent: tuple[str, int, int] | None,
        path: Path,
    ) -> tuple[int, int]:
        seen = self.objects.get(id(obj))
        if seen is not None:
            return seen
        slot = self.by_view.get(key) if key is not None else None
        if slot is None:
            slot = len(self.slots)
            self.slots.append(StateSlot(slot_name(path), value, kind, code, shape, nbytes))
            self.paths.append(path)
            self.next_v.append(0)
            if key is not None and extent is not None:
                self.by_view[key] = slot
                self.extents.append((extent[0], extent[1], extent[2], slot))
        v = self.next_v[slot]
        self.next_v[slot] = v + 1
        self.objects[id(obj)] = (slot, v)
        self.keep.append(obj)
        return slot, v

    def check_overlaps(self) -> None:
        """Refuse partial views: memory shared by two different views cannot be kept shared."""
        self.extents.sort()
        end_dev, end, end_slot = "", -1, -1
        for dev, start, stop, slot in self.extents:
            if dev == end_dev and start < end:
                a, b = format_path(self.paths[end_slot]), format_path(self.paths[slot])
                raise ValueError(
                    f"state{a} and state{b} are different views of overlapping memory. .many "
                    "stores tensors that are the same view (same storage, offset, shape, "
                    "stride and dtype) once and restores them sharing, but cannot keep "
                    "partial views sharing; store copies (tensor.clone()) or one of them"
                )
            if dev != end_dev or stop > end:
                end_dev, end, end_slot = dev, stop, slot


def flatten(
    obj: Any, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES, devices: bool = False
) -> FlatState:
    """Split a state tree into its JSON document and its tensor slots (FORMAT.md, State trees).

    Raises TypeError/ValueError naming the path of the first leaf or container that cannot be
    stored. `devices=True` accepts tensors on any device (their bytes are copied by the caller).
    """
    f = _Flattener(max_depth, max_nodes, devices)
    root = f.node(obj, (), 0)
    f.check_overlaps()
    return FlatState({"version": TREE_VERSION, "root": root}, f.slots)


def state_metadata(doc: dict[str, Any], metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The name-table metadata of a state file: the caller's keys plus the reserved tree key."""
    meta = dict(metadata or {})
    if STATE_KEY in meta:
        raise ValueError(f"metadata key {STATE_KEY!r} is reserved for the state tree")
    meta[STATE_KEY] = doc
    return meta


def save_state(
    path: str | os.PathLike[str],
    obj: Any,
    *,
    prev: Receipt | str | bytes | None = None,
    metadata: Mapping[str, Any] | None = None,
    hash: bool = True,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
) -> Receipt:
    """Write a whole state tree to `path` atomically (like `save`) and return its receipt.

    `obj` is a dict, OrderedDict, list or tuple (nested) or a single leaf; leaves are CPU torch
    tensors, numpy arrays and numpy scalars of any FORMAT.md dtype, int, float (inf and nan
    included), bool, str and None. Tensors that are the same view of one storage are stored
    once and come back sharing. Any other leaf raises TypeError naming its path.
    """
    flat = flatten(obj, max_depth=max_depth, max_nodes=max_nodes)
    sources = [slot_source(s.name, s.value) for s in flat.slots]
    return write_file(
        path, sources, prev=prev, metadata=state_metadata(flat.doc, metadata), hash=hash
    )


# -- rebuilding (load side) -----------------------------------------------------------------


@dataclass
class LoadedState:
    """A loaded state file: the tree, the caller's metadata and the file's receipts."""

    tree: Any
    metadata: dict[str, Any]
    receipt: Receipt
    prev_receipt: Receipt | None
    path: str | None
    # how the file was read and why (reader.Checkpoint.read_mode)
    read_mode: str = "mapped"


class _Builder:
    def __init__(
        self,
        buf: Any,
        parsed: Parsed,
        where: str,
        as_numpy: bool,
        tensor_hook: Callable[[Any], Any] | None,
        max_depth: int,
        max_nodes: int,
    ) -> None:
        self.buf = buf
        self.parsed = parsed
        self.where = where
        self.as_numpy = as_numpy
        self.tensor_hook = tensor_hook
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.nodes = 0
        self.n = parsed.header.slot_count
        self.slots: dict[int, tuple[int, tuple[int, ...], int, int]] = {}
        self.torch_base: dict[int, Any] = {}
        self.numpy_base: dict[int, np.ndarray] = {}
        self.objects: dict[tuple[int, int], tuple[tuple[Any, ...], Any]] = {}
        self.referenced: set[int] = set()

    def fail(self, msg: str, path: Path) -> ManyFormatError:
        return ManyFormatError(f"state tree at {format_path(path)}: {msg}", self.where)

    def node(self, n: Any, path: Path, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise self.fail(f"more than {self.max_nodes} nodes (max_nodes=)", path)
        t = type(n)
        if n is None or t is bool or t is str or t is int:
            return n
        if t is float:
            if not math.isfinite(n):  # Python's json reads NaN/Infinity, which JSON lacks
                raise self.fail('a non-finite float must be written {"f": ...}', path)
            return n
        if t is not dict:
            raise self.fail(f"a bare JSON {t.__name__} is not a node (containers are tagged)", path)
        if "T" in n or "N" in n:
            return self.leaf(n, path)
        if len(n) == 1 and "f" in n:
            v = n["f"]
            if type(v) is not str or v not in _NONFINITE:
                raise self.fail(f"non-finite float must be 'inf', '-inf' or 'nan', not {v!r}", path)
            return _NONFINITE[v]
        if depth >= self.max_depth:
            raise self.fail(f"nested deeper than {self.max_depth} containers (max_depth=)", path)
        if len(n) == 1 and ("l" in n or "t" in n):
            tag, items = next(iter(n.items()))
            if type(items) is not list:
                raise self.fail(f"'{tag}' must hold a list", path)
            out = [self.node(v, (*path, i), depth + 1) for i, v in enumerate(items)]
            return out if tag == "l" else tuple(out)
        if (len(n) == 1 and "d" in n) or ("o" in n and set(n) <= {"o", "m"}):
            ordered = "o" in n
            items = n["o" if ordered else "d"]
            if type(items) is not list:
                raise self.fail("dict items must be a list of [key, node] pairs", path)
            d: dict[Any, Any] = OrderedDict() if ordered else {}
            for item in items:
                if type(item) is not list or len(item) != 2:
                    raise self.fail("dict items must be [key, node] pairs", path)
                k = item[0]
                if type(k) is not str and type(k) is not int:
                    raise self.fail(f"dict key {str(k)[:40]!r} is not a str or int", path)
                if k in d:
                    raise self.fail(f"duplicate dict key {k!r}", path)
                d[k] = self.node(item[1], (*path, k), depth + 1)
            if "m" in n:
                # OrderedDict attributes are plain Python attributes; only `_metadata` exists.
                d._metadata = self.node(n["m"], (*path, _Attr("_metadata")), depth + 1)  # type: ignore[attr-defined]
            return d
        raise self.fail(f"unknown node with keys {sorted(map(str, n))[:8]}", path)

    def leaf(self, n: dict[str, Any], path: Path) -> Any:
        is_tensor = "T" in n
        tag = "T" if is_tensor else "N"
        extra = set(n) - {tag}
        if ("N" in n and is_tensor) or extra - (_TENSOR_EXTRA if is_tensor else _ARRAY_EXTRA):
            raise self.fail(f"unknown keys in a {tag} leaf: {sorted(map(str, extra))[:8]}", path)
        slot, v = n[tag], n.get("v", 0)
        if type(slot) is not int or not 0 <= slot < self.n:
            raise self.fail(f"slot index {str(slot)[:40]} is not in [0, {self.n})", path)
        if type(v) is not int or not 0 <= v <= self.max_nodes:
            raise self.fail(f"view index {str(v)[:40]} is not a small non-negative int", path)
        for flag in ("P", "rg", "s"):
            if flag in n and n[flag] is not True:
                raise self.fail(f"flag {flag!r} must be true when present", path)
        self.referenced.add(slot)
        kind = "torch" if is_tensor and not self.as_numpy else "numpy"
        # One object per (slot, view): every reference to it must describe it the same way.
        signature = (tag, "P" in n, "rg" in n, "s" in n)
        seen = self.objects.get((slot, v))
        if seen is not None:
            if seen[0] != signature:
                raise self.fail(
                    f"view {v} of slot {slot} is described two ways ({seen[0]} and {signature})",
                    path,
                )
            return seen[1]
        code, shape, offset, length = self._slot(slot)
        if "rg" in n and code not in GRAD_DTYPE_CODES:
            raise self.fail(
                f"requires grad, but slot {slot} holds {DTYPES[code][0]}: only floating point "
                "and complex tensors can require grad",
                path,
            )
        if not is_tensor and code == BFLOAT16:
            raise self.fail("a numpy leaf cannot be bfloat16 (numpy has no bfloat16)", path)
        if "s" in n and shape != ():
            raise self.fail(f"a numpy scalar needs a 0-d slot, slot {slot} is {shape}", path)
        if self.buf is None:  # checking only (tree_problems): every check above is done
            obj = None
        elif kind == "torch":
            obj = self.torch_leaf(slot, n, path)
        else:
            obj = self.numpy_leaf(slot, n, path)
        self.objects[(slot, v)] = (signature, obj)
        return obj

    def _slot(self, slot: int) -> tuple[int, tuple[int, ...], int, int]:
        """(dtype code, checked shape, absolute offset, length) of a slot, checked once."""
        found = self.slots.get(slot)
        if found is None:
            d = self.parsed.desc[slot]
            shape = self.parsed.shape(slot)
            offset = self.parsed.header.state_offset + int(d["offset"])
            found = self.slots[slot] = (int(d["dtype"]), shape, offset, int(d["length"]))
        return found

    def torch_leaf(self, slot: int, n: dict[str, Any], path: Path) -> Any:
        import torch

        base = self.torch_base.get(slot)
        if base is None:
            code, shape, offset, length = self._slot(slot)
            tdtype = getattr(torch, DTYPES[code][0], None)
            if tdtype is None:
                raise self.fail(f"this torch has no dtype {DTYPES[code][0]}", path)
            if length == 0:
                base = torch.empty(shape, dtype=tdtype)
            else:
                raw = torch.frombuffer(self.buf, dtype=torch.uint8, count=length, offset=offset)
                base = raw.view(tdtype).reshape(shape)
            if self.tensor_hook is not None:
                base = self.tensor_hook(base)
            self.torch_base[slot] = base
        # detach(): a new tensor object over the same storage, so views of one slot share it.
        t = base.detach()
        if "P" in n:
            return torch.nn.Parameter(t, requires_grad="rg" in n)
        if "rg" in n:
            t.requires_grad_(True)
        return t

    def numpy_leaf(self, slot: int, n: dict[str, Any], path: Path) -> Any:
        base = self.numpy_base.get(slot)
        if base is None:
            code, shape, offset, length = self._slot(slot)
            dtype = DTYPES[code][1]
            if length == 0:
                base = np.empty(shape, dtype=dtype)
            else:
                base = np.ndarray(shape, dtype=dtype, buffer=self.buf, offset=offset)
            self.numpy_base[slot] = base
        return base[()] if "s" in n else base.view()


def _build(b: _Builder, doc: Any) -> Any:
    """The tree of a `many.state` document; every defect is a ManyFormatError."""
    if type(doc) is not dict or set(doc) != {"version", "root"}:
        raise ManyFormatError(f"{STATE_KEY!r} must be an object with 'version' and 'root'", b.where)
    if doc["version"] != TREE_VERSION or type(doc["version"]) is not int:
        raise ManyFormatError(
            f"state tree version {str(doc['version'])[:20]} is not {TREE_VERSION}; a newer "
            "serwatt wrote it: upgrade to read it",
            b.where,
        )
    tree = b.node(doc["root"], (), 0)
    if len(b.referenced) != b.n:
        missing = sorted(set(range(b.n)) - b.referenced)[:5]
        names = [show_name(b.parsed.table.names[i]) for i in missing]
        raise ManyFormatError(
            f"slots [{', '.join(names)}] are not referenced by the state tree", b.where
        )
    return tree


def tree_problems(parsed: Parsed) -> list[str]:
    """What `load_state` would refuse in a parsed file's state tree (empty when the file has
    none, or a sound one): the same walk as loading, with every check and no tensor built.
    The default bounds apply, so a tree that needs a larger `max_nodes=` is reported."""
    doc = parsed.table.metadata.get(STATE_KEY)
    if doc is None:
        return []
    try:
        _build(_Builder(None, parsed, "", True, None, MAX_DEPTH, MAX_NODES), doc)
    except ManyFormatError as exc:
        return exc.problems
    return []


def _open_image(source: str | os.PathLike[str] | bytearray | memoryview) -> tuple[int, str | None]:
    """A descriptor for a state file, or for an in-memory image of one (an anonymous memfd),
    so both are read the one checked way (profiler.many.reader: FIFOs and devices refused,
    header and table read with pread)."""
    if isinstance(source, bytearray | memoryview):
        fd = os.memfd_create("many-state", os.MFD_CLOEXEC)
        try:
            view = memoryview(source).cast("B")
            written = 0
            while written < len(view):
                written += os.write(fd, view[written:])
        except BaseException:
            os.close(fd)
            raise
        return fd, None
    where = os.fspath(source)
    if os.path.isdir(where):
        raise ManyFormatError("is a directory, not a .many file", where)
    fd, _size = open_regular(where)
    return fd, where


def open_state(
    source: str | os.PathLike[str] | bytearray | memoryview,
    *,
    verify: bool = False,
    as_numpy: bool = False,
    tensor_hook: Callable[[Any], Any] | None = None,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    read: str = "auto",
) -> LoadedState:
    """Load a state file (a path, or a writable in-memory image of one) with its receipts.

    `verify=True` rehashes every slot and the receipt before anything is bound, and binds
    what it verified: a file another user could write is verified into a private copy
    (`reader.load` says when and what it costs). `read` ("auto", "mmap" or "copy") is
    `reader.load`'s: a file on a network or FUSE filesystem is copied whole into private
    memory rather than mapped; `LoadedState.read_mode` says which. `as_numpy=True`
    returns torch leaves as numpy arrays (bfloat16 as raw uint16), so no torch is needed.
    `tensor_hook(tensor) -> tensor` is applied once per torch slot before its leaves are made
    (torch_compat uses it for `map_location`).
    """
    read_as = check_read(read)
    fd, where = _open_image(source)
    try:
        size = os.fstat(fd).st_size
        parsed = read_parsed(fd, size, where)
        if where is None:
            how = ReadPlan(False, "mapped: an in-memory image")
        else:
            # what is verified is what is bound (reader.load's docstring says why)
            others = verify and writable_by_others(os.fstat(fd))
            how = plan(fd, read_as, others_can_write=others)
        if verify:
            fd, problems = verified_fd(fd, parsed, copy=how.copy)
            if problems:
                raise ManyFormatError(problems, where)
        elif how.copy:
            fd = read_copy(fd, parsed, where or "<memory>")
        # One private mapping for binding: writes to loaded tensors go to private pages and
        # never reach the file.
        buf: Any = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    meta = dict(parsed.table.metadata)
    doc = meta.pop(STATE_KEY, None)
    if doc is None:
        raise ManyFormatError(
            f"holds no state tree (no {STATE_KEY!r} metadata): it was written by many.save, "
            "not save_state; read it with many.load",
            where,
        )
    b = _Builder(buf, parsed, where or "<memory>", as_numpy, tensor_hook, max_depth, max_nodes)
    tree = _build(b, doc)
    prev = parsed.header.prev_receipt
    return LoadedState(
        tree=tree,
        metadata=meta,
        receipt=Receipt(parsed.header.receipt),
        prev_receipt=None if prev == bytes(32) else Receipt(prev),
        path=where,
        read_mode=how.why,
    )


def load_state(
    path: str | os.PathLike[str],
    *,
    verify: bool = False,
    as_numpy: bool = False,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    read: str = "auto",
) -> Any:
    """The state tree saved by `save_state`, its tensors mapped from the file (copy-on-write).

    O(slots + tree nodes): tensor bytes are read when touched. Writing to a loaded tensor
    changes private memory, never the file. `verify=True` rehashes everything first, and
    the tensors hold what it verified even if the file's owner writes it later (`open_state`).
    Int keys come back int, tuples tuple, OrderedDict OrderedDict (with `_metadata`). `read`:
    "auto", "mmap" or "copy" (`reader.load`; a file on a network or FUSE filesystem is copied).
    """
    return open_state(
        path,
        verify=verify,
        as_numpy=as_numpy,
        max_depth=max_depth,
        max_nodes=max_nodes,
        read=read,
    ).tree
