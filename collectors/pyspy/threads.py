"""Mapping py-spy's thread labels to kernel tids.

py-spy names a thread by its kernel tid when it knows it (3.11+) and by the hex
pthread_t otherwise (<3.11 in nonblocking mode); see collectors/pyspy/runner.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from serwatt.collectors import procstat

if TYPE_CHECKING:  # speedscope imports this module for ThreadMapping
    from serwatt.collectors.pyspy.speedscope import ThreadTrack


@dataclass(frozen=True)
class ThreadMapping:
    tid_of: dict[str, int]  # track label -> kernel tid
    method: dict[str, str]  # track label -> "pyspy" | "pthread" | "main" | "comm"
    unmapped: tuple[str, ...]


# glibc x86-64 keeps `pid_t tid` at 0x2d0 in struct pthread (2.28-2.39); the offset is
# validated on the live process before use, and scanned for when it does not hold.
_PTHREAD_TID_OFFSETS = (0x2D0, *range(0, 0x800, 4))


def map_threads(
    pid: int, tracks: Sequence[ThreadTrack], *, procfs: Path = Path("/proc")
) -> ThreadMapping:
    tid_of: dict[str, int] = {}
    method: dict[str, str] = {}
    for tr in tracks:
        if tr.os_tid is not None:
            tid_of[tr.label] = tr.os_tid
            method[tr.label] = "pyspy"
    pending = [tr for tr in tracks if tr.label not in tid_of and tr.pthread_id is not None]
    if pending:
        live = procstat.thread_ids(pid, procfs)
        if live:
            for offset in _PTHREAD_TID_OFFSETS:
                addrs = [tr.pthread_id + offset for tr in pending if tr.pthread_id is not None]
                values = procstat.read_mem_u32(pid, addrs, procfs)
                if len(values) != len(pending):
                    if not values:
                        break  # /proc/<pid>/mem unreadable: no point scanning
                    continue
                got = [values[a] for a in addrs]
                if all(v in live for v in got) and len(set(got)) == len(got):
                    if len(got) == 1 and offset != _PTHREAD_TID_OFFSETS[0]:
                        # one thread alone cannot validate a scanned offset
                        continue
                    for tr, v in zip(pending, got, strict=True):
                        tid_of[tr.label] = v
                        method[tr.label] = "pthread"
                    break
        pending = [tr for tr in pending if tr.label not in tid_of]
        for tr in pending:
            if tr.name == "MainThread" and pid in live and pid not in tid_of.values():
                tid_of[tr.label] = pid
                method[tr.label] = "main"
        pending = [tr for tr in pending if tr.label not in tid_of]
        if pending:
            comms: dict[str, list[int]] = {}
            for t in live - set(tid_of.values()):
                name = procstat.thread_comm(pid, t, procfs)
                if name is None:
                    continue
                comms.setdefault(name, []).append(t)
            for tr in pending:
                cands = comms.get((tr.name or "")[:15], [])
                if len(cands) == 1:
                    tid_of[tr.label] = cands[0]
                    method[tr.label] = "comm"
    unmapped = tuple(tr.label for tr in tracks if tr.label not in tid_of)
    return ThreadMapping(tid_of=tid_of, method=method, unmapped=unmapped)


# ---------------------------------------------------------------- running
