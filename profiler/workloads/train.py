"""A small real training loop that checkpoints through one chosen serializer.

    python -m serwatt.profiler.workloads.train
        --ckpt {pickle,torch,json,protobuf,msgpack,safetensors,many,many-async [--overlap]}
        --steps N --every K --size MB [--dir DIR] [--resume]

The model is a stack of square linear layers trained with Adam on a synthetic regression
task (PyTorch on the CPU; a numpy implementation of the same loop when torch is absent or
`--backend numpy`). Every K steps the model and optimizer state (about `--size` MB: weights
plus Adam's two moments) is written through the chosen path, as a whole new file made
durable the same way for every format (temp file, fsync, rename). `--resume` restores the
newest checkpoint in `--dir` and continues from its step. The batch of step s depends only
on (seed, s), so a resumed run does exactly the training work of an uninterrupted one and
baseline and `.many` runs are comparable under `serwatt profile`.

`--ckpt many-async` checkpoints through `many.Checkpointer` (`DIR/async-<seq>.many`, one
checkpoint in flight, written in the background, waited for before exit); with `--overlap`
the weights and Adam moments are copied while the next step computes and that step's
`optimizer.step()` waits for the copy (torch backend). Its checkpoint entries say the
training stall (`save_s`) and that wait (`step_wait_s`) apart, and their sum (`cost_s`),
and `cpu_s_all_threads`: the process's CPU, every thread, from the call's start until the
file is durable (`time.process_time()` at both ends; the end read on the writer thread).

The summary (one JSON line on stdout) carries `params_blake3`, a hash of the final weights,
so runs can be checked for equal work.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import numpy as np

FORMATS = ("pickle", "torch", "json", "protobuf", "msgpack", "safetensors", "many")
ASYNC_MANY = "many-async"  # many.Checkpointer: not a serializer of its own, .many in background
EXTENSIONS = {
    "pickle": "pkl",
    "torch": "pt",
    "json": "json",
    "protobuf": "pb",
    "msgpack": "msgpack",
    "safetensors": "safetensors",
    "many": "many",
}
LAYERS = 8
BATCH = 32
LR = 1e-3

Tensors = dict[str, np.ndarray]


class UsageError(Exception):
    """Bad arguments: printed with the fix, exit code 2."""


# ---------------------------------------------------------------------------------------
# Models: the same network and optimizer in torch and in numpy.
# ---------------------------------------------------------------------------------------


def width_for(size_mb: float) -> int:
    """Layer width so that weights + biases + two Adam moments come to about size_mb."""
    floats = size_mb * 1e6 / 4 / 3  # fp32, three copies (weights, exp_avg, exp_avg_sq)
    return max(8, int(math.sqrt(floats / LAYERS)))


def batch(seed: int, step: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((BATCH, width), dtype=np.float32)
    # A fixed smooth target the network can learn: a bounded function of the input.
    y = np.tanh(x[:, ::-1] * 0.5).astype(np.float32)
    return x, y


class TorchTrainer:
    backend = "torch"

    def __init__(self, width: int, seed: int) -> None:
        import torch

        self.torch = torch
        torch.manual_seed(seed)
        layers: list[Any] = []
        for i in range(LAYERS):
            layers.append(torch.nn.Linear(width, width))
            if i < LAYERS - 1:
                layers.append(torch.nn.Tanh())
        self.model = torch.nn.Sequential(*layers)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=LR)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        torch = self.torch
        self.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        self.opt.step()
        return float(loss.item())

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors by name, JSON metadata): model weights and Adam state, flattened."""
        tensors: dict[str, Any] = {
            f"model.{k}": v.detach() for k, v in self.model.state_dict().items()
        }
        osd = self.opt.state_dict()
        for idx, st in osd["state"].items():
            for key, value in st.items():
                tensors[f"optim.{idx}.{key}"] = value
        return tensors, {"param_groups": osd["param_groups"]}

    def restore(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        torch = self.torch
        as_t = {
            k: (torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v)
            for k, v in tensors.items()
        }
        self.model.load_state_dict({k[6:]: v for k, v in as_t.items() if k.startswith("model.")})
        state: dict[int, dict[str, Any]] = {}
        for k, v in as_t.items():
            if k.startswith("optim."):
                _, idx, key = k.split(".", 2)
                state.setdefault(int(idx), {})[key] = v.clone()
        self.opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})

    def params_digest(self) -> str:
        h = blake3.blake3()
        for k, v in self.model.state_dict().items():
            h.update(k.encode())
            h.update(v.detach().contiguous().numpy().tobytes())
        return h.hexdigest()


