"""The parent side of a proof run: build the shim, run a child, read its answer.

    from tests.proofs.harness import build_shim, run_child
    shim = build_shim(tmp_path)                        # cc -O2 -shared -fPIC ...
    r = run_child("tests.proofs.targets:arena_update", "count", n=10_000, shim=shim,
                  workdir=tmp_path)
    r.result["counts"]                                 # {"malloc": 0, ...}

Any `module:factory` works as a target: `factory(workdir, **kwargs)` builds its state and
returns a zero-argument step. Each run is its own child process, so a trap (SIGABRT) or a
seccomp kill (SIGSYS) ends the child, not the caller.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHIM_SOURCE = Path(__file__).with_name("alloc_shim.c")
SIGSYS_REPORT_SOURCE = Path(__file__).with_name("sigsys_report.c")
SIGSYS_MARK = "SERWATT-SIGSYS"


def _compile(source: Path, out: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FileNotFoundError("no C compiler (cc) on PATH; install gcc (Debian: build-essential)")
    subprocess.run(
        [cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(out), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


def build_shim(out_dir: Path) -> Path:
    """Compile the shim with the system C compiler into `out_dir`; returns the .so path."""
    return _compile(SHIM_SOURCE, out_dir / "libserwatt_alloc_shim.so")


def _sigsys_reporter(workdir: Path) -> Path:
    # Built next to the child's files: each proof has its own workdir, so parallel workers
    # never share (or half-write) one .so.
    out = workdir / ".serwatt_sigsys_report.so"
    return out if out.exists() else _compile(SIGSYS_REPORT_SOURCE, out)


@dataclass
class ChildRun:
    returncode: int
    stdout: str
    stderr: str
    result: dict[str, Any] | None  # the child's JSON line (count / trap / tracemalloc modes)

    @property
    def signal(self) -> str | None:
        return signal.Signals(-self.returncode).name if self.returncode < 0 else None

    @property
    def trapped_call(self) -> str | None:
        """Which filtered call killed a seccomp child, and from where: the SIGSYS handler's
        report (system call number, first two arguments, thread, backtrace), or None."""
        start = self.stderr.find(SIGSYS_MARK)
        if start < 0:
            return None
        end = self.stderr.find(f"{SIGSYS_MARK} end", start)
        return self.stderr[start : end if end >= 0 else None]

    @property
    def survived(self) -> bool:
        return self.returncode == 0 and self.stdout.startswith("SURVIVED")


def run_child(
    target: str,
    mode: str,
    *,
    workdir: Path,
    n: int = 10_000,
    warmup: int = 200,
    shim: Path | None = None,
    kwargs: dict[str, Any] | None = None,
    python_malloc: str | None = None,
    timeout: float = 120,
) -> ChildRun:
    """Run `target`'s step `n` times in a fresh child under `mode` (see tests/proofs/child.py).

    `shim` is preloaded for "count" and "trap" (trap sets SERWATT_ALLOC_TRAP=1).
    `python_malloc` sets PYTHONMALLOC (e.g. "malloc": every Python object allocation then
    goes through malloc, so the shim counts and names them).
    """
    spec = {"target": target, "mode": mode, "n": n, "warmup": warmup, "workdir": str(workdir)}
    spec["kwargs"] = kwargs or {}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("SERWATT_ALLOC_TRAP", None)
    env.pop("PYTHONMALLOC", None)
    if mode in ("count", "trap"):
        if shim is None:
            raise ValueError(f"mode {mode!r} needs the shim (build_shim)")
        env["LD_PRELOAD"] = str(shim)
        if mode == "trap":
            env["SERWATT_ALLOC_TRAP"] = "1"
    if python_malloc:
        env["PYTHONMALLOC"] = python_malloc
    if mode.startswith("seccomp"):
        # Memory freed in the loop must stay in the process, or reusing it is a new mmap/brk
        # the filter kills, and when that happens depends on how threads interleave on a
        # loaded machine, not on the code: pymalloc unmaps an arena once it empties (so
        # objects go through malloc here), glibc trims the heap top after large frees and
        # gives a thread that finds its arena locked a new mmap'd arena. With these off,
        # what the filter still kills is real growth: more memory than warm-up used.
        if not python_malloc:
            env["PYTHONMALLOC"] = "malloc"
        env["MALLOC_ARENA_MAX"] = "1"
        env["MALLOC_TRIM_THRESHOLD_"] = str(1 << 40)
        # Each brk in warm-up takes 1 MiB beyond its need: a few hundred bytes the loop keeps
        # per step (numpy's small-block cache, bounded by the tracemalloc proof) or a
        # heap-top chunk fragmented by them then fit in the warm-up's heap instead of
        # growing it on step 129 of 200 (numpy 2.4, a fresh venv). Growth past 1 MiB is
        # still killed.
        env["MALLOC_TOP_PAD_"] = str(1 << 20)
        env["SERWATT_SIGSYS_REPORT"] = str(_sigsys_reporter(workdir))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.proofs.child", json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )
    result = None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines and lines[-1].startswith("{"):
        result = json.loads(lines[-1])
    return ChildRun(proc.returncode, proc.stdout, proc.stderr, result)
