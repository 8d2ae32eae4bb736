"""A training-like loop whose main thread waits for a CPU in compute, not in its checkpoint.

    python tests/workloads/contended.py TRUTH_FILE [COMPUTE_S] [SAVE_S] [WORKERS]

The whole process is pinned to one CPU and, where allowed (root), given nice -20 before its
threads start (they inherit both): among its own threads the CPU is shared evenly, and
other processes that land on that CPU get about 1% of it each, so the target's share of
the CPU is fixed by the workload, not by the machine's load. Compute: for COMPUTE_S of its
own CPU time the main thread runs Python arithmetic while WORKERS threads hash a buffer in C
with the GIL released (hashlib drops the GIL for large inputs), so they share that CPU and the
main thread is runnable but waiting for it most of the time (3 workers: 3/4).
Checkpoint: the workers sleep and the main thread pickles (pickle.dumps) for about
SAVE_S of CPU, alone on the CPU.

Ground truth: the main thread times every pickle.dumps with time.thread_time(); on
SIGUSR1 the process appends {"pickle": s, "total": process_time} to TRUTH_FILE, so two
signals bracket an interval.
"""

import hashlib
import json
import os
import pickle
import signal
import sys
import threading
import time

truth_path = sys.argv[1]
COMPUTE_S = float(sys.argv[2]) if len(sys.argv) > 2 else 0.6
SAVE_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.6
WORKERS = int(sys.argv[4]) if len(sys.argv) > 4 else 3

cpu = max(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})  # threads started later inherit it
try:
    os.setpriority(os.PRIO_PROCESS, 0, -20)  # so do they the nice value
except PermissionError:
    pass  # not root: the share then also depends on what else runs on that CPU
payload = {f"k{i}": {"id": i, "v": [i * 0.5, i * 1.5], "tag": "t" * 10} for i in range(5000)}
acc = {"pickle": 0.0}
compute = threading.Event()


def worker() -> None:
    buf = b"x" * (1 << 20)
    while True:
        compute.wait()
        hashlib.sha256(buf).digest()


def snapshot(signum: int, frame: object) -> None:
    with open(truth_path, "a") as fh:
        fh.write(json.dumps({"pickle": acc["pickle"], "total": time.process_time()}) + "\n")


signal.signal(signal.SIGUSR1, snapshot)
for k in range(WORKERS):
    threading.Thread(target=worker, name=f"hasher{k}", daemon=True).start()
# how many dumps take SAVE_S of CPU alone on the CPU
t0 = time.thread_time()
n = 0
while time.thread_time() - t0 < 0.2:
    pickle.dumps(payload)
    n += 1
dumps_per_save = max(1, round(n * SAVE_S / 0.2))
print("ready", flush=True)
while True:
    compute.set()
    end = time.thread_time() + COMPUTE_S
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x += i % 7
    compute.clear()
    for _ in range(dumps_per_save):
        t0 = time.thread_time()
        blob = pickle.dumps(payload)
        acc["pickle"] += time.thread_time() - t0