class NumpyTrainer:
    """The same tanh MLP and Adam, by hand, for machines without torch."""

    backend = "numpy"

    def __init__(self, width: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        bound = 1 / math.sqrt(width)
        self.params: dict[str, np.ndarray] = {}
        for i in range(LAYERS):
            self.params[f"{2 * i}.weight"] = rng.uniform(-bound, bound, (width, width)).astype(
                np.float32
            )
            self.params[f"{2 * i}.bias"] = rng.uniform(-bound, bound, width).astype(np.float32)
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.t = 0

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        acts = [x]
        h = x
        for i in range(LAYERS):
            h = h @ self.params[f"{2 * i}.weight"].T + self.params[f"{2 * i}.bias"]
            if i < LAYERS - 1:
                h = np.tanh(h)
            acts.append(h)
        diff = h - y
        loss = float(np.mean(diff * diff))
        grad = (2.0 / diff.size) * diff
        grads: dict[str, np.ndarray] = {}
        for i in reversed(range(LAYERS)):
            if i < LAYERS - 1:
                grad = grad * (1 - acts[i + 1] ** 2)
            grads[f"{2 * i}.weight"] = grad.T @ acts[i]
            grads[f"{2 * i}.bias"] = grad.sum(axis=0)
            grad = grad @ self.params[f"{2 * i}.weight"]
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            mhat = self.m[k] / (1 - b1**self.t)
            vhat = self.v[k] / (1 - b2**self.t)
            self.params[k] = (self.params[k] - LR * mhat / (np.sqrt(vhat) + eps)).astype(np.float32)
        return loss

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors: dict[str, Any] = {f"model.{k}": v for k, v in self.params.items()}
        for idx, k in enumerate(self.params):
            tensors[f"optim.{idx}.exp_avg"] = self.m[k]
            tensors[f"optim.{idx}.exp_avg_sq"] = self.v[k]
        tensors["optim.t"] = np.array(self.t, dtype=np.int64)
        return tensors, {}

    def restore(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        def arr(v: Any) -> np.ndarray:
            return np.array(v.numpy() if hasattr(v, "numpy") else v)

        for idx, k in enumerate(self.params):
            self.params[k] = arr(tensors[f"model.{k}"])
            self.m[k] = arr(tensors[f"optim.{idx}.exp_avg"])
            self.v[k] = arr(tensors[f"optim.{idx}.exp_avg_sq"])
        self.t = int(arr(tensors["optim.t"]))

    def params_digest(self) -> str:
        h = blake3.blake3()
        for k, v in self.params.items():
            h.update(k.encode())
            h.update(np.ascontiguousarray(v).tobytes())
        return h.hexdigest()


# ---------------------------------------------------------------------------------------
# Checkpoint writers and readers: one pair per format, each calling its serializer directly
# so that a stack sample inside it is attributed to that serializer.
# ---------------------------------------------------------------------------------------


def _numpy(t: Any) -> np.ndarray:
    """A numpy view of a tensor (no copy for CPU tensors); bfloat16 is not used here."""
    return t if isinstance(t, np.ndarray) else t.detach().numpy()


def _durable_replace(tmp: Path, path: Path) -> None:
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def save_pickle(path: Path, tensors: dict[str, Any], meta: dict[str, Any], tmp: Path) -> None:
    doc = {"meta": meta, "tensors": {k: _numpy(v) for k, v in tensors.items()}}
    with open(tmp, "wb") as f:
        pickle.dump(doc, f, protocol=5)


# What a checkpoint save_pickle wrote refers to: numpy's array and dtype rebuilders (the
# protocol-5 buffer one for contiguous arrays, the older one otherwise; numpy 1 and 2
# spell the module differently). Anything else in a file is refused before it runs.
PICKLE_GLOBALS = frozenset(
    (module, name)
    for core in ("numpy.core", "numpy._core")
    for module, name in (
        (f"{core}.numeric", "_frombuffer"),
        (f"{core}.multiarray", "_reconstruct"),
        (f"{core}.multiarray", "scalar"),
    )
) | {("numpy", "dtype"), ("numpy", "ndarray")}


class _ArraysOnly(pickle.Unpickler):
    """Unpickles dicts, lists, numbers, strings and numpy arrays; any other global (the way
    a pickle runs code: os.system, builtins.eval, a class's __reduce__) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in PICKLE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refers to {module}.{name}, which a checkpoint of this workload never holds"
        )


def load_pickle(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    with open(path, "rb") as f:
        try:
            doc = _ArraysOnly(f).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
            raise UsageError(
                f"--resume: {path} is not a checkpoint this workload wrote ({exc}); remove it "
                "or resume from another --dir"
            ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tensors"), dict):
        raise UsageError(f"--resume: {path} holds no tensors; remove it or use another --dir")
    return doc["tensors"], doc["meta"]


def save_torch(path: Path, tensors: dict[str, Any], meta: dict[str, Any], tmp: Path) -> None:
    import torch

    as_t = {
        k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in tensors.items()
    }
    torch.save({"meta": meta, "tensors": as_t}, tmp)


def load_torch(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    doc = torch.load(path, weights_only=True)
    return doc["tensors"], doc["meta"]


def save_json(path: Path, tensors: dict[str, Any], meta: dict[str, Any], tmp: Path) -> None:
    doc = {
        "meta": meta,
        "tensors": {
            k: {
                "dtype": _numpy(v).dtype.str,
                "shape": list(_numpy(v).shape),
                "data": _numpy(v).ravel().tolist(),
            }
            for k, v in tensors.items()
        },
    }
    with open(tmp, "w") as f:
        json.dump(doc, f)


def load_json(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    with open(path) as f:
        doc = json.load(f)
    tensors = {
        k: np.array(t["data"], dtype=np.dtype(t["dtype"])).reshape(t["shape"])
        for k, t in doc["tensors"].items()
    }
    return tensors, doc["meta"]


_PROTO_CLASS: Any = None


def _proto_class() -> Any:
    """The Checkpoint message, built at run time (no protoc on training nodes needed)."""
    global _PROTO_CLASS
    if _PROTO_CLASS is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        fdp = descriptor_pb2.FileDescriptorProto(
            name="serwatt_train.proto", package="serwatt.train"
        )
        tensor = fdp.message_type.add(name="Tensor")
        F = descriptor_pb2.FieldDescriptorProto
        tensor.field.add(name="name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        tensor.field.add(name="dtype", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        tensor.field.add(name="shape", number=3, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
        tensor.field.add(name="data", number=4, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
        ckpt = fdp.message_type.add(name="Checkpoint")
        ckpt.field.add(
            name="tensors",
            number=1,
            type=F.TYPE_MESSAGE,
            label=F.LABEL_REPEATED,
            type_name=".serwatt.train.Tensor",
        )
        ckpt.field.add(name="meta_json", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        _PROTO_CLASS = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("serwatt.train.Checkpoint")
        )
    return _PROTO_CLASS


def save_protobuf(path: Path, tensors: dict[str, Any], meta: dict[str, Any], tmp: Path) -> None:
    msg = _proto_class()(meta_json=json.dumps(meta))
    for k, v in tensors.items():
        a = _numpy(v)
        msg.tensors.add(name=k, dtype=a.dtype.str, shape=a.shape, data=a.tobytes())
    with open(tmp, "wb") as f:
        f.write(msg.SerializeToString())


def load_protobuf(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    msg = _proto_class()()
    with open(path, "rb") as f:
        msg.ParseFromString(f.read())
    tensors = {
        t.name: np.frombuffer(t.data, dtype=np.dtype(t.dtype)).reshape(tuple(t.shape))
        for t in msg.tensors
    }
    return tensors, json.loads(msg.meta_json)


def save_msgpack(path: Path, tensors: dict[str, Any], meta: dict[str, Any], tmp: Path) -> None:
    import msgpack

    doc = {
        "meta": meta,
        "tensors": {
            k: {
                "dtype": _numpy(v).dtype.str,
                "shape": list(_numpy(v).shape),
                "data": np.ascontiguousarray(_numpy(v)).reshape(-1).view(np.uint8).data,
            }
            for k, v in tensors.items()
        },
    }
    with open(tmp, "wb") as f:
        f.write(msgpack.packb(doc))


def load_msgpack(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import msgpack

    with open(path, "rb") as f:
        doc = msgpack.unpackb(f.read())
    tensors = {
        k: np.frombuffer(t["data"], dtype=np.dtype(t["dtype"])).reshape(t["shape"])
        for k, t in doc["tensors"].items()
    }
    return tensors, doc["meta"]


def save_safetensors(path: Path, tensors: dict[str, Any], meta: dict[str, Any], tmp: Path) -> None:
    md = {"meta": json.dumps(meta)}
    if any(not isinstance(v, np.ndarray) for v in tensors.values()):
        from safetensors.torch import save_file as save_torch_file

        save_torch_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=md)
    else:
        from safetensors.numpy import save_file as save_numpy_file

        save_numpy_file(tensors, str(tmp), metadata=md)


def load_safetensors(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        meta = json.loads((f.metadata() or {})["meta"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    return tensors, meta


def save_many(
    path: Path, tensors: dict[str, Any], meta: dict[str, Any], tmp: Path, prev: Any = None
) -> Any:
    from serwatt.profiler import many

    # .many's save is itself atomic and durable; it writes straight to `path`.
    return many.save(path, tensors, prev=prev, metadata=meta)


def load_many(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from serwatt.profiler import many

    ckpt = many.load(path)
    return {k: ckpt[k] for k in ckpt}, ckpt.metadata


SAVERS: dict[str, Callable[..., Any]] = {
    "pickle": save_pickle,
    "torch": save_torch,
    "json": save_json,
    "protobuf": save_protobuf,
    "msgpack": save_msgpack,
    "safetensors": save_safetensors,
    "many": save_many,
}
LOADERS: dict[str, Callable[[Path], tuple[dict[str, Any], dict[str, Any]]]] = {
    "pickle": load_pickle,
    "torch": load_torch,
    "json": load_json,
    "protobuf": load_protobuf,
    "msgpack": load_msgpack,
    "safetensors": load_safetensors,
    "many": load_many,
}


def checkpoint_paths(directory: Path, fmt: str) -> list[tuple[int, Path]]:
    pattern = re.compile(rf"ckpt-(\d{{8}})\.{re.escape(EXTENSIONS[fmt])}")
    found = []
    for p in directory.iterdir() if directory.is_dir() else []:
        m = pattern.fullmatch(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m serwatt.profiler.workloads.train", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--ckpt", choices=(*FORMATS, ASYNC_MANY), required=True, help="checkpoint serializer"
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="with --ckpt many-async: copy weights and optimizer state while the next step "
        "computes; its optimizer.step() waits for that copy",
    )
    p.add_argument("--steps", type=int, default=20, help="train until this step (default 20)")
    p.add_argument("--every", type=int, default=5, help="checkpoint every K steps (default 5)")
    p.add_argument("--size", type=float, default=16.0, help="checkpoint size in MB (default 16)")
    p.add_argument(
        "--dir", type=Path, default=Path("serwatt-train-ckpt"), help="checkpoint directory"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in --dir"
    )
    p.add_argument(
        "--keep", type=int, default=2, help="checkpoints to keep (default 2; 0 keeps all)"
    )
    p.add_argument("--backend", choices=("auto", "torch", "numpy"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    return p


def make_trainer(backend: str, width: int, seed: int, threads: int) -> TorchTrainer | NumpyTrainer:
    if backend in ("auto", "torch"):
        try:
            import torch
        except ImportError:
            if backend == "torch":
                raise UsageError(
                    "--backend torch: torch is not installed (use --backend numpy)"
                ) from None
        else:
            torch.set_num_threads(threads)
            return TorchTrainer(width, seed)
    return NumpyTrainer(width, seed)


def train(args: argparse.Namespace) -> dict[str, Any]:
    if args.steps < 0 or args.every < 1 or args.size <= 0 or args.keep < 0:
        raise UsageError("--steps >= 0, --every >= 1, --size > 0 and --keep >= 0 are required")
    if args.overlap and args.ckpt != ASYNC_MANY:
        raise UsageError(f"--overlap overlaps many.Checkpointer's copy: use --ckpt {ASYNC_MANY}")
    if args.ckpt == ASYNC_MANY:
        return train_async(args)
    width = width_for(args.size)
    found = checkpoint_paths(args.dir, args.ckpt) if args.resume else []
    if args.resume and not found:
        raise UsageError(
            f"--resume: no {args.ckpt} checkpoint (ckpt-*.{EXTENSIONS[args.ckpt]}) in {args.dir}"
        )
    if args.ckpt == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UsageError("--ckpt torch needs torch installed; choose another format") from None
    if args.ckpt == "many":
        import serwatt.profiler.many  # noqa: F401  (here, so restore_s times the load, not the import)
    trainer = make_trainer(args.backend, width, args.seed, args.threads)
    args.dir.mkdir(parents=True, exist_ok=True)
    start_step, restored, restore_s, prev = 0, None, None, None
    if found:
        start_step, restored_path = found[-1]
        t0 = time.perf_counter()
        tensors, meta = LOADERS[args.ckpt](restored_path)
        trainer.restore(tensors, meta)
        restore_s = time.perf_counter() - t0
        restored = str(restored_path)
        if args.ckpt == "many":
            from serwatt.profiler import many

            # Continue the receipt chain from the checkpoint this run grew out of.
            prev = many.load(restored_path).receipt
    checkpoints = []
    loss = float("nan")
    for step in range(start_step + 1, args.steps + 1):
        x, y = batch(args.seed, step, width)
        loss = trainer.step(x, y)
        if step % args.every == 0:
            path = args.dir / f"ckpt-{step:08d}.{EXTENSIONS[args.ckpt]}"
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tensors, meta = trainer.state()
            meta = dict(meta, step=step, format=args.ckpt, width=width, backend=trainer.backend)
            t0 = time.perf_counter()
            if args.ckpt == "many":
                prev = save_many(path, tensors, meta, tmp, prev=prev)
            else:
                SAVERS[args.ckpt](path, tensors, meta, tmp)
                _durable_replace(tmp, path)
            save_s = time.perf_counter() - t0
            entry = {
                "step": step,
                "path": str(path),
                "bytes": path.stat().st_size,
                "save_s": round(save_s, 6),
            }
            checkpoints.append(entry)
            print(
                f"checkpoint step={step} format={args.ckpt} bytes={entry['bytes']} "
                f"save_s={save_s:.4f}",
                file=sys.stderr,
                flush=True,
            )
            if args.keep:
                for _, old in checkpoint_paths(args.dir, args.ckpt)[: -args.keep]:
                    old.unlink()
    return {
        "format": args.ckpt,
        "backend": trainer.backend,
        "width": width,
        "layers": LAYERS,
        "start_step": start_step,
        "final_step": max(args.steps, start_step),
        "loss": loss,
        "params_blake3": trainer.params_digest(),
        "restored_from": restored,
        "restore_s": restore_s,
        "checkpoints": checkpoints,
    }


def train_async(args: argparse.Namespace) -> dict[str, Any]:
    """--ckpt many-async: the same loop, checkpointing through many.Checkpointer."""
    from serwatt.profiler.many.checkpointer import Checkpointer, Written
    from serwatt.profiler.many.state import load_state

    width = width_for(args.size)
    # Making the Checkpointer reads the newest checkpoint's receipt to continue its chain:
    # on a resume that read is part of the restore (serwatt counts the main thread's time
    # in every episode that reads the file), so restore_s holds it beside the load.
    t0 = time.perf_counter()
    cp = Checkpointer(args.dir, prefix="async", keep=args.keep or None)
    latest = cp.latest() if args.resume else None
    opening_s = time.perf_counter() - t0
    if args.resume and latest is None:
        cp.close()
        raise UsageError(f"--resume: no {ASYNC_MANY} checkpoint (async-*.many) in {args.dir}")
    trainer = make_trainer(args.backend, width, args.seed, args.threads)
    if args.overlap and not isinstance(trainer, TorchTrainer):
        cp.close()
        raise UsageError("--overlap waits in a torch optimizer's step(): use --backend torch")
    start_step, restore_s = 0, None
    if latest is not None:
        t0 = time.perf_counter()
        tree = load_state(latest, verify=True)
        trainer.restore(tree["tensors"], tree["meta"])
        restore_s = opening_s + time.perf_counter() - t0
        start_step = int(tree["meta"]["step"])
    durable: dict[str, tuple[Written, float]] = {}
    # on the background thread, as each file becomes durable: the process's CPU then
    cp.on_written = lambda w: durable.__setitem__(w.path, (w, time.process_time()))
    checkpoints: list[dict[str, Any]] = []
    loss = float("nan")
    try:
        for step in range(start_step + 1, args.steps + 1):
            x, y = batch(args.seed, step, width)
            loss = trainer.step(x, y)
            if step % args.every:
                continue
            tensors, meta = trainer.state()
            meta = dict(meta, step=step, format=ASYNC_MANY, width=width, backend=trainer.backend)
            # around the call, as for the other formats (Staged.stall_s is the call's own
            # figure, about 0.1 ms shorter: it stops before the hand-off)
            cpu0, t0 = time.process_time(), time.perf_counter()
            staged = cp.checkpoint(
                {"tensors": tensors, "meta": meta},
                metadata={"step": step},
                optimizer=getattr(trainer, "opt", None),
                overlap=args.overlap,
            )
            save_s = time.perf_counter() - t0
            checkpoints.append(
                {
                    "step": step,
                    "path": staged.path,
                    "bytes": staged.nbytes,
                    "save_s": save_s,
                    "cpu0": cpu0,
                }
            )
            print(
                f"checkpoint step={step} format={ASYNC_MANY} bytes={staged.nbytes} "
                f"save_s={save_s:.4f} overlapped_bytes={staged.overlapped_bytes}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        cp.close()  # the checkpoint in flight is made durable before the summary
    for entry in checkpoints:
        w, cpu_durable = durable[entry["path"]]
        entry["cpu_s_all_threads"] = round(cpu_durable - entry.pop("cpu0"), 6)
        entry["step_wait_s"] = round(w.step_wait_s, 6)
        entry["cost_s"] = round(entry["save_s"] + w.step_wait_s, 6)
        entry["save_s"] = round(entry["save_s"], 6)
        entry["write_s"] = round(w.write_s, 6)
    return {
        "format": ASYNC_MANY,
        "overlap": bool(args.overlap),
        "backend": trainer.backend,
        "width": width,
        "layers": LAYERS,
        "start_step": start_step,
        "final_step": max(args.steps, start_step),
        "loss": loss,
        "params_blake3": trainer.params_digest(),
        "restored_from": latest,
        "restore_s": restore_s,
        "checkpoints": checkpoints,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = train(args)
    except UsageError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
