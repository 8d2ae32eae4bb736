"""py-spy's scheduling (collectors/sched.py): a 0.1 ms slice and nice -20, set on a real
py-spy and read back from the kernel.

The accuracy effect itself (samples no longer gathering after the target's system
calls) is measured by bench/accuracy.py --threads 2 (--sampler-priority off beside
auto); one 30 s run of that bench's workload here guards it: the README's 3 pp goal for
two busy threads, which default scheduling misses (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from serwatt.collectors import procstat, sched
from serwatt.collectors.pyspy import PySpy, SamplingPlan
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.service.config import ConfigError, parse_config
from tests.benches import load_bench
from tests.collectors.test_pyspy_real import pyspy_children
from tests.daemon_support import PYTHON, daemon_config
from tests.service.test_systemd import as_nobody

REPO = Path(__file__).resolve().parents[2]
# Custom slices arrived in Linux 6.12; on an older kernel every test below checks that
# serwatt says so instead of checking the slice.
KERNEL_HAS_SLICES = sched.get_attr(os.getpid())[2] > 0


def _pyspy_attrs(parent: int, stop: threading.Event, seen: list[tuple[float, tuple]]) -> None:
    """Every 50 ms: (policy, nice, slice) of each thread of each py-spy child of `parent`."""
    while not stop.is_set():
        for pid in pyspy_children(parent):
            for tid in procstat.thread_ids(pid):
                try:
                    seen.append((time.monotonic(), sched.get_attr(tid)))
                except OSError:
                    continue
        stop.wait(0.05)


def _window_attrs(priority: str) -> tuple[set[tuple], tuple[str, ...]]:
    target = subprocess.Popen([sys.executable, "-c", "while True: sum(range(1000))"])
    stop = threading.Event()
    seen: list[tuple[float, tuple]] = []
    watcher = threading.Thread(target=_pyspy_attrs, args=(os.getpid(), stop, seen))
    try:
        time.sleep(0.3)
        watcher.start()
        started = time.monotonic()
        w = PySpy(priority=priority).record_window(
            target.pid, duration_s=2, plan=SamplingPlan(rate_hz=50)
        )
    finally:
        stop.set()
        watcher.join()
        target.kill()
        target.wait()
    assert w.samples, "the window sampled nothing"
    # after py-spy's start-up (its threads exist and the banner re-application is done)
    late = {attr for t, attr in seen if t > started + 0.7}
    assert late, "never saw the py-spy process"
    return late, w.errors.notes


@pytest.mark.serial  # py-spy's scheduling, timed: alone, on a quiet machine
def test_auto_gives_every_pyspy_thread_the_slice_and_nice() -> None:
    assert os.geteuid() == 0, "the test machine runs the suite as root"
    attrs, notes = _window_attrs("auto")
    if KERNEL_HAS_SLICES:
        assert attrs == {(0, sched.NICE, sched.SLICE_NS)}, attrs  # SCHED_OTHER, -20, 0.1 ms
        assert not any("scheduling priority" in n for n in notes), notes
    else:
        assert {a[:2] for a in attrs} == {(0, sched.NICE)}, attrs
        assert any(sched.NO_SLICE in n for n in notes), notes


@pytest.mark.serial  # py-spy's scheduling, timed: alone, on a quiet machine
def test_off_leaves_pyspy_as_it_was_started() -> None:
    attrs, notes = _window_attrs("off")
    assert {a[:2] for a in attrs} == {(0, os.getpriority(os.PRIO_PROCESS, 0))}, attrs
    assert all(a[2] != sched.SLICE_NS for a in attrs), attrs
    assert not any("scheduling priority" in n for n in notes), notes


def test_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="priority must be one of"):
        PySpy(priority="yes")


UNPRIVILEGED = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from serwatt.collectors import sched
    from serwatt.collectors.pyspy import PySpy, SamplingError  # imported while /root is readable
    os.setgroups([]); os.setgid(65534); os.setuid(65534)  # drops every capability
    child = subprocess.Popen(["sleep", "30"])  # same uid as us now
    out = {"nice_problem": sched.nice_problem()}
    try:
        out["with_nice"] = sched.make_prompt(child.pid, nice=True)
        out["without_nice"] = sched.make_prompt(child.pid, nice=False)
        out["attr"] = sched.get_attr(child.pid)
        out["auto"] = PySpy(priority="auto").raise_priority(child.pid)
        try:
            PySpy(priority="required")
            out["required"] = "accepted"
        except SamplingError as exc:
            out["required"] = str(exc)
    finally:
        child.kill()
    print(json.dumps(out))
    """
)


