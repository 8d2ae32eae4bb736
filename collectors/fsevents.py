"""File events under a checkpoint directory, from inotify: which files were completed and
opened for reading, and when.

A checkpoint is a file a job wrote. inotify says so without guessing: IN_CLOSE_WRITE when a
file opened for writing is closed, IN_MOVED_TO when a file is renamed into place (the
atomic temp-file-then-rename every durable writer uses). IN_OPEN marks a read (a restore
opens its checkpoint) once the same file's IN_CLOSE_NOWRITE shows the open was not for
writing (an open whose close is IN_CLOSE_WRITE was the writer's); it is stamped at the
open. inotify events carry no time, so each is stamped with the host clock (time.time(),
the clock episodes use) when the watch reads it: a blocking poll on the inotify
descriptor, so the stamp is late by the reader's wake-up. In serwatt's own process that
reader would wait for the GIL behind classification (a json.loads of a py-spy window holds
it for as long as it takes: stamps 0.15 s late were seen), so `WatchProcess` runs the
watch in a child process of its own, where nothing else holds its GIL: its stamps are
late by the scheduler's wake-up only. Events read together share one stamp.

The directory is the job's, so what it holds is hostile:
- watches are added for DIR and each directory under it, never through a link
  (IN_DONT_FOLLOW | IN_ONLYDIR), at most `max_watches`;
- a directory created or renamed in later is watched as it appears (and what it already
  holds is listed once, since files may land in it before the watch is added);
- a renamed directory keeps its watch (inotify watches inodes) and its path follows;
- at most `max_events` events are kept; the rest are counted in `dropped`, as are the
  events the kernel itself dropped (IN_Q_OVERFLOW: `overflows`);
- a file's size is taken with lstat right after the event (None when it is gone, or is
  not a regular file).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from inotify_simple import INotify, flags

from serwatt.collectors.mounts import read_mounts

WRITTEN = "written"
OPENED = "opened"
MAX_WATCHES = 10_000
MAX_EVENTS = 200_000
_POLL_MS = 200  # how often the thread looks at its stop flag while nothing happens

_DIR_MASK = (
    flags.CLOSE_WRITE
    | flags.MOVED_TO
    | flags.MOVED_FROM
    | flags.CREATE
    | flags.OPEN
    | flags.CLOSE_NOWRITE
    | flags.DELETE_SELF
    | flags.DONT_FOLLOW
    | flags.ONLYDIR
)


# Files a job's logger writes next to its checkpoints, which no save writes: TensorBoard's
# event files (a Trainer's logging_dir is under its output_dir by default).
NOT_CHECKPOINTS = ("events.out.tfevents.",)


# Hidden names that are checkpoint files: torch.distributed.checkpoint's FileSystemWriter
# renames its metadata into place as `.metadata` after the data files, and its save
# returns right after (without it, a DCP save's stall ended at its last data file).
HIDDEN_CHECKPOINTS = frozenset({".metadata"})


def default_name_filter(name: str) -> bool:
    """A checkpoint name: not hidden (`.ckpt.tmp-…`) but for HIDDEN_CHECKPOINTS, not a temp
    file (`*.tmp`), not a logger's (NOT_CHECKPOINTS)."""
    if name in HIDDEN_CHECKPOINTS:
        return True
    hidden_or_temp = name.startswith(".") or name.endswith(".tmp")
    return not hidden_or_temp and not name.startswith(NOT_CHECKPOINTS)


def name_filter(glob: str | None) -> Callable[[str], bool]:
    """The names that count as checkpoints: those matching `glob` (fnmatch, case
    sensitive, on the file name), or the default rule when `glob` is None."""
    if glob is None:
        return default_name_filter
    return lambda name: fnmatch.fnmatchcase(name, glob)


@dataclass(frozen=True)
class FileEvent:
    """A file under the watched directory completed (`written`) or opened (`opened`).

    t: epoch seconds when the watch read the event; path: the file's path when it
    happened; bytes: its size right after (None: gone, or not a regular file)."""

    t: float
    kind: str
    path: str
    bytes: int | None


