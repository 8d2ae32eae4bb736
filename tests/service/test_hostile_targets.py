"""Issue 45: a file a job controls cannot stop, starve or blind the daemon for the other
targets. Each hostile file is put beside an honest target whose process must still be
found, within a bound that the hostile file's stall would have broken."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from profiler.service.discovery import discover
from tests.fuse_stall import fuse_available, stalling_fuse
from tests.service.test_discovery import SLEEPER, spec

needs_fuse = pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))

# Discovery of a handful of processes takes milliseconds; a stalled pid file would take
# forever. Past this, the scan waited on the job's file.
SCAN_BOUND_S = 5.0


@pytest.fixture
def honest(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    marker = f"honest-{os.getpid()}-{tmp_path.name}"
    p = subprocess.Popen([sys.executable, "-c", SLEEPER, marker])
    p.marker = marker  # type: ignore[attr-defined]
    yield p
    p.kill()
    p.wait(timeout=30)


def _within(fn: Callable[[], Any], bound_s: float) -> tuple[bool, Any]:
    """(whether fn returned within bound_s, what it returned or raised)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(bound_s)
    return (not t.is_alive(), out[0] if out else None)


def _targets(honest: subprocess.Popen[bytes], pid_file: Path) -> list[Any]:
    return [
        spec("hostile", pid_file=pid_file),
        spec("honest", cmdline=honest.marker),  # type: ignore[attr-defined]
    ]


def _honest_found(result: Any, honest: subprocess.Popen[bytes]) -> None:
    assert not isinstance(result, BaseException), f"discovery raised {result!r}"
    assert {(d.target, d.pid) for d in result} == {("honest", honest.pid)}


def test_a_fifo_pid_file_does_not_hang_discovery(tmp_path: Path, honest) -> None:  # type: ignore[no-untyped-def]
    pid_file = tmp_path / "job.pid"
    os.mkfifo(pid_file)
    try:
        errors: dict[tuple[str, str], int] = {}
        done, result = _within(
            lambda: discover(_targets(honest, pid_file), target_errors=errors), SCAN_BOUND_S
        )
        assert done, "discovery blocked on the job's FIFO pid file"
        _honest_found(result, honest)
        assert errors == {("hostile", "pid_file_refused"): 1}
    finally:
        # release a reader the old code left blocked in open()
        fd = os.open(pid_file, os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)


def test_a_pid_file_linked_to_dev_zero_is_refused_not_read(tmp_path: Path, honest) -> None:  # type: ignore[no-untyped-def]
    pid_file = tmp_path / "job.pid"
    pid_file.symlink_to("/dev/zero")
    # In a child with 1 GiB of address space: reading /dev/zero whole would end there.
    code = (
        "import resource, sys, pickle\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from profiler.service.discovery import discover\n"
        "from tests.service.test_discovery import spec\n"
        f"found = discover([spec('hostile', pid_file={str(pid_file)!r}),"
        f" spec('honest', cmdline={honest.marker!r})])\n"
        "print(sorted((d.target, d.pid) for d in found))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str([("honest", honest.pid)])


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe12\n", "\u00b2\n".encode(), "\u0661\u0662\n".encode(), b"12\x00\n", b""],
    ids=["not-utf8", "superscript-digit", "arabic-indic-digits", "nul", "empty"],
)
def test_odd_pid_file_content_costs_only_its_own_target(
    tmp_path: Path, honest, content: bytes
) -> None:  # type: ignore[no-untyped-def]
    pid_file = tmp_path / "job.pid"
    pid_file.write_bytes(content)
    errors: dict[tuple[str, str], int] = {}
    done, result = _within(
        lambda: discover(_targets(honest, pid_file), target_errors=errors), SCAN_BOUND_S
    )
    assert done
    _honest_found(result, honest)
    assert errors == {("hostile", "pid_file_invalid"): 1}


