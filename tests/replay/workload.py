"""The replayed target: one thread pickling, then writing JSON, then sleeping, in a loop
(tests/replay/capture.py records real py-spy windows of it)."""

import json
import pickle
import time

DOC = {f"k{i}": [i, str(i), {"x": i * 0.5}] for i in range(3000)}


def pickle_phase(until: float) -> None:
    while time.time() < until:
        pickle.dumps(DOC)


def json_phase(until: float) -> None:
    while time.time() < until:
        json.dumps(DOC)


def main() -> None:
    end = time.time() + 60
    while time.time() < end:
        pickle_phase(time.time() + 0.4)
        json_phase(time.time() + 0.3)
        time.sleep(0.3)


if __name__ == "__main__":
    main()
