"""The `serwatt demo` workload: a training-loop-shaped mix of serialization and compute.

Each round does a fixed amount of each kind of work, so every codepath shows up in
the profile: pickle (dumps/loads of a nested dict), json (dumps/loads), protobuf
(a message type built at runtime from a FileDescriptorProto, serialized and parsed
by the installed backend, upb by default), torch.save/torch.load of a small state
dict when torch is installed, and plain Python compute (the `other` codepath).

    python -m serwatt.profiler.workloads.demo [--duration S]
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import time
from typing import Any


def build_record_types() -> tuple[Any, Any]:
    """A `Batch { repeated Record records }` message pair, defined at runtime."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="serwatt_demo.proto", package="serwatt.demo")
    rec = fdp.message_type.add(name="Record")
    fd = descriptor_pb2.FieldDescriptorProto
    rec.field.add(name="id", number=1, type=fd.TYPE_INT64, label=fd.LABEL_OPTIONAL)
    rec.field.add(name="values", number=2, type=fd.TYPE_DOUBLE, label=fd.LABEL_REPEATED)
    rec.field.add(name="tag", number=3, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    batch = fdp.message_type.add(name="Batch")
    batch.field.add(
        name="records",
        number=1,
        type=fd.TYPE_MESSAGE,
        type_name=".serwatt.demo.Record",
        label=fd.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    get = getattr(message_factory, "GetMessageClass", None)
    if get is None:  # protobuf < 4.22
        factory = message_factory.MessageFactory(pool)
        get = factory.GetPrototype
    return (
        get(pool.FindMessageTypeByName("serwatt.demo.Record")),
        get(pool.FindMessageTypeByName("serwatt.demo.Batch")),
    )


def make_payload(n: int = 3000) -> dict[str, Any]:
    return {
        f"key{i}": {"id": i, "values": [i * 0.5, i * 1.5, i * 2.5], "tag": "x" * 12}
        for i in range(n)
    }


def do_pickle(payload: dict[str, Any]) -> int:
    blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    back = pickle.loads(blob)
    return len(back)


def do_json(payload: dict[str, Any]) -> int:
    text = json.dumps(payload)
    back = json.loads(text)
    return len(back)


def do_protobuf(batch: Any, batch_cls: Any) -> int:
    blob = batch.SerializeToString()
    back = batch_cls.FromString(blob)
    return len(back.records)


def do_torch(torch: Any, state: dict[str, Any]) -> int:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    return len(back)


def do_compute(n: int = 60000) -> float:
    acc = 0.0
    for i in range(n):
        acc += (i % 7) * 0.5 - (i % 3)
    return acc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds to run (default 20)")
    args = ap.parse_args(argv)
    payload = make_payload()
    record_cls, batch_cls = build_record_types()
    batch = batch_cls()
    for i in range(3000):
        batch.records.append(record_cls(id=i, values=[i * 0.5, i * 1.5], tag="y" * 12))
    torch: Any
    try:
        import torch
    except ImportError:  # the demo runs without torch; the torch row then stays at 0
        torch = None
    state = {}
    if torch is not None:
        state = {f"layer{i}.weight": torch.randn(256, 256) for i in range(8)}
    deadline = time.monotonic() + args.duration
    rounds = 0
    small = make_payload(1000)
    # repeats chosen so each kind takes roughly 10 ms per round on a 2-vCPU VM
    while time.monotonic() < deadline:
        for _ in range(2):
            do_pickle(payload)
        do_json(small)
        for _ in range(15):
            do_protobuf(batch, batch_cls)
        if torch is not None:
            for _ in range(3):
                do_torch(torch, state)
        do_compute()
        rounds += 1
    print(f"demo workload: {rounds} rounds in {args.duration:g} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