def test_a_pid_file_naming_the_honest_pid_still_matches(tmp_path: Path, honest) -> None:  # type: ignore[no-untyped-def]
    """The control: a plain pid file is read (so the refusals above are not blanket)."""
    pid_file = tmp_path / "job.pid"
    pid_file.write_text(f" {honest.pid}\n")
    found = discover([spec("by-file", pid_file=pid_file)])
    assert [(d.target, d.pid) for d in found] == [("by-file", honest.pid)]


@needs_fuse
def test_a_stalled_fuse_pid_file_costs_only_its_own_target(tmp_path: Path, honest) -> None:  # type: ignore[no-untyped-def]
    with stalling_fuse(tmp_path / "mnt", {"job.pid": f"{honest.pid}\n".encode()}) as fs:
        pid_file = fs.mountpoint / "job.pid"
        found = discover([spec("hostile", pid_file=pid_file)])
        assert [d.pid for d in found] == [honest.pid]  # answered: read as any file
        fs.stall()
        errors: dict[tuple[str, str], int] = {}
        for _ in range(3):  # and again: a stuck read is not waited on twice
            t0 = time.monotonic()
            done, result = _within(
                lambda: discover(_targets(honest, pid_file), target_errors=errors), SCAN_BOUND_S
            )
            assert done, "discovery blocked on the job's stalled FUSE pid file"
            _honest_found(result, honest)
            assert time.monotonic() - t0 < SCAN_BOUND_S
        assert errors == {("hostile", "pid_file_stuck"): 3}


# --------------------------------------------------------------------------- item 8: maps


def test_maps_of_a_process_not_admitted_by_its_exe_is_never_read(tmp_path: Path) -> None:
    """A process named like a target whose exe is not Python: its maps (260 MB in the
    probe, a FIFO here, so a read of it shows as a hang) is not opened."""
    from tests.service.test_discovery import make_proc

    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "stat").write_text("cpu  1 2 3\nbtime 1800000000\nprocesses 10\n")
    d = make_proc(procfs, 12, ["node", "train.py"], exe="/usr/bin/node")
    (d / "maps").unlink()
    os.mkfifo(d / "maps")
    make_proc(procfs, 13, ["python3", "train.py"])
    stats: dict[str, int] = {}
    try:
        done, result = _within(
            lambda: discover([spec(cmdline="train")], procfs, stats=stats), SCAN_BOUND_S
        )
        assert done, "discovery read the maps of a process its exe did not admit"
        assert [p.pid for p in result] == [13]
        assert stats == {"not_python": 1}
    finally:
        os.close(os.open(d / "maps", os.O_RDWR | os.O_NONBLOCK))


def test_maps_of_an_exe_admitted_process_is_read_bounded(tmp_path: Path) -> None:
    """A target that names a non-Python exe (an embedded interpreter: uwsgi) has its
    processes' maps searched for libpython, and at most MAX_MAPS_BYTES of it."""
    import tracemalloc

    from collectors.procstat import MAX_MAPS_BYTES
    from tests.service.test_discovery import make_proc

    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "stat").write_text("cpu  1 2 3\nbtime 1800000000\nprocesses 10\n")
    lib = "7f00-7f01 r-xp 0 08:01 5 /usr/lib/libpython3.10.so.1.0\n"
    make_proc(procfs, 11, ["uwsgi", "app"], exe="/usr/bin/uwsgi", maps=lib)
    d = make_proc(procfs, 12, ["uwsgi", "app"], exe="/usr/bin/uwsgi")
    with open(d / "maps", "wb") as f:  # 256 MiB of mappings, then libpython
        f.truncate(256 << 20)
        f.seek(256 << 20)
        f.write(lib.encode())
    stats: dict[str, int] = {}
    tracemalloc.start()
    try:
        found = discover([spec(cmdline="app", exe="uwsgi")], procfs, stats=stats)
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [p.pid for p in found] == [11]
    assert stats == {"not_python": 1}  # libpython past the bound is not looked for
    assert peak < 4 * MAX_MAPS_BYTES, f"{peak} bytes held to search a maps file"
    # and without an exe criterion, uwsgi is not admitted at all
    assert discover([spec(cmdline="app")], procfs) == []
