"""A thread that serializes for ~2 ms and sleeps 18 ms, pinned to one CPU: the
alternating loop (tests/workloads/alternating.py) timing itself.

    python tests/workloads/wakeups.py TRUTH_FILE

Pinned to the last CPU it may use, beside a busy process pinned there too (the test
starts one), every wakeup from the sleep waits in the run queue at the sleep line. It
runs as SCHED_BATCH so that it does: under EEVDF (Linux 6.6 and later) a woken
SCHED_NORMAL thread preempts the busy one at once and never waits at the sleep line
(measured on 6.18: no on-CPU sample there; its waits sat at the thread_time() line
instead, where the syscall ends its slice), while a batch thread's wakeup preempts
nothing (check_preempt_wakeup_fair), so it waits until the busy one's slice ends.
Ground truth: time.thread_time() around the pickle and json calls; on SIGUSR1 the
process appends {"serialization": s, "total": process_time} to TRUTH_FILE.
"""

import json
import os
import pickle
import signal
import sys
import time

truth_path = sys.argv[1]
os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
data = {f"k{i}": list(range(30)) for i in range(60)}
acc = {"serialization": 0.0}


def snapshot(signum: int, frame: object) -> None:
    row = {"serialization": acc["serialization"], "total": time.process_time()}
    with open(truth_path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


signal.signal(signal.SIGUSR1, snapshot)
print("ready", flush=True)
while True:
    t0 = time.thread_time()
    for _ in range(4):
        pickle.loads(pickle.dumps(data))
        json.loads(json.dumps(data))
    acc["serialization"] += time.thread_time() - t0
    time.sleep(0.018)
