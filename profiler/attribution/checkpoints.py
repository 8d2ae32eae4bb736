"""Checkpoints and restores identified by file events, matched to episodes.

A checkpoint is a file the job completed under `--checkpoints DIR` (collectors/fsevents.py:
IN_CLOSE_WRITE, or IN_MOVED_TO for an atomic rename). Which serializer call wrote it is
then a matter of time: inotify names no thread, so

- the *writer* is the serialization episode (profiler/attribution/episodes.py) that spans
  the event, within the episode's stated resolution (its resolution_s widened by its
  edge_unknown_s) plus STAMP_SLACK_S for the watch's late stamp; the process's main
  (training) thread first, else any thread (a background writer);
- the *stall* is the main thread's wall time in the checkpoint: the writer itself when it
  is on the main thread, else the main thread's episode that ended last before the event
  and no earlier than the writer began (the copy `many.Checkpointer` makes before its
  background thread writes);
- `async_tail_s` is the time from the stall's end to the event (0 when the stall spans it);
- `cpu_s_all_threads` is the process's CPU, every thread (exited ones too), between the
  save's start (the stall's, else the writer's) and the event;
- an event no episode spans still counts, with no episode, `wall_s` None and timed_by
  "file event only" (a save lost to a window gap, or too short to sample);
- a stall several files' events fall in (saves closer together than the episode rules'
  gap merge into one episode; or one call wrote several files) is no one checkpoint's:
  those checkpoints have no stall_s, and timed_by says why;
- an episode of the main thread that is neither a checkpoint's nor a restore's is
  `unmatched` (an import, a load, a log line's pickling): counted, never a checkpoint.

A restore is a read of a checkpoint file the run did not itself write (IN_OPEN, confirmed
a read by the file's IN_CLOSE_NOWRITE): the main thread's episode spanning the open, by
the same rule; several opens in one episode are one restore, and a file whose opens no
episode spans is one "file event only" restore. `read_bytes` is the process's storage
reads (/proc/<pid>/io) over the episode. Formats that map and read on first use (`.many`,
safetensors' safe_open) are `lazy`: their open is not all of the restore.

An episode that has a direction (encode / decode) matches only events of its own kind:
writes to encode, opens to decode; one without matches either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from collectors.fsevents import OPENED, WRITTEN, FileEvent
from profiler.attribution.episodes import Episode

# How late the watch's stamp may be (a thread waking from poll(), GIL handover): a margin
# on each match window, not a resolution any figure claims.
STAMP_SLACK_S = 0.05
FILE_EVENT_ONLY = "file event only"
SHARED = "one episode spans several files"
LAZY_SUFFIXES = (".many", ".safetensors")
LAZY_NOTE = "lazy format: tensors are read on first use, so the open is not all of the restore"

# (pid, t0, t1) -> the process's CPU seconds (or bytes read) between them; None: unknown
Counter = Callable[[int, float, float], float | None]


def stated_resolution_s(ep: Episode) -> float:
    """The episode's 95% half-width, widened by the time it may have run unobserved."""
    return ep.resolution_s + ep.edge_unknown_s


def _direction(ep: Episode) -> str | None:
    return getattr(ep, "direction", None)


def _spans(ep: Episode, t: float) -> float | None:
    """How far `t` is outside the episode (0 inside), or None beyond its tolerance; its
    times may be early against the host's by up to host_lag_s."""
    tol = stated_resolution_s(ep) + STAMP_SLACK_S
    if ep.start - tol <= t <= ep.end + tol + ep.host_lag_s:
        return max(0.0, ep.start - t, t - ep.end - ep.host_lag_s)
    return None


def _best(candidates: Iterable[Episode], t: float) -> Episode | None:
    scored = [
        (d, not ep.main_thread, ep.start, ep)
        for ep in candidates
        if (d := _spans(ep, t)) is not None
    ]
    if not scored:
        return None
    scored.sort(key=lambda s: (s[1], s[0], s[2]))
    return scored[0][3]


@dataclass(frozen=True)
class Checkpoint:
    """One file the job completed, and what of the job it cost.

    episode: the writer (None: file event only); stall: the main thread's episode in the
    checkpoint (None: none seen); stall_s: its wall time, within ± resolution_s;
    timed_by: the stall's (or the writer's) timing, or "file event only"."""

    path: str
    bytes: int | None
    event_t: float
    pid: int | None
    thread_id: int | None
    episode: Episode | None
    stall: Episode | None
    stall_s: float | None
    resolution_s: float | None
    timed_by: str
    cpu_s_all_threads: float | None
    async_tail_s: float | None


@dataclass(frozen=True)
class Restore:
    """One checkpoint file the job read back (see the module docstring)."""

    path: str
    bytes: int | None
    open_t: float
    pid: int | None
    thread_id: int | None
    episode: Episode | None
    wall_s: float | None
    resolution_s: float | None
    timed_by: str
    read_bytes: float | None
    lazy: bool


@dataclass(frozen=True)
class Matched:
    checkpoints: tuple[Checkpoint, ...]
    restores: tuple[Restore, ...]
    unmatched: tuple[Episode, ...]


