"""What in a job's torch.save files the `.many` drop-in of `serwatt ab --swap torch`
cannot write, read without unpickling: the globals the zip's data.pkl refers to, by
pickletools' opcodes, against the tensor, storage and array globals the drop-in writes.

A file too damaged to check (its zip or its pickle unreadable) is named with the fix.
"""

from __future__ import annotations

import os
import pickletools
import zipfile
from collections.abc import Iterator, Sequence
from typing import Any

from serwatt.profiler.profile.checkpoint_files import ZIP_MAGIC
from serwatt.profiler.safeio import open_regular
from serwatt.profiler.terminal_escape import escape_text

MAX_PICKLE_BYTES = 64 << 20  # a state dict's pickle holds names and offsets, not tensor data
# The globals a torch.save file of tensors, dicts and lists refers to: what the drop-in
# writes (torch_compat's scope). Anything else is a pickled object it refuses.
_TENSOR_GLOBALS = {
    ("collections", "OrderedDict"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    # numpy arrays and scalars (an RNG state): the drop-in stores them as arrays
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # protocol 2's bytes (torch.save's default protocol)
}


def _globals(data: bytes) -> Iterator[tuple[str, str]]:
    """(module, name) of every global a pickle refers to, without unpickling it."""
    strings: list[str] = []
    memo: dict[int, Any] = {}
    for op, arg, _pos in pickletools.genops(data):
        if op.name == "GLOBAL" and isinstance(arg, str):
            module, _, name = arg.partition(" ")
            yield module, name
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
            yield strings[-2], strings[-1]
        elif isinstance(arg, str) and "UNICODE" in op.name:
            strings.append(arg)
        elif op.name == "MEMOIZE" and strings:
            memo[len(memo)] = strings[-1]
        elif op.name in ("BINGET", "LONG_BINGET") and isinstance(arg, int):
            if isinstance(got := memo.get(arg), str):
                strings.append(got)


def _damaged(path: str, exc: BaseException) -> str:
    detail = escape_text(f"{type(exc).__name__}: {exc}"[:200])
    return (
        f"{escape_text(os.path.basename(path))}: a damaged torch.save file ({detail}), so "
        "what it pickles cannot be checked; check that torch.load reads it and save it "
        "again, move it out of the checkpoint directory, or A/B this job with --candidate"
    )


def _pickle_of(fd: int) -> bytes | None:
    """The data.pkl bytes of the torch.save zip open at `fd` (None: no such member, or one
    past MAX_PICKLE_BYTES). Raises whatever the zip's damage makes zipfile raise."""
    with os.fdopen(os.dup(fd), "rb") as fh, zipfile.ZipFile(fh) as zf:
        member = next(
            (
                i
                for i in zf.infolist()
                if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"
            ),
            None,
        )
        if member is None or member.file_size > MAX_PICKLE_BYTES:
            return None
        return zf.read(member)


def unsupported_by_swap(paths: Sequence[str]) -> list[str]:
    """`swap_problems`' two lists in one, damaged files first."""
    damaged, pickled = swap_problems(paths)
    return damaged + pickled


def swap_problems(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """What in these torch.save files the `.many` drop-in cannot write, every file: (files
    too damaged to check, a zip or pickle that cannot be read; files that pickle objects,
    "training_args.bin pickles transformers.training_args.TrainingArguments", which the
    swap sends to the original torch.save). Not torch.save zips: nothing."""
    problems: list[str] = []
    damaged: list[str] = []
    for path in paths:
        try:
            with open_regular(path) as fd:
                if os.pread(fd, 4, 0) != ZIP_MAGIC:
                    continue
                try:
                    data = _pickle_of(fd)
                # The file is the job's and damage takes any shape: zipfile raises
                # BadZipFile, zlib.error, lzma.LZMAError, NotImplementedError (a method it
                # lacks), RuntimeError (an encryption flag), EOFError, OSError... Each is the
                # same answer: this file cannot be checked.
                except Exception as exc:
                    damaged.append(_damaged(path, exc))
                    continue
        except OSError:
            continue  # gone, or not a regular file: not a checkpoint the job left
        if data is None:
            continue
        try:
            found = sorted(
                {
                    f"{m}.{n}"
                    for m, n in _globals(data)
                    if (m, n) not in _TENSOR_GLOBALS
                    and not (m == "torch" and n.endswith("Storage"))
                }
            )
        except Exception as exc:  # pickletools on a damaged pickle: ValueError, EOFError...
            damaged.append(_damaged(path, exc))
            continue
        if found:
            problems.append(f"{os.path.basename(path)} pickles {', '.join(found[:3])}")
    return damaged, problems
