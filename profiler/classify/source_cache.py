"""The threaded source cache: target files loaded, prefiltered and indexed off the caller's thread.

A file is opened inside its target's root (target_files.py), looked up in the on-disk
store when one is given (source_store.py), else prefiltered (prefilter.py) and indexed
(source_index.py) and stored, on a loader thread that callers wait on only until their
deadline (SOURCE_WAIT_S), so no file can stall a sampling thread; loader threads are
capped (MAX_LOADS, MAX_LOADS_PER_ROOT). An index is shared by every cache in the
process that reads the same file version. docs/classification.md "Hostile sources".

A file is the target's. One on FUSE, or reached through a link into FUSE, is never
stat'ed or opened (target_files.py: ON_FUSE); one on a network filesystem that stops
answering is, and a load past its wait is *stuck*; it keeps its root's slot (so a root
has at most MAX_LOADS_PER_ROOT threads, stuck or not) but not a node-wide one (so stuck
loads of one target never starve another's). The re-stat of cached files (`revalidate`) runs
on a worker per user the target processes run as (profiler/owned_io.py) and is waited
on at most STAT_WAIT_S: a user whose stat did not answer has its files dropped, and loads
them again under the same caps, so only that user's call sites go `other` (NOT_READY,
the window's classify_timeout). At most MAX_STUCK_PER_USER loads of one user's
processes are stuck at once: a job of many processes has as many roots.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

from serwatt.collectors import mounts
from serwatt.collectors.mounts import OnFuse
from serwatt.profiler.classify.callsite import LineIndex
from serwatt.profiler.classify.prefilter import CallsitePrefilter
from serwatt.profiler.classify.source_index import SourceIndex, SourceTooCostly
from serwatt.profiler.classify.source_store import SourceStore
from serwatt.profiler.classify.target_files import (
    MAX_SOURCE_BYTES,
    decode_source,
    open_source,
    package_of,
    read_fd,
    stat_source,
)
from serwatt.profiler.owned_io import OwnedWorkers, Stuck, user_of

# How long one caller waits for one file's load. A load still running after this is
# not waited on again by anyone: it finishes (or not) in the background.
SOURCE_WAIT_S = 3.0
# Loader threads at once, in all and per target root. A load blocked for good (a
# FUSE file the target serves and never answers) keeps its thread; past these caps
# new files are "not ready" until loads finish, so a target can degrade its own
# call-site classification, not stall sampling or grow the daemon's threads.
MAX_LOADS = 16
MAX_LOADS_PER_ROOT = 4
# How long revalidate waits for the re-stat of every cached file (one worker per user,
# in parallel): local files answer in microseconds.
STAT_WAIT_S = 0.5
# Stuck loads of one user's processes, at most: a job of many processes has
# as many roots, and each root's caps alone would let it hold threads without bound.
MAX_STUCK_PER_USER = 8
# The re-stat of cached files: one worker per user whose processes' files are cached.
_STATS = OwnedWorkers(per_owner=1, name="serwatt-source-stat")

# SourceCache.get's `error` when a load was not waited for (callers tell it apart).
NOT_READY = "source not ready: still loading (not waited on past the deadline)"

_Ident = tuple[int, int, int, int]  # (st_dev, st_ino, mtime_ns, size): one file version


@dataclass
class _Loaded:
    """What one load found (on a loader thread)."""

    key: tuple[int, int] | None  # (mtime_ns, size); None when the file could not be opened
    index: LineIndex | None = None
    error: str | None = None
    filtered: bool = False  # read, and the prefilter found no possible match
    parsed: bool = False  # this load built the index
    shared: bool = False  # the index was built by another load or cache
    too_costly: bool = False
    stored: bool = False  # answered by the on-disk store (an index or a no-match marker)


# Parsed files shared by every SourceCache in the process, keyed by the file's identity
# and version. Targets' frames name their files through /proc/<pid>/root, so each
# process of a job, and each restart, is a new path to the same inode, and the daemon
# keeps one classifier (one SourceCache) per concurrent window: without this, one file
# would be parsed once per (process, classifier) pair and the daemon's RSS would grow
# as processes come and go (docs/daemon.md). Weak values: an index lives as long as
# some cache holds it.
_SHARED: weakref.WeakValueDictionary[_Ident, LineIndex] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()
# Versions being indexed now: a second load of one waits for the first (one parse).
_INDEXING: dict[_Ident, Future[LineIndex]] = {}
# Versions given up as too costly (bounded: oldest forgotten first).
_GIVEN_UP: OrderedDict[_Ident, str] = OrderedDict()
_GIVEN_UP_MAX = 4096
# Loader threads running, in all and per root.
_LOADS_RUNNING: dict[str | None, int] = {}
# When each running load started (by a token): a load running past SOURCE_WAIT_S is
# stuck and no longer holds one of the MAX_LOADS node-wide slots.
_LOAD_STARTS: dict[object, tuple[float, int | None]] = {}  # token -> (started, user)
# Loads finishing, for the wait at exit.
_LOADS_DONE = threading.Condition(_SHARED_LOCK)
# How long the interpreter's exit waits for loads still running. A loader thread left
# running is a daemon thread, and the interpreter ends such a thread where it next takes
# the GIL: inside re2's match (the prefilter), which released it, that ends the process
# with "terminate called without an active exception" (SIGABRT) after serwatt profile
# wrote its results. A load parses one file: seconds at most.
EXIT_WAIT_S = 15.0


def _active(now: float) -> int:
    """Loads running and not yet stuck (under _SHARED_LOCK)."""
    return sum(1 for started, _u in _LOAD_STARTS.values() if now - started < SOURCE_WAIT_S)


def _stuck(now: float, user: int | None) -> int:
    """Stuck loads of one user's processes (under _SHARED_LOCK)."""
    return sum(
        1 for started, u in _LOAD_STARTS.values() if u == user and now - started >= SOURCE_WAIT_S
    )


