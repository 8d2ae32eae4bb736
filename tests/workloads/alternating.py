"""A host thread that serializes for ~2 ms, then sleeps 18 ms, forever: the shape of a
training loop's serialization between GPU steps, and of the daemon bench's targets.

    python tests/workloads/alternating.py [MARKER [PROGRESS_FILE]]

MARKER is ignored (it is there for cmdline matching). With PROGRESS_FILE the loop times
itself and publishes, every 0.25 s, whole (written aside, then renamed): chunks done,
wall and thread-CPU seconds inside chunks, and of that CPU the seconds in pickle and in
json (each call inside time.thread_time), the in-process truth bench/daemon.py holds the
daemon to.

~90% of its wall-time samples sit on the sleep line while nearly all of its CPU is in
pickle and json (tests/service/test_daemon_attribution.py, bench/sampler_choice.py).
"""

import json
import os
import pickle
import sys
import time
from pathlib import Path

Progress = tuple[int, float, float, float, float]


def read_progress(path: Path) -> Progress | None:
    """What the loop last published to PROGRESS_FILE: (chunks, wall s inside chunks, thread
    CPU s inside chunks, of which in pickle, in json); None before its first publish."""
    try:
        chunks, busy, cpu, in_pickle, in_json = path.read_text().split()
        return int(chunks), float(busy), float(cpu), float(in_pickle), float(in_json)
    except (OSError, ValueError):
        return None


def main() -> None:
    out = sys.argv[2] if len(sys.argv) > 2 else None
    data = {f"k{i}": list(range(30)) for i in range(60)}
    chunks, busy_s, cpu_s, last_pub = 0, 0.0, 0.0, time.monotonic()
    pickle_s = json_s = 0.0
    while True:
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(4):
            a = time.thread_time()
            pickle.loads(pickle.dumps(data))
            b = time.thread_time()
            json.loads(json.dumps(data))
            pickle_s += b - a
            json_s += time.thread_time() - b
        busy_s += time.perf_counter() - t0
        cpu_s += time.thread_time() - c0
        chunks += 1
        if out is not None and time.monotonic() - last_pub > 0.25:
            with open(out + ".tmp", "w") as f:
                f.write(f"{chunks} {busy_s!r} {cpu_s!r} {pickle_s!r} {json_s!r}")
            os.replace(out + ".tmp", out)
            last_pub = time.monotonic()
        time.sleep(0.018)


if __name__ == "__main__":
    main()
