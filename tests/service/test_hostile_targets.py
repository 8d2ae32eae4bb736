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

from serwatt.profiler.service.discovery import discover
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
        "from serwatt.profiler.service.discovery import discover\n"
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
def test_a_stalled_fuse_pid_file_costs_only_its_own_target(
    tmp_path: Path,
    honest,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from serwatt.collectors import mounts

    with stalling_fuse(tmp_path / "mnt", {"job.pid": f"{honest.pid}\n".encode()}) as fs:
        pid_file = tmp_path / "job.pid"
        pid_file.symlink_to(fs.mountpoint / "job.pid")
        linked_dir = tmp_path / "run"
        linked_dir.symlink_to(fs.mountpoint)
        fs.stall()
        # on the mount itself, or through a link to it or to its directory: never asked,
        # answering or not
        for path in (fs.mountpoint / "job.pid", pid_file, linked_dir / "job.pid"):
            errors: dict[tuple[str, str], int] = {}
            done, found = _within(
                lambda p=path, e=errors: discover([spec("hostile", pid_file=p)], target_errors=e),
                SCAN_BOUND_S,
            )
            assert done and found == [] and errors == {("hostile", "pid_file_refused"): 1}
        assert fs.stalled_requests() == []
        # a network filesystem is read (the mount table made not to call this one FUSE
        # stands one in): the stall costs its target alone, and each scan waits for it
        # at most once
        monkeypatch.setattr(mounts, "is_fuse", lambda fstype: False)
        errors = {}
        for _ in range(3):
            t0 = time.monotonic()
            done, result = _within(
                lambda: discover(_targets(honest, pid_file), target_errors=errors), SCAN_BOUND_S
            )
            assert done, "discovery blocked on the job's stalled pid file"
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

    from serwatt.collectors.procstat import MAX_MAPS_BYTES
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


# --------------------------------------------------------------- items 4, 9: checkpoints


def _watchers(pid: int) -> list[int]:
    """The checkpoint-watch children of `pid` (python -m serwatt.collectors.fsevents)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"serwatt.collectors.fsevents" in argv:
            out.append(int(d.name))
    return out


def _ready(rc: Any, run_id: str) -> bool:
    """The run's watch is up (RunCheckpoints.open returns before it is)."""
    return rc.wait_ready(run_id, 30.0) if hasattr(rc, "wait_ready") else True


def _ckpt_spec(name: str, directory: Path) -> Any:
    from dataclasses import replace

    return replace(spec(name, cmdline="never-matches-anything"), checkpoints=directory)


@needs_fuse
@pytest.mark.parametrize("where", ["inside", "itself"])
def test_a_stalled_fuse_checkpoint_directory_costs_only_its_own_run(
    tmp_path: Path, where: str
) -> None:
    """Item 4: the main thread waited forever for the watcher's "ready". A FUSE mount
    inside the directory is not descended into (as find -xdev); one at the directory
    itself stalls its watch, which never comes up: that run alone goes to the heuristic."""
    from serwatt.profiler.service import run_checkpoints
    from serwatt.profiler.service.run_checkpoints import RunCheckpoints

    hostile_dir, honest_dir = tmp_path / "hostile", tmp_path / "honest"
    hostile_dir.mkdir()
    honest_dir.mkdir()
    mnt = hostile_dir / "mnt" if where == "inside" else hostile_dir
    errors: list[tuple[str, str]] = []
    rc = RunCheckpoints(Path("/proc"), on_error=lambda t, k: errors.append((t, k)))
    rows: dict[str, Any] = {}

    class Rec:
        def append_checkpoints(self, run_id: str, matched: Any, **kw: Any) -> None:
            rows[run_id] = kw["identity"]

    with stalling_fuse(mnt, {"x.pt": b"x"}, dirs=("sub",)) as fs:
        fs.stall()
        t0 = time.monotonic()
        done, _ = _within(lambda: rc.open("hostile-1", _ckpt_spec("hostile", hostile_dir)), 2.0)
        assert done, "opening the run waited on the job's stalled FUSE mount"
        done, _ = _within(lambda: rc.open("honest-1", _ckpt_spec("honest", honest_dir)), 2.0)
        assert done
        assert _ready(rc, "honest-1")
        (honest_dir / "step1.pt").write_bytes(b"1")
        if where == "inside":
            assert _ready(rc, "hostile-1")
            (hostile_dir / "step1.pt").write_bytes(b"1")
        done, _ = _within(lambda: rc.store("honest-1", Rec()), 5.0)
        assert done
        done, _ = _within(lambda: rc.store("hostile-1", Rec()), 2.0)
        assert done, "storing the run waited on the job's stalled FUSE mount"
        done, _ = _within(rc.close, run_checkpoints.CLOSE_WAIT_S + 2.0)
        assert done, "closing the watches waited on the stalled one"
        assert time.monotonic() - t0 < 30
    assert rows["honest-1"]["file_events"] == 1
    if where == "inside":
        assert rows["hostile-1"]["file_events"] == 1
        assert rows["hostile-1"]["unwatched_dirs"] == 1
        assert errors == []
    else:
        assert "hostile-1" not in rows  # its checkpoints go to the heuristic
        assert errors == [("hostile", "checkpoint_watch")]
    assert _watchers(os.getpid()) == []


def test_one_watcher_per_target_whatever_its_runs(tmp_path: Path) -> None:
    """Item 9: one watcher interpreter per matched process (24 runs: 24 children)."""
    from serwatt.profiler.service.run_checkpoints import RunCheckpoints

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    rc = RunCheckpoints(Path("/proc"))
    try:
        for i in range(24):
            rc.open(f"a-{i}", _ckpt_spec("a", a))
        rc.open("b-0", _ckpt_spec("b", b))
        for i in range(24):
            assert _ready(rc, f"a-{i}")
        assert _ready(rc, "b-0")
        assert len(_watchers(os.getpid())) == 2
        (a / "step1.pt").write_bytes(b"1")
        time.sleep(0.5)
        rc.open("a-late", _ckpt_spec("a", a))  # opened after the file: not its event
        assert _ready(rc, "a-late")
        (a / "step2.pt").write_bytes(b"2")
        time.sleep(0.5)
        rows: dict[str, Any] = {}

        class Rec:
            def append_checkpoints(self, run_id: str, matched: Any, **kw: Any) -> None:
                rows[run_id] = kw["identity"]["file_events"]

        for run in [f"a-{i}" for i in range(24)] + ["a-late", "b-0"]:
            rc.store(run, Rec())
        assert rows == {**{f"a-{i}": 2 for i in range(24)}, "a-late": 1, "b-0": 0}
        assert _watchers(os.getpid()) == []  # the last run of a target stops its watcher
    finally:
        rc.close()


# ------------------------------------------- procfs files of processes not yet admitted


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the job's files are another user's")
def test_a_stalled_procfs_read_costs_that_process_its_admission_not_the_scan(
    tmp_path: Path,
) -> None:
    """A process's environ that never answers (a FIFO in a procfs tree, as a job holding
    its memory-map lock would make it): before, discovery read it on the scan's thread and
    hung (needs root: the job runs as another user). Now the scan waits PROC_READ_WAIT_S
    for it at most, finds the honest process,
    and counts the stall under the targets that process was yet to be checked against;
    once PROC_READS_PER_USER of its user's reads are stuck, it does not wait at all."""
    from serwatt.profiler.service.discovery import PROC_READ_WAIT_S, PROC_READS_PER_USER
    from tests.service.test_discovery import make_proc

    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "stat").write_text("cpu  1 2 3\nbtime 1800000000\nprocesses 10\n")
    d = make_proc(procfs, 12, ["python3", "hostile.py"])
    (d / "environ").unlink()
    os.mkfifo(d / "environ")
    os.chown(d, 65534, 65534)  # another user's job: its stuck reads cap its user alone
    make_proc(procfs, 13, ["python3", "honest.py"])
    targets = [
        spec("hostile", cmdline="hostile", environ={"JOB": "1"}),
        spec("honest", cmdline="honest"),
    ]
    errors: dict[tuple[str, str], int] = {}
    took = []
    try:
        for _ in range(PROC_READS_PER_USER + 1):
            t0 = time.monotonic()
            done, result = _within(
                lambda: discover(targets, procfs, target_errors=errors), SCAN_BOUND_S
            )
            took.append(time.monotonic() - t0)
            assert done, "discovery blocked on a process's procfs file"
            assert not isinstance(result, BaseException), f"discovery raised {result!r}"
            assert [(p.target, p.pid) for p in result] == [("honest", 13)]
        n = PROC_READS_PER_USER + 1
        assert errors == {("hostile", "proc_read_stuck"): n, ("honest", "proc_read_stuck"): n}
        # each stalled read waited on once, then the user's reads are all stuck: no wait
        assert all(PROC_READ_WAIT_S <= t < SCAN_BOUND_S for t in took[:-1]), took
        assert took[-1] < PROC_READ_WAIT_S, took
    finally:
        # release the readers left blocked in open()
        os.close(os.open(d / "environ", os.O_RDWR | os.O_NONBLOCK))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the job's files are another user's")