class DirectoryWatch:
    """An inotify watch of a directory tree, read on a thread of its own.

        watch = DirectoryWatch(Path("ckpt"))
        watch.start()          # before the job starts: nothing it writes is missed
        ...
        events = watch.stop()  # every event, in the order read

    Raises OSError from start() when inotify cannot watch the directory (not one, no
    permission, inotify instances exhausted)."""

    def __init__(
        self,
        root: Path,
        *,
        include: Callable[[str], bool] = default_name_filter,
        max_watches: int = MAX_WATCHES,
        max_events: int = MAX_EVENTS,
        on_event: Callable[[FileEvent], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.include = include
        self.on_event = on_event  # each event kept, as it is kept (on the watch's thread)
        self.max_watches = max_watches
        self.max_events = max_events
        self.dropped = 0  # events not kept (over max_events)
        self.overflows = 0  # IN_Q_OVERFLOW: the kernel dropped events
        self.unwatched_dirs = 0  # directories not watched (over max_watches, or vanished)
        self._events: list[FileEvent] = []
        self._paths: dict[int, str] = {}  # watch descriptor -> directory path
        self._own_opens: dict[str, int] = {}  # path -> opens of ours still to be seen
        self._open: dict[str, list[float]] = {}  # path -> times of opens not yet closed
        self._open_count = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._barriers: list[threading.Event] = []
        self._inotify: INotify | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- control

    def start(self) -> None:
        self._inotify = INotify()
        try:
            self._add_tree(str(self.root), required=True)
        except OSError:
            self._inotify.close()
            self._inotify = None
            raise
        self._thread = threading.Thread(target=self._run, name="serwatt-fsevents", daemon=True)
        self._thread.start()

    def stop(self) -> list[FileEvent]:
        """Stop watching (after reading what is pending); every event kept, in order."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._inotify is not None:
            self._drain(timeout_ms=0)
            self._inotify.close()
            self._inotify = None
        # opens never seen closed (the watch ended first) are taken as reads
        for path, times in sorted(self._open.items()):
            for t in times:
                self._keep(FileEvent(t, OPENED, path, _size(path)))
        self._open.clear()
        with self._lock:
            self._events.sort(key=lambda e: e.t)
        return self.events()

    def events(self) -> list[FileEvent]:
        with self._lock:
            return list(self._events)

    @contextmanager
    def own_open(self, path: str) -> Iterator[None]:
        """Around an open of `path` by this process (serwatt reading a receipt): that
        open is not the job's, so the next open event of `path` is not kept."""
        key = os.path.abspath(path)
        with self._lock:
            self._own_opens[key] = self._own_opens.get(key, 0) + 1
        yield

    # ---------------------------------------------------------------- watches

    def _add_watch(self, path: str, *, required: bool = False) -> bool | None:
        """Watch a directory: None when it is not watched, True when it already was (a
        directory renamed inside the tree), False when it is new."""
        assert self._inotify is not None
        if len(self._paths) >= self.max_watches:
            self.unwatched_dirs += 1
            return None
        try:
            wd = self._inotify.add_watch(path, _DIR_MASK)
        except OSError:
            if required:
                raise
            self.unwatched_dirs += 1
            return None
        old = self._paths.get(wd)
        if old is not None and old != path:
            # the same inode under a new name: a renamed directory; its subtree follows
            prefix = old + os.sep
            for other, p in list(self._paths.items()):
                if p.startswith(prefix):
                    self._paths[other] = path + os.sep + p[len(prefix) :]
        self._paths[wd] = path
        return old is not None

    def _add_tree(self, top: str, *, required: bool = False, seen_t: float | None = None) -> None:
        """Watch `top` and every directory under it (links not followed); with `seen_t`,
        files already there count as written at `seen_t` (they landed before the watch)."""
        stack = [top]
        first = True
        mounts = _mount_points()
        while stack:
            d = stack.pop()
            if os.path.abspath(d) in mounts and (not first or not required):
                # Another filesystem under DIR (a FUSE mount the job serves may never
                # answer a listing): not watched, as `find -xdev`.
                self.unwatched_dirs += 1
                first = False
                continue
            known = self._add_watch(d, required=required and first)
            first = False
            if known is None:
                continue
            if known:
                continue  # renamed inside the tree: its files and subdirectories are watched
            try:
                with os.scandir(d) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif seen_t is not None and self.include(entry.name):
                            self._keep(FileEvent(seen_t, WRITTEN, entry.path, _size(entry.path)))
            except OSError:
                continue

    # ---------------------------------------------------------------- reading

    def barrier(self) -> threading.Event:
        """Set once every event inotify holds now has been read and kept."""
        done = threading.Event()
        with self._lock:
            self._barriers.append(done)
        return done

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                barriers, self._barriers = self._barriers, []
            self._drain(timeout_ms=0 if barriers else _POLL_MS)
            for b in barriers:
                b.set()
        with self._lock:
            barriers, self._barriers = self._barriers, []
        for b in barriers:
            b.set()

    def _drain(self, *, timeout_ms: int) -> None:
        assert self._inotify is not None
        try:
            raw = self._inotify.read(timeout=timeout_ms)
        except OSError:
            return
        t = time.time()
        for ev in raw:
            self._handle(ev.wd, ev.mask, ev.name, t)

    def _handle(self, wd: int, mask: int, name: str, t: float) -> None:
        if mask & flags.Q_OVERFLOW:
            self.overflows += 1
            return
        if mask & flags.IGNORED:
            self._paths.pop(wd, None)
            return
        directory = self._paths.get(wd)
        if directory is None or not name:
            return
        path = os.path.join(directory, name)
        if mask & flags.ISDIR:
            if mask & (flags.CREATE | flags.MOVED_TO):
                self._add_tree(path, seen_t=t)
            return
        if not self.include(name):
            return
        if mask & (flags.CLOSE_WRITE | flags.MOVED_TO):
            if mask & flags.CLOSE_WRITE:
                self._closed(path)  # that open was the writer's
            self._keep(FileEvent(t, WRITTEN, path, _size(path)))
        elif mask & flags.OPEN:
            key = os.path.abspath(path)
            with self._lock:
                own = self._own_opens.get(key, 0)
                if own:
                    if own == 1:
                        del self._own_opens[key]
                    else:
                        self._own_opens[key] = own - 1
                    return
            if self._open_count >= self.max_events:
                self.dropped += 1
                return
            self._open.setdefault(path, []).append(t)
            self._open_count += 1
        elif mask & flags.CLOSE_NOWRITE:
            opened = self._closed(path)
            if opened is not None:
                self._keep(FileEvent(opened, OPENED, path, _size(path)))

    def _closed(self, path: str) -> float | None:
        """The time of the earliest open of `path` not yet closed, now closed."""
        times = self._open.get(path)
        if not times:
            return None
        self._open_count -= 1
        t = times.pop(0)
        if not times:
            del self._open[path]
        return t

    def _keep(self, event: FileEvent) -> None:
        with self._lock:
            if len(self._events) >= self.max_events:
                self.dropped += 1
                return
            self._events.append(event)
        if self.on_event is not None:
            self.on_event(event)


class _SharedChild:
    """One watching child process (`python -m serwatt.collectors.fsevents DIR`) and the
    WatchProcess views it feeds: every view of one (DIR, glob) shares it, so a target
    whose every process is a run of its own still has one watcher (issue 45: one
    interpreter per process ran the unit out of memory and tasks)."""

    def __init__(self, key: tuple[str, str | None]) -> None:
        self.key = key
        self.views: list[WatchProcess] = []
        self.ready = threading.Event()  # the child watches DIR (or failed: `error`)
        self.error: str | None = None
        self.counters = {"dropped": 0, "overflows": 0, "unwatched_dirs": 0}
        self._synced = threading.Condition()
        self._sync_sent = self._sync_seen = 0
        root, glob = key
        argv = [sys.executable, "-m", "serwatt.collectors.fsevents", root]
        if glob is not None:
            argv += ["--glob", glob]
        here = os.path.dirname(
            os.path.dirname(os.path.abspath(sys.modules["serwatt"].__file__ or ""))
        )
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self._reader = threading.Thread(target=self._read, name="serwatt-fsevents", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "ready" in msg or "error" in msg:
                self.error = msg.get("error")
                self.ready.set()
            elif "synced" in msg or "done" in msg:
                self.counters = {k: int(v) for k, v in (msg.get("synced") or msg["done"]).items()}
                with self._synced:
                    self._sync_seen += 1
                    self._synced.notify_all()
            else:
                ev = FileEvent(float(msg["t"]), str(msg["kind"]), str(msg["path"]), msg["bytes"])
                with _SHARED_LOCK:
                    views = list(self.views)
                for view in views:
                    view._deliver(ev)
        if not self.ready.is_set():
            self.error = self.error or f"the watch of {self.key[0]} ended before it started"
            self.ready.set()

    def sync(self, timeout_s: float) -> bool:
        """Wait until the child has read what inotify holds now (its events are then
        delivered); False when it did not answer in time (its directory is then
        unresponsive, never waited on again)."""
        if self.key in _UNRESPONSIVE or self.error is not None or not self.ready.is_set():
            return False
        with self._synced:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("sync\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):
                return False
            self._sync_sent += 1
            want = self._sync_sent
            if not self._synced.wait_for(lambda: self._sync_seen >= want, timeout_s):
                with _SHARED_LOCK:
                    _UNRESPONSIVE.add(self.key)
                return False
        return True

    def close(self, timeout_s: float) -> None:
        """End the child: it stops on EOF; past `timeout_s` (or at once when it is known
        stuck in DIR) it is killed, and not waited for: a process in a FUSE request the
        server has read ends only once the server answers or dies (the kernel waits
        uninterruptibly then, SIGKILL or not). Such a child is kept in _LINGERING, and
        its directory gets no other child while it lives."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        stuck = self.key in _UNRESPONSIVE or not self.ready.is_set()
        try:
            self.proc.wait(timeout=0 if stuck else timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.05)
        if self.proc.poll() is None:
            with _SHARED_LOCK:
                _LINGERING[self.key] = self
            return
        self._reader.join(timeout=timeout_s)


# (DIR, glob) -> the child watching it, while some WatchProcess uses it.
_CHILDREN: dict[tuple[str, str | None], _SharedChild] = {}
_SHARED_LOCK = threading.Lock()
# Directories whose child once left a sync unanswered (stuck in DIR): their children
# are never waited on again; what they had not read is lost to that target alone.
_UNRESPONSIVE: set[tuple[str, str | None]] = set()
# Children killed while stuck in their directory and not ended yet (see close()).
_LINGERING: dict[tuple[str, str | None], _SharedChild] = {}
READY_TIMEOUT_S = 10.0  # a child that has not listed DIR by then is stuck in it
SYNC_TIMEOUT_S = 2.0  # a child that has not read its pending events by then is stuck
STOP_TIMEOUT_S = 3.0  # a child that has not ended by then is killed


class WatchProcess:
    """A DirectoryWatch run in a child process (`python -m serwatt.collectors.fsevents DIR`), so
    that its stamps do not wait for this process's GIL. Same interface as DirectoryWatch.

    Views of one (DIR, glob) share one child (_SharedChild): each gets the events read
    from its start() to its stop(). The child writes one JSON line per event; a view's
    stop() asks it to read what inotify holds first (`sync`, at most SYNC_TIMEOUT_S),
    and the last view's stop ends it (killed past STOP_TIMEOUT_S).

    start(): with wait=True (serwatt profile: before the job starts, so nothing it
    writes is missed) waits at most `ready_timeout_s` for the child to watch DIR and
    raises OSError when it cannot (not a directory, no permission, or stuck in it: a
    FUSE mount the job serves). With wait=False (the daemon's main loop) it returns at
    once; `wait_ready` then says whether the watch is up, and a watch that never came
    up has no events."""

    def __init__(
        self,
        root: Path,
        *,
        glob: str | None = None,
        max_events: int = MAX_EVENTS,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.root = Path(root)
        self.glob = glob
        self.max_events = max_events
        self.ready_timeout_s = ready_timeout_s
        self.dropped = self.overflows = self.unwatched_dirs = 0
        self.error: str | None = None
        self._events: list[FileEvent] = []
        self._own_opens: dict[str, int] = {}
        self._lock = threading.Lock()
        self._child: _SharedChild | None = None
        self._last_child: _SharedChild | None = None  # after stop: own_open tells its views
        self._started_at = 0.0

    def start(self, *, wait: bool = True) -> None:
        key = (os.path.abspath(self.root), self.glob)
        with _SHARED_LOCK:
            stuck = _LINGERING.get(key)
            if stuck is not None and stuck.proc.poll() is None:
                self.error = f"an earlier watch of {self.root} is still stuck in it"
                if wait:
                    raise OSError(self.error)
                return
            _LINGERING.pop(key, None)
            child = _CHILDREN.get(key)
            if child is None or child.proc.poll() is not None or child.error is not None:
                child = _CHILDREN[key] = _SharedChild(key)
            child.views.append(self)
        self._child = child
        self._started_at = time.monotonic()
        if wait and not self.wait_ready(self.ready_timeout_s):
            error = self.error or f"the watch of {self.root} did not start"
            self.stop()
            raise OSError(error)

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the child watches DIR, waiting at most `timeout_s` (and never past
        `ready_timeout_s` from start())."""
        child = self._child or self._last_child
        if child is None:
            return False
        left = self.ready_timeout_s - (time.monotonic() - self._started_at)
        child.ready.wait(max(0.0, min(timeout_s, left)))
        if not child.ready.is_set():
            self.error = f"the watch of {self.root} did not start in {self.ready_timeout_s:g} s"
            return False
        self.error = child.error
        return child.error is None

    def _deliver(self, ev: FileEvent) -> None:
        with self._lock:
            if ev.kind == OPENED:
                key = os.path.abspath(ev.path)
                own = self._own_opens.get(key, 0)
                if own:
                    self._own_opens[key] = own - 1
                    return
            if len(self._events) >= self.max_events:
                self.dropped += 1
                return
            self._events.append(ev)

    def stop(self) -> list[FileEvent]:
        child, self._child = self._child, None
        self._last_child = child
        if child is not None:
            if child.ready.is_set():
                child.sync(SYNC_TIMEOUT_S)
            with _SHARED_LOCK:
                child.views.remove(self)
                last = not child.views
                if last and _CHILDREN.get(child.key) is child:
                    del _CHILDREN[child.key]
            if last:
                child.close(STOP_TIMEOUT_S)
            counters = child.counters
            self.dropped += counters["dropped"]
            self.overflows = counters["overflows"]
            self.unwatched_dirs = counters["unwatched_dirs"]
        with self._lock:
            self._events.sort(key=lambda e: e.t)
        return self.events()

    def events(self) -> list[FileEvent]:
        with self._lock:
            return list(self._events)

    @property
    def pid(self) -> int | None:
        """The watching child's pid while it runs (None before start or after stop)."""
        child = self._child
        return child.proc.pid if child is not None and child.proc.poll() is None else None

    @contextmanager
    def own_open(self, path: str) -> Iterator[None]:
        """As DirectoryWatch.own_open, for every view of the child (the open is none of
        theirs), this one's after its stop too."""
        key = os.path.abspath(path)
        child = self._child or self._last_child
        with _SHARED_LOCK:
            views = {id(v): v for v in ([self] + (child.views if child else []))}
        for view in views.values():
            with view._lock:
                view._own_opens[key] = view._own_opens.get(key, 0) + 1
        yield


def close_all(timeout_s: float = STOP_TIMEOUT_S) -> None:
    """End every child at once (their views keep what they had): the daemon is ending."""
    with _SHARED_LOCK:
        children = list(_CHILDREN.values())
        _CHILDREN.clear()
    for child in children:
        with contextlib.suppress(OSError, ValueError):
            assert child.proc.stdin is not None
            child.proc.stdin.close()
    deadline = time.monotonic() + timeout_s
    for child in children:
        child.close(max(0.0, deadline - time.monotonic()))


def _child(argv: list[str]) -> int:
    """The child of WatchProcess: watch argv[0] until stdin closes."""
    glob = argv[2] if len(argv) >= 3 and argv[1] == "--glob" else None
    out = sys.stdout
    lock = threading.Lock()

    def emit(msg: dict) -> None:
        with lock, contextlib.suppress(BrokenPipeError):  # the parent is gone
            out.write(json.dumps(msg) + "\n")
            out.flush()

    watch = DirectoryWatch(
        Path(argv[0]),
        include=name_filter(glob),
        on_event=lambda e: emit({"t": e.t, "kind": e.kind, "path": e.path, "bytes": e.bytes}),
    )
    try:
        watch.start()
    except OSError as exc:
        emit({"error": f"cannot watch {argv[0]}: {exc.strerror or exc}"})
        return 1
    emit({"ready": True})

    def counters() -> dict[str, int]:
        return {"dropped": watch.dropped, "overflows": watch.overflows,
                "unwatched_dirs": watch.unwatched_dirs}  # fmt: skip

    for line in sys.stdin:  # until the parent closes it
        if line.strip() == "sync":
            watch.barrier().wait()
            emit({"synced": counters()})
    watch.stop()
    emit({"done": counters()})
    return 0


def _mount_points() -> frozenset[str]:
    """Every mount point of this process's namespace (procfs: never blocks)."""
    return frozenset(m.point for m in read_mounts())


def _size(path: str) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
