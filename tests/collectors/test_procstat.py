"""procstat on fake procfs trees (exact numbers) and on real processes (live kernel)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serwatt.collectors import procstat
from serwatt.collectors.pyspy import SamplingPlan

TICK = procstat.CLOCK_TICKS_PER_S


def stat_line(
    pid: int, comm: str, state: str, ppid: int, utime: int, stime: int, start: int
) -> str:
    # fields after comm: state ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime stime cutime cstime priority nice threads itreal starttime ...
    rest = [state, ppid, pid, pid, 0, -1, 0, 0, 0, 0, 0, utime, stime, 0, 0, 20, 0, 1, 0, start]
    return f"{pid} ({comm}) " + " ".join(str(x) for x in rest) + " 0 0\n"


def make_proc(
    root: Path,
    pid: int,
    threads: dict[int, tuple[int, int, int | None]],
    *,
    comm: str = "python3",
    ppid: int = 1,
    exe: str = "/usr/bin/python3.11",
    start: int = 500,
) -> None:
    base = root / str(pid)
    (base / "task").mkdir(parents=True)
    (base / "stat").write_text(stat_line(pid, comm, "S", ppid, 0, 0, start))
    (base / "cmdline").write_text("python3\0train.py\0")
    (base / "exe").symlink_to(exe)
    for tid, (ut, st, sched) in threads.items():
        t = base / "task" / str(tid)
        t.mkdir()
        t.joinpath("stat").write_text(stat_line(tid, f"{comm} (x) y", "R", ppid, ut, st, start))
        t.joinpath("comm").write_text(comm + "\n")
        if sched is not None:
            t.joinpath("schedstat").write_text(f"{sched} 0 1\n")


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    return tmp_path


def test_stat_source_when_schedstat_reads_zero(fake: Path) -> None:
    make_proc(fake, 10, {10: (100, 50, 0), 11: (0, 0, 0)})
    before = procstat.snapshot(10, fake)
    make_proc_dir = fake / "10" / "task"
    (make_proc_dir / "10" / "stat").write_text(stat_line(10, "python3", "R", 1, 130, 70, 500))
    (make_proc_dir / "11" / "stat").write_text(stat_line(11, "python3", "S", 1, 5, 0, 500))
    after = procstat.snapshot(10, fake)
    d = procstat.delta(before, after)
    assert d.source == "stat" and d.resolution_s == pytest.approx(1 / TICK)
    assert d.per_tid_s == {10: pytest.approx(50 / TICK), 11: pytest.approx(5 / TICK)}


def test_schedstat_preferred_when_live(fake: Path) -> None:
    make_proc(fake, 20, {20: (100, 0, 1_000_000_000), 21: (3, 0, 30_000_000)})
    before = procstat.snapshot(20, fake)
    (fake / "20" / "task" / "20" / "schedstat").write_text("1250000000 0 3\n")
    (fake / "20" / "task" / "20" / "stat").write_text(stat_line(20, "p", "R", 1, 125, 0, 500))
    (fake / "20" / "task" / "21").joinpath("schedstat").unlink()
    import shutil

    shutil.rmtree(fake / "20" / "task" / "21")  # thread 21 exited
    after = procstat.snapshot(20, fake)
    d = procstat.delta(before, after)
    assert d.source == "schedstat"
    assert d.per_tid_s == {20: pytest.approx(0.25)}
    assert d.exited_tids == (21,)


def test_run_queue_wait_from_schedstat(fake: Path) -> None:
    make_proc(fake, 30, {30: (100, 0, 1_000_000_000)})  # run_delay 0
    before = procstat.snapshot(30, fake)
    assert before.threads[30].wait_ns == 0
    # 0.5 s more on a CPU, 0.75 s more waiting in a run queue
    (fake / "30" / "task" / "30" / "schedstat").write_text("1500000000 750000000 9\n")
    d = procstat.delta(before, procstat.snapshot(30, fake))
    assert d.per_tid_s == {30: pytest.approx(0.5)}
    assert d.wait_per_tid_s == {30: pytest.approx(0.75)}


def test_comm_with_parens_and_process_info(fake: Path) -> None:
    make_proc(fake, 30, {30: (1, 1, None)}, comm="we ird) (name", ppid=7, start=250)
    info = procstat.process_info(30, fake)
    assert info.comm == "we ird) (name" and info.ppid == 7
    assert info.start_time_s == pytest.approx(1700000000 + 250 / TICK)
    assert info.cmdline == ("python3", "train.py") and info.exe == "/usr/bin/python3.11"


def test_children_descendants_and_python_kind(fake: Path) -> None:
    make_proc(fake, 40, {40: (0, 0, None)}, ppid=1)
    make_proc(fake, 41, {41: (0, 0, None)}, ppid=40, exe="/usr/bin/bash")
    make_proc(fake, 42, {42: (0, 0, None)}, ppid=41, exe="/opt/py/bin/python3.13t")
    assert procstat.children(40, fake) == [41]
    assert procstat.descendants(40, fake) == [41, 42]
    k = procstat.python_kind(42, fake)
    assert k.is_python and k.free_threaded and k.version == "3.13"
    assert not procstat.python_kind(41, fake).is_python
    assert procstat.python_kind(40, fake).version == "3.11"


def test_missing_process(fake: Path) -> None:
    with pytest.raises(procstat.ProcessGone, match="gone"):
        procstat.snapshot(999, fake)
    with pytest.raises(procstat.ProcessGone, match="no such process: 999"):
        procstat.process_info(999, fake)
    assert not procstat.exists(999, fake)


@pytest.mark.serial  # a busy thread's CPU over 1 s: alone, on a quiet machine
def test_real_busy_and_idle_threads() -> None:
    code = (
        "import threading, time\n"
        "def spin():\n"
        "    x = 0\n"
        "    while True: x += 1\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "print(threading.get_native_id(), flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        main_tid = int(p.stdout.readline())  # type: ignore[union-attr]
        assert main_tid == p.pid
        before = procstat.snapshot(p.pid)
        time.sleep(1.0)
        after = procstat.snapshot(p.pid)
        d = procstat.delta(before, after)
        assert set(d.per_tid_s) == {int(t) for t in os.listdir(f"/proc/{p.pid}/task")}
        spinner = max(d.per_tid_s, key=lambda t: d.per_tid_s[t])
        assert spinner != p.pid
        assert d.per_tid_s[spinner] > 0.2  # generous: the machine is shared
        assert d.per_tid_s[p.pid] < 0.1
        assert procstat.python_kind(p.pid).is_python
        assert procstat.process_info(p.pid).ppid == os.getpid()
        assert p.pid in procstat.children(os.getpid())
    finally:
        p.kill()
        p.wait()


def test_context_switches_give_the_wakeup_share_of_the_wait(fake: Path) -> None:
    make_proc(fake, 50, {50: (100, 0, 1_000_000_000)})
    status = fake / "50" / "task" / "50" / "status"
    status.write_text(
        "Name:\tpython3\nvoluntary_ctxt_switches:\t10\nnonvoluntary_ctxt_switches:\t5\n"
    )
    before = procstat.snapshot(50, fake, switches=True)
    assert before.threads[50].switches == (10, 5)
    assert procstat.snapshot(50, fake).threads[50].switches is None  # not read unless asked
    status.write_text("voluntary_ctxt_switches:\t40\nnonvoluntary_ctxt_switches:\t95\n")
    (fake / "50" / "task" / "50" / "schedstat").write_text("1500000000 800000000 20\n")
    d = procstat.delta(before, procstat.snapshot(50, fake, switches=True))
    assert d.wakeup_share_per_tid == {50: pytest.approx(30 / 120)}


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("schedstat", "12 -3 1\n"),  # negative
        ("schedstat", "1 2\n"),  # short
        ("schedstat", "x y z\n"),
        ("schedstat", "1 2 3 " + "9" * 100_000),  # too long
        ("status", "voluntary_ctxt_switches:\tlots\nnonvoluntary_ctxt_switches:\t1\n"),
        ("status", "Name:\tno counts here\n"),
    ],
)
def test_odd_schedstat_or_status_reads_as_absent(fake: Path, name: str, text: str) -> None:
    make_proc(fake, 60, {60: (7, 3, 1_000)})
    (fake / "60" / "task" / "60" / name).write_text(text)
    th = procstat.snapshot(60, fake, switches=True).threads[60]
    assert th.stat_ticks == 10
    if name == "schedstat":
        assert th.sched_ns is None and th.wait_ns is None
    else:
        assert th.switches is None and th.sched_ns == 1_000


def test_a_thread_whose_stat_does_not_parse_is_left_out_and_named(fake: Path) -> None:
    make_proc(fake, 70, {70: (1, 1, None), 71: (2, 2, None), 72: (3, 3, None)})
    (fake / "70" / "task" / "71" / "stat").write_text("71 (x) R garbage\n")
    (fake / "70" / "task" / "72" / "stat").write_text("7" * (procstat.MAX_READ_BYTES + 1))
    snap = procstat.snapshot(70, fake)
    assert set(snap.threads) == {70}
    reasons = dict(snap.unreadable)
    assert set(reasons) == {71, 72}
    assert "task/71/stat" in reasons[71] and "fields" in reasons[71]
    assert "longer than" in reasons[72]
    # no thread parses: a clear error naming the file and the likely cause
    (fake / "70" / "task" / "70" / "stat").write_text("not a stat line")
    with pytest.raises(procstat.ProcfsCorrupt, match=r"task/70/stat.*is .* a procfs"):
        procstat.snapshot(70, fake)


def test_a_window_on_a_procfs_that_does_not_parse_is_a_sampling_error(fake: Path) -> None:
    from serwatt.collectors.pyspy import SamplingError
    from serwatt.profiler.sampling.collect import collect_window

    make_proc(fake, 80, {80: (1, 1, None)})
    (fake / "80" / "task" / "80" / "stat").write_text("\x00" * 50)
    with pytest.raises(SamplingError, match=r"cannot read the CPU time of process 80: .*stat"):
        collect_window(
            80, duration_s=1, plan=SamplingPlan(rate_hz=10, on_cpu_run=True), procfs=fake
        )


def test_exiting_is_gone_a_zombie_or_a_task_inside_its_exit(fake: Path) -> None:
    # a real zombie (exited, not reaped) and a real running process
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 30
        while procstat.exists(zombie.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procstat.exiting(zombie.pid) and not procstat.exiting(running.pid)
    finally:
        running.kill()
        for p in (zombie, running):
            p.wait()
    assert procstat.exiting(999, fake)  # no such pid
    # a task inside do_exit still reads state R, with PF_EXITING in its flags (field 9)
    make_proc(fake, 50, {50: (0, 0, None)}, ppid=1)
    stat = (fake / "50" / "stat").read_text()
    head, rest = stat.rsplit(")", 1)
    fields = rest.split()
    fields[0], fields[6] = "R", str(int(fields[6]) | procstat.PF_EXITING)
    (fake / "50" / "stat").write_text(f"{head}) {' '.join(fields)}\n")
    assert procstat.exists(50, fake) and procstat.exiting(50, fake)
    fields[6] = "0"
    (fake / "50" / "stat").write_text(f"{head}) {' '.join(fields)}\n")
    assert not procstat.exiting(50, fake)
