"""`serwatt daemon` as a child process with NVML replayed (tests/nvml_replay.py): the real
daemon, config and exporter, with only the GPU driver this machine lacks replaced at its
interface, so a multi-process test (tests/report/test_fleet.py) has GPU series to query.

    python -m tests.replayed_daemon --config FILE --timeline NAME --gpu-pid PID
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serwatt.profiler.cli.daemon import serve
from tests.nvml_replay import ReplayNvmlBackend, load_timeline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.replayed_daemon")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--timeline", required=True, help="a tests/fixtures/nvml timeline")
    parser.add_argument(
        "--gpu-pid", type=int, action="append", default=[], help="a pid the GPU lists"
    )
    args = parser.parse_args(argv)
    backend = ReplayNvmlBackend(load_timeline(args.timeline), target_pids=args.gpu_pid)
    # as `serwatt daemon` runs it (its logging, so its landing line with the bound port)
    return serve(args.config, nvml_backend=backend)


if __name__ == "__main__":
    sys.exit(main())
