"""py-spy under SCHED_FIFO (collectors/sched.py): real py-spy, real kernel policies.

The accuracy effect itself (samples no longer gathering after the target's system
calls) is a benchmark, bench/accuracy.py --threads 2: it depends on how busy the
machine is, so no test here asserts it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from collectors import sched
from collectors.pyspy import PySpy
from profiler.config import ConfigError, parse_config
from tests.test_daemon_support import PYTHON, config_text, free_port
from tests.test_systemd import as_nobody

REPO = Path(__file__).resolve().parents[1]


def _pyspy_policies(parent: int, stop: threading.Event, seen: list[tuple[float, str]]) -> None:
    """Every 50 ms: the scheduling policy of each thread of each py-spy child of `parent`."""
    while not stop.is_set():
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                if comm != "py-spy" or ppid != parent:
                    continue
                for tid in os.listdir(f"/proc/{entry}/task"):
                    seen.append((time.monotonic(), sched.policy_of(int(tid))))
            except (OSError, ValueError):
                continue
        stop.wait(0.05)


def _window_policies(realtime: str) -> tuple[list[str], tuple[str, ...]]:
    target = subprocess.Popen([sys.executable, "-c", "while True: sum(range(1000))"])
    stop = threading.Event()
    seen: list[tuple[float, str]] = []
    watcher = threading.Thread(target=_pyspy_policies, args=(os.getpid(), stop, seen))
    try:
        time.sleep(0.3)
        watcher.start()
        started = time.monotonic()
        w = PySpy(realtime=realtime).record_window(target.pid, duration_s=2, rate_hz=50)
    finally:
        stop.set()
        watcher.join()
        target.kill()
        target.wait()
    assert w.samples, "the window sampled nothing"
    # after py-spy's start-up (its threads exist and the policy was applied)
    late = [policy for t, policy in seen if t > started + 0.7]
    assert late, "never saw the py-spy process"
    return late, w.errors.notes


def test_auto_runs_every_pyspy_thread_under_sched_fifo() -> None:
    assert os.geteuid() == 0, "the test machine runs the suite as root"
    policies, notes = _window_policies("auto")
    assert set(policies) == {"fifo"}, policies
    assert not any("normal priority" in n for n in notes), notes


def test_off_leaves_pyspy_at_normal_priority() -> None:
    policies, notes = _window_policies("off")
    assert set(policies) == {"other"}, policies
    assert not any("normal priority" in n for n in notes), notes


def test_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="realtime must be one of"):
        PySpy(realtime="yes")


UNPRIVILEGED = textwrap.dedent(
    """
    import json, os, resource, subprocess, sys, time
    from collectors import sched
    from collectors.pyspy import PySpy, SamplingError  # imported while /root is readable
    rtprio = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_RTPRIO, (rtprio, rtprio))
    os.setgroups([]); os.setgid(65534); os.setuid(65534)  # drops every capability
    child = subprocess.Popen(["sleep", "30"])  # same uid as us now
    out = {"problem": sched.permission_problem()}
    try:
        out["made"] = sched.make_realtime(child.pid)
        out["policy"] = sched.policy_of(child.pid)
        out["auto"] = PySpy(realtime="auto").raise_priority(child.pid)
        try:
            PySpy(realtime="required")
            out["required"] = "accepted"
        except SamplingError as exc:
            out["required"] = str(exc)
    finally:
        child.kill()
    print(json.dumps(out))
    """
)


def _unprivileged(rtprio: int) -> dict[str, str | None]:
    import json

    out = subprocess.run(
        [sys.executable, "-c", UNPRIVILEGED, str(rtprio)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, str | None] = json.loads(out.stdout)
    return result


def test_without_cap_sys_nice_auto_falls_back_and_required_names_the_fix() -> None:
    r = _unprivileged(rtprio=0)
    assert r["problem"] == "no CAP_SYS_NICE and RLIMIT_RTPRIO is 0"
    # the kernel, not serwatt, refuses
    assert r["made"] == "sched_setscheduler(SCHED_FIFO) was refused (EPERM)"
    assert r["policy"] == "other"
    assert r["auto"] == r["problem"]
    assert r["required"] is not None and "CAP_SYS_NICE" in r["required"]
    assert "sampler_realtime: false" in r["required"]


@pytest.mark.parametrize(
    ("rtprio", "capeff", "allowed"),
    [
        (0, "0000000000000000", False),
        (0, f"{1 << sched.CAP_SYS_NICE:016x}", True),  # the capability alone
        (1, "0000000000000000", True),  # RLIMIT_RTPRIO alone (this machine cannot raise it)
    ],
)
def test_permission_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rtprio: int, capeff: str, allowed: bool
) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(f"Name:\tx\nCapEff:\t{capeff}\n")
    monkeypatch.setattr(sched.resource, "getrlimit", lambda _r: (rtprio, rtprio))
    assert (sched.permission_problem(tmp_path) is None) == allowed


@pytest.mark.parametrize(
    ("value", "mode"), [("auto", "auto"), ("true", "required"), ("false", "off")]
)
def test_config_key(tmp_path: Path, value: str, mode: str) -> None:
    text = f"sampler_realtime: {value}\ntargets:\n  - name: t\n    match: {{cmdline: x}}\n"
    assert parse_config(text, tmp_path / "c.yaml").sampler_realtime == mode


def test_config_key_bad_value_names_the_key_and_line(tmp_path: Path) -> None:
    text = "targets:\n  - name: t\n    match: {cmdline: x}\nsampler_realtime: sometimes\n"
    with pytest.raises(ConfigError) as ei:
        parse_config(text, tmp_path / "c.yaml")
    (problem,) = ei.value.problems
    assert problem.key_path == "sampler_realtime" and problem.line == 4
    assert "auto, true, false" in problem.message


def test_daemon_exits_78_when_realtime_is_required_but_not_allowed(tmp_path: Path) -> None:
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        config_text(
            port=free_port(),
            record_dir=tmp_path / "runs",
            targets={"t": "x"},
            extra="sampler_realtime: true\n",
        )
    )
    # the unit's capabilities without CAP_SYS_NICE
    proc = as_nobody(
        ["sys_ptrace", "dac_read_search"],
        [PYTHON, "-m", "profiler", "daemon", "--config", str(cfg)],
        cwd=REPO,
    )
    assert proc.returncode == 78, proc.stderr
    assert "real-time sampling is required but not allowed" in proc.stderr
    assert "CAP_SYS_NICE" in proc.stderr


WITH_UNIT_CAPS = textwrap.dedent(
    """
    import subprocess, sys
    from collectors import sched
    from collectors.pyspy import PySpy
    child = subprocess.Popen(["sleep", "30"])
    try:
        print("made", sched.make_realtime(child.pid), sched.policy_of(child.pid))
    finally:
        child.kill()
    w = PySpy(realtime="required").record_window(int(sys.argv[1]), duration_s=1, rate_hz=50)
    print("samples", len(w.samples), "notes", list(w.errors.notes))
    """
)


def test_the_unit_capabilities_allow_real_time_sampling() -> None:
    """As the unit runs it (nobody + CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_SYS_NICE):
    py-spy can be made SCHED_FIFO, and a required real-time window samples a root target."""
    target = subprocess.Popen([sys.executable, "-c", "while True: sum(range(1000))"])
    try:
        time.sleep(0.3)
        out = as_nobody(
            ["sys_ptrace", "dac_read_search", "sys_nice"],
            [PYTHON, "-c", WITH_UNIT_CAPS, str(target.pid)],
            cwd=REPO,
        )
    finally:
        target.kill()
        target.wait()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "made None fifo" in out.stdout
    assert "notes []" in out.stdout and "samples 0 " not in out.stdout, out.stdout


def test_profile_required_without_the_privilege_is_a_usage_error() -> None:
    target = subprocess.Popen([sys.executable, "-c", "while True: sum(range(1000))"])
    try:
        time.sleep(0.3)
        out = as_nobody(
            ["sys_ptrace", "dac_read_search"],
            [PYTHON, "-m", "profiler", "profile", "--sampler-realtime", "required",
             "--pid", str(target.pid), "--duration", "1"],
            cwd=REPO,
        )  # fmt: skip
    finally:
        target.kill()
        target.wait()
    assert out.returncode == 2, out.stdout + out.stderr
    assert "real-time sampling is required but not allowed" in out.stderr
    assert "--sampler-realtime off" in out.stderr
