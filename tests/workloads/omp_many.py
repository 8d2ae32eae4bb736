"""A torch job with OpenMP worker threads alive and `.many` saves between its steps.

    python omp_many.py DIR TRUTH_JSON SECONDS GO_FILE

It prints "ready", waits for GO_FILE (the profiler is attached), runs SECONDS, writes
the truth and then idles, threads alive, until it is killed.

torch.set_num_threads(2) makes every matmul run on OpenMP's worker threads as well as
the main thread; between steps the main thread saves the model's state with
`profiler.many.save`, which hashes on a short-lived thread of its own. Truth per save:
the process's CPU over the save (time.process_time), and the part of it that the
OpenMP workers used (their /proc task CPU), so the save's own CPU is the difference.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def _task_cpu_s(tids: list[int]) -> float:
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except OSError:
            pass  # a worker that exited used nothing more
    return total / 1e9


def main() -> None:
    out_dir, truth_path, seconds, go = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    import torch

    from serwatt.profiler import many

    torch.set_num_threads(2)
    torch.manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(16)}  # 64 MiB
    x = torch.randn(32, 1024)
    before = {int(t) for t in os.listdir("/proc/self/task")}
    _ = x @ state["layer0.weight"]  # starts OpenMP's worker threads
    workers = sorted({int(t) for t in os.listdir("/proc/self/task")} - before)
    main_tid = threading.get_native_id()
    workers = [t for t in workers if t != main_tid]
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.05)
    saves: list[dict[str, float]] = []
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        for w in list(state.values())[:8]:
            x = torch.tanh(x @ w) * 0.5
        step += 1
        if step % 3 == 0:
            t0, omp0 = time.time(), _task_cpu_s(workers)
            cpu0, main0 = time.process_time(), time.thread_time()
            many.save(os.path.join(out_dir, f"ckpt-{step}.many"), state)
            main1, cpu1 = time.thread_time(), time.process_time()
            omp1, t1 = _task_cpu_s(workers), time.time()
            saves.append(
                {
                    "start": t0,
                    "end": t1,
                    "process_cpu_s": cpu1 - cpu0,
                    "omp_cpu_s": omp1 - omp0,
                    "main_cpu_s": main1 - main0,
                }
            )
    with open(truth_path, "w") as fh:
        json.dump({"saves": saves, "omp_workers": workers, "steps": step}, fh)
    print("done", flush=True)
    time.sleep(600)  # idle, threads alive: the profile ends while they are


if __name__ == "__main__":
    main()
