"""`serwatt profile` end to end: real commands, real py-spy, the JSON document,
child following, exit codes, and every bad-input case (exit 2 with a clear message)."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records.store import Recorder
from tests.workloads.targets import find_interpreter

REPO = Path(__file__).resolve().parents[2]
SERWATT = [sys.executable, "-m", "serwatt"]
PY312 = str(find_interpreter(("3.12.1", "3.13.0", "3.12")))
PY310 = str(find_interpreter(("3.10.13", "3.10")))


def serwatt(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERWATT, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def check_document(doc: dict) -> None:
    assert doc["schema"] == "serwatt.profile/1"
    assert set(doc["codepaths"]) == set(CODEPATHS)
    shares = [c["share"] for c in doc["codepaths"].values()]
    assert sum(shares) == pytest.approx(1.0, abs=1e-5)
    assert sum(c["cpu_s"] for c in doc["codepaths"].values()) == pytest.approx(
        doc["cpu_s"], abs=1e-4
    )
    assert doc["samples"] == sum(c["samples"] for c in doc["codepaths"].values())
    for c in doc["codepaths"].values():
        assert set(c) >= {"samples", "cpu_s", "share", "share_ci95", "wall_s", "energy_j",
                          "gpu_wait_s"}  # fmt: skip
        if c["share_ci95"] is not None:
            lo, hi = c["share_ci95"]
            assert 0 <= lo <= c["share"] + 1e-9 and c["share"] - 1e-9 <= hi <= 1
    assert doc["energy"]["source"] in ("rapl", "model", "unavailable")
    assert isinstance(doc["gpus"], list)
    assert {"pyspy_samples", "pyspy_errors", "partial_stacks", "behind_s"} <= set(doc["sampler"])


KNOWN_SHARE = REPO / "tests" / "workloads" / "known_share.py"
# The README's claim for one busy thread: each codepath's CPU share within 2 pp of the
# workload's own thread_time() (bench/accuracy.py --threads 1, at --rate 100).
SHARE_PP = 0.02
# Issue 22's goal for a multi-process job (DataLoader workers): the serializer's CPU within
# 15% of the truth timed in every process. Forked 3.10 children still come out low: json
# -8.5% (share 0.617 against 0.674-0.678) on a quiet fresh clone, -4% to -13% in other
# runs, so the README's one-thread 2 pp does not hold for them yet (issue 22 stays open).
CHILDREN_REL = 0.15
RATE = "100"


def truth_share(truth_file: Path, record: Path, run_id: str) -> tuple[float, float]:
    """The serializer's share of the CPU serwatt sampled, from the workload's own clocks
    (tests/workloads/known_share.py), as (low, high). Each process's work, from `work_at`
    on, is inside serwatt's windows when its first window began before `work_at` (the
    window's CPU snapshot precedes its start, py-spy's banner): the test asserts that.
    The CPU before `work_at` (start-up and the attach sleep) may or may not have been in
    the first window: `high` assumes none of it, `low` all of it. Not stamped at all: a
    few ms after each process's last stamp (a child's record, the truth file, the exit),
    under 0.2% of the CPU."""
    recorder = Recorder(record, readonly=True)
    try:
        windows = recorder.run(run_id).windows
    finally:
        recorder.close()
    first: dict[int, float] = {}
    for w in windows:
        first[w.pid] = min(first.get(w.pid, math.inf), w.started_at)
    serializer = seen_all = seen_work = 0.0
    for p in json.loads(truth_file.read_text())["processes"]:
        assert first.get(p["pid"], math.inf) < p["work_at"], (
            f"serwatt's first window of {p['pid']} began at {first.get(p['pid'])}, after "
            f"its work began at {p['work_at']}: the truth covers more than was sampled"
        )
        serializer += p["serializer_cpu_s"]
        seen_all += p["end_cpu_s"]
        seen_work += p["end_cpu_s"] - p["before_work_cpu_s"]
    return serializer / seen_all, serializer / seen_work


@pytest.mark.serial
def test_profile_command_returns_its_exit_code_and_writes_the_document(tmp_path: Path) -> None:
    truth_file = tmp_path / "truth.json"
    out, record = tmp_path / "p.json", tmp_path / "runs.sqlite"
    r = serwatt(
        "profile", "--rate", RATE, "--json", str(out), "--record", str(record),
        "--run-id", "known-pickle", "--", PY312, str(KNOWN_SHARE), str(truth_file), "pickle",
        "3.0", "6.0", "3",
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    doc = json.loads(out.read_text())
    check_document(doc)
    assert doc["target"]["python"] == subprocess.run(
        [PY312, "-c", "import platform; print(platform.python_version())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert doc["target"]["command"].endswith(" pickle 3.0 6.0 3")
    assert doc["rate_hz"] == float(RATE)
    # Truth: 3 CPU-s of arithmetic then 6 CPU-s of pickle.dumps, a share of ~2/3. The
    # README's 2 pp is for 30 s runs; with 1 + 2 CPU-s the phase and window edges' error
    # (~0.1 s) is 3 pp of the whole (quiet VM: 0.637-0.702 against 0.665 in five runs),
    # with 3 + 6 CPU-s 0.646-0.660.
    low, high = truth_share(truth_file, record, "known-pickle")
    share = doc["codepaths"]["pickle"]["share"]
    assert low - SHARE_PP <= share <= high + SHARE_PP, (share, low, high)
    assert doc["codepaths"]["pickle"]["share_ci95"] is not None
    # the table and the progress line
    assert "pickle" in r.stdout and "share [95% CI]" in r.stdout
    assert "elapsed" in r.stderr and "samples" in r.stderr and "errors" in r.stderr


@pytest.mark.serial
def test_python_children_are_followed(tmp_path: Path) -> None:
    truth_file = tmp_path / "truth.json"
    out, record = tmp_path / "p.json", tmp_path / "runs.sqlite"
    r = serwatt(
        "profile", "--rate", RATE, "--json", str(out), "--record", str(record),
        "--run-id", "known-pool", "--", PY310, str(KNOWN_SHARE), str(truth_file), "pool",
        "0.7", "1.5", "0",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    check_document(doc)
    workers = [t for t in doc["targets"] if t["pid"] != doc["target"]["pid"] and t["samples"]]
    assert len(workers) >= 2, doc["targets"]
    # Truth: two forked children, each 0.7 CPU-s of arithmetic then 1.5 CPU-s of
    # json.dumps, and a parent that waits for them: a json share of ~2/3 of all three.
    low, high = truth_share(truth_file, record, "known-pool")
    share = doc["codepaths"]["json"]["share"]
    assert low * (1 - CHILDREN_REL) <= share <= high * (1 + CHILDREN_REL), (share, low, high)


CHILDREN = """
import subprocess, sys, time
work = (
    "import json, time\\nuntil = time.monotonic() + 2.5\\n"
    "while time.monotonic() < until: json.dumps(list(range(3000)))"
)
plain = subprocess.Popen([sys.executable, "-c", work])
# a Python child whose argv[0] says it is serwatt, as the console script's does
like_serwatt = subprocess.Popen(["serwatt", "-c", work], executable=sys.executable)
sys.exit(plain.wait() or like_serwatt.wait())
"""


def test_children_are_admitted_by_the_daemons_rule(tmp_path: Path) -> None:
    """A profile follows the children the daemon's discovery would admit
    (profiler/sampling/eligible.py): a Python child is sampled, a child that is serwatt
    itself is not (sampling the sampler would bill its cost to the job)."""
    out = tmp_path / "p.json"
    r = serwatt("profile", "--json", str(out), "--", sys.executable, "-c", CHILDREN)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    commands = {t["command"].split(" ", 1)[0]: t for t in doc["targets"]}
    assert set(commands) == {sys.executable}, doc["targets"]
    children = [t for t in doc["targets"] if t["pid"] != doc["target"]["pid"]]
    assert len(children) == 1 and children[0]["samples"] > 0, doc["targets"]


def test_attach_with_pid_and_duration() -> None:
    p = subprocess.Popen(
        [PY310, "-c", "import json\nd=list(range(30000))\nwhile True: s = json.dumps(d)"]
    )
    try:
        time.sleep(0.5)
        t0 = time.time()
        # at the full rate: the sample count below is 3 s of 50 Hz, not the budget's
        r = serwatt("profile", "--pid", str(p.pid), "--duration", "3", "--cpu-budget", "off")
        elapsed = time.time() - t0
        assert p.poll() is None  # attaching never stops the target
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 0, r.stderr
    assert elapsed < 30
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("json"))
    assert int(row.split()[1]) > 50


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile"], "missing command"),
        (["profile", "--"], "missing command"),
        (["profile", "--", "no-such-command-xyz"], "command not found: no-such-command-xyz"),
        (["profile", "--pid", "1", "--", "python"], "either --pid"),
        (["profile", "--rate", "0", "--", "python"], "--rate"),
        (["profile", "--json", "/no/such/dir/x.json", "--", "python"], "does not exist"),
        (["profile", "--pyspy", "/no/such/py-spy", "--", "python"], "not an executable"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], message: str) -> None:
    r = serwatt(*argv)
    assert r.returncode == 2
    assert message in r.stderr


def test_dead_pid_exit_2() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    r = serwatt("profile", "--pid", str(p.pid), "--duration", "1")
    assert r.returncode == 2
    assert f"no such process: {p.pid}" in r.stderr


def test_not_python_pid_exit_2() -> None:
    p = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        r = serwatt("profile", "--pid", str(p.pid), "--duration", "1")
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 2
    assert "not a Python interpreter" in r.stderr


def test_free_threaded_exit_2(tmp_path: Path) -> None:
    fake = tmp_path / "python3.14t"
    shutil.copy("/bin/sleep", fake)
    p = subprocess.Popen([str(fake), "30"])
    try:
        time.sleep(0.2)
        r = serwatt("profile", "--pid", str(p.pid), "--duration", "1")
        r2 = serwatt("profile", "--", str(fake), "2")
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 2 and "free-threaded" in r.stderr
    assert r2.returncode == 2 and "free-threaded" in r2.stderr


def test_no_ptrace_permission_exit_2() -> None:
    p = subprocess.Popen([PY312, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        r = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             *SERWATT, "profile", "--pid", str(p.pid), "--duration", "1"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 2, r.stderr
    assert "CAP_SYS_PTRACE" in r.stderr and "kernel.yama.ptrace_scope" in r.stderr


# SIGTERM is the same path as SIGINT in a second real profile: make check
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.long)]
)
def test_signal_ends_an_attach_profile_with_the_table(sig: signal.Signals, tmp_path: Path) -> None:
    p = subprocess.Popen(
        [PY312, "-c", "import json\nd=list(range(30000))\nwhile True: json.dumps(d)"]
    )
    out = tmp_path / "p.json"
    try:
        time.sleep(0.5)
        s = subprocess.Popen(
            [*SERWATT, "profile", "--pid", str(p.pid), "--json", str(out)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # the signal comes once the progress line counts samples (a fixed sleep let it
        # arrive during start-up on a loaded machine, before the handlers were in place)
        assert s.stderr is not None
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = s.stderr.readline()
            seen.append(line)
            got = re.search(r"(\d+) samples", line)
            if not line or (got and int(got.group(1)) >= 25):
                break
        s.send_signal(sig)
        stdout, rest = s.communicate(timeout=60)
        stderr = "".join(seen) + rest
        assert p.poll() is None  # the target keeps running
    finally:
        p.kill()
        p.wait()
    assert s.returncode == 0, stderr
    assert "share [95% CI]" in stdout
    doc = json.loads(out.read_text())
    assert doc["codepaths"]["json"]["samples"] > 20


def test_a_sampler_that_never_works_is_an_error_and_the_command_still_completes(
    tmp_path: Path,
) -> None:
    """Fault injection: a py-spy that can never read the command. serwatt must not stop
    the user's command for its own failure; it says what failed and exits 1."""
    broken = tmp_path / "py-spy"
    broken.write_text("#!/bin/sh\necho 'Error: Failed to get stack traces'\nexit 1\n")
    broken.chmod(0o755)
    done = tmp_path / "done"
    cmd = f"import pathlib, time; time.sleep(2); pathlib.Path({str(done)!r}).write_text('ok')"
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", "--pyspy", str(broken), "--",
         PY312, "-c", cmd],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "serwatt profile: error:" in r.stderr and "Failed to get stack traces" in r.stderr
    assert "Traceback" not in r.stderr
    assert done.read_text() == "ok"  # the command ran to its end
