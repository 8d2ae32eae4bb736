"""I/O on files a target controls, with a deadline, on workers owned by that target.

A job controls its pid file, its sources and its checkpoint directory, and any user can
put a FUSE filesystem it serves under them: an open, stat or read there can then block
for good, whatever flags it is given (O_NONBLOCK means nothing to a FUSE request), and
no thread stuck in such a call can be interrupted. So serwatt never makes such a call on
a thread that serves more than one target (the daemon's main loop, a shared classifier):
it runs it here, on a thread of its own counted against its owner (a target, a target
process's root), and waits at most a deadline.

A call not done by then raises `Stuck` and is left running; its thread counts against
its owner until it returns, and an owner with `per_owner` calls in flight gets `Stuck` at
once, without a new thread. So one target's stuck files cost that target its own
figures (the caller counts them in its window notes and
`serwatt_sampler_errors_total{kind=...}`), never the caller's time past the deadline,
never another owner's calls, and never more than `per_owner` threads per owner.

Outside the layers, like profiler/safeio.py: every layer may import it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

T = TypeVar("T")

STUCK = "stuck"  # the error kind callers count a Stuck under


class Stuck(OSError):
    """The call did not answer by its deadline, or its owner's workers are all stuck."""

    def __init__(self, owner: Hashable, what: str) -> None:
        super().__init__(errno.ETIMEDOUT, f"{what} did not answer in time (owner {owner!r})")
        self.owner = owner


class OwnedWorkers:
    """See the module docstring. Thread-safe; one per kind of I/O is enough."""

    def __init__(self, *, per_owner: int = 1, name: str = "serwatt-owned-io") -> None:
        self.per_owner = per_owner
        self.name = name
        self._lock = threading.Lock()
        self._running: dict[Hashable, int] = {}

    def running(self, owner: Hashable) -> int:
        """Calls of `owner` not returned yet (stuck ones included)."""
        with self._lock:
            return self._running.get(owner, 0)

    def threads(self) -> int:
        """Calls not returned yet, over every owner."""
        with self._lock:
            return sum(self._running.values())

    def submit(self, owner: Hashable, fn: Callable[[], T]) -> Future[T] | None:
        """`fn` started on a thread of `owner`'s; None when `per_owner` of them run."""
        with self._lock:
            if self._running.get(owner, 0) >= self.per_owner:
                return None
            self._running[owner] = self._running.get(owner, 0) + 1
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the waiter, never lost
                future.set_exception(exc)
            finally:
                with self._lock:
                    self._running[owner] -= 1
                    if not self._running[owner]:
                        del self._running[owner]

        threading.Thread(target=run, name=self.name, daemon=True).start()
        return future

    def call(self, owner: Hashable, fn: Callable[[], T], timeout_s: float, what: str = "I/O") -> T:
        """`fn()`'s result (or what it raised) when it returns within `timeout_s`;
        else Stuck, with `fn` left running on its owner's thread."""
        future = self.submit(owner, fn)
        if future is None:
            raise Stuck(owner, f"{what} (earlier I/O of this owner still stuck)")
        return wait(future, owner, timeout_s, what)


def user_of(proc_root: str | None) -> int | None:
    """The uid a target process runs as, from its procfs directory (its root is
    `<procfs>/<pid>/root`; a stat of procfs never blocks); None when unknown. An owner
    for the I/O of a job's processes: each is a root of its own, and a job may start
    many."""
    if proc_root is None:
        return None
    try:
        return os.stat(os.path.dirname(proc_root.rstrip("/"))).st_uid
    except OSError:
        return None


def wait(future: Future[T], owner: Hashable, timeout_s: float, what: str = "I/O") -> T:
    """The result of a submitted call within `timeout_s`, else Stuck."""
    try:
        return future.result(timeout=max(0.0, timeout_s))
    except FutureTimeout:
        raise Stuck(owner, what) from None
