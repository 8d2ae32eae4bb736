"""What `many.load(verify=True)` costs when it verifies into a private copy (a file another
user can write) against verifying in place (a file only we can write), and why a private
(copy-on-write) mapping of the file would not do instead.

    python bench/many_verified_copy.py [SIZE_MIB] [REPEATS]

Prints one JSON line: seconds per load (each side alternated, the file in the page cache),
the copy's shared memory, and whether a MAP_PRIVATE mapping showed a later write to the file.
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from serwatt.profiler.many import load, save


def private_mapping_sees_later_writes(directory: str) -> bool:
    path = os.path.join(directory, "cow.bin")
    with open(path, "wb") as f:
        f.write(bytes(mmap.PAGESIZE * 2))
    fd = os.open(path, os.O_RDWR)
    try:
        cow = mmap.mmap(fd, mmap.PAGESIZE * 2, access=mmap.ACCESS_COPY)
        first = cow[0]  # read (mapped, not copied)
        os.pwrite(fd, b"\x07", 0)  # the owner writes the file afterwards
        seen = cow[0] != first
        cow.close()
        return seen
    finally:
        os.close(fd)


def main() -> None:
    size_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory(prefix="many-verified-") as d:
        path = os.path.join(d, "ckpt.many")
        rng = np.random.default_rng(0)
        save(path, {"w": rng.integers(0, 255, size_mib << 20, dtype=np.uint8)})
        with load(path, verify=True) as ckpt:  # page cache warm
            pass
        times: dict[str, list[float]] = {"in_place": [], "copy": []}
        shmem = 0
        for _ in range(repeats):
            for side, mode in (("in_place", 0o644), ("copy", 0o666)):
                os.chmod(path, mode)
                t = time.perf_counter()
                ckpt = load(path, verify=True)
                times[side].append(time.perf_counter() - t)
                if side == "copy":  # the memfd's pages (ckpt._fd is the copy here)
                    shmem = max(shmem, os.fstat(ckpt._fd).st_blocks * 512)
                ckpt.close()
        print(
            json.dumps(
                {
                    "size_mib": size_mib,
                    "repeats": repeats,
                    "in_place_s": [round(x, 3) for x in times["in_place"]],
                    "copy_s": [round(x, 3) for x in times["copy"]],
                    "median_in_place_s": round(statistics.median(times["in_place"]), 3),
                    "median_copy_s": round(statistics.median(times["copy"]), 3),
                    "copy_shmem_mib": round(shmem / (1 << 20), 1),
                    "map_private_sees_later_writes": private_mapping_sees_later_writes(d),
                }
            )
        )


if __name__ == "__main__":
    main()
