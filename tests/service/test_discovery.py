"""Process discovery against real processes (real /proc) and hand-built procfs trees."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest

from serwatt.profiler.records.run_ids import NO_UNIT, format_start_time, render_run_id
from serwatt.profiler.sampling.eligible import PF_KTHREAD
from serwatt.profiler.service.config import TargetMatch, TargetSpec
from serwatt.profiler.service.discovery import discover

SLEEPER = "import time, sys; time.sleep(120)"


def spec(name: str = "t", run: str = "{target}-{pid}", **match: object) -> TargetSpec:
    if "environ" in match:
        match["environ"] = MappingProxyType(dict(match["environ"]))  # type: ignore[arg-type]
    for key in ("cmdline", "exe", "cgroup"):
        if isinstance(match.get(key), str):
            match[key] = re.compile(match[key])  # type: ignore[arg-type]
    return TargetSpec(name=name, match=TargetMatch(**match), run=run)  # type: ignore[arg-type]


@pytest.fixture
def marker() -> str:
    return f"serwatt-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def spawn() -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], **kwargs: object) -> subprocess.Popen:
        p = subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def wait_for(pred, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


# --------------------------------------------------------------------------- real processes


def test_cmdline_match_finds_real_python_processes_with_start_time_and_run_id(
    marker: str, spawn
) -> None:  # type: ignore[no-untyped-def]
    before = time.time()
    a = spawn([sys.executable, "-c", SLEEPER, "train.py", marker])
    b = spawn([sys.executable, "-c", SLEEPER, "train.py", marker, "--rank", "1"])
    spawn([sys.executable, "-c", SLEEPER, "eval.py", marker])  # other script: not a match
    target = spec("trainer", cmdline=rf"train\.py {marker}", run="{target}-{start_time}-{pid}")
    found = wait_for(lambda: (lambda ds: ds if len(ds) >= 2 else None)(discover([target])))
    assert sorted(d.pid for d in found) == sorted([a.pid, b.pid])
    for d in found:
        assert d.target == "trainer"
        assert marker in d.cmdline and d.cmdline.startswith(sys.executable)
        assert d.exe == os.path.realpath(sys.executable)
        assert before - 2 <= d.start_time <= time.time() + 1
        assert d.run_id == f"trainer-{format_start_time(d.start_time)}-{d.pid}"
        assert d.ppid == os.getpid()


def test_every_given_criterion_must_hold(marker: str, spawn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "SERWATT_TEST_JOB": marker, "RANK": "0"}
    p = spawn([sys.executable, "-c", SLEEPER, marker], env=env)
    q = spawn([sys.executable, "-c", SLEEPER, marker], env={**env, "RANK": "1"})
    wait_for(lambda: Path(f"/proc/{q.pid}/cmdline").read_bytes().count(marker.encode()))
    wait_for(lambda: Path(f"/proc/{p.pid}/cmdline").read_bytes().count(marker.encode()))
    exe_re = re.escape(os.path.basename(os.path.realpath(sys.executable))) + "$"
    mem_cgroup = Path(f"/proc/{p.pid}/cgroup").read_text().splitlines()[-1].split(":", 2)[2]
    pid_file = tmp_path / "trainer.pid"
    pid_file.write_text(f"{p.pid}\n")

    def pids(**match: object) -> set[int]:
        return {d.pid for d in discover([spec(cmdline=marker, **match)])}

    assert pids() == {p.pid, q.pid}
    assert pids(environ={"SERWATT_TEST_JOB": marker, "RANK": "0"}) == {p.pid}
    assert pids(environ={"SERWATT_TEST_JOB": "other"}) == set()
    assert pids(exe=exe_re) == {p.pid, q.pid}
    assert pids(exe=r"/bin/bash$") == set()
    assert pids(cgroup="^" + re.escape(mem_cgroup) + "$") == {p.pid, q.pid}
    assert pids(cgroup=r"^/no/such/cgroup$") == set()
    assert pids(pid_file=pid_file) == {p.pid}
    assert pids(pid_file=tmp_path / "missing.pid") == set()
    assert pids(pid_file=pid_file, environ={"RANK": "1"}) == set()


def test_first_matching_target_wins(marker: str, spawn) -> None:  # type: ignore[no-untyped-def]
    p = spawn([sys.executable, "-c", SLEEPER, marker])
    first, second = spec("first", cmdline=marker), spec("second", cmdline="-c")
    found = wait_for(lambda: [d for d in discover([first, second]) if d.pid == p.pid])
    assert [d.target for d in found] == ["first"]


def test_non_python_serwatt_and_pyspy_processes_are_not_targets(marker: str, spawn) -> None:  # type: ignore[no-untyped-def]
    sh = spawn(["/bin/sh", "-c", "sleep 120; true", marker])  # `; true`: sh may not exec sleep
    py = spawn([sys.executable, "-c", SLEEPER, marker])
    # A Python process whose argv[0] says it is serwatt (as the console script is).
    serwatt_like = spawn(["serwatt", "-c", SLEEPER, marker], executable=sys.executable)
    stats: dict[str, int] = {}
    found = wait_for(
        lambda: (
            [d.pid for d in discover([spec(cmdline=marker)], stats=stats)]
            if Path(f"/proc/{serwatt_like.pid}/cmdline").read_bytes().startswith(b"serwatt")
            else None
        )
    )
    assert found == [py.pid]
    assert sh.pid not in found and serwatt_like.pid not in found
    assert stats["not_python"] >= 1 and stats["self"] >= 2  # serwatt_like and this test process


def test_this_process_is_excluded_by_default_but_not_when_asked(marker: str) -> None:
    argv = Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    me = spec(cmdline="^" + re.escape(b" ".join(argv).decode()) + "$")
    assert os.getpid() not in {d.pid for d in discover([me])}
    assert os.getpid() in {d.pid for d in discover([me], exclude_pids=())}


def test_processes_exiting_during_scans_never_raise(marker: str, spawn) -> None:  # type: ignore[no-untyped-def]
    target = spec(cmdline=marker, environ={"SERWATT_X": "1"})
    env = {**os.environ, "SERWATT_X": "1"}
    stats: dict[str, int] = {}
    deadline = time.monotonic() + 3.0
    scans = 0
    while time.monotonic() < deadline:
        for _ in range(4):
            spawn([sys.executable, "-c", "pass", marker], env=env)
        discover([target], stats=stats)
        scans += 1
    assert scans >= 3


# --------------------------------------------------------------------------- fake procfs


def make_proc(
    root: Path,
    pid: int,
    argv: list[str],
    *,
    exe: str | None = "/usr/bin/python3.11",
    ppid: int = 1,
    flags: int = 0,
    start_ticks: int = 500,
    cgroup: str = "0::/system.slice/trainer.service\n",
    environ: dict[str, str] | None = None,
    maps: str = "",
    comm: str = "python3",
) -> Path:
    d = root / str(pid)
    d.mkdir(parents=True)
    rest = ["S", str(ppid), "1", "1", "0", "-1", str(flags)] + ["0"] * 12 + [str(start_ticks)]
    rest += ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(rest) + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + (b"\0" if argv else b""))
    if exe is not None:
        (d / "exe").symlink_to(exe)
    (d / "cgroup").write_text(cgroup)
    env = environ or {}
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
    (d / "maps").write_text(maps)
    return d


@pytest.fixture
def procfs(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text("cpu  1 2 3\nbtime 1800000000\nprocesses 10\n")
    return root


def test_fake_procfs_start_time_unit_and_run_template(procfs: Path) -> None:
    make_proc(procfs, 10, ["python3", "train.py"], start_ticks=100 * os.sysconf("SC_CLK_TCK"))
    target = spec("trainer", cmdline="train", run="{host}/{unit}-{start_time}")
    (d,) = discover([target], procfs, host="node1")
    assert d.start_time == 1_800_000_100.0
    assert d.unit == "trainer.service"
    assert d.run_id == "node1_trainer.service-20270115T080140Z"  # '/' is made safe
    assert d.exe == "/usr/bin/python3.11" and d.cmdline == "python3 train.py"


def test_fake_procfs_units_cgroups_and_kernel_threads(procfs: Path) -> None:
    make_proc(procfs, 2, [], exe=None, ppid=0, flags=PF_KTHREAD, comm="kthreadd")
    make_proc(procfs, 30, [], exe=None, ppid=2, flags=PF_KTHREAD, comm="kworker/0:1")
    make_proc(
        procfs,
        40,
        ["python3", "train.py"],
        cgroup="12:memory:/kubepods/pod1\n1:name=systemd:/user.slice/user-1000.slice/"
        "user@1000.service/app.slice/job.service\n0::/user.slice/user-1000.slice/"
        "user@1000.service/app.slice/job.service\n",
    )
    make_proc(procfs, 50, ["python3", "train.py"], cgroup="0::/\n")
    stats: dict[str, int] = {}
    found = discover([spec(cmdline="train")], procfs, stats=stats)
    assert [(d.pid, d.unit) for d in found] == [(40, "user@1000.service"), (50, None)]
    assert stats["kernel_thread"] == 2
    assert [d.pid for d in discover([spec(systemd_unit="job.service")], procfs)] == [40]
    assert [d.pid for d in discover([spec(systemd_unit="user@1000.service")], procfs)] == [40]
    assert [d.pid for d in discover([spec(cgroup="^/kubepods/")], procfs)] == [40]
    (d,) = discover([spec(cmdline="train", run="{unit}-{pid}")], procfs, exclude_pids=[40])
    assert d.run_id == f"{NO_UNIT}-50"


def test_fake_procfs_python_detection(procfs: Path) -> None:
    make_proc(procfs, 10, ["/opt/venv/bin/python", "x"], exe="/usr/bin/python3.13t")
    make_proc(
        procfs,
        11,
        ["uwsgi", "x"],
        exe="/usr/bin/uwsgi",
        maps="7f00-7f01 r-xp 0 08:01 5 /usr/lib/libpython3.10.so.1.0\n",
    )
    make_proc(procfs, 12, ["node", "x"], exe="/usr/bin/node", maps="7f00-7f01 r-xp /lib/libc.so\n")
    make_proc(procfs, 13, ["py-spy", "record", "x"], exe="/venv/bin/py-spy")
    make_proc(procfs, 14, ["/usr/bin/python3", "/usr/local/bin/serwatt", "daemon", "x"])
    make_proc(procfs, 15, ["python3", "-m", "serwatt", "daemon", "x"])
    stats: dict[str, int] = {}
    found = discover([spec(cmdline="x")], procfs, stats=stats)
    # uwsgi's libpython is in its maps, read only for a target that names its exe
    assert [d.pid for d in found] == [10]
    assert stats == {"not_python": 2, "self": 3}
    found = discover([spec(cmdline="x", exe="uwsgi|node")], procfs)
    assert [d.pid for d in found] == [11]


def test_fake_procfs_vanished_and_unreadable_processes_are_counted(procfs: Path) -> None:
    make_proc(procfs, 10, ["python3", "train.py"])
    (procfs / "11").mkdir()  # exited between listdir and the first read
    d12 = make_proc(procfs, 12, ["python3", "train.py"])
    (d12 / "environ").unlink()  # exited after its stat was read
    d13 = make_proc(procfs, 13, ["python3", "train.py"])
    (d13 / "stat").write_text("13 (python3) S")  # truncated stat of an exiting process
    (procfs / "14").mkdir()
    (procfs / "14" / "stat").mkdir()  # unreadable as a file
    stats: dict[str, int] = {}
    found = discover([spec(cmdline="train", environ={"A": "1"})], procfs, stats=stats)
    assert found == []
    assert stats["vanished"] >= 3
    stats = {}
    make_proc(procfs, 20, ["python3", "train.py"], environ={"A": "1"})
    found = discover([spec(cmdline="train", environ={"A": "1"})], procfs, stats=stats)
    assert [d.pid for d in found] == [20]


def test_fake_procfs_comm_with_parentheses_and_spaces(procfs: Path) -> None:
    make_proc(procfs, 10, ["python3", "t"], comm="py (x) y", start_ticks=7)
    (d,) = discover([spec(cmdline="t")], procfs)
    assert d.start_time == 1_800_000_000 + 7 / os.sysconf("SC_CLK_TCK")


def test_a_btime_that_moves_under_ntp_keeps_each_process_and_its_run(procfs: Path) -> None:
    """The kernel recomputes btime on every read (wall clock minus time since boot): NTP
    slewing moves it by a second now and then. A process's start time, its identity to
    the daemon and its run id stay as first read."""
    make_proc(procfs, 10, ["python3", "train.py"], start_ticks=100 * os.sysconf("SC_CLK_TCK"))
    target = spec("trainer", cmdline="train")
    (first,) = discover([target], procfs)
    (procfs / "stat").write_text("cpu  1 2 3\nbtime 1800000001\nprocesses 10\n")
    (again,) = discover([target], procfs)
    assert (again.start_time, again.run_id) == (first.start_time, first.run_id)
    assert first.start_time == 1_800_000_100.0


def test_procfs_without_btime_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu 1\n")
    with pytest.raises(RuntimeError, match="no btime"):
        discover([spec(cmdline="x")], tmp_path)
    assert discover([], tmp_path) == []


def test_render_run_id() -> None:
    assert (
        render_run_id(
            "{target}:{unit}:{pid}:{start_time}:{host}",
            target="t",
            pid=7,
            start_time=0.0,
            unit=None,
            host="h",
        )
        == "t:nounit:7:19700101T000000Z:h"
    )
    assert render_run_id("{unit} x", target="t", pid=1, start_time=0, unit="a b", host="h") == (
        "a_b_x"
    )


def interpreters() -> list[str]:
    """This test's Python plus every pyenv interpreter on the machine (targets may be older
    than serwatt's own Python: 2.7 and 3.6+ are common on training images)."""
    found = [sys.executable]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for python in sorted(root.glob("*/bin/python")):
        if os.access(python, os.X_OK):
            found.append(str(python))
    return found


