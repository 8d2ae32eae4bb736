"""Starting and ending a test FUSE server that runs as its own process (tests/fuse_stall.py,
tests/fuse_latency.py): run as a process so a reader stuck in the kernel on its mount is
released when the server is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def start(script: Path, args: list[str], mountpoint: Path) -> subprocess.Popen[bytes]:
    """`python script *args`, once `mountpoint` is mounted; the server's stderr in the
    error when it exits or has not mounted within 20 s."""
    proc = subprocess.Popen(
        [sys.executable, str(script), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 20
    while not os.path.ismount(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc, mountpoint)
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"the FUSE server did not mount {mountpoint}: {err}")
        time.sleep(0.05)
    return proc


def stop(proc: subprocess.Popen[bytes], mountpoint: Path) -> None:
    # Killing the server aborts the connection: every request blocked on it fails with
    # ENOTCONN, so no test thread stays stuck in the kernel.
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    subprocess.run(
        ["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True, timeout=10, check=False
    )
