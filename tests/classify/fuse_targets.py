"""What the FUSE source tests share (test_fuse_sources.py, test_fuse_links.py): a source
file, a directory a `nobody` target can search, real target processes, and a bound on a
call that may never return."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SRC = b"import pickle\n\ndef save(x):\n    return pickle.dumps(x)\n"
NOBODY = 65534


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory the `nobody` target can search: serwatt reads a source only where the
    target itself could (issue 45 item 15), and pytest's own tmp_path is under a 0700
    directory of root's."""
    path = Path(tempfile.mkdtemp(prefix="serwatt-fuse-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sleepers() -> Iterator[Callable[..., int]]:
    """Real processes whose /proc/PID/root is a target's root (same mount namespace),
    running as `uid`."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(uid: int = 0) -> int:
        p = subprocess.Popen(["sleep", "300"], preexec_fn=(lambda: os.setuid(uid)) if uid else None)
        procs.append(p)
        return p.pid

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=30)


def within(fn: Callable[[], Any], bound_s: float) -> tuple[bool, Any]:
    """Run `fn` on a daemon thread: (whether it returned within `bound_s`, what it
    returned). A thread stuck in a FUSE request is left behind; it cannot be ended."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(bound_s)
    return (not t.is_alive(), out[0] if out else None)
