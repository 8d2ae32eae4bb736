"""The run record in a directory other users can write (issue 45, items 5 and 11).

SQLite opens the record, and beside it its -journal, -wal and -shm, by name, and resolves
every link in the name first. The record's path was checked, then handed to SQLite by
name: another user flipping a link at the name (in a sticky directory like /tmp, with
fs.protected_symlinks=0, the kernel's default) made root create and write a file where
the link pointed; a link or a file of theirs at a side name (`-shm`) crashed `profile
--record` after the job had started, or gave SQLite their journal to roll back. Now
every directory on the way to the record must be one no other user can change, and in a
shared directory the record and its side files are made by serwatt (or are already its
own) before SQLite is given their name, which the sticky bit then keeps from everyone
else."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serwatt.profiler.records.store import Recorder, RecordError

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
SIDES = ("-journal", "-wal", "-shm")
NAMES = ("runs.sqlite", *(f"runs.sqlite{s}" for s in SIDES))
SYSCTL = Path("/proc/sys/fs/protected_symlinks")


@pytest.fixture()
def shared() -> Iterator[Path]:
    """A directory like /tmp (root's, mode 1777) that user nobody can reach, on a path
    no other user can change."""
    base = Path(tempfile.mkdtemp(prefix="serwatt-shared-", dir="/tmp"))
    try:
        base.chmod(0o755)
        d = base / "shared"
        d.mkdir()
        d.chmod(0o1777)
        (base / "victims").mkdir()
        yield d
    finally:
        shutil.rmtree(base)


@contextlib.contextmanager
def unprotected_symlinks() -> Iterator[None]:
    """fs.protected_symlinks=0 (the kernel's default) for the test: with 1 the kernel
    itself refuses to follow another user's link in a sticky directory, and the race
    would test nothing."""
    before = SYSCTL.read_text().strip()
    if before != "0":
        try:
            SYSCTL.write_text("0")
        except OSError as exc:
            pytest.skip(f"fs.protected_symlinks is {before} and cannot be set here ({exc})")
    try:
        yield
    finally:
        if before != "0":
            SYSCTL.write_text(before)


FLIPPER = r"""
import os, sys, time
os.setgroups([]); os.setgid(65534); os.setuid(65534)
d, victims, until = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
names = sys.argv[4:]
while time.monotonic() < until:
    for name in names:
        link = os.path.join(d, name)
        try:
            os.symlink(os.path.join(victims, name), link)
        except OSError:
            continue  # root's file is there now: the sticky bit keeps it
        try:
            os.unlink(link)
        except OSError:
            pass
"""


def _clear(d: Path) -> None:
    for name in NAMES:
        p = d / name
        if p.exists() and not p.is_symlink():  # root's own: nobody cannot remove it
            p.unlink()


@pytest.mark.parametrize("flipped", [NAMES[:1], NAMES], ids=["the record", "every name"])
def test_a_flipping_link_never_leads_the_record_elsewhere(
    shared: Path, flipped: tuple[str, ...]
) -> None:
    """Another user flips links at the names as fast as they can; the recorder opens,
    writes and closes, again and again. The old code lost the race at the record's own
    name in a few seconds (root created the file the link named) and at a side name
    failed after opening (the job already running)."""
    victims = shared.parent / "victims"
    seconds = 12.0 if len(flipped) == 1 else 5.0
    with unprotected_symlinks():
        flipper = subprocess.Popen(
            [sys.executable, "-c", FLIPPER, str(shared), str(victims), str(seconds), *flipped]
        )
        try:
            opened = refused = 0
            until = time.monotonic() + seconds - 0.5
            while time.monotonic() < until and not any(victims.iterdir()):
                _clear(shared)
                try:
                    rec = Recorder(shared / "runs.sqlite")
                except RecordError as exc:
                    refused += 1
                    assert "runs.sqlite" in str(exc)
                    continue
                with rec:
                    rec.start_run("r", "t", host={}, config={}, sources={})
                    opened += 1
                    # what SQLite holds open is root's, and a file (in WAL mode it
                    # has no -journal: a link the flipper puts there leads nowhere)
                    for name in NAMES[:1] + NAMES[2:]:
                        info = os.lstat(shared / name)
                        assert (info.st_uid, info.st_mode & 0o170000) == (0, 0o100000)
        finally:
            flipper.wait(timeout=seconds + 30)
    assert sorted(p.name for p in victims.iterdir()) == [], (
        f"root followed a planted link ({opened} opened, {refused} refused)"
    )
    assert opened > 0  # the race was run, not just refused


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("planted", ["link", "their file"])
def test_a_side_file_another_user_planted_is_refused_before_the_job_starts(
    shared: Path, side: str, planted: str
) -> None:
    victim = shared.parent / "victims" / "created-by-root"
    name = shared / f"runs.sqlite{side}"
    if planted == "link":
        name.symlink_to(victim)
    else:
        name.write_bytes(b"")  # a hot journal, a WAL or shared memory of theirs
    os.lchown(name, NOBODY, NOBODY)
    marker = shared.parent / "ran"
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", "--nvml", "off", "--record",
         str(shared / "runs.sqlite"), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 2, r.stderr[-3000:]
    assert not marker.exists(), "the job started before the record was refused"
    assert f"runs.sqlite{side}" in r.stderr and "\n" not in r.stderr.strip(), r.stderr
    assert not victim.exists()
    assert sorted(p.name for p in shared.iterdir()) == [name.name]  # nothing left behind


def test_a_record_another_user_owns_or_a_hard_link_in_a_shared_dir_is_refused(
    shared: Path,
) -> None:
    theirs = shared / "runs.sqlite"
    Recorder(theirs).close()
    os.chown(theirs, NOBODY, NOBODY)  # they may replace it with a link at any time
    with pytest.raises(RecordError, match="owned by uid 65534"):
        Recorder(theirs)
    with pytest.raises(RecordError, match="owned by uid 65534"):
        Recorder(theirs, readonly=True)
    os.chown(theirs, 0, 0)
    os.link(theirs, shared / "elsewhere")  # root's file, but a second name may be theirs
    with pytest.raises(RecordError, match="hard link"):
        Recorder(theirs)


def test_a_directory_on_the_way_another_user_can_change_is_refused(tmp_path: Path) -> None:
    """The record's own directory is root's, but the one above it is another user's: they
    could rename it away and put a link in its place between the check and SQLite."""
    theirs = tmp_path / "theirs"
    (theirs / "records").mkdir(parents=True)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(RecordError, match=r"theirs.*owned by uid 65534"):
        Recorder(theirs / "records" / "runs.sqlite")
    assert list((theirs / "records").iterdir()) == []


def test_the_record_in_a_shared_dir_is_still_written_and_read(shared: Path) -> None:
    path = shared / "runs.sqlite"
    with Recorder(path) as rec:
        rec.start_run("r", "t", host={}, config={}, sources={})
        with Recorder(path, readonly=True) as reader:
            assert [r.run_id for r in reader.runs()] == ["r"]
    with Recorder(path, readonly=True) as reader:
        assert [r.run_id for r in reader.runs()] == ["r"]
    assert sorted(p.name for p in shared.iterdir()) == ["runs.sqlite"]


def test_the_record_directory_is_made_without_following_a_planted_link(shared: Path) -> None:
    """record.dir's missing directories are made by the same walk that opens them: a link
    another user put on the way is refused before anything is made where it points."""
    victims = shared.parent / "victims"
    link = shared / "x"
    link.symlink_to(victims)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(RecordError, match="symbolic link owned by uid 65534"):
        Recorder.for_dir(link / "records")
    assert list(victims.iterdir()) == []
    made = shared.parent / "mine" / "a" / "b"  # the honest case: made, root's
    Recorder.for_dir(made).close()
    assert made.is_dir() and made.stat().st_uid == 0


def test_a_record_that_fails_after_the_job_started_is_reported_not_a_crash(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Whatever still makes the record fail once the job runs (a full disk, a query past
    its deadline: here every one), `profile` goes on without it, the job is never
    orphaned, and the end says what the record missed."""
    from serwatt.profiler.attribution.window import AttributedWindow
    from serwatt.profiler.profile.record_sink import RecordSink
    from serwatt.profiler.profile.session import SessionInfo
    from serwatt.profiler.records import store
    from tests.records.test_recorder import window

    path = tmp_path / "runs.sqlite"
    monkeypatch.setattr(store, "_PROGRESS_STEPS", 1)  # the deadline looked at every step
    sink = RecordSink(path, run_id="run-1", host={})  # opened before the job: sound
    monkeypatch.setattr(store, "QUERY_DEADLINE_S", -1.0)  # then every statement stopped
    sink.on_start(SessionInfo(1, "train", 1_800_000_000.0, 50.0, 5.0, Path("/proc")))
    for i in range(3):
        sink.on_window(AttributedWindow(report=window(pid=1, t0=1_800_000_000.0 + 5 * i)))
    sink.on_episodes([])
    with pytest.raises(store.RecordError, match="ran past"):  # so the run exits non-zero
        sink.finish()
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], err
    assert "not recorded" in lines[0] and "3 window(s)" in lines[0], lines[0]
    assert "ran past" in lines[0]  # the first failure, word for word