def match(
    events: Sequence[FileEvent],
    episodes: Sequence[Episode],
    *,
    cpu_s: Counter,
    read_bytes: Counter,
) -> Matched:
    """Checkpoints, restores and unmatched main-thread episodes (module docstring)."""
    eps = sorted(episodes, key=lambda e: (e.start, e.pid, e.thread))
    encoders = [e for e in eps if _direction(e) != "decode"]
    decoders = [e for e in eps if _direction(e) != "encode" and e.main_thread]
    used: set[int] = set()
    checkpoints = []
    written_at: dict[str, float] = {}
    for ev in sorted((e for e in events if e.kind == WRITTEN), key=lambda e: e.t):
        written_at.setdefault(ev.path, ev.t)
        checkpoints.append(_checkpoint(ev, encoders, used, cpu_s))
    checkpoints = _unshared(checkpoints)
    restores = _restores(
        [
            e
            for e in events
            if e.kind == OPENED and not (e.path in written_at and written_at[e.path] <= e.t)
        ],
        decoders,
        used,
        read_bytes,
    )
    unmatched = tuple(e for e in eps if e.main_thread and id(e) not in used)
    return Matched(tuple(checkpoints), tuple(restores), unmatched)


def _checkpoint(
    ev: FileEvent, encoders: Sequence[Episode], used: set[int], cpu_s: Counter
) -> Checkpoint:
    writer = _best(encoders, ev.t)
    if writer is None:
        return Checkpoint(
            path=ev.path, bytes=ev.bytes, event_t=ev.t, pid=None, thread_id=None, episode=None,
            stall=None, stall_s=None, resolution_s=None, timed_by=FILE_EVENT_ONLY,
            cpu_s_all_threads=None, async_tail_s=None,
        )  # fmt: skip
    stall: Episode | None = writer if writer.main_thread else None
    if stall is None:
        tol = STAMP_SLACK_S + stated_resolution_s(writer)
        before = [
            e
            for e in encoders
            if e.pid == writer.pid
            and e.main_thread
            and id(e) not in used
            and writer.start - tol - stated_resolution_s(e) <= e.end <= ev.t + STAMP_SLACK_S
        ]
        stall = max(before, key=lambda e: e.end) if before else None
    used.add(id(writer))
    timed = stall if stall is not None else writer
    if stall is not None:
        used.add(id(stall))
    begin = timed.start
    stall_s = stall.wall_s if stall is not None else None
    resolution = stated_resolution_s(stall) if stall is not None else None
    timed_by = timed.timed_by
    if stall is not None and stall.truncated and ev.t < stall.end + stall.host_lag_s:
        # sampling stopped inside it (the job exits after its last save): its last cell
        # runs to the end of the run, so it ends at the file event instead
        stall_s = max(0.0, ev.t - stall.start - stall.host_lag_s / 2)
        resolution = stall.resolution_s + STAMP_SLACK_S + stall.host_lag_s / 2
        timed_by = f"{timed_by}, ended at the file event"
    return Checkpoint(
        path=ev.path,
        bytes=ev.bytes,
        event_t=ev.t,
        pid=writer.pid,
        thread_id=writer.thread,
        episode=writer,
        stall=stall,
        stall_s=stall_s,
        resolution_s=resolution,
        timed_by=timed_by,
        cpu_s_all_threads=cpu_s(writer.pid, begin, max(begin, ev.t)),
        async_tail_s=max(0.0, ev.t - stall.end - stall.host_lag_s) if stall is not None else None,
    )


def _unshared(checkpoints: list[Checkpoint]) -> list[Checkpoint]:
    """A stall that several files' events fall in is not one checkpoint's: saves closer
    together than the episode rules' gap (GAP_TICKS) merge into one episode, or one call
    writes several files. Those checkpoints keep their writer but no stall of their own."""
    sharing: dict[int, int] = {}
    for c in checkpoints:
        if c.stall is not None:
            sharing[id(c.stall)] = sharing.get(id(c.stall), 0) + 1
    out = []
    for c in checkpoints:
        n = sharing.get(id(c.stall), 0) if c.stall is not None else 0
        if n > 1:
            c = replace(
                c, stall_s=None, resolution_s=None, cpu_s_all_threads=None, async_tail_s=None,
                timed_by=f"{SHARED} ({n} files)",
            )  # fmt: skip
        out.append(c)
    return out


def _restores(
    opens: Sequence[FileEvent], decoders: Sequence[Episode], used: set[int], read_bytes: Counter
) -> list[Restore]:
    by_episode: dict[int, tuple[Episode, FileEvent]] = {}
    unmatched_paths: dict[str, FileEvent] = {}
    matched_paths: set[str] = set()
    for ev in sorted(opens, key=lambda e: e.t):
        ep = _best((d for d in decoders if id(d) not in used), ev.t)
        if ep is None:
            unmatched_paths.setdefault(ev.path, ev)
            continue
        matched_paths.add(ev.path)
        by_episode.setdefault(id(ep), (ep, ev))
    out = []
    for ep, ev in by_episode.values():
        used.add(id(ep))
        out.append(
            Restore(
                path=ev.path, bytes=ev.bytes, open_t=ev.t, pid=ep.pid, thread_id=ep.thread,
                episode=ep, wall_s=ep.wall_s, resolution_s=stated_resolution_s(ep),
                timed_by=ep.timed_by, read_bytes=read_bytes(ep.pid, ep.start, ep.end),
                lazy=ev.path.endswith(LAZY_SUFFIXES),
            )
        )  # fmt: skip
    for path, ev in unmatched_paths.items():
        if path in matched_paths:
            continue  # another open of the file is the restore (a listing, a receipt read)
        out.append(
            Restore(
                path=path, bytes=ev.bytes, open_t=ev.t, pid=None, thread_id=None, episode=None,
                wall_s=None, resolution_s=None, timed_by=FILE_EVENT_ONLY, read_bytes=None,
                lazy=path.endswith(LAZY_SUFFIXES),
            )
        )  # fmt: skip
    out.sort(key=lambda r: r.open_t)
    return out
