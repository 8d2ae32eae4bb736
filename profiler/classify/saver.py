"""Which save function of the job's own code a sample's thread is in.

A checkpoint is more than the serializer call: the job's save function often turns its
state into what the serializer takes first (tensors to lists for JSON, `state_dict()`
copies, metadata), and the training thread waits for that too. Those lines call no
serializer, so their samples are `other`, and the episode (profiler/attribution/
episodes.py) begins only at the serializer call. The checkpoint's stall
(profiler/attribution/checkpoints.py) takes that preparation in when it can be told
apart from training: the samples just before the episode that are inside the *same
call* of the same save function.

A save function is a frame of the job's own files (not the standard library's, not an
installed package's: `target_files.is_job_file`) whose name says it saves
(SAVER_NAME: save, checkpoint, ckpt, dump, serialize, persist, snapshot), the innermost
such frame on the stack that is not a block nested in another (a comprehension, a
lambda, a local function: "save_json.<locals>.<dictcomp>" runs inside save_json's call).
The call is told by where it was called from: the caller frame's file and line. Two
samples with the same key were in one call of it when nothing else came between them on
their thread (the episode rules check that).

What this cannot see: a job that saves straight from its training loop (nanoGPT's
`torch.save(checkpoint, ...)` at module level) has no save function, and its
preparation is not told from training; a save function inside an installed package
(a trainer library's) is not the job's, so its preparation is not taken in either.
Both leave the stall where the serializer call began, as before.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from serwatt.collectors.samples import Frame
from serwatt.profiler.classify.target_files import is_job_file

SAVER_NAME = re.compile(r"save|checkpoint|ckpt|dump|seriali[sz]e|persist|snapshot", re.I)


@functools.lru_cache(maxsize=1 << 14)
def _is_saver(name: str, filename: str) -> bool:
    # a comprehension, lambda or nested function ("save_json.<locals>.<dictcomp>") is a
    # block of the function around it, whose call is the one to key by
    return "<" not in name and SAVER_NAME.search(name) is not None and is_job_file(filename)


def saver_call(frames: Sequence[Frame]) -> str:
    """A key for the innermost save function call on a leaf-first stack:
    "<file>:<function> called at <caller file>:<line>"; "" when there is none."""
    python = [f for f in frames if not f.is_native]
    for i, f in enumerate(python):
        if _is_saver(f.name, f.filename):
            caller = python[i + 1] if i + 1 < len(python) else None
            at = f"{caller.filename}:{caller.line}" if caller is not None else "?"
            return f"{f.filename}:{f.name} called at {at}"
    return ""
