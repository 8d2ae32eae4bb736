"""What a run left in a checkpoint directory: the directory's checkpoint files by version,
the files written between two snapshots, and each file's format by its magic bytes.

A file counts as written by a run when its (dev, inode, size, mtime) under the directory
is new after the run. Which names are checkpoints is the checkpoint watch's rule
(collectors/fsevents.py `name_filter`: no temp files, no TensorBoard events, or the
`--checkpoint-glob`); links are not followed and at most MAX_ENTRIES entries are looked at.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from serwatt.collectors.fsevents import name_filter
from serwatt.profiler.many.format import MAGIC
from serwatt.profiler.safeio import read_head

MAX_ENTRIES = 100_000  # entries of a checkpoint directory looked at per snapshot
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip

FileVersion = tuple[int, int, int, int]  # (dev, inode, size, mtime_ns)


def snapshot(directory: Path, glob: str | None = None) -> dict[str, FileVersion]:
    """path -> version of each regular file under `directory` whose name is a checkpoint's
    (`--checkpoint-glob`, or the watch's default rule: no temp files, no TensorBoard
    events), links not followed, at most MAX_ENTRIES entries looked at."""
    keep = name_filter(glob)
    out: dict[str, FileVersion] = {}
    pending = [str(directory)]
    seen = 0
    while pending and seen < MAX_ENTRIES:
        top = pending.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                break
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                pending.append(entry.path)
            elif stat.S_ISREG(info.st_mode) and keep(entry.name):
                out[entry.path] = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    return out


def written_files(before: dict[str, FileVersion], after: dict[str, FileVersion]) -> list[str]:
    """The files a run completed: present after it, and new or changed since before it."""
    return sorted(p for p, v in after.items() if before.get(p) != v)


def written_paths(directory: Path, glob: str | None = None) -> list[str]:
    return sorted(snapshot(directory, glob))


def by_format(sizes: dict[str, int]) -> dict[str, list[int]]:
    """[files, bytes] written per format: `.many`, torch.save's zip, anything else."""
    out = {"many": [0, 0], "torch": [0, 0], "other": [0, 0]}
    for path, size in sizes.items():
        try:
            head = read_head(path, len(MAGIC))
        except OSError:
            head = b""
        kind = "many" if head == MAGIC else "torch" if head.startswith(ZIP_MAGIC) else "other"
        out[kind][0] += 1
        out[kind][1] += size
    return out


def is_many(path: str) -> bool:
    """Whether the file begins with the `.many` magic bytes (profiler/many/FORMAT.md)."""
    try:
        return read_head(path, len(MAGIC)) == MAGIC
    except OSError:
        return False
