"""Checkpoint benchmark: the same state saved and restored by every baseline and by `.many`.

    .venv/bin/python bench/checkpoint.py [--size-mb 1024] [--tensors 200] [--small-mb 64]
        [--large-mb 4096] [--repeat 3] [--dir /tmp/serwatt-bench] [--json results.json]

For each format: save seconds (serialize + write + fsync + rename, the same durability work
for all), open-to-first-tensor seconds, all-bytes-touched seconds (until every byte of every
tensor is resident and readable: one read per 4 KiB page, which is free for formats that
already copied the bytes in and faults pages in for mapped ones), bytes on disk, peak RSS,
private (anonymous) RSS, and verify seconds where the format can verify content. Restores
are measured with a cold page cache (the file's pages dropped with
posix_fadvise(POSIX_FADV_DONTNEED) after fsync) and warm. Every measurement runs in a fresh
child process so RSS figures are its own. Ratios are against safetensors and against a raw
sequential write/read of the same bytes on the same disk, measured in the same run.

JSON and protobuf run at --small-mb (they copy every byte through Python objects).
Also measured: `.many` open+rebind at --size-mb and --large-mb (same 200 slots, sparse files
for both formats, since opening reads only headers) and an in-place update of 1% of slots.
Files are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BIG_FORMATS = [
    "raw",
    "many",
    "many-nohash",
    "safetensors",
    "torch",
    "torch-mmap",
    "pickle",
    "msgpack",
]
SMALL_FORMATS = ["raw", "many", "safetensors", "json", "protobuf"]
PAGE = 4096


# ------------------------------------------------------------------------------------------
# child side: one operation, one process
# ------------------------------------------------------------------------------------------


def shapes_for(total_bytes: int, n: int) -> list[tuple[int, int]]:
    """n float32 tensors of 1024 columns, mixed sizes (1:2:3:4), summing to ~total_bytes."""
    weights = [1 + (i % 4) for i in range(n)]
    floats = total_bytes // 4
    return [(max(1, floats * w // sum(weights) // 1024), 1024) for w in weights]


def make_state(total_bytes: int, n: int) -> dict[str, Any]:
    import torch

    return {
        f"layer{i:03d}.weight": torch.full(shape, float(i % 251), dtype=torch.float32)
        for i, shape in enumerate(shapes_for(total_bytes, n))
    }


def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def durable(write: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    fd = os.open(tmp, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)


def child_save(fmt: str, path: Path, total: int, n: int) -> dict[str, Any]:
    import numpy as np

    state = make_state(total, n)
    arrays = {k: v.numpy() for k, v in state.items()}
    base_rss = rss_bytes()
    t0 = time.perf_counter()
    if fmt == "raw":

        def write(p: Path) -> None:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for a in arrays.values():
                mv = a.reshape(-1).view(np.uint8).data
                pos = 0
                while pos < len(mv):
                    pos += os.write(fd, mv[pos : pos + (1 << 30)])
            os.close(fd)

        durable(write, path)
    elif fmt in ("many", "many-nohash"):
        from profiler import many

        many.save(path, state, hash=(fmt == "many"))
    elif fmt == "safetensors":
        from safetensors.torch import save_file

        durable(lambda p: save_file(state, str(p)), path)
    elif fmt in ("torch", "torch-mmap"):
        import torch

        durable(lambda p: torch.save(state, p), path)
    elif fmt == "pickle":
        import pickle

        def write(p: Path) -> None:
            with open(p, "wb") as f:
                pickle.dump(arrays, f, protocol=5)

        durable(write, path)
    elif fmt == "msgpack":
        import msgpack

        def write(p: Path) -> None:
            doc = {
                k: {"shape": list(a.shape), "data": a.reshape(-1).view(np.uint8).data}
                for k, a in arrays.items()
            }
            with open(p, "wb") as f:
                f.write(msgpack.packb(doc))

        durable(write, path)
    elif fmt == "json":

        def write(p: Path) -> None:
            with open(p, "w") as f:
                json.dump(
                    {
                        k: {"shape": list(a.shape), "data": a.ravel().tolist()}
                        for k, a in arrays.items()
                    },
                    f,
                )

        durable(write, path)
    elif fmt == "protobuf":
        from profiler.workloads.train import _proto_class

        def write(p: Path) -> None:
            msg = _proto_class()()
            for k, a in arrays.items():
                msg.tensors.add(name=k, dtype=a.dtype.str, shape=a.shape, data=a.tobytes())
            with open(p, "wb") as f:
                f.write(msg.SerializeToString())

        durable(write, path)
    else:
        raise SystemExit(f"unknown format {fmt}")
    save_s = time.perf_counter() - t0
    return {
        "save_s": save_s,
        "save_extra_peak_rss": max(0, peak_rss_bytes() - base_rss),
        "bytes": path.stat().st_size,
    }


def touch(arrays: list[Any]) -> int:
    """One read per page of every tensor: every byte becomes resident and readable."""
    import numpy as np

    total = 0
    for a in arrays:
        flat = (a if isinstance(a, np.ndarray) else a.numpy()).reshape(-1).view(np.uint8)
        total += int(flat[::PAGE].sum())
    return total


def child_load(fmt: str, path: Path, total: int, n: int, prefetch: bool = False) -> dict[str, Any]:
    import numpy as np

    first_name = "layer000.weight"
    if fmt in ("torch", "torch-mmap", "safetensors"):
        import torch  # noqa: F401  (imported before timing: import cost is not restore cost)
    if fmt.startswith("many"):
        from profiler import many  # noqa: F401
    if fmt == "msgpack":
        import msgpack  # noqa: F401
    shapes = shapes_for(total, n)
    base, base_anon = rss_bytes(), rss_anon_bytes()
    t0 = time.perf_counter()
    keep: Any = None
    if fmt == "raw":
        fd = os.open(path, os.O_RDONLY)
        # The strongest plain read: sequential hint (doubles the kernel's readahead window);
        # measured 1.0 s against 2-3.3 s without it for 1 GiB cold on the development VM.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        bufs = []
        for i, shape in enumerate(shapes):
            buf = np.empty(shape, dtype=np.float32)
            mv = buf.reshape(-1).view(np.uint8).data
            pos = 0
            while pos < len(mv):
                pos += os.readv(fd, [mv[pos : pos + (1 << 30)]])
            bufs.append(buf)
            if i == 0:
                t_first = time.perf_counter()
        os.close(fd)
        first = bufs[0]
        arrays = bufs
    elif fmt.startswith("many"):
        from profiler import many

        ckpt = many.load(path)
        first = ckpt[first_name]
        t_first = time.perf_counter()
        if prefetch:
            # The MADV_WILLNEED hint for the whole file (measured slower than plain faults here).
            ckpt.prefetch()
        arrays = [ckpt[k] for k in ckpt]
        keep = ckpt
    elif fmt == "safetensors":
        from safetensors import safe_open

        f = safe_open(str(path), framework="pt")
        first = f.get_tensor(first_name)
        t_first = time.perf_counter()
        arrays = [f.get_tensor(k) for k in f.keys()]  # noqa: SIM118
        keep = f
    elif fmt in ("torch", "torch-mmap"):
        import torch

        sd = torch.load(path, weights_only=True, mmap=(fmt == "torch-mmap"))
        first = sd[first_name]
        t_first = time.perf_counter()
        arrays = list(sd.values())
    elif fmt == "pickle":
        import pickle

        with open(path, "rb") as fh:
            sd = pickle.load(fh)
        first = sd[first_name]
        t_first = time.perf_counter()
        arrays = list(sd.values())
    elif fmt == "msgpack":
        import msgpack

        with open(path, "rb") as fh:
            doc = msgpack.unpackb(fh.read())
        views = {
            k: np.frombuffer(d["data"], dtype=np.float32).reshape(d["shape"])
            for k, d in doc.items()
        }
        first = views[first_name]
        t_first = time.perf_counter()
        arrays = list(views.values())
    elif fmt == "json":
        with open(path) as fh:
            doc = json.load(fh)
        views = {
            k: np.array(d["data"], dtype=np.float32).reshape(d["shape"]) for k, d in doc.items()
        }
        first = views[first_name]
        t_first = time.perf_counter()
        arrays = list(views.values())
    elif fmt == "protobuf":
        from profiler.workloads.train import _proto_class

        msg = _proto_class()()
        with open(path, "rb") as fh:
            msg.ParseFromString(fh.read())
        views = {
            t.name: np.frombuffer(t.data, dtype=np.float32).reshape(tuple(t.shape))
            for t in msg.tensors
        }
        first = views[first_name]
        t_first = time.perf_counter()
        arrays = list(views.values())
    else:
        raise SystemExit(f"unknown format {fmt}")
    touch(arrays)
    t_all = time.perf_counter()
    first_ok = float(np.asarray(first).reshape(-1)[0]) == 0.0
    del keep
    return {
        "first_s": t_first - t0,
        "all_s": t_all - t0,
        "load_peak_rss": max(0, peak_rss_bytes() - base),
        "load_anon_rss": max(0, rss_anon_bytes() - base_anon),
        "first_value_ok": first_ok,
        "tensors": len(arrays),
    }


def child_verify(path: Path) -> dict[str, Any]:
    from profiler import many

    t0 = time.perf_counter()
    problems = many.verify(path)
    return {"verify_s": time.perf_counter() - t0, "problems": len(problems)}


def child_update(path: Path, fraction: float) -> dict[str, Any]:
    import numpy as np

    from profiler import many

    arena = many.Arena(path)
    names = list(arena.names)
    k = max(1, round(len(names) * fraction))
    chosen = names[:: max(1, len(names) // k)][:k]
    values = {nm: np.full(arena.info(nm).shape, 7.0, dtype=np.float32) for nm in chosen}
    t0 = time.perf_counter()
    for nm, v in values.items():
        arena.update(nm, v)
    arena.commit()
    dt = time.perf_counter() - t0
    arena.close()
    return {"update_s": dt, "slots": k, "bytes": sum(v.nbytes for v in values.values())}


def child_open(fmt: str, path: Path, reps: int) -> dict[str, Any]:
    """Warm open (header only) and open + rebind of every tensor (no data touched)."""
    open_only, bind_all = [], []
    if fmt == "many":
        from profiler import many

        for _ in range(reps):
            t0 = time.perf_counter()
            ckpt = many.load(path)
            t1 = time.perf_counter()
            views = [ckpt[k] for k in ckpt]
            t2 = time.perf_counter()
            open_only.append(t1 - t0)
            bind_all.append(t2 - t0)
            del views
            ckpt.close()
    else:
        import torch  # noqa: F401
        from safetensors import safe_open

        for _ in range(reps):
            t0 = time.perf_counter()
            with safe_open(str(path), framework="pt") as f:
                t1 = time.perf_counter()
                views = [f.get_tensor(k) for k in f.keys()]  # noqa: SIM118
                t2 = time.perf_counter()
            open_only.append(t1 - t0)
            bind_all.append(t2 - t0)
            del views
    return {
        "open_only_best_s": min(open_only),
        "open_only_median_s": statistics.median(open_only),
        "open_best_s": min(bind_all),
        "open_median_s": statistics.median(bind_all),
    }


def child_main(spec: dict[str, Any]) -> None:
    op, path = spec["op"], Path(spec["path"])
    if op == "save":
        out = child_save(spec["format"], path, spec["total"], spec["n"])
    elif op == "load":
        out = child_load(
            spec["format"], path, spec["total"], spec["n"], spec.get("prefetch", False)
        )
    elif op == "verify":
        out = child_verify(path)
    elif op == "update":
        out = child_update(path, spec["fraction"])
    elif op == "open":
        out = child_open(spec["format"], path, spec["reps"])
    else:
        raise SystemExit(f"unknown op {op}")
    print(json.dumps(out))


# ------------------------------------------------------------------------------------------
# parent side
# ------------------------------------------------------------------------------------------


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


EXT = {
    "raw": "raw",
    "many": "many",
    "many-nohash": "many",
    "safetensors": "safetensors",
    "torch": "pt",
    "torch-mmap": "pt",
    "pickle": "pkl",
    "msgpack": "msgpack",
    "json": "json",
    "protobuf": "pb",
}


def bench_formats(
    formats: list[str], total: int, n: int, repeat: int, workdir: Path
) -> dict[str, dict[str, Any]]:
    """Round-robin over formats in each repetition, so every format sees the same disk and
    neighbours over time (a shared machine drifts by 2-4x within minutes)."""
    runs: dict[str, dict[str, list[Any]]] = {fmt: {} for fmt in formats}
    for rep in range(repeat):
        for fmt in formats:
            path = workdir / f"state-{fmt}.{EXT[fmt]}"
            spec = {"format": fmt, "path": str(path), "total": total, "n": n}
            saved = run_child({"op": "save", **spec})
            drop_cache(path)
            cold = run_child({"op": "load", **spec})
            warm = run_child({"op": "load", **spec})
            row = {
                **saved,
                **{f"cold_{k}": v for k, v in cold.items()},
                **{f"warm_{k}": v for k, v in warm.items()},
            }
            if fmt == "many":
                # With the prefetch hint (MADV_WILLNEED on the whole file) instead of plain faults.
                drop_cache(path)
                hinted = run_child({"op": "load", **spec, "prefetch": True})
                row["cold_all_prefetch_s"] = hinted["all_s"]
                drop_cache(path)
                row["cold_verify_s"] = run_child({"op": "verify", "path": str(path)})["verify_s"]
                row["warm_verify_s"] = run_child({"op": "verify", "path": str(path)})["verify_s"]
                upd = run_child({"op": "update", "path": str(path), "fraction": 0.01})
                row["update_1pct_s"] = upd["update_s"]
                row["update_1pct_slots"] = upd["slots"]
                row["update_1pct_bytes"] = upd["bytes"]
            for k, v in row.items():
                runs[fmt].setdefault(k, []).append(v)
            print(
                f"  rep {rep + 1} {fmt:<12} save {saved['save_s']:.3f}s  cold first "
                f"{cold['first_s']:.4f}s all {cold['all_s']:.3f}s  warm first "
                f"{warm['first_s']:.4f}s all {warm['all_s']:.3f}s",
                flush=True,
            )
            path.unlink()
    # Times: best of `repeat` (other tenants of a shared machine only ever add time), with
    # the median kept beside it; sizes and RSS: median.
    results: dict[str, dict[str, Any]] = {}
    for fmt, fruns in runs.items():
        res: dict[str, Any] = {"runs": repeat}
        for k, v in fruns.items():
            if isinstance(v[0], bool) or not isinstance(v[0], int | float):
                res[k] = v[0]
            elif k.endswith("_s"):
                res[k] = min(v)
                res[k + "_median"] = statistics.median(v)
            else:
                res[k] = statistics.median(v)
        results[fmt] = res
    return results


def sparse_pair(total: int, n: int, workdir: Path) -> tuple[Path, Path]:
    """A `.many` and a safetensors file of the benchmark's layout, data left as holes."""
    import numpy as np

    from profiler import many

    shapes = shapes_for(total, n)
    names = [f"layer{i:03d}.weight" for i in range(n)]
    mpath = workdir / f"open-{total >> 20}.many"
    many.Arena.create(
        mpath, {nm: (sh, np.float32) for nm, sh in zip(names, shapes, strict=True)}
    ).close()
    spath = workdir / f"open-{total >> 20}.safetensors"
    header: dict[str, Any] = {}
    off = 0
    for nm, sh in zip(names, shapes, strict=True):
        nbytes = sh[0] * sh[1] * 4
        header[nm] = {"dtype": "F32", "shape": list(sh), "data_offsets": [off, off + nbytes]}
        off += nbytes
    hbytes = json.dumps(header, separators=(",", ":")).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    with open(spath, "wb") as f:
        f.write(len(hbytes).to_bytes(8, "little") + hbytes)
        f.truncate(8 + len(hbytes) + off)
    return mpath, spath


