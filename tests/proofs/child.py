"""The child side of a proof run: `python -m tests.proofs.child SPEC` (SPEC: JSON).

SPEC = {"target": "module:factory", "kwargs": {...}, "mode": MODE, "n": N, "warmup": W,
"workdir": DIR}. The factory builds its state and returns a zero-argument `step`; the child
calls it W times (warm-up: caches, free lists and pools fill), then N times under MODE:

- "count": between the shim's serwatt_alloc_begin/end (LD_PRELOAD); prints the counts.
- "trap": the same with SERWATT_ALLOC_TRAP=1 set by the parent: the first allocation aborts.
- "tracemalloc": tracemalloc net (still allocated after the loop; again after a full
  collection, which empties CPython's free lists) and peak over the loop.
- "seccomp": the kill filter installed after the warm-up; prints SURVIVED and _exits.
- "seccomp-control": the filter, then one anonymous mmap: the process must die of SIGSYS.

The loop is `for _ in itertools.repeat(None, n): step()`: no per-iteration int objects, so
the loop itself allocates nothing (the "empty" target measures exactly that).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import itertools
import json
import os
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _loop(step: Callable[[], object], n: int) -> None:
    for _ in itertools.repeat(None, n):
        step()


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _symbol(libc: Any, addr: int) -> str:
    info = _DlInfo()
    if not addr or not libc.dladdr(ctypes.c_void_p(addr), ctypes.byref(info)):
        return hex(addr)
    lib = os.path.basename((info.dli_fname or b"?").decode(errors="replace"))
    name = (info.dli_sname or b"").decode(errors="replace")
    return f"{lib}:{name}" if name else f"{lib}+{hex(addr - (info.dli_fbase or 0))}"


def _shim_counts(lib: Any) -> dict[str, Any]:
    kinds = ctypes.c_int.in_dll(lib, "serwatt_alloc_kinds").value
    events_max = ctypes.c_int.in_dll(lib, "serwatt_alloc_events_max").value
    depth_max = ctypes.c_int.in_dll(lib, "serwatt_alloc_depth_max").value
    lib.serwatt_alloc_kind_name.restype = ctypes.c_char_p
    names = [lib.serwatt_alloc_kind_name(k).decode() for k in range(kinds)]
    counts = (ctypes.c_uint64 * kinds).in_dll(lib, "serwatt_alloc_counts")
    nbytes = (ctypes.c_uint64 * kinds).in_dll(lib, "serwatt_alloc_bytes")
    counts_bt = (ctypes.c_uint64 * kinds).in_dll(lib, "serwatt_alloc_counts_begin_thread")
    nbytes_bt = (ctypes.c_uint64 * kinds).in_dll(lib, "serwatt_alloc_bytes_begin_thread")
    ev_bt = (ctypes.c_uint64 * events_max).in_dll(lib, "serwatt_alloc_event_begin_thread")
    n_events = ctypes.c_uint64.in_dll(lib, "serwatt_alloc_event_count").value
    ev_kind = (ctypes.c_uint64 * events_max).in_dll(lib, "serwatt_alloc_event_kind")
    ev_size = (ctypes.c_uint64 * events_max).in_dll(lib, "serwatt_alloc_event_size")
    ev_depth = (ctypes.c_uint64 * events_max).in_dll(lib, "serwatt_alloc_event_depth")
    frames = ((ctypes.c_void_p * depth_max) * events_max).in_dll(lib, "serwatt_alloc_event_frames")
    libc = ctypes.CDLL(None)
    events = []
    for i in range(min(n_events, events_max)):
        stack = [_symbol(libc, frames[i][j] or 0) for j in range(ev_depth[i])]
        stack = [s for s in stack if "alloc_shim" not in s]
        events.append(
            {
                "kind": names[ev_kind[i]],
                "size": ev_size[i],
                "stack": stack,
                "caller_thread": bool(ev_bt[i]),
            }
        )
    return {
        "counts": {names[k]: counts[k] for k in range(kinds)},
        "bytes": {names[k]: nbytes[k] for k in range(kinds)},
        # the thread that ran the loop alone (the rest came from threads it started)
        "caller_counts": {names[k]: counts_bt[k] for k in range(kinds)},
        "caller_bytes": {names[k]: nbytes_bt[k] for k in range(kinds)},
        "max_size": ctypes.c_uint64.in_dll(lib, "serwatt_alloc_max_size").value,
        "events": events,
    }


def main(spec: dict[str, Any]) -> int:
    module, _, func = spec["target"].partition(":")
    reporter = os.environ.get("SERWATT_SIGSYS_REPORT")
    if reporter and spec["mode"].startswith("seccomp"):
        # Loaded before the warm-up: dlopen maps memory and allocates, which must not move
        # the heap the loop then runs in.
        if ctypes.CDLL(reporter).serwatt_sigsys_install() != 0:
            raise OSError("sigaction(SIGSYS) failed")
    factory = getattr(importlib.import_module(module), func)
    step = factory(Path(spec["workdir"]), **spec.get("kwargs", {}))
    n, mode = int(spec["n"]), spec["mode"]
    _loop(step, int(spec["warmup"]))
    gc.collect()
    if mode in ("count", "trap"):
        lib = ctypes.CDLL(None)
        begin, end = lib.serwatt_alloc_begin, lib.serwatt_alloc_end
        begin.restype = end.restype = None
        begin()
        _loop(step, n)
        end()
        out = _shim_counts(lib)
    elif mode == "tracemalloc":
        tracemalloc.start(8)
        before = tracemalloc.take_snapshot()
        tracemalloc.reset_peak()
        start_current = tracemalloc.get_traced_memory()[0]
        _loop(step, n)
        current, peak = tracemalloc.get_traced_memory()
        # A full collection also empties CPython's free lists (tuples, floats, ...): what is
        # still traced after it was retained by the loop, not parked for reuse.
        gc.collect()
        current_after_gc = tracemalloc.get_traced_memory()[0]
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        top = [
            {"where": str(s.traceback[0]), "size_diff": s.size_diff, "count_diff": s.count_diff}
            for s in after.compare_to(before, "lineno")[:8]
            if s.size_diff
        ]
        out = {
            "net": current - start_current,
            "net_after_gc": current_after_gc - start_current,
            "peak": peak - start_current,
            "top": top,
        }
    elif mode in ("seccomp", "seccomp-control"):
        from tests.proofs.seccomp import install_kill_filter

        message = f"SURVIVED {n}\n".encode()
        install_kill_filter(trap=bool(reporter))
        if mode == "seccomp-control":
            import mmap

            mmap.mmap(-1, 1 << 20)  # must not return
            os.write(1, b"NOT KILLED\n")
            os._exit(3)
        _loop(step, n)
        # No interpreter shutdown: finalization unmaps memory, which the filter kills.
        os.write(1, message)
        os._exit(0)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    out.update(mode=mode, n=n, target=spec["target"])
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
