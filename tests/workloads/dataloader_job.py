"""A DataLoader training job that times its own ForkingPickler calls in every process.

    python dataloader_job.py OUT_DIR {tensors|plain} SECONDS

Two workers (fork) load dict samples (a feature vector, a label and Python metadata)
for a small MLP; the main thread logs a JSON line every 50 steps. `tensors`: the
workers' batches are tensors, which cross by file descriptor (torch's default
`file_descriptor` sharing: unpickling runs rebuild_storage_fd, resource_sharer and
connection's HMAC handshake under `_ForkingPickler.loads`). `plain`: the batches stay
Python lists and dicts (plain pickling), converted to tensors in the main process.

Truth: multiprocessing.reduction.ForkingPickler.dumps and .loads are wrapped before
the DataLoader starts, so the forked workers inherit the wrappers; each outermost
call's time.thread_time() delta is summed (a dumps nested in a loads, the handshake's
`send`, counts once, in the loads). Each process writes OUT_DIR/truth-<pid>.json: the
main process after its workers are shut down, a worker from a multiprocessing
finalizer run after its queues' own. The job waits (up to 20 s) for a py-spy attached
to it before it starts, so the truth covers only what a sampler could see.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
import time
from multiprocessing import reduction, util
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_depth = threading.local()
_totals = {"dumps_cpu_s": 0.0, "loads_cpu_s": 0.0, "dumps": 0, "loads": 0}
_orig_dumps = reduction.ForkingPickler.dumps  # a classmethod, bound to the class


def _enter() -> bool:
    d = getattr(_depth, "n", 0)
    _depth.n = d + 1
    return d == 0


def _leave(kind: str, t0: float, outer: bool) -> None:
    _depth.n -= 1
    if outer:
        spent = time.thread_time() - t0
        with _lock:
            _totals[f"{kind}_cpu_s"] += spent
            _totals[kind] += 1


def timed_dumps(cls: type, obj: Any, protocol: int | None = None) -> Any:
    outer = _enter()
    t0 = time.thread_time()
    try:
        return _orig_dumps(obj, protocol)
    finally:
        _leave("dumps", t0, outer)


def timed_loads(*args: Any, **kwargs: Any) -> Any:
    # ForkingPickler.loads is pickle.loads itself (a class attribute)
    outer = _enter()
    t0 = time.thread_time()
    try:
        return pickle.loads(*args, **kwargs)
    finally:
        _leave("loads", t0, outer)


def _write_truth(out_dir: str, role: str) -> None:
    with _lock:
        doc = {"pid": os.getpid(), "role": role, **_totals}
    # the process's main thread (the training loop, or the worker's loop): its CPU and the
    # time it waited for one in the run queue, from the kernel (schedstat, ns)
    on_cpu_ns, run_delay_ns, _ = Path("/proc/self/schedstat").read_text().split()
    doc["cpu_s"], doc["run_delay_s"] = int(on_cpu_ns) / 1e9, int(run_delay_ns) / 1e9
    path = Path(out_dir) / f"truth-{os.getpid()}.json"
    path.write_text(json.dumps(doc))


def _sampler_attached(pid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"py-spy") and str(pid).encode() in argv:
            return True
    return False


class Samples:
    """Dict samples: a 32-feature vector, a label and metadata (Python objects)."""

    def __init__(self, n: int, tensors: bool) -> None:
        self.n, self.tensors = n, tensors

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        feats = [((i * 31 + k) % 97) / 97.0 for k in range(32)]
        meta = {
            "id": i,
            "source": f"shard-{i % 7}",
            "tokens": list(range(i % 1000, i % 1000 + 192)),
            "words": [f"w{k}" for k in range(24)],
        }
        if self.tensors:
            return {"x": torch.tensor(feats), "y": torch.tensor([float(i % 2)]), "meta": meta}
        return {"x": feats, "y": [float(i % 2)], "meta": meta}


def _keep_python(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


def _stack_tensors(batch: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    return {
        "x": torch.stack([s["x"] for s in batch]),
        "y": torch.stack([s["y"] for s in batch]),
        "meta": [s["meta"] for s in batch],
    }


def _worker_init(out_dir: str, worker_id: int) -> None:
    with _lock:  # the fork copied the main process's totals
        for key in _totals:
            _totals[key] = 0 if isinstance(_totals[key], int) else 0.0
    # after the queues' finalizers (exitpriority -5 joins the feeder thread)
    util.Finalize(None, _write_truth, args=(out_dir, f"worker{worker_id}"), exitpriority=-100)


def main() -> None:
    out_dir, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if mode not in ("tensors", "plain"):
        raise SystemExit(f"mode must be tensors or plain, not {mode!r}")
    import functools

    import torch
    from torch.utils.data import DataLoader

    reduction.ForkingPickler.dumps = classmethod(timed_dumps)  # type: ignore[method-assign,assignment]
    reduction.ForkingPickler.loads = staticmethod(timed_loads)  # type: ignore[method-assign,assignment]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tensors = mode == "tensors"
    loader = DataLoader(
        Samples(1 << 20, tensors),
        batch_size=64,
        num_workers=2,
        multiprocessing_context="fork",
        worker_init_fn=functools.partial(_worker_init, out_dir),
        collate_fn=_stack_tensors if tensors else _keep_python,
        persistent_workers=False,
    )
    deadline = time.monotonic() + 20
    attached = _sampler_attached(os.getpid())
    while not attached and time.monotonic() < deadline:
        time.sleep(0.05)
        attached = _sampler_attached(os.getpid())
    it = iter(loader)
    steps, end = 0, time.monotonic() + seconds
    log = Path(out_dir) / "train.jsonl"
    with log.open("w") as fh:
        while time.monotonic() < end:
            batch = next(it)
            if tensors:
                x, y = batch["x"], batch["y"]
            else:
                x = torch.tensor([s["x"] for s in batch])
                y = torch.tensor([s["y"] for s in batch])
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if steps % 50 == 0:
                fh.write(json.dumps({"step": steps, "loss": loss.item()}) + "\n")
    it._shutdown_workers()  # type: ignore[attr-defined]  # the workers write their truth
    _write_truth(out_dir, "main")
    (Path(out_dir) / "job.json").write_text(json.dumps({"steps": steps, "sampler": attached}))


if __name__ == "__main__":
    main()
