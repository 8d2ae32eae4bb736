"""Known blocking serializations, timed from inside: the episode test's target.

    python tests/workloads/blocking_dumps.py DIR PLAN.json RESULT.json

PLAN.json: {"pause_s": 0.3, "sync_mb": 64,
            "checkpoints": [{"seconds": 0.5, "durable": false}, ...]}

Builds a state whose pickling takes about the longest planned time (calibrated on this
machine), prints `ready`, and waits for `go` on stdin. Then, per checkpoint: pause_s of
non-serialization work and sleep, then one `pickle.dump` of a slice of the state sized
for `seconds` into a file in DIR. A durable checkpoint also carries `sync_mb` MiB of
random bytes (so its fsync has data to flush: on a fast disk an fsync of a small file is
shorter than a sampling tick) and is followed by fsync, os.replace into place and an
fsync of DIR. Every step is timed with perf_counter, and its CPU with thread_time (the
main thread's CPU clock, user and system time: what serwatt reads per thread). After the
last one it pauses, prints `done`, waits for a line on stdin (the profiler has stopped
sampling, so writing the result, itself a json.dump, is not sampled), writes RESULT.json
and exits:

    {"checkpoints": [{"dump_s": ..., "sync_s": ..., "total_s": ..., "dump_cpu_s": ...,
                      "total_cpu_s": ..., "durable": ...}]}

dump_s is the pickle.dump call alone; sync_s the durability tail (0 when not durable);
total_s the checkpoint from the start of pickle.dump to the end of the tail;
dump_cpu_s and total_cpu_s the thread's CPU over dump_s and total_s.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path

CALIBRATION_ITEMS = 100_000


def build_state(items: int) -> list[tuple[int, float, str]]:
    # distinct small objects: pickling them is CPU-bound (memo, opcodes), not a memcpy
    return [(i, i * 0.5, f"k{i}") for i in range(items)]


def seconds_per_item(state: list[tuple[int, float, str]], scratch: Path) -> float:
    part = state[:CALIBRATION_ITEMS]
    best = float("inf")
    for _ in range(3):
        with open(scratch, "wb") as f:
            t0 = time.perf_counter()
            pickle.dump(part, f, protocol=pickle.HIGHEST_PROTOCOL)
            best = min(best, time.perf_counter() - t0)
    scratch.unlink()
    return best / CALIBRATION_ITEMS


def other_work(pause_s: float) -> None:
    deadline = time.perf_counter() + pause_s
    total = 0
    for i in range(20_000):  # a little CPU that is no serializer
        total += i * i
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(left, 0.05))


def checkpoint(
    state: list[tuple[int, float, str]], blob: bytes | None, out: Path
) -> dict[str, float | bool]:
    tmp = out.with_suffix(".tmp")
    payload = {"state": state, "blob": blob}
    c0, t0 = time.thread_time(), time.perf_counter()
    with open(tmp, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
        t1, c1 = time.perf_counter(), time.thread_time()
        if blob is not None:
            f.flush()
            os.fsync(f.fileno())
    if blob is not None:
        os.replace(tmp, out)
        dir_fd = os.open(out.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    t2, c2 = time.perf_counter(), time.thread_time()
    return {
        "dump_s": t1 - t0,
        "sync_s": t2 - t1 if blob is not None else 0.0,
        "total_s": t2 - t0,
        "dump_cpu_s": c1 - c0,
        "total_cpu_s": c2 - c0,
        "durable": blob is not None,
    }


def main() -> None:
    out_dir, plan_path, result_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    plan = json.loads(plan_path.read_text())
    pause_s = float(plan["pause_s"])
    longest = max(float(c["seconds"]) for c in plan["checkpoints"])
    state = build_state(CALIBRATION_ITEMS)
    per_item = seconds_per_item(state, out_dir / "calibration.bin")
    state = build_state(max(CALIBRATION_ITEMS, int(longest / per_item)))
    parts = [state[: max(1, int(float(c["seconds"]) / per_item))] for c in plan["checkpoints"]]
    blob = os.urandom(int(plan["sync_mb"]) << 20)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    results = []
    for k, (spec, part) in enumerate(zip(plan["checkpoints"], parts, strict=True)):
        other_work(pause_s)
        durable = bool(spec["durable"])
        results.append(checkpoint(part, blob if durable else None, out_dir / f"ckpt{k}.pkl"))
    other_work(pause_s)
    print("done", flush=True)
    sys.stdin.readline()
    with open(result_path, "w") as f:
        json.dump({"checkpoints": results}, f)


if __name__ == "__main__":
    main()
