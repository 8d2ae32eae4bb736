"""`StepGate`: an optimizer step pre-hook that holds `optimizer.step()` while a background
copy of the tensors that step would change is still running.

`arm(optimizer)` registers the hook (on the training thread, before the copy starts);
`release()` (from the copying thread, when the copy is done) lets the step through. The hook
runs on the training thread, here in profiler/many, so a sampling profiler attributes the
wait to `.many`: it is part of the checkpoint's cost.

Removal is on the training thread only: torch walks the step hooks in an OrderedDict, and
deleting an entry while `step()` walks it raises there. From inside the hook that is safe
only when it is the newest entry (it is unless a hook was registered after it); otherwise
the next `arm()` or `remove()` (the checkpointer's next call, wait or close) removes it, and
until then it returns at once.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class StepGate:
    """One gate, re-armed for each overlapped checkpoint (one in flight at a time)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed_for_step = False  # armed and not yet released
        self._waiting_since: float | None = None
        self._handle: Any = None
        self.waited_s = 0.0  # how long step() waited for the last release

    def arm(self, optimizer: Any) -> None:
        """Hold the next `optimizer.step()` until `release()`. Call on the training thread."""
        self.remove()
        with self._cond:
            self._closed_for_step = True
            self._waiting_since = None
            self.waited_s = 0.0
        self._handle = optimizer.register_step_pre_hook(self._before_step)

    def release(self) -> None:
        """Let the step through (idempotent). Safe from any thread."""
        with self._cond:
            if not self._closed_for_step:
                return
            self._closed_for_step = False
            if self._waiting_since is not None:
                self.waited_s = time.perf_counter() - self._waiting_since
            self._cond.notify_all()

    @property
    def holding(self) -> bool:
        with self._cond:
            return self._closed_for_step

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with self._cond:
            if self._closed_for_step:
                self._waiting_since = time.perf_counter()
                while self._closed_for_step:
                    self._cond.wait()
        self._remove(in_step=True)

    def remove(self) -> None:
        """Remove the hook once released. Call on the training thread, outside `step()`."""
        self._remove(in_step=False)

    def _remove(self, *, in_step: bool) -> None:
        handle = self._handle
        if handle is None or self.holding:
            return
        if in_step:
            hooks = handle.hooks_dict_ref()
            if hooks is not None and hooks and next(reversed(hooks)) != handle.id:
                return
        self._handle = None
        handle.remove()