def test_every_interpreter_version_is_recognised_as_python(marker: str, spawn) -> None:  # type: ignore[no-untyped-def]
    procs = [
        spawn([python, "-c", "import time; time.sleep(120)", marker]) for python in interpreters()
    ]
    stats: dict[str, int] = {}
    found = wait_for(
        lambda: (lambda ds: ds if len(ds) == len(procs) else None)(
            discover([spec(cmdline=marker)], stats=stats)
        )
    )
    assert sorted(d.pid for d in found) == sorted(p.pid for p in procs)
    assert "not_python" not in stats


def test_a_checkpoint_watch_is_never_a_target(marker: str, spawn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # a serwatt's checkpoint watch: `python -m collectors.fsevents DIR`, DIR in its argv
    watch_dir = tmp_path / marker
    watch_dir.mkdir()
    watch = spawn(
        [sys.executable, "-m", "serwatt.collectors.fsevents", str(watch_dir)],
        cwd=Path(__file__).resolve().parents[2],
        stdin=subprocess.PIPE,  # it watches until its stdin closes
    )
    job = spawn([sys.executable, "-c", SLEEPER, marker])
    stats: dict[str, int] = {}
    found = wait_for(lambda: {d.pid for d in discover([spec(cmdline=marker)], stats=stats)} or None)
    assert found == {job.pid} and watch.pid not in found
    assert watch.poll() is None  # alive (and matching the pattern) all the while
    assert stats["self"] >= 2  # the watch and this test process
