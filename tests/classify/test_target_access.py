"""A target's frames name only what the target itself could read (issue 45 item 15).

serwatt reads sources as root; a target running as `nobody` can name any path in its
frames (a link to a root-only file, or compile() under that file's name). Before, root read
and parsed the file and the call site's serializer showed in the target's figures (and so in
/metrics). Now a file is read only if the target's own fsuid, fsgid and groups may search
every directory on the way and read the file; otherwise its samples are `other`, and the
file is never opened for reading.

Real processes: the target runs as uid 65534 under the system Python (ours lives under
/root), sampled with the real py-spy, classified by a fresh process as the daemon does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.classify import target_files
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.sampling.collect import collect_window, finish_window
from serwatt.profiler.sampling.window import WindowReport
from tests.classify.test_hostile_sources import PICKLE_LOOP, RUNNER, classify_in_child
from tests.daemon_support import stop_process

NOBODY = 65534
GROUP = 4242  # a supplementary group of the target
OTHER_GROUP = 4243  # one it is not in
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the target runs as another uid"),
    pytest.mark.skipif(
        not os.access(SYSTEM_PYTHON, os.X_OK), reason="needs a Python that uid 65534 can run"
    ),
]


@pytest.fixture
def tree() -> Iterator[Path]:
    """A directory every user can enter, holding the cases (pytest's tmp_path is root's
    0700 directory, which the target could not enter at all)."""
    top = Path(tempfile.mkdtemp(prefix="serwatt-access-", dir="/tmp"))
    os.chmod(top, 0o755)
    (top / "runner.py").write_text(RUNNER)
    (top / "workload.txt").write_text(PICKLE_LOOP)

    def source(rel: str, mode: int, gid: int = 0) -> None:
        p = top / rel
        p.write_text(PICKLE_LOOP)
        os.chown(p, 0, gid)
        os.chmod(p, mode)

    source("root_only.py", 0o600)
    source("readable.py", 0o644)
    source("group_mine.py", 0o640, GROUP)
    source("group_other.py", 0o640, OTHER_GROUP)
    closed = top / "closed"
    closed.mkdir(mode=0o700)
    source("closed/open.py", 0o644)
    theirs = top / "theirs"  # the target's own directory, where it plants a link
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    (theirs / "link.py").symlink_to(top / "root_only.py")
    os.lchown(theirs / "link.py", NOBODY, NOBODY)
    own = theirs / "own.py"  # its own file, closed to everyone else
    own.write_text(PICKLE_LOOP)
    os.chown(own, NOBODY, NOBODY)
    os.chmod(own, 0o600)
    try:
        yield top
    finally:
        shutil.rmtree(top)


@contextmanager
def nobody_target(top: Path, frame_path: str) -> Iterator[int]:
    proc = subprocess.Popen(
        [SYSTEM_PYTHON, str(top / "runner.py"), frame_path, str(top / "workload.txt")],
        stdout=subprocess.PIPE,
        text=True,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[GROUP],
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        time.sleep(0.3)
        yield proc.pid
    finally:
        stop_process(proc)
        assert proc.stdout is not None
        proc.stdout.close()


CANNOT = ["root_only.py", "theirs/link.py", "group_other.py", "closed/open.py"]
CAN = ["readable.py", "group_mine.py", "theirs/own.py"]


def test_only_what_the_target_could_read_is_read(tree: Path) -> None:
    with nobody_target(tree, str(tree / "readable.py")) as pid:
        root = f"/proc/{pid}/root"
        for rel in CANNOT:
            with pytest.raises(PermissionError):
                target_files.read_source(Path(root + str(tree / rel)), root)
        for rel in CAN:
            assert target_files.read_source(Path(root + str(tree / rel)), root) == PICKLE_LOOP
        # nor is a file in a directory it cannot search even looked at
        with pytest.raises(PermissionError):
            target_files.stat_source(root + str(tree / "closed/open.py"), root)


@pytest.mark.parametrize("rel", ["theirs/link.py", "root_only.py"])
def test_a_frame_naming_a_root_only_file_classifies_other(tree: Path, rel: str) -> None:
    frame = str(tree / rel)
    with nobody_target(tree, frame) as pid:
        got = classify_in_child(pid, frame, f"/proc/{pid}/root")
    # had root read it, line 4 would be `pickle` (the control below): the figures, and
    # /metrics from them, would tell what the file calls
    assert {cp for cp, _, _ in got} == {"other"}, got
    assert all("cannot read" in how for _, _, how in got), got


def test_control_a_file_the_target_can_read_classifies_pickle(tree: Path) -> None:
    frame = str(tree / "theirs/own.py")
    with nobody_target(tree, frame) as pid:
        got = classify_in_child(pid, frame, f"/proc/{pid}/root")
    assert {cp for cp, _, _ in got} == {"pickle"}, got


# --- a target that has exited before its window is classified -------------------------


def _exited_window(top: Path, frame_path: str) -> WindowReport:
    """A window of a `nobody` target whose frames name `frame_path`, classified after the
    target exited (its /proc/PID gone: its sources are read at host paths)."""
    with nobody_target(top, frame_path) as pid:
        raw = collect_window(pid, duration_s=1.0, plan=SamplingPlan(rate_hz=50, on_cpu_run=True))
    assert not Path(f"/proc/{pid}").exists()
    return finish_window(raw, Classifier.default(), deadline_s=30.0)


def test_an_exited_target_still_reads_only_what_it_could(tree: Path) -> None:
    """Before, an exited target's sources were read at host paths with no check: root
    read the root-only file and the window said `pickle`."""
    report = _exited_window(tree, str(tree / "root_only.py"))
    assert "target exited: sources read from host paths" in report.errors.notes
    samples = sum(cp.samples for cp in report.codepaths.values())
    assert samples > 10, report.codepaths
    assert report.codepaths["pickle"].samples == 0, report.codepaths
    assert report.codepaths["other"].samples == samples, report.codepaths


def test_control_an_exited_target_reads_its_own_file(tree: Path) -> None:
    """Its credentials, remembered while it lived, let it read its own file."""
    report = _exited_window(tree, str(tree / "theirs/own.py"))
    assert "target exited: sources read from host paths" in report.errors.notes
    samples = sum(cp.samples for cp in report.codepaths.values())
    assert samples > 10, report.codepaths
    assert report.codepaths["pickle"].samples >= 0.9 * samples, report.codepaths


def test_a_target_never_seen_alive_has_nothing_read(tree: Path) -> None:
    """No credentials were ever read for this root: nothing of it is read, not even a
    file every user may read."""
    root = target_files.exited_root("/proc/999999999/root")
    with pytest.raises(target_files.TargetCannotRead, match="exited before its credentials"):
        target_files.read_source(Path(root + str(tree / "readable.py")), root)