def fmt_s(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"


def fmt_b(x: float) -> str:
    return f"{x / 2**20:.0f} MiB" if x >= 2**20 else f"{x / 2**10:.0f} KiB"


def print_table(title: str, res: dict[str, dict[str, Any]]) -> None:
    raw = res["raw"]
    st = res.get("safetensors")
    print(f"\n{title}")
    cols = [
        "format",
        "save",
        "xraw bw",
        "xsafet",
        "cold first",
        "cold all",
        "xraw rd",
        "warm first",
        "warm all",
        "disk",
        "save +RSS",
        "load peakRSS",
        "load anon",
        "verify cold/warm",
    ]
    print(" | ".join(cols))
    for fmt, r in res.items():
        ver = (
            "n/a (no content hash)"
            if "cold_verify_s" not in r
            else f"{fmt_s(r['cold_verify_s'])} / {fmt_s(r['warm_verify_s'])}"
        )
        print(
            " | ".join(
                [
                    fmt,
                    fmt_s(r["save_s"]),
                    f"{raw['save_s'] / r['save_s']:.2f}",
                    f"{r['save_s'] / st['save_s']:.2f}" if st else "-",
                    fmt_s(r["cold_first_s"]),
                    fmt_s(r["cold_all_s"]),
                    f"{raw['cold_all_s'] / r['cold_all_s']:.2f}",
                    fmt_s(r["warm_first_s"]),
                    fmt_s(r["warm_all_s"]),
                    fmt_b(r["bytes"]),
                    fmt_b(r["save_extra_peak_rss"]),
                    fmt_b(r["cold_load_peak_rss"]),
                    fmt_b(r["cold_load_anon_rss"]),
                    ver,
                ]
            )
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--tensors", type=int, default=200)
    p.add_argument("--small-mb", type=int, default=64)
    p.add_argument("--large-mb", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", type=Path, default=Path("/tmp/serwatt-bench"))
    p.add_argument("--formats", default=",".join(BIG_FORMATS))
    p.add_argument("--small-formats", default=",".join(SMALL_FORMATS))
    p.add_argument("--json", type=Path, help="also write all figures here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    total, small, n = args.size_mb << 20, args.small_mb << 20, args.tensors
    env = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "dir": str(args.dir),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(
        f"checkpoint benchmark: {n} tensors, {args.size_mb} MiB "
        f"(small formats {args.small_mb} MiB); {env}"
    )
    out: dict[str, Any] = {"env": env, "args": {k: str(v) for k, v in vars(args).items()}}
    try:
        print(f"\n[{args.size_mb} MiB]")
        out["big"] = bench_formats(args.formats.split(","), total, n, args.repeat, args.dir)
        print(f"\n[{args.small_mb} MiB]")
        out["small"] = bench_formats(args.small_formats.split(","), small, n, args.repeat, args.dir)
        scaling = {}
        for size in sorted({total, args.large_mb << 20}):
            mpath, spath = sparse_pair(size, n, args.dir)
            scaling[size >> 20] = {
                "many": run_child(
                    {"op": "open", "format": "many", "path": str(mpath), "reps": 200}
                ),
                "safetensors": run_child(
                    {"op": "open", "format": "safetensors", "path": str(spath), "reps": 200}
                ),
            }
            mpath.unlink()
            spath.unlink()
        out["open_scaling"] = scaling
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    env["loadavg_end"] = os.getloadavg()

    print_table(f"{args.size_mb} MiB, {n} tensors (times: best of {args.repeat})", out["big"])
    print_table(f"{args.small_mb} MiB, {n} tensors (times: best of {args.repeat})", out["small"])
    for label, res in (("big", out["big"]), ("small", out["small"])):
        m = res.get("many")
        if m:
            print(
                f"{label}: .many cold all-bytes with prefetch() (MADV_WILLNEED): "
                f"{fmt_s(m['cold_all_prefetch_s'])}; update 1% ({m['update_1pct_slots']} "
                f"slots, {fmt_b(m['update_1pct_bytes'])}) + commit: "
                f"{fmt_s(m['update_1pct_s'])}"
            )
    print("\nopen + rebind all tensors, warm, no data touched (best / median of 200):")
    for size_mb, r in scaling.items():
        m, t = r["many"], r["safetensors"]
        print(
            f"  {size_mb} MiB: open only: .many load() {fmt_s(m['open_only_best_s'])} / "
            f"{fmt_s(m['open_only_median_s'])}, safetensors safe_open() "
            f"{fmt_s(t['open_only_best_s'])} / {fmt_s(t['open_only_median_s'])}"
        )
        print(
            f"  {size_mb} MiB: open + all {n} tensors: .many {fmt_s(m['open_best_s'])} / "
            f"{fmt_s(m['open_median_s'])}, safetensors safe_open+get_tensor "
            f"{fmt_s(t['open_best_s'])} / {fmt_s(t['open_median_s'])}"
        )

    big, raw = out["big"], out["big"]["raw"]
    goals = []
    if "many-nohash" in big:
        goals.append(
            (
                "save without hashing >= 0.8x raw write bandwidth",
                raw["save_s"] / big["many-nohash"]["save_s"],
                0.8,
            )
        )
    if "many" in big:
        m = big["many"]
        goals.append(
            ("save with receipts >= 0.5x raw write bandwidth", raw["save_s"] / m["save_s"], 0.5)
        )
        goals.append(
            ("all-bytes read (cold) >= 0.8x raw read", raw["cold_all_s"] / m["cold_all_s"], 0.8)
        )
        goals.append(
            ("all-bytes read (warm) >= 0.8x raw read", raw["warm_all_s"] / m["warm_all_s"], 0.8)
        )
        goals.append(
            (
                "update 1% of slots <= 2% of a full save (ratio)",
                m["update_1pct_s"] / m["save_s"],
                -0.02,
            )
        )
    sizes = sorted(scaling)
    r_small, r_large = scaling[sizes[0]], scaling[sizes[-1]]
    goals.append(
        (
            "open+rebind all at least as fast as safe_open+get_tensor all (speedup, best of 200)",
            r_small["safetensors"]["open_best_s"] / r_small["many"]["open_best_s"],
            1.0,
        )
    )
    goals.append(
        (
            "load() at least as fast as a bare safe_open() (speedup, best of 200)",
            r_small["safetensors"]["open_only_best_s"] / r_small["many"]["open_only_best_s"],
            1.0,
        )
    )
    goals.append(
        (
            f"open+rebind {sizes[-1]} MiB within 1.5x of {sizes[0]} MiB (time ratio, best of 200)",
            r_large["many"]["open_best_s"] / r_small["many"]["open_best_s"],
            -1.5,
        )
    )
    print("\ngoals:")
    out["goals"] = []
    for text, value, bound in goals:
        ok = value <= -bound if bound < 0 else value >= bound
        out["goals"].append({"goal": text, "value": value, "met": ok})
        print(f"  [{'met' if ok else 'MISSED'}] {text}: {value:.3f}")
    print(f"\nload average start {env['loadavg_start']}, end {env['loadavg_end']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