def test_the_daemon_counts_a_stalled_procfs_read_and_goes_on(tmp_path: Path) -> None:
    """The daemon over a procfs (--path.procfs) where a job's cmdline never answers:
    before, its main loop hung in the first scan (no /metrics, SIGTERM unanswered). Now
    each scan counts it in serwatt_sampler_errors_total{kind="proc_read_stuck"}, the loop
    scans again, and SIGTERM stops it."""
    from tests.daemon_support import start_daemon, total
    from tests.service.test_discovery import make_proc

    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "stat").write_text("cpu  1 2 3\nbtime 1800000000\nprocesses 10\n")
    d = make_proc(procfs, 12, ["python3", "hostile.py"])
    (d / "cmdline").unlink()
    os.mkfifo(d / "cmdline")
    os.chown(d, 65534, 65534)
    daemon = start_daemon(tmp_path, {"hostile": "hostile"}, procfs=procfs)
    try:
        m = daemon.wait_metric(
            "serwatt_sampler_errors_total",
            2,
            timeout_s=30,
            target="hostile",
            kind="proc_read_stuck",
        )
        assert (
            total(m, "serwatt_sampler_errors_total", target="hostile", kind="proc_read_stuck") >= 2
        )
        assert daemon.stop()[0] == 0
    finally:
        daemon.kill()
        os.close(os.open(d / "cmdline", os.O_RDWR | os.O_NONBLOCK))
