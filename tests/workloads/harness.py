"""Run a workload under a real interpreter and read its stacks with real py-spy.

Used by the real-process tests and by `capture.py`, which records the fixtures under
tests/fixtures/pyspy/. Conversions here turn py-spy's own JSON (`dump --json`) and
speedscope documents into collectors.samples.Sample, leaf first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from serwatt.collectors.samples import Frame, Sample

WORKLOAD = Path(__file__).with_name("serializers.py")
REPO = Path(__file__).resolve().parents[2]


def pyspy_binary() -> str:
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    found = shutil.which("py-spy")
    if not found:
        raise RuntimeError("py-spy not found next to the test interpreter or on PATH")
    return found


@contextmanager
def running(python: str | Path, kind: str, *, max_s: float = 120.0) -> Iterator[int]:
    """Start `serializers.py KIND` under `python`, yield its pid once it is ready."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(
        [str(python), str(WORKLOAD), kind, str(max_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until ready (torch import: seconds)
        if not line.startswith("ready"):
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"workload {kind} under {python} did not start: {line!r} {err}")
        time.sleep(0.2)  # let the loop start
        yield proc.pid
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def dump(pid: int, *, native: bool = False, attempts: int = 8) -> list[dict[str, Any]]:
    """One `py-spy dump --json` of every thread (nonblocking unless native).

    A nonblocking read races the running target and sometimes fails ("Failed to copy
    PyCodeObject"); that is py-spy's documented cost of not pausing, so retry.
    """
    cmd = [pyspy_binary(), "dump", "--json", "--pid", str(pid)]
    cmd.append("--native" if native else "--nonblocking")
    err = ""
    for _ in range(attempts):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            doc: list[dict[str, Any]] = json.loads(proc.stdout)
            return doc
        err = proc.stderr.strip()[:400]
        time.sleep(0.05)
    raise RuntimeError(f"{' '.join(cmd)} failed {attempts} times: {err}")


def record_speedscope(pid: int, *, duration_s: float, rate_hz: int, out: Path) -> dict[str, Any]:
    cmd = [
        pyspy_binary(),
        "record",
        "--nonblocking",
        "--idle",
        "--threads",
        "--full-filenames",
        "--format",
        "speedscope",
        "-r",
        str(rate_hz),
        "-d",
        str(duration_s),
        "-p",
        str(pid),
        "-o",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def frame_from_dump(f: dict[str, Any]) -> Frame:
    return Frame(f["name"], f["filename"], int(f.get("line") or 0), f.get("module"))


def samples_from_dump(doc: list[dict[str, Any]], t: float = 0.0) -> list[Sample]:
    return [
        Sample(
            pid=th["pid"],
            tid=th.get("os_thread_id"),
            thread_id=th["thread_id"],
            thread_name=th.get("thread_name"),
            t=t,
            frames=tuple(frame_from_dump(f) for f in th["frames"]),
            active=th.get("active"),
        )
        for th in doc
    ]


def samples_from_speedscope(doc: dict[str, Any], pid: int = 0) -> list[Sample]:
    """Every sample of every thread; speedscope stacks are root first, Sample is leaf first."""
    frames = [
        Frame(f["name"], f.get("file") or "", int(f.get("line") or 0))
        for f in doc["shared"]["frames"]
    ]
    out = []
    for profile in doc["profiles"]:
        for k, stack in enumerate(profile["samples"]):
            chain = [frames[i] for i in stack]
            # --threads prepends a pseudo-frame "thread (<tid>): <name>" at the root.
            chain = [f for f in chain if not (f.name.startswith("thread (") and not f.filename)]
            out.append(
                Sample(
                    pid=pid,
                    tid=None,
                    thread_id=0,
                    thread_name=profile.get("name"),
                    t=float(k),
                    frames=tuple(reversed(chain)),
                )
            )
    return out
