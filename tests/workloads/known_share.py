"""A known serializer share of CPU, measured from inside: test_profile_cli's target.

    python tests/workloads/known_share.py TRUTH.json pickle SPIN_S SER_S EXIT_CODE
    python tests/workloads/known_share.py TRUTH.json pool SPIN_S SER_S EXIT_CODE

Each working process stamps its CPU (time.process_time) and the host clock (time.time,
the clock serwatt's windows are stamped in) at its first line, then sleeps ATTACH_S so
that serwatt attaches while it is idle, then stamps `work_at` and works: SPIN_S CPU-s
of pure-Python arithmetic (no serializer: serwatt's `other`), then SER_S CPU-s of one
serializer, each call timed with time.thread_time (single-threaded: the process's CPU).
Everything after `work_at` is measured; the CPU before it (`before_work_cpu_s`:
interpreter start-up, or a forked child's first instructions, and the sleep) may or
may not fall in serwatt's first window, so the test bounds the truth by both cases.

`pickle`: the process itself pickles. `pool`: it forks two Python children that each
spin and then json.dumps (fork, not spawn: a forked child runs ~1.5 ms of CPU before its
first stamp where a spawned interpreter runs ~40 ms, the unknown the truth must bound).
The children are joined before the parent's last stamp. The parent writes TRUTH.json
(one record per process: pid, first_at, work_at, before_work_cpu_s, serializer_cpu_s,
end_cpu_s), sleeps END_S so serwatt's last CPU poll falls after the work, and exits
with EXIT_CODE. A child writes its record as plain text (no serializer) to a file the
parent reads.
"""

from __future__ import annotations

import time

FIRST_AT = time.time()  # before any import that costs CPU
FIRST_CPU = time.process_time()

import json  # noqa: E402 - after the first stamp on purpose
import os  # noqa: E402
import pickle  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ATTACH_S = 2.0  # serwatt's first window starts in this sleep (the test checks it did)
END_S = 0.5  # longer than serwatt's CPU poll (0.1 s)
FIELDS = ("pid", "first_at", "work_at", "before_work_cpu_s", "serializer_cpu_s", "end_cpu_s")


def spin(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    total = 0
    while time.thread_time() < end:
        for i in range(20_000):
            total += i * i


def serialize(kind: str, cpu_s: float) -> float:
    """Call pickle.dumps or json.dumps until cpu_s CPU-s have passed; the CPU-s inside
    the calls. Each is called by its own name: serwatt classifies a call site by what it
    names (a dumps passed in as a variable is not named pickle's)."""
    data = {str(i): [i, "x" * 10] for i in range(5000)}
    inside = 0.0
    end = time.thread_time() + cpu_s
    while (t0 := time.thread_time()) < end:
        if kind == "pickle":
            pickle.dumps(data)
        else:
            json.dumps(data)
        inside += time.thread_time() - t0
    return inside


def work(first_at: float, kind: str, spin_s: float, ser_s: float) -> dict:
    time.sleep(ATTACH_S)
    work_at = time.time()
    before = time.process_time()
    spin(spin_s)
    inside = serialize(kind, ser_s)
    return {
        "pid": os.getpid(),
        "first_at": first_at,
        "work_at": work_at,
        "before_work_cpu_s": before,
        "serializer_cpu_s": inside,
        "end_cpu_s": time.process_time(),
    }


def child(out: str, spin_s: float, ser_s: float) -> None:
    first_at = time.time()
    rec = work(first_at, "json", spin_s, ser_s)
    Path(out).write_text(" ".join(repr(rec[k]) for k in FIELDS))


def main() -> None:
    truth, mode = Path(sys.argv[1]), sys.argv[2]
    spin_s, ser_s, code = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    if mode == "pickle":
        records = [work(FIRST_AT, "pickle", spin_s, ser_s)]
    else:
        time.sleep(ATTACH_S)
        work_at, before = time.time(), time.process_time()
        import multiprocessing as mp  # after the stamp: its CPU is measured and seen

        ctx = mp.get_context("fork")
        outs = [f"{truth}.child{k}" for k in range(2)]
        procs = [ctx.Process(target=child, args=(o, spin_s, ser_s)) for o in outs]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        records = []
        for o in outs:
            values = Path(o).read_text().split()
            records.append(
                {k: (int if k == "pid" else float)(v) for k, v in zip(FIELDS, values, strict=True)}
            )
        records.append({
            "pid": os.getpid(), "first_at": FIRST_AT, "work_at": work_at,
            "before_work_cpu_s": before, "serializer_cpu_s": 0.0,
            "end_cpu_s": time.process_time(),
        })  # fmt: skip
    truth.write_text(json.dumps({"first_cpu_s": FIRST_CPU, "processes": records}))
    time.sleep(END_S)
    sys.exit(code)


if __name__ == "__main__":
    main()
