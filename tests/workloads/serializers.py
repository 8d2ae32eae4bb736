"""Real serializer workloads for classification tests: `python serializers.py KIND [MAX_S]`.

Each KIND loops one serialization call (as a user would write it) until MAX_S seconds
pass (default 60) or it is killed. It prints `ready <pid>` once its data is built, so
a test samples only the loop. Runs on CPython 3.8+ with only the libraries KIND needs
(protobuf/msgpack/pyyaml in the small target venvs; torch/numpy/safetensors only in
the project venv). The EXPECT table says where each KIND's samples must land.
"""

import io
import json
import os
import sys
import time

# kind -> codepath every serializer sample must land in
EXPECT = {
    "pickle_alias": "pickle",
    "pickle_from_alias": "pickle",
    "pickle_multiline": "pickle",
    "pickle_ambiguous": "pickle",
    "pickle_callbacks": "pickle",
    "pickle_persistent_id": "pickle",
    "pickle_pure_python": "pickle",
    "mp_queue": "pickle",
    "json_dumps": "json",
    "json_loads": "json",
    "orjson_roundtrip": "json",
    "protobuf_serialize": "protobuf",
    "protobuf_parse": "protobuf",
    "protobuf_json_format": "protobuf",
    "protobuf_python_backend": "protobuf",
    "msgpack_packb": "msgpack",
    "msgpack_unpackb": "msgpack",
    "yaml_dump": "yaml",
    "yaml_load": "yaml",
    "torch_save": "torch",
    "torch_load": "torch",
    "tensor_copy": "other",
    "numpy_save": "numpy",
    "numpy_load": "numpy",
    "safetensors_save": "safetensors",
    "safetensors_load": "safetensors",
    "many_save": "many",
    "many_load": "many",
    "compute": "other",
}


def _data(n=20000):
    return {str(i): [i, float(i) * 1.5, f"value-{i}", {"k": i}] for i in range(n)}


def _descriptor_set(copies=300):
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet()
    proto = descriptor_pb2.FileDescriptorProto()
    descriptor_pb2.DESCRIPTOR.CopyToProto(proto)
    for _ in range(copies):
        fds.file.add().CopyFrom(proto)
    return fds