def loads_running() -> int:
    """Loader threads running now, stuck ones included."""
    with _SHARED_LOCK:
        return len(_LOAD_STARTS)


def wait_for_loads(timeout_s: float, *, stuck_too: bool = True) -> bool:
    """Block until no load runs, at most `timeout_s`; whether none runs.

    stuck_too=False: only loads not yet stuck. A stuck load waits in the kernel on a
    file (FUSE) that may never answer; it is not in re2, and ending the interpreter
    under it is safe, so the exit does not wait for it (the daemon's stop would)."""
    deadline = time.monotonic() + timeout_s
    with _LOADS_DONE:
        while _LOAD_STARTS if stuck_too else _active(time.monotonic()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _LOADS_DONE.wait(min(left, SOURCE_WAIT_S) if not stuck_too else left)
    return True


atexit.register(wait_for_loads, EXIT_WAIT_S, stuck_too=False)


def _index_once(
    ident: _Ident, text: str, path: str, package: str | None, started: float
) -> tuple[LineIndex, SourceIndex | None]:
    """(the shared index, the one built here or None) for one file version; raises what
    indexing raised."""
    with _SHARED_LOCK:
        index = _SHARED.get(ident)
        if index is not None:
            return index, None
        pending = _INDEXING.get(ident)
        if pending is None:
            pending = _INDEXING[ident] = Future()
            mine = True
        else:
            mine = False
    if not mine:
        return pending.result(), None  # on a loader thread: bounded by the CPU budget
    try:
        built = SourceIndex(text, path, package, cpu_started=started)
    except BaseException as exc:
        with _SHARED_LOCK:
            del _INDEXING[ident]
            if isinstance(exc, SourceTooCostly):
                _GIVEN_UP[ident] = str(exc)
                while len(_GIVEN_UP) > _GIVEN_UP_MAX:
                    _GIVEN_UP.popitem(last=False)
        pending.set_exception(exc)
        raise
    with _SHARED_LOCK:
        index = _SHARED.setdefault(ident, built)
        del _INDEXING[ident]
    pending.set_result(index)
    return index, built


def _shared(ident: _Ident, index: LineIndex) -> LineIndex:
    with _SHARED_LOCK:
        return _SHARED.setdefault(ident, index)


# A source whose resolution reaches a FUSE mount, directly or through links: never
# stat'ed or opened (target_files.py). A FUSE request the server has read and never
# answers leaves the thread that made it unkillable, and the daemon with it.
ON_FUSE = f"source not read: {mounts.ON_FUSE}"


def _not_read(exc: OnFuse) -> str:
    return f"source not read: {exc.strerror}"


def _load(
    path: str, root: str | None, prefilter: CallsitePrefilter | None, store: SourceStore | None
) -> _Loaded:
    """Open, read, prefilter and index one file (runs on a loader thread)."""
    started = time.thread_time()
    try:
        fd = open_source(path, root)
    except OnFuse as exc:
        return _Loaded(None, error=_not_read(exc))
    except (OSError, ValueError) as exc:
        return _Loaded(None, error=f"source not readable: {_reason(exc)}")
    try:
        st = os.fstat(fd)
        key = (st.st_mtime_ns, st.st_size)
        ident = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with _SHARED_LOCK:
            index = _SHARED.get(ident)
            given_up = _GIVEN_UP.get(ident)
        if index is not None:
            return _Loaded(key, index, shared=True)
        if given_up is not None:
            return _Loaded(key, error=given_up, too_costly=True)
        data = read_fd(fd, MAX_SOURCE_BYTES)
    except OSError as exc:
        return _Loaded(None, error=f"source not readable: {_reason(exc)}")
    finally:
        os.close(fd)
    try:
        package = package_of(Path(path), root)
        fingerprint = prefilter.fingerprint if prefilter is not None else None
        entry = store.entry(data, package, fingerprint) if store is not None else None
        if entry is not None:
            if entry.no_match():
                return _Loaded(key, filtered=True, stored=True)
            stored = entry.index()
            if stored is not None:
                return _Loaded(key, _shared(ident, stored), stored=True)
        text = decode_source(data)
        if prefilter is not None and not prefilter.may_match(text, package):
            if entry is not None:
                entry.put_no_match()
            return _Loaded(key, filtered=True)
        index, built = _index_once(ident, text, path, package, started)
        if built is not None and entry is not None:
            entry.put_index(built)
        return _Loaded(key, index, parsed=built is not None, shared=built is None)
    except SourceTooCostly as exc:
        return _Loaded(key, error=str(exc), too_costly=True)
    except (OSError, ValueError, SyntaxError, RecursionError, MemoryError) as exc:
        return _Loaded(key, error=f"source not parsed: {type(exc).__name__}: {exc}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def _start_load(
    path: str, root: str | None, prefilter: CallsitePrefilter | None, store: SourceStore | None
) -> Future[_Loaded] | None:
    """A load on its own thread; None when MAX_LOADS (not stuck) or MAX_LOADS_PER_ROOT
    (stuck or not) run, or MAX_STUCK_PER_USER loads of the root's user are stuck."""
    token = object()
    user = user_of(root)
    with _SHARED_LOCK:
        now = time.monotonic()
        if (
            _active(now) >= MAX_LOADS
            or _LOADS_RUNNING.get(root, 0) >= MAX_LOADS_PER_ROOT
            or (root is not None and _stuck(now, user) >= MAX_STUCK_PER_USER)
        ):
            return None
        _LOADS_RUNNING[root] = _LOADS_RUNNING.get(root, 0) + 1
        _LOAD_STARTS[token] = (now, user)
    future: Future[_Loaded] = Future()

    def run() -> None:
        try:
            future.set_result(_load(path, root, prefilter, store))
        except BaseException as exc:  # handed to the waiter, never lost
            future.set_exception(exc)
        finally:
            with _SHARED_LOCK:
                _LOADS_RUNNING[root] -= 1
                if not _LOADS_RUNNING[root]:
                    del _LOADS_RUNNING[root]
                del _LOAD_STARTS[token]
                _LOADS_DONE.notify_all()

    threading.Thread(target=run, name="serwatt-source-load", daemon=True).start()
    return future


def _stat_keys(
    files: list[tuple[str, str | None]],
) -> Callable[[], list[tuple[int, int] | None]]:
    """The re-stat of (path, root) files, for their user's worker."""
    return lambda: [SourceCache._stat_key(p, root) for p, root in files]


@dataclass
class _Entry:
    key: tuple[int, int] | None  # (mtime_ns, size); None when the file could not be stat'ed
    index: LineIndex | None
    error: str | None
    checked_at: float
    # the prefilter read the text and found no possible call-site match: not parsed
    filtered: bool = False


class SourceCache:
    """Parsed sources keyed by path, revalidated by (mtime, size) at most every `stat_ttl_s`.

    A file already parsed by any cache in the process (same inode and version) is
    reused, not parsed again (`shared_hits`).

    `generation` increases whenever a cached file changes, so callers that memoize
    results derived from sources know to drop them.

    Loads run on loader threads; `get` waits for one at most SOURCE_WAIT_S (a load
    running longer is not waited on again) and never past its `deadline`. A source
    not loaded by then is NOT_READY (`not_ready` counts those answers) and asked
    again next time. Not thread-safe: one per sampling thread.
    """

    def __init__(
        self, *, max_files: int = 2048, stat_ttl_s: float = 2.0, store: SourceStore | None = None
    ) -> None:
        self.max_files = max_files
        self.store = store
        self.stat_ttl_s = stat_ttl_s
        self.generation = 0
        self.sweeps = 0
        self.parses = 0
        self.filtered = 0  # files the prefilter read and did not parse
        self.shared_hits = 0  # files another path or cache had parsed already
        self.not_ready = 0  # answers NOT_READY: the load was not waited for
        self.too_costly = 0  # files given up past the CPU budget
        self.stored = 0  # files the on-disk store answered (read, not prefiltered or parsed)
        self.stat_stuck = 0  # cached files dropped: their root's re-stat did not answer
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._roots: dict[str, str | None] = {}  # path -> the root it resolves in
        self._pending: dict[tuple[str, bool], tuple[Future[_Loaded], float]] = {}
        self._last_sweep = time.monotonic()

    @staticmethod
    def _stat_key(path: str, root: str | None) -> tuple[int, int] | None:
        try:
            st = stat_source(path, root)
        except (OSError, ValueError):
            return None
        return (st.st_mtime_ns, st.st_size)

    def revalidate(self, now: float | None = None) -> bool:
        """Re-stat every cached file if the TTL passed; True when something changed.

        The files of each user's processes are stat'ed on that user's worker, at most
        STAT_WAIT_S for all: a user whose stat did not answer (or is still stuck from
        before) has its files dropped (`stat_stuck`), as changed files are."""
        now = time.monotonic() if now is None else now
        if now - self._last_sweep < self.stat_ttl_s:
            return False
        self._last_sweep = now
        self.sweeps += 1
        users: dict[str | None, int | None] = {}
        by_user: dict[int | None, list[tuple[str, str | None]]] = {}
        for path in self._entries:
            root = self._roots.get(path)
            if root not in users:
                users[root] = user_of(root)
            by_user.setdefault(users[root], []).append((path, root))
        sweeps = {user: _STATS.submit(user, _stat_keys(files)) for user, files in by_user.items()}
        deadline = time.monotonic() + STAT_WAIT_S
        changed = False
        for user, files in by_user.items():
            paths = [p for p, _r in files]
            future = sweeps[user]
            try:
                if future is None:
                    raise Stuck(user, "re-stat")
                keys = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except (Stuck, FutureTimeout):
                for path in paths:
                    del self._entries[path]
                self.stat_stuck += len(paths)
                changed = True
                continue
            for path, key in zip(paths, keys, strict=True):
                entry = self._entries[path]
                if key != entry.key:
                    del self._entries[path]
                    changed = True
                else:
                    entry.checked_at = now
        if changed:
            self.generation += 1
        return changed

    def forget(self, prefix: str) -> None:
        """Drop every cached file under `prefix` (a target's root that now is another)."""
        gone = [p for p in self._entries if p.startswith(prefix)]
        for p in gone:
            del self._entries[p]
            self._roots.pop(p, None)
        for slot in [k for k in self._pending if k[0].startswith(prefix)]:
            del self._pending[slot]  # its load may finish; nobody takes its answer
        if gone:
            self.generation += 1

    def get(
        self,
        path: str,
        prefilter: CallsitePrefilter | None = None,
        *,
        root: str | None = None,
        deadline: float | None = None,
    ) -> tuple[LineIndex | None, str | None, int | None]:
        """(index, error, mtime_ns) for one path; the error says why there is no index.

        `root`: `path` starts with it and resolves inside it (a target's
        /proc/<pid>/root); None reads host paths. With `prefilter`, a file whose text
        cannot hold a call-site match is not parsed: (None, None, mtime_ns); without
        it, such a file is parsed now. `deadline` (time.monotonic()): not waited on
        past it; error NOT_READY then.
        """
        entry = self._entries.get(path)
        if entry is not None and not (entry.filtered and prefilter is None):
            self._entries.move_to_end(path)
            return entry.index, entry.error, entry.key[0] if entry.key else None
        slot = (path, prefilter is None)
        pending = self._pending.get(slot)
        if pending is None and deadline is not None and time.monotonic() >= deadline:
            # Not started: nobody would wait for it, and its parse would hold the GIL that
            # the caller, past its deadline, needs to finish (a torch job's first window:
            # 8.5-10.3 s of wall for 1.1-1.3 s of classification, and at 10 s the session
            # gave up on it). The next caller with time left starts it.
            self.not_ready += 1
            return None, NOT_READY, None
        if pending is None:
            future = _start_load(path, root, prefilter, self.store)
            if future is None:
                self.not_ready += 1
                return None, NOT_READY, None
            pending = self._pending[slot] = (future, time.monotonic())
        future, started = pending
        now = time.monotonic()
        wait = SOURCE_WAIT_S - (now - started)
        if deadline is not None:
            wait = min(wait, deadline - now)
        try:
            loaded = future.result(timeout=max(0.0, wait))
        except FutureTimeout:
            self.not_ready += 1
            return None, NOT_READY, None
        finally:
            if future.done():
                del self._pending[slot]
        self.parses += loaded.parsed
        self.shared_hits += loaded.shared
        self.filtered += loaded.filtered
        self.too_costly += loaded.too_costly
        self.stored += loaded.stored
        self._entries[path] = _Entry(
            loaded.key, loaded.index, loaded.error, time.monotonic(), loaded.filtered
        )
        self._roots[path] = root
        self._entries.move_to_end(path)
        if len(self._entries) > self.max_files:
            old, _ = self._entries.popitem(last=False)
            self._roots.pop(old, None)
        return loaded.index, loaded.error, loaded.key[0] if loaded.key else None
