"""Durability calls: is a sample's thread making a file durable (fsync) or moving it
into place (rename/replace)?

A checkpoint is more than the serializer call: writers that mean it to survive a
crash follow it with `os.fsync` (or `fdatasync`), an atomic `os.replace`/`os.rename`,
and an fsync of the directory. These are C calls that push no Python frame, so while
one runs the innermost Python frame is its caller, at the line of the call, and the
sample is classified `other`. This module reads that line (profiler/classify/source_cache.py)
and says which kind of durability call it makes. pathlib's `Path.replace` and
`Path.rename`, `shutil.move`, and a directory fsync (`os.fsync(os.open(dir, ...))`)
all end in these os calls on a line of their own module, so they are found the same way.

The episodes (profiler/attribution/episodes.py) use this to attach the durability tail
to the checkpoint episode it follows.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from serwatt.collectors.samples import Frame
from serwatt.profiler.classify.prefilter import CallsitePrefilter
from serwatt.profiler.classify.source_cache import NOT_READY, SourceCache
from serwatt.profiler.classify.target_files import is_job_file, source_path

SYNC = "sync"  # data reaches the disk: os.fsync, os.fdatasync, os.sync
RENAME = "rename"  # the file is moved into place: os.replace, os.rename

# Resolved call names (an imported root: `os.fsync`, `from os import replace`).
DURABILITY_CALLS: Mapping[str, str] = {
    "os.fsync": SYNC,
    "os.fdatasync": SYNC,
    "os.sync": SYNC,
    "os.replace": RENAME,
    "os.rename": RENAME,
}

_MEMO_MAX = 1 << 16

# Text a file must hold to call one of DURABILITY_CALLS: `os.<name>` spelled out, or an
# import that could rebind one (`from os import`, `import os as`). Far more files import
# os and say "replace" (str.replace) than call os.replace; those are not parsed.
_CALL_TEXT = re.compile(
    r"\bos\s*\.\s*(?:fsync|fdatasync|sync|replace|rename)\b|\bfrom\s+os\s+import\b"
    r"|\bimport\s+os\s+as\b"
)


class _Prefilter(CallsitePrefilter):
    def may_match(self, text: str, package: str | None) -> bool:
        return _CALL_TEXT.search(text) is not None and super().may_match(text, package)


class DurabilityReader:
    """Which durability call, if any, a stack's innermost Python frame is at.

    Not thread-safe (one per classifier: `reader_for`). Files are read through the
    target's root like the call-site rules, parsed once (shared with the classifier's
    parses of the same file), and files whose text cannot call any of
    DURABILITY_CALLS are not parsed at all. A file still loading at the caller's
    deadline answers "" and is asked again next time (`not_ready` counts those).
    """

    def __init__(self, *, stat_ttl_s: float = 2.0) -> None:
        self._sources = SourceCache(stat_ttl_s=stat_ttl_s)
        self._prefilter = _Prefilter(tuple(DURABILITY_CALLS), lambda _word: False)
        self._generation = self._sources.generation
        self._memo: dict[tuple[str, int], str] = {}

    @property
    def not_ready(self) -> int:
        return self._sources.not_ready

    def prepare(
        self,
        stacks: Iterable[Sequence[Frame]],
        proc_root: Path | None,
        deadline: float | None = None,
    ) -> None:
        """Answer `kind` now for every distinct leaf line of `stacks` in the job's own files
        (not the standard library's or installed packages', `is_job_file`), so the files
        that make checkpoints durable load before the window's deadline is spent on the
        rest. A window's classification loads a torch job's hundreds of
        source files in time order; a script's fsync line, seconds into the run, came
        after them, past the deadline, and every checkpoint of the window lost its
        durability tail (and with it its match to the file it wrote)."""
        leaves: dict[tuple[str, int], Sequence[Frame]] = {}
        for frames in stacks:
            leaf = next((f for f in frames if not f.is_native), None)
            if leaf is not None and leaf.line > 0:
                leaves.setdefault((leaf.filename, leaf.line), frames)
        # only the job's own files: each load started here is one the classifier's loads
        # (at most 4 per target root at once) wait behind
        for key in leaves:
            if is_job_file(key[0]):
                self.kind(leaves[key], proc_root, deadline)

    def kind(
        self, frames: Sequence[Frame], proc_root: Path | None, deadline: float | None = None
    ) -> str:
        """SYNC, RENAME, or "" (no durability call on the innermost Python frame's line)."""
        leaf = next((f for f in frames if not f.is_native), None)
        if leaf is None or leaf.line <= 0:
            return ""
        path = source_path(leaf.filename, proc_root)
        if path is None:
            return ""
        self._sources.revalidate()
        if self._sources.generation != self._generation:
            self._generation = self._sources.generation
            self._memo.clear()
        key = (path, leaf.line)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        found = ""
        index, error, _mtime = self._sources.get(
            path,
            self._prefilter,
            root=str(proc_root) if proc_root is not None else None,
            deadline=deadline,
        )
        if error == NOT_READY:
            return ""  # not memoized
        if index is not None:
            for call in index.calls_at(leaf.line).calls:
                if call.imported and call.name in DURABILITY_CALLS:
                    found = DURABILITY_CALLS[call.name]
                    if found == SYNC:
                        break
        if len(self._memo) >= _MEMO_MAX:
            self._memo.clear()
        self._memo[key] = found
        return found


# One reader per classifier: a classifier is used by one sampling thread at a time
# (the daemon borrows them from a pool, the profile session has one finisher thread),
# so its reader is too, and needs no lock of its own.
_READERS: weakref.WeakKeyDictionary[object, DurabilityReader] = weakref.WeakKeyDictionary()
_READERS_LOCK = threading.Lock()


def reader_for(owner: object) -> DurabilityReader:
    """The DurabilityReader that goes with `owner` (a classifier), made on first use.
    An owner that cannot be weakly referenced gets a new reader each call."""
    with _READERS_LOCK:
        try:
            reader = _READERS.get(owner)
            if reader is None:
                reader = _READERS[owner] = DurabilityReader()
        except TypeError:
            return DurabilityReader()
    return reader
