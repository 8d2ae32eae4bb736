"""collectors/fsevents.py: a real inotify watch of a real directory tree."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from serwatt.collectors.fsevents import OPENED, WRITTEN, DirectoryWatch, WatchProcess, name_filter

# the watch in this process, and in the child process `serwatt profile` runs it in
WATCHES = pytest.mark.parametrize("make", [DirectoryWatch, WatchProcess], ids=["thread", "child"])


def _settle(watch: DirectoryWatch | WatchProcess, n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(watch.events()) < n and time.monotonic() < deadline:
        time.sleep(0.01)


@WATCHES
def test_completed_files_through_renames_and_new_subdirectories(tmp_path: Path, make) -> None:
    watch = make(tmp_path)
    watch.start()
    try:
        t0 = time.time()
        (tmp_path / "a.pt").write_bytes(b"x" * 100)  # IN_CLOSE_WRITE
        tmp = tmp_path / ".b.pt.tmp-1"
        tmp.write_bytes(b"y" * 200)  # hidden temp name: ignored
        os.replace(tmp, tmp_path / "b.pt")  # IN_MOVED_TO
        (tmp_path / "c.tmp").write_bytes(b"z")  # *.tmp: ignored
        sub = tmp_path / "step-1"
        sub.mkdir()
        time.sleep(0.3)  # the new directory's watch is added by the thread
        (sub / "c.many").write_bytes(b"w" * 300)
        _settle(watch, 3)  # its size is read before the directory moves
        renamed = tmp_path / "step-1-done"
        sub.rename(renamed)
        time.sleep(0.3)
        (renamed / "d.json").write_bytes(b"v" * 7)
        _settle(watch, 4)
        t1 = time.time()
    finally:
        events = watch.stop()
    written = [(Path(e.path).relative_to(tmp_path).as_posix(), e.bytes) for e in events]
    assert written == [
        ("a.pt", 100),
        ("b.pt", 200),
        ("step-1/c.many", 300),
        ("step-1-done/d.json", 7),
    ]
    assert all(e.kind == WRITTEN and t0 <= e.t <= t1 for e in events)


@WATCHES
def test_open_is_a_read_and_own_opens_are_not_kept(tmp_path: Path, make) -> None:
    f = tmp_path / "ckpt.pt"
    f.write_bytes(b"x" * 10)
    watch = make(tmp_path)
    watch.start()
    try:
        with watch.own_open(str(f)):
            f.read_bytes()  # serwatt's own read of a receipt
        time.sleep(0.3)
        f.read_bytes()  # the job's
        _settle(watch, 1)
    finally:
        events = watch.stop()
    assert [(e.kind, e.path, e.bytes) for e in events] == [(OPENED, str(f), 10)]


def test_a_file_in_a_directory_moved_in_counts_and_links_are_not_followed(
    tmp_path: Path,
) -> None:
    watched = tmp_path / "w"
    watched.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "elsewhere.pt").write_bytes(b"e")
    os.symlink(outside, watched / "link")
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "shard-0.pt").write_bytes(b"s" * 5)
    watch = DirectoryWatch(watched)
    watch.start()
    try:
        (outside / "later.pt").write_bytes(b"l")  # through the link: not under the watch
        staged.rename(watched / "step-2")  # a directory completed elsewhere, moved in
        _settle(watch, 1)
        time.sleep(0.2)
    finally:
        events = watch.stop()
    assert [(Path(e.path).relative_to(watched).as_posix(), e.bytes) for e in events] == [
        ("step-2/shard-0.pt", 5)
    ]


def test_checkpoint_glob() -> None:
    default = name_filter(None)
    assert default("ckpt-1.pt") and not default(".ckpt-1.pt") and not default("x.tmp")
    only_many = name_filter("*.many")
    assert only_many("a.many") and not only_many("a.pt")


def test_events_are_bounded(tmp_path: Path) -> None:
    watch = DirectoryWatch(tmp_path, max_events=3)
    watch.start()
    try:
        for i in range(10):
            (tmp_path / f"f{i}").write_bytes(b"")
        deadline = time.monotonic() + 5
        while watch.dropped < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        events = watch.stop()
    assert len(events) == 3 and watch.dropped == 7


def test_a_directory_that_cannot_be_watched_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot watch"):
        WatchProcess(tmp_path / "missing").start()