class Slow:
    """An object whose pickling runs Python callbacks (the C pickler calls them)."""

    def __init__(self, i):
        self.i = i
        self.payload = list(range(200))

    def __getstate__(self):
        return {"i": self.i, "payload": [x * 2 for x in self.payload]}

    def __setstate__(self, state):
        self.i = state["i"]
        self.payload = [x // 2 for x in state["payload"]]


def run(kind, max_s):
    deadline = time.time() + max_s

    def ready():
        sys.stdout.write(f"ready {os.getpid()}\n")
        sys.stdout.flush()

    if kind == "pickle_alias":
        import pickle as pk

        data = _data()
        ready()
        while time.time() < deadline:
            blob = pk.dumps(data)
        return blob
    if kind == "pickle_from_alias":
        import pickle
        from pickle import loads as thaw

        blob = pickle.dumps(_data())
        ready()
        while time.time() < deadline:
            obj = thaw(blob)
        return obj
    if kind == "pickle_multiline":
        import pickle

        data = _data()
        ready()
        while time.time() < deadline:
            blob = pickle.dumps(
                data,
                protocol=2,
            )
        return blob
    if kind == "pickle_ambiguous":
        import pickle

        def make(i):
            return [i, str(i)]

        ready()
        while time.time() < deadline:
            blob = pickle.dumps([make(i) for i in range(20000)])
        return blob
    if kind == "pickle_callbacks":
        import pickle

        objs = [Slow(i) for i in range(2000)]
        ready()
        while time.time() < deadline:
            blob = pickle.dumps(objs)
            pickle.loads(blob)
        return blob
    if kind == "pickle_persistent_id":
        import pickle

        class RefPickler(pickle.Pickler):
            def persistent_id(self, obj):
                if isinstance(obj, tuple) and len(obj) == 3:
                    return f"ref-{sum(obj)}"
                return None

        data = [(i, i + 1, i + 2) for i in range(30000)]
        ready()
        while time.time() < deadline:
            buf = io.BytesIO()
            RefPickler(buf, protocol=2).dump(data)
        return buf
    if kind == "pickle_pure_python":
        import pickle

        data = _data(4000)
        ready()
        while time.time() < deadline:
            buf = io.BytesIO()
            pickle._Pickler(buf).dump(data)  # pickle.py's Python pickler, as subclasses use
        return buf
    if kind == "mp_queue":
        import multiprocessing

        q = multiprocessing.Queue()
        data = _data()
        ready()
        while time.time() < deadline:
            q.put(data)  # pickled by the queue's feeder thread (Queue._feed)
            q.get()  # unpickled here, in Queue.get at `_ForkingPickler.loads(res)`
        return q
    if kind == "json_dumps":
        data = _data()
        ready()
        while time.time() < deadline:
            text = json.dumps(data)
        return text
    if kind == "json_loads":
        text = json.dumps(_data())
        ready()
        while time.time() < deadline:
            obj = json.loads(text)
        return obj
    if kind == "orjson_roundtrip":
        import orjson

        data = _data()
        ready()
        while time.time() < deadline:
            obj = orjson.loads(orjson.dumps(data))
        return obj
    if kind == "protobuf_serialize":
        msg = _descriptor_set()
        ready()
        while time.time() < deadline:
            blob = msg.SerializeToString()
        return blob
    if kind == "protobuf_parse":
        from google.protobuf.descriptor_pb2 import FileDescriptorSet

        blob = _descriptor_set().SerializeToString()
        ready()
        while time.time() < deadline:
            msg = FileDescriptorSet.FromString(blob)
            msg.ParseFromString(blob)
        return msg
    if kind == "protobuf_python_backend":
        # protobuf's pure-Python backend: serialization runs as Python frames.
        os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
        msg = _descriptor_set(copies=10)
        ready()
        while time.time() < deadline:
            blob = msg.SerializeToString()
            msg.ParseFromString(blob)
        return blob
    if kind == "protobuf_json_format":
        from google.protobuf import json_format

        msg = _descriptor_set(copies=20)
        ready()
        while time.time() < deadline:
            text = json_format.MessageToJson(msg)
        return text
    if kind == "msgpack_packb":
        import msgpack

        data = _data()
        ready()
        while time.time() < deadline:
            blob = msgpack.packb(data)
        return blob
    if kind == "msgpack_unpackb":
        import msgpack

        blob = msgpack.packb(_data())
        ready()
        while time.time() < deadline:
            obj = msgpack.unpackb(blob, strict_map_key=False)
        return obj
    if kind == "yaml_dump":
        import yaml

        data = _data(500)
        ready()
        while time.time() < deadline:
            text = yaml.safe_dump(data)
        return text
    if kind == "yaml_load":
        import yaml

        text = yaml.safe_dump(_data(500))
        ready()
        while time.time() < deadline:
            data = yaml.safe_load(text)
        return data
    if kind in ("torch_save", "torch_load", "tensor_copy"):
        import copy

        import torch

        sd = {f"layer{i}.weight": torch.randn(64, 64) for i in range(400)}
        blob = io.BytesIO()
        torch.save(sd, blob)
        raw = blob.getvalue()
        ready()
        while time.time() < deadline:
            if kind == "torch_save":
                buf = io.BytesIO()
                torch.save(sd, buf)
            elif kind == "torch_load":
                torch.load(io.BytesIO(raw), weights_only=True)
            else:
                for t in sd.values():
                    copy.copy(t)
        return raw
    if kind == "numpy_save":
        import numpy as np

        arr = np.arange(2_000_000, dtype=np.float64).reshape(1000, 2000)
        objs = np.array([{"k": i} for i in range(2000)], dtype=object)
        ready()
        while time.time() < deadline:
            buf = io.BytesIO()
            np.save(buf, arr)
            np.save(buf, objs, allow_pickle=True)
        return buf
    if kind == "numpy_load":
        import numpy as np

        buf = io.BytesIO()
        np.save(buf, np.arange(2_000_000, dtype=np.float64).reshape(1000, 2000))
        np.save(buf, np.array([{"k": i} for i in range(2000)], dtype=object), allow_pickle=True)
        ready()
        while time.time() < deadline:
            buf.seek(0)
            arr = np.load(buf)
            objs = np.load(buf, allow_pickle=True)
        return arr, objs
    if kind == "safetensors_load":
        import numpy as np
        from safetensors.numpy import load, save

        blob = save({f"w{i}": np.ones((256, 256), dtype=np.float32) for i in range(100)})
        ready()
        while time.time() < deadline:
            tensors = load(blob)
        return tensors
    if kind == "safetensors_save":
        import numpy as np
        from safetensors.numpy import save

        tensors = {f"w{i}": np.ones((256, 256), dtype=np.float32) for i in range(100)}
        ready()
        while time.time() < deadline:
            blob = save(tensors)
        return blob
    if kind == "many_save":
        import tempfile

        import numpy as np

        from serwatt.profiler import many

        state = {f"w{i}": np.full((512, 512), i, dtype=np.float32) for i in range(16)}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ckpt.many")
            ready()
            while time.time() < deadline:
                many.save(path, state)
        return None
    if kind == "many_load":
        import tempfile

        import numpy as np

        from serwatt.profiler import many

        state = {f"w{i}": np.full((512, 512), i, dtype=np.float32) for i in range(16)}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ckpt.many")
            many.save(path, state)
            ready()
            while time.time() < deadline:
                # map, bind every slot and check every hash: all of it .many's own work
                ckpt = many.load(path, verify=True)
                views = [ckpt[name] for name in ckpt]
                del views
                ckpt.close()
        return None
    if kind == "compute":
        ready()
        total = 0
        while time.time() < deadline:
            total += sum(i * i for i in range(10000))
        return total
    raise SystemExit(
        "unknown workload kind {!r}; known: {}".format(kind, ", ".join(sorted(EXPECT)))
    )


if __name__ == "__main__":
    run(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 60.0)
