"""A host thread that serializes for ~2 ms, then sleeps 18 ms, forever: the shape of a
training loop's serialization between GPU steps, and of the daemon bench's targets.

    python tests/workloads/alternating.py [MARKER]   # MARKER: ignored, for cmdline matching

~90% of its wall-time samples sit on the sleep line while nearly all of its CPU is in
pickle and json (tests/service/test_daemon_attribution.py, bench/sampler_choice.py).
"""

import json
import pickle
import time


def main() -> None:
    data = {f"k{i}": list(range(30)) for i in range(60)}
    while True:
        for _ in range(4):
            pickle.loads(pickle.dumps(data))
            json.loads(json.dumps(data))
        time.sleep(0.018)


if __name__ == "__main__":
    main()
