"""`py-spy dump --json` output parsed into threads of frames (pure, no I/O).

A dump is one snapshot of every thread's stack, read while the target runs: what
`serwatt classify` explains. Its JSON is a list of threads, each with `frames` (innermost
first: name, filename, line, module). Anything else is refused with a message naming
what is wrong, since the file or the dump comes from outside.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from serwatt.collectors.samples import Frame


class DumpError(ValueError):
    """Not `py-spy dump --json` output."""


@dataclass(frozen=True)
class DumpThread:
    tid: str  # the kernel tid, or py-spy's thread id in hex when it knows none
    name: str
    frames: tuple[Frame, ...]


def parse_dump(text: str) -> list[DumpThread]:
    try:
        doc = json.loads(text)
    except RecursionError:
        raise DumpError("not `py-spy dump --json` output: nested too deeply") from None
    except ValueError as exc:
        raise DumpError(f"not `py-spy dump --json` output: {exc}") from None
    if not isinstance(doc, list):
        raise DumpError("not `py-spy dump --json` output: expected a JSON list of threads")
    return [_thread(t, i) for i, t in enumerate(doc)]


def _thread(doc: Any, i: int) -> DumpThread:
    if not isinstance(doc, dict) or not isinstance(doc.get("frames", []), list):
        raise DumpError(f"not `py-spy dump --json` output: thread {i} is not an object with frames")
    try:
        frames = tuple(
            Frame(
                str(f["name"]),
                str(f.get("filename") or ""),
                int(f.get("line") or 0),
                None if f.get("module") is None else str(f["module"]),
            )
            for f in doc.get("frames", [])
        )
        tid = doc.get("os_thread_id") or hex(int(doc.get("thread_id") or 0))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DumpError(f"not `py-spy dump --json` output: thread {i}: bad frame ({exc})") from None
    return DumpThread(tid=str(tid), name=str(doc.get("thread_name") or ""), frames=frames)