def test_without_cap_sys_nice_the_slice_still_applies_and_required_names_the_fix() -> None:
    out = subprocess.run(
        [sys.executable, "-c", UNPRIVILEGED],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["nice_problem"] == "nice -20 not allowed (no CAP_SYS_NICE, RLIMIT_NICE below 40)"
    # the kernel, not serwatt, refuses the nice
    assert r["with_nice"] == ["sched_setattr was refused (EPERM)"]
    policy, nice, slice_ns = r["attr"]
    assert (policy, nice) == (0, os.getpriority(os.PRIO_PROCESS, 0))  # nice kept
    if KERNEL_HAS_SLICES:
        assert r["without_nice"] == [] and slice_ns == sched.SLICE_NS  # no privilege needed
        assert r["auto"] == r["nice_problem"]
    else:
        assert r["without_nice"] == [sched.NO_SLICE]
        assert r["auto"] == f"{r['nice_problem']}; {sched.NO_SLICE}"
    assert "CAP_SYS_NICE" in r["required"] and "sampler_priority: false" in r["required"]


@pytest.mark.parametrize(
    ("rlimit_nice", "capeff", "allowed"),
    [
        (0, "0000000000000000", False),
        (39, "0000000000000000", False),  # down to nice -19 only
        (0, f"{1 << sched.CAP_SYS_NICE:016x}", True),  # the capability alone
        (40, "0000000000000000", True),  # RLIMIT_NICE alone (root here cannot raise it)
    ],
)
def test_nice_permission_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rlimit_nice: int, capeff: str, allowed: bool
) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(f"Name:\tx\nCapEff:\t{capeff}\n")
    monkeypatch.setattr(sched.resource, "getrlimit", lambda _r: (rlimit_nice, rlimit_nice))
    assert (sched.nice_problem(tmp_path) is None) == allowed


@pytest.mark.parametrize(
    ("value", "mode"), [("auto", "auto"), ("true", "required"), ("false", "off")]
)
def test_config_key(tmp_path: Path, value: str, mode: str) -> None:
    text = f"sampler_priority: {value}\ntargets:\n  - name: t\n    match: {{cmdline: x}}\n"
    assert parse_config(text, tmp_path / "c.yaml").sampler_priority == mode


def test_config_key_bad_value_names_the_key_and_line(tmp_path: Path) -> None:
    text = "targets:\n  - name: t\n    match: {cmdline: x}\nsampler_priority: sometimes\n"
    with pytest.raises(ConfigError) as ei:
        parse_config(text, tmp_path / "c.yaml")
    (problem,) = ei.value.problems
    assert problem.key_path == "sampler_priority" and problem.line == 4
    assert "auto, required, off, true, false" in problem.message


def test_daemon_exits_78_when_priority_is_required_but_not_allowed(tmp_path: Path) -> None:
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(daemon_config(tmp_path / "runs", {"t": "x"}, sampler_priority=True))
    # the unit's capabilities without CAP_SYS_NICE
    proc = as_nobody(
        ["sys_ptrace", "dac_read_search"],
        [PYTHON, "-m", "serwatt", "daemon", "--config", str(cfg)],
        cwd=REPO,
    )
    assert proc.returncode == 78, proc.stderr
    assert "sampler priority is required but not allowed" in proc.stderr
    assert "CAP_SYS_NICE" in proc.stderr


WITH_UNIT_CAPS = textwrap.dedent(
    """
    import subprocess, sys
    from serwatt.collectors import sched
    from serwatt.collectors.pyspy import PySpy, SamplingPlan
    child = subprocess.Popen(["sleep", "30"])
    try:
        print("made", sched.make_prompt(child.pid, nice=True), sched.get_attr(child.pid)[1])
    finally:
        child.kill()
    plan = SamplingPlan(rate_hz=50)
    w = PySpy(priority="required").record_window(int(sys.argv[1]), duration_s=1, plan=plan)
    print("samples", len(w.samples), "notes", list(w.errors.notes))
    """
)


@pytest.mark.serial  # py-spy's scheduling, timed: alone, on a quiet machine
def test_the_unit_capabilities_allow_the_sampler_priority() -> None:
    """As the unit runs it (nobody + CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_SYS_NICE):
    py-spy can be given nice -20, and a window with the priority required samples a root
    target."""
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
    if KERNEL_HAS_SLICES:
        assert out.returncode == 0, out.stdout + out.stderr
        assert "made [] -20" in out.stdout
        assert "notes []" in out.stdout and "samples 0 " not in out.stdout, out.stdout
    else:
        assert out.returncode != 0 and sched.NO_SLICE in out.stderr, out.stdout + out.stderr


def test_profile_required_without_the_privilege_is_a_usage_error() -> None:
    target = subprocess.Popen([sys.executable, "-c", "while True: sum(range(1000))"])
    try:
        time.sleep(0.3)
        out = as_nobody(
            ["sys_ptrace", "dac_read_search"],
            [PYTHON, "-m", "serwatt", "profile", "--sampler-priority", "required",
             "--pid", str(target.pid), "--duration", "1"],
            cwd=REPO,
        )  # fmt: skip
    finally:
        target.kill()
        target.wait()
    assert out.returncode == 2, out.stdout + out.stderr
    assert "sampler priority is required but not allowed" in out.stderr
    assert "--sampler-priority off" in out.stderr


@pytest.mark.serial  # py-spy's scheduling, timed: alone, on a quiet machine
@pytest.mark.skipif(not KERNEL_HAS_SLICES, reason="the 0.1 ms slice needs Linux 6.12")
def test_samples_do_not_gather_after_the_targets_system_calls() -> None:
    """The regression test of the sampler's scheduling: two busy threads timing their
    own pickle/json/protobuf/msgpack calls with time.thread_time() (bench/accuracy.py's
    mix workload, 30 s of 5 s windows at 100 Hz, as `serwatt profile` samples). With
    py-spy at default priority its wake-ups follow the target's system calls, so the
    lines after the thread_time() calls (`other`) get too many samples: `other`
    +5.2 to +6.2 pp in four 30 s runs on the quiet development VM, +0.9 and +1.8 pp
    with the slice and nice -20 (docs/benchmarks.md). Asserted: `other` within the
    README's 3 pp goal. (The serializers' own errors vary more from run to run at
    30 s, up to 3.4 pp: the bench gives their interval.)"""
    bench = load_bench("accuracy")
    args = argparse.Namespace(
        rate=100.0, window=5.0, duration=30.0, on_cpu_run=True, sampler_priority="auto",
        timing_rate=None,
    )  # fmt: skip
    true, doc = bench.profile_once(
        args, Classifier.default(), script=bench.WORKLOAD, script_args=["2"],
        keys=bench.MIX_CODEPATHS,
    )  # fmt: skip
    errors = {
        cp: round((doc["codepaths"][cp]["share"] - true[cp]) * 100, 2)
        for cp in (*bench.MIX_CODEPATHS, "other")
    }
    assert abs(errors["other"]) <= 3.0, errors
