"""Checkpoints and restores identified by file events, matched to episodes.

A checkpoint is a file the job completed under `--checkpoints DIR` (collectors/fsevents.py:
IN_CLOSE_WRITE, or IN_MOVED_TO for an atomic rename). Which serializer call wrote it is
then a matter of time: inotify names no thread, so

- the *writer* is the serialization episode (profiler/attribution/episodes.py) that spans
  the event, within the episode's stated resolution (its resolution_s widened by its
  edge_unknown_s) plus STAMP_SLACK_S for the watch's late stamp; the process's main
  (training) thread first, else any thread (a background writer);
- the *stall* is the main thread's wall time in the checkpoint: the writer itself when it
  is on the main thread, else the main thread's episode that began before the writer and
  ended nearest the writer's start, by the event (the copy `many.Checkpointer` makes
  before its background thread writes). With one save in flight the next call waits for
  the write in progress and so spans its event: a background episode of the same process
  that began before that call and spans the event is then the writer, not the call;
- a stall begins where the job's own save function began preparing the state for the
  serializer (the episode's `prepared_s`: profiler/attribution/episodes.py, profiler/
  classify/saver.py), since the training thread waits for that too; its resolution
  widens by the count noise of those ticks when timed by sample counts;
- `async_tail_s` is the time from the stall's end to the event (0 when the stall spans it);
- `cpu_s_all_threads` is the process's CPU, every thread (exited ones too), between the
  save's start (its stall's) and the event; None for a checkpoint with no stall: its writer
  is then a background thread, whose first sample is not where the save began (the copy
  on the training thread went unseen, or the writer was busy from an earlier save);
- an event no episode spans still counts, with no episode, `wall_s` None and timed_by
  "file event only" (a save lost to a window gap, or too short to sample);
- a stall several files' events fall in (saves closer together than the episode rules'
  gap merge into one episode; or one call wrote several files) is no one checkpoint's:
  those checkpoints have no stall_s, and timed_by says why;
- an episode of the main thread that is neither a checkpoint's nor a restore's is
  `unmatched` (an import, a load, a log line's pickling): counted, never a checkpoint.

A restore is a read of a checkpoint file the run did not itself write (IN_OPEN, confirmed
a read by the file's IN_CLOSE_NOWRITE): the main thread's episode spanning the open, by
the same rule; several opens in one episode are one restore, so are one file's opens in
several episodes of the process (their wall times summed), and a file whose opens no
episode spans is one "file event only" restore. `read_bytes` is the process's storage
reads (/proc/<pid>/io) over the episode. Formats that map and read on first use (`.many`,
safetensors' safe_open) are `lazy`: their open is not all of the restore. The format is
told by the file's first bytes (`lazy_format`; a `.many` file saved as `ckpt.pt` by the
torch drop-in is lazy), by its suffix only when they could not be read.

An episode that has a direction (encode / decode) matches only events of its own kind:
writes to encode, opens to decode; one without matches either. An episode of a codepath
that writes only text (TEXT_CODEPATHS: json, yaml) is not the writer of a file whose first
bytes are binary (a zip, a pickle, `.many`): the log line a job prints as a save completes
is then never the save when the save itself went unsampled.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from serwatt.collectors.fsevents import OPENED, WRITTEN, FileEvent
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.many.format import MAGIC

# How late the watch's stamp may be (a thread waking from poll(), GIL handover): a margin
# on each match window, not a resolution any figure claims.
STAMP_SLACK_S = 0.05
FILE_EVENT_ONLY = "file event only"
PART_OF = "part of the save of"  # a file of a checkpoint directory's save (`_saves`)
# A file of a checkpoint directory written again this long after the directory's last
# file begins a new save (`_saves`): a Trainer's files land within a few hundred ms, its
# saves are steps apart. A directory rewritten by saves closer together merges them.
SAVE_GAP_S = 1.0
SHARED = "one episode spans several files"
LAZY_SUFFIXES = (".many", ".safetensors")
LAZY_HEAD_BYTES = 9  # what `lazy_format` looks at
_SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors spec's limit on its JSON header
# codepaths whose encoders write only text (json.dump, orjson's UTF-8 bytes, yaml.dump)
TEXT_CODEPATHS = frozenset({"json", "yaml"})
LAZY_NOTE = "lazy format: tensors are read on first use, so the open is not all of the restore"

# (pid, t0, t1) -> the process's CPU seconds (or bytes read) between them; None: unknown
Counter = Callable[[int, float, float], float | None]


def lazy_format(head: bytes) -> bool | None:
    """Whether a file that begins with `head` (its first LAZY_HEAD_BYTES) is read on first
    use: `.many` (its magic, profiler/many/FORMAT.md) and safetensors (a little-endian u64
    header length, then the JSON header's `{`) are; a zip (torch.save), a pickle and
    anything else are not. None when `head` is too short to say."""
    if head.startswith(MAGIC):
        return True
    if len(head) < LAZY_HEAD_BYTES:
        return None
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= _SAFETENSORS_MAX_HEADER and head[8:9] == b"{"


def lazy_by_suffix(path: str) -> bool:
    """The format by name, where the file's bytes are gone."""
    return path.endswith(LAZY_SUFFIXES)


def file_is_lazy(path: str, head: bytes | None) -> bool:
    """A file's format from its first bytes, from its name when they could not be read."""
    got = None if head is None else lazy_format(head)
    return lazy_by_suffix(path) if got is None else got


def binary_head(head: bytes | None) -> bool:
    """Whether a file that begins with `head` cannot be text: a control byte other than
    whitespace, or bytes that are not UTF-8 (a sequence cut off at the end excepted).
    False when the head is unknown or empty."""
    if not head:
        return False
    if any(b < 0x20 and b not in b"\t\n\r\f" for b in head):
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.end < len(head) or exc.reason != "unexpected end of data"
    return False


def stated_resolution_s(ep: Episode) -> float:
    """The episode's 95% half-width, widened by the time it may have run unobserved."""
    return ep.resolution_s + ep.edge_unknown_s


def _stall_resolution_s(ep: Episode, *, stated: bool = True) -> float:
    """A stall's 95% half-width: its episode's (stated: widened by unobserved time), plus,
    when timed by sample counts, what the Poisson noise of its preparation's ticks adds
    (2*sqrt(n) periods over all n ticks, against the episode's own samples alone)."""
    base = stated_resolution_s(ep) if stated else ep.resolution_s
    prep = ep.prepared_s
    if prep <= 0 or ep.timed_by != "sample counts" or ep.period_s <= 0:
        return base
    n = max(0, ep.samples)
    return base + 2.0 * ep.period_s * (math.sqrt(n + prep / ep.period_s) - math.sqrt(n))


def _direction(ep: Episode) -> str | None:
    return getattr(ep, "direction", None)


def _tolerance_s(ep: Episode) -> float:
    """How far from an episode's edges a file event may be stamped and still be its."""
    return stated_resolution_s(ep) + STAMP_SLACK_S


def _spans(ep: Episode, t: float) -> float | None:
    """How far `t` is outside the episode (0 inside), or None beyond its tolerance; its
    times may be early against the host's by up to host_lag_s."""
    tol = _tolerance_s(ep)
    if ep.start - tol <= t <= ep.end + tol + ep.host_lag_s:
        return max(0.0, ep.start - t, t - ep.end - ep.host_lag_s)
    return None


def _ends_at(ep: Episode, t: float) -> bool:
    """Whether the episode ends at `t`, within its tolerance (as `_spans` measures it)."""
    tol = _tolerance_s(ep)
    return ep.end - tol <= t <= ep.end + tol + ep.host_lag_s


def _best(candidates: Iterable[Episode], t: float) -> Episode | None:
    # The main thread first, the nearest of its episodes. Of other threads', any within
    # tolerance, the one ending nearest the event: a write ends when its file is complete,
    # a thread the write started and joined (.many's hasher) outlives it in the samples.
    scored = [
        (not ep.main_thread, d if ep.main_thread else 0.0, abs(ep.end - t), ep.start, ep)
        for ep in candidates
        if (d := _spans(ep, t)) is not None
    ]
    if not scored:
        return None
    scored.sort(key=lambda s: s[:4])
    return scored[0][4]


def _background_writer(
    main: Episode, encoders: Sequence[Episode], used: set[int], t: float
) -> Episode | None:
    """The background thread's write that the main thread's episode `main` only waits on.

    With one save in flight (many.Checkpointer), the next checkpoint call on the main thread
    first waits for the previous write, so it spans that write's file event too. The file is
    then the write of the same process's other thread that spans the event, began before
    `main` did and ends nearest the event (a write ends when its file is complete). So is
    one that began later but fsynced where `main` did not: the main thread then waited in
    close() or wait() for the write it had handed over. So is one of `main`'s codepath
    that began later where `main`, not durable, only ends at the event: the call handed
    the write over and returned as it completed (a 4 MB write done in 8 ms, the copy's
    episode ending 1 ms past its file, within resolution). So, last, is one of `main`'s
    codepath whose stack named an encode call where `main`'s named none: the main thread
    waited in the codepath's frames (the last save's copy, then `.wait()` before exit, one
    episode) while the other thread wrote."""
    others = [
        e
        for e in encoders
        if e.pid == main.pid
        and e.main_thread is False
        and id(e) not in used
        and (
            e.start < main.start
            or (e.durable and not main.durable)
            or (e.codepath == main.codepath and not main.durable and _ends_at(main, t))
            or (
                e.codepath == main.codepath
                and _direction(e) == "encode"
                and _direction(main) != "encode"
            )
        )
        and _spans(e, t) is not None
        # A main episode that fsynced wrote a file itself (a synchronous save): another
        # thread is its file's writer only if it ends at the event or fsynced too. A
        # thread that only waits in `.many`'s frames (its hashing pool, idle between
        # saves) does neither, and spans every save of the run.
        and (not main.durable or e.durable or _ends_at(e, t))
    ]
    return min(others, key=lambda e: abs(e.end - t)) if others else None


def _handing_over(
    writer: Episode, encoders: Sequence[Episode], used: set[int], t: float
) -> Episode | None:
    """The main thread's episode that handed `writer`'s work to it: begun before the write
    began (a later call is the next checkpoint's, waiting for this one), ending no earlier
    than the write began and by the event, within the two episodes' resolutions; of those,
    the one that ends nearest the write's start.

    A write that began in a window gap began earlier than it shows (edge_unknown_s), never
    later, so the hand-off must begin before the write's start as seen, to within the
    edges' own resolutions."""
    tol = _tolerance_s(writer)
    before = [
        e
        for e in encoders
        if e.pid == writer.pid
        and e.main_thread
        and id(e) not in used
        and e.start - e.resolution_s <= writer.start + writer.resolution_s
        and writer.start - tol - stated_resolution_s(e) <= e.end <= t + STAMP_SLACK_S
    ]
    return min(before, key=lambda e: abs(e.end - writer.start)) if before else None


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
    head_of: Callable[[str], bytes | None] = lambda _path: None,
    root: str | os.PathLike[str] | None = None,
) -> Matched:
    """Checkpoints, restores and unmatched main-thread episodes (module docstring);
    `head_of(path)` is a file's first LAZY_HEAD_BYTES (None: unreadable, the file is gone)
    and tells its format; `root` is the watched DIR, whose subdirectories' files are saved
    together (`_saves`)."""
    eps = sorted(episodes, key=lambda e: (e.start, e.pid, e.thread))
    encoders = [e for e in eps if _direction(e) != "decode"]
    decoders = [e for e in eps if _direction(e) != "encode" and e.main_thread]
    used: set[int] = set()
    checkpoints = []
    written_at: dict[str, float] = {}
    for ev in sorted((e for e in events if e.kind == WRITTEN), key=lambda e: e.t):
        written_at.setdefault(ev.path, ev.t)
        writers = encoders
        if binary_head(head_of(ev.path)):
            writers = [e for e in encoders if e.codepath not in TEXT_CODEPATHS]
        checkpoints.append(_checkpoint(ev, writers, used, cpu_s))
    if root is not None:
        checkpoints = _saves(checkpoints, os.fspath(root), cpu_s, encoders, used)
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
        lambda path: file_is_lazy(path, head_of(path)),
    )
    unmatched = tuple(e for e in eps if e.main_thread and id(e) not in used)
    return Matched(tuple(checkpoints), tuple(restores), unmatched)


def _checkpoint(
    ev: FileEvent, encoders: Sequence[Episode], used: set[int], cpu_s: Counter
) -> Checkpoint:
    writer = _best(encoders, ev.t)
    if writer is not None and writer.main_thread:
        writer = _background_writer(writer, encoders, used, ev.t) or writer
    if writer is None:
        return Checkpoint(
            path=ev.path, bytes=ev.bytes, event_t=ev.t, pid=None, thread_id=None, episode=None,
            stall=None, stall_s=None, resolution_s=None, timed_by=FILE_EVENT_ONLY,
            cpu_s_all_threads=None, async_tail_s=None,
        )  # fmt: skip
    stall: Episode | None = writer if writer.main_thread else None
    if stall is None:
        stall = _handing_over(writer, encoders, used, ev.t)
    used.add(id(writer))
    timed = stall if stall is not None else writer
    if stall is not None:
        used.add(id(stall))
    begin = timed.start - (stall.prepared_s if stall is not None else 0.0)
    stall_s = stall.wall_s + stall.prepared_s if stall is not None else None
    resolution = _stall_resolution_s(stall) if stall is not None else None
    timed_by = timed.timed_by
    stall_end = stall.end + stall.host_lag_s if stall is not None else None
    tol = _tolerance_s(writer)
    if (
        stall is not None
        and stall is not writer
        and stall.start < writer.start
        and stall.end > writer.start + tol
    ):
        # the main thread went on waiting for the write it handed over (close() or wait()
        # right after the last save): the checkpoint's stall ends where the write began
        stall_s = max(0.0, writer.start - begin)
        resolution = _stall_resolution_s(stall) + stated_resolution_s(writer)
        timed_by = f"{timed_by}, ended where its background write began"
        stall_end = writer.start
    elif stall is not None and stall.truncated and ev.t < stall.end + stall.host_lag_s:
        # sampling stopped inside it (the job exits after its last save): its last cell
        # runs to the end of the run, so it ends at the file event instead
        stall_s = max(0.0, ev.t - begin - stall.host_lag_s / 2)
        resolution = _stall_resolution_s(stall, stated=False) + STAMP_SLACK_S + stall.host_lag_s / 2
        timed_by = f"{timed_by}, ended at the file event"
        stall_end = ev.t
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
        cpu_s_all_threads=(
            cpu_s(writer.pid, begin, max(begin, ev.t)) if stall is not None else None
        ),
        async_tail_s=max(0.0, ev.t - stall_end) if stall_end is not None else None,
    )


def _save_dir(path: str, root: str) -> str | None:
    """The checkpoint directory a file is in: its first-level directory under `root`
    (`DIR/checkpoint-20/optimizer.pt` -> `DIR/checkpoint-20`); None for a file in `root`."""
    rel = os.path.relpath(path, root)
    first, sep, _rest = rel.partition(os.sep)
    if not sep or first in (os.curdir, os.pardir):
        return None
    return os.path.join(root, first)


def _saves(
    checkpoints: list[Checkpoint],
    root: str,
    cpu_s: Counter,
    encoders: Sequence[Episode] = (),
    used: set[int] | None = None,
) -> list[Checkpoint]:
    """Files completed in one checkpoint directory within one save are one checkpoint.

    A save is the files of one first-level directory under DIR, until a file already
    written in it is written again more than SAVE_GAP_S after the one before (a directory
    rewritten every save, `latest/`, is one checkpoint per save; a slow save of
    `checkpoint-N/`, seconds between its files, is still one). Its row is the directory
    (`_one_save`); its files stay, each with its writer episode (a breakdown per file and
    codepath) and no stall of its own:
    timed_by `PART_OF`. A stall episode matched in several saves (one whose edges are
    loosely resolved spans the files of the save before it too) counts for the save whose
    files it is nearest, the earliest of equals."""
    groups: dict[str, list[list[Checkpoint]]] = {}
    out: list[Checkpoint] = []
    for c in sorted(checkpoints, key=lambda c: c.event_t):
        key = _save_dir(c.path, root)
        if key is None:
            out.append(c)
            continue
        runs = groups.setdefault(key, [])
        if runs and (
            c.event_t - runs[-1][-1].event_t <= SAVE_GAP_S
            or c.path not in {m.path for m in runs[-1]}
        ):
            runs[-1].append(c)
        else:
            runs.append([c])
    saves = sorted(
        ((key, members) for key, runs in groups.items() for members in runs),
        key=lambda g: g[1][0].event_t,
    )
    nearest: dict[int, tuple[float, int]] = {}  # stall -> (distance, save index)
    for i, (_key, members) in enumerate(saves):
        for c in members:
            if c.stall is None:
                continue
            d = _spans(c.stall, c.event_t)
            got = (abs(c.stall.end - c.event_t) if d is None else d, i)
            nearest[id(c.stall)] = min(nearest.get(id(c.stall), got), got)
    taken = set(used or ()) | set(nearest)
    spare = [e for e in encoders if e.main_thread and id(e) not in taken]
    for i, (key, members) in enumerate(saves):
        mine = {k for k, (_d, j) in nearest.items() if j == i}
        out.extend(_one_save(key, members, cpu_s, mine, spare, used))
    out.sort(key=lambda c: c.event_t)
    return out


def _one_save(
    directory: str,
    members: list[Checkpoint],
    cpu_s: Counter,
    mine: set[int],
    spare: list[Episode],
    used: set[int] | None,
) -> list[Checkpoint]:
    """A save's row and its files (`_saves`).

    Its stall begins where the first of its files' stalls began, counting where its save
    function began preparing (`prepared_s`), or at the first file the training thread
    wrote when that is earlier (config.json, written before the weights' save and too
    short to sample), and ends at the last file the training thread
    wrote (or that no thread was seen writing: a small file between sampled episodes),
    since the save returns as its last file is written; an episode running on past it is
    the training thread's next work. File events are stamped on the host's clock, which an
    episode's may trail by up to its host_lag_s: that end is taken half a lag early, and
    its resolution widened by half a lag. With no file of the training thread's (a
    background writer's save), it ends where the last of its stalls ends."""
    stalls = {id(c.stall): c.stall for c in members if c.stall is not None and id(c.stall) in mine}
    # the training thread's serialization just before, ending where the save's first seen
    # stall begins (within its resolution), is the same save: the weights' safetensors
    # episode no file's event was nearest to (its files stamped together, late)
    while stalls:
        head = min(stalls.values(), key=lambda e: e.start)
        before = [
            e
            for e in spare
            if e.pid == head.pid
            and e.start < head.start
            and head.start - _tolerance_s(e) <= e.end <= head.start + e.resolution_s
        ]
        if not before:
            break
        e = max(before, key=lambda e: e.end)
        spare.remove(e)
        stalls[id(e)] = e
        if used is not None:
            used.add(id(e))
    last = members[-1]
    # a file is its last event in the save: the watch lists a new directory's files as it
    # is added (collectors/fsevents.py), so a file still being written then (DCP's
    # `__0_0.distcp`, the directory made just before it) is seen again at its close
    files = sorted({c.path: c for c in members}.values(), key=lambda c: c.event_t)
    n = len(files)
    sizes = [c.bytes for c in files]
    total = None if None in sizes else sum(s for s in sizes if s is not None)
    parts = [
        replace(
            c, stall=None, stall_s=None, resolution_s=None, cpu_s_all_threads=None,
            async_tail_s=None, timed_by=f"{PART_OF} {os.path.basename(directory)} ({n} files)",
        )
        for c in files
    ]  # fmt: skip
    if not stalls:
        row = Checkpoint(
            path=directory, bytes=total, event_t=last.event_t, pid=None, thread_id=None,
            episode=None, stall=None, stall_s=None, resolution_s=None,
            timed_by=f"{FILE_EVENT_ONLY}, one save of {n} files", cpu_s_all_threads=None,
            async_tail_s=None,
        )  # fmt: skip
        return [row, *parts]
    first = min(stalls.values(), key=lambda e: e.start - e.prepared_s)
    begin = first.start - first.prepared_s
    begin_resolution = _stall_resolution_s(first)
    own = [c.event_t for c in members if c.episode is None or c.episode.main_thread]
    if own:
        lag = max(e.host_lag_s for e in stalls.values())
        end, end_resolution = max(own) - lag / 2, lag / 2 + STAMP_SLACK_S
        host_end = max(own)
        if min(own) - lag / 2 < begin:  # a file done before the first stall seen began
            begin, begin_resolution = min(own) - lag / 2, lag / 2 + STAMP_SLACK_S
    else:
        ending = max(stalls.values(), key=lambda e: e.end)
        end, end_resolution = ending.end, stated_resolution_s(ending)
        host_end = ending.end + ending.host_lag_s
    row = Checkpoint(
        path=directory,
        bytes=total,
        event_t=last.event_t,
        pid=first.pid,
        thread_id=first.thread,
        episode=first,
        stall=first,
        stall_s=max(0.0, end - begin),
        resolution_s=begin_resolution + end_resolution,
        timed_by=f"{first.timed_by}, one save of {n} files",
        cpu_s_all_threads=cpu_s(first.pid, begin, max(begin, end)),
        async_tail_s=max(0.0, last.event_t - host_end),
    )
    return [row, *parts]


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


def _at_most(reads: list[float | None], size: int | None) -> float | None:
    """A file's reads over its episodes, summed: no more than the file holds."""
    if None in reads:
        return None
    total = sum(r for r in reads if r is not None)
    return total if size is None else min(total, float(size))


def _restores(
    opens: Sequence[FileEvent],
    decoders: Sequence[Episode],
    used: set[int],
    read_bytes: Counter,
    is_lazy: Callable[[str], bool],
) -> list[Restore]:
    by_episode: dict[int, tuple[Episode, FileEvent]] = {}
    files_of: dict[int, set[str]] = {}  # episode -> the files opened in it
    unmatched_paths: dict[str, FileEvent] = {}
    matched_paths: set[str] = set()
    for ev in sorted(opens, key=lambda e: e.t):
        ep = _best((d for d in decoders if id(d) not in used), ev.t)
        if ep is None:
            unmatched_paths.setdefault(ev.path, ev)
            continue
        matched_paths.add(ev.path)
        # an episode that opened several files stands for its largest (a torch.load of the
        # optimizer, not the small json read just before it)
        had = by_episode.get(id(ep))
        if had is None or (ev.bytes or 0) > (had[1].bytes or 0):
            by_episode[id(ep)] = (ep, ev)
        files_of.setdefault(id(ep), set()).add(ev.path)
    # A file read back in several of the process's episodes is one restore: the main
    # thread's time in all of them (many.Checkpointer reads the newest receipt when it is
    # made, the job loads the state later).
    per_file: dict[tuple[int, str], list[tuple[Episode, FileEvent, float | None]]] = {}
    for ep, ev in by_episode.values():
        used.add(id(ep))
        # the process's reads over the episode are this file's only when it is the one
        # file opened in it, and then no more than the file holds (the process read
        # other things meanwhile: a log, a dataset)
        got = read_bytes(ep.pid, ep.start, ep.end) if len(files_of[id(ep)]) == 1 else None
        if got is not None and ev.bytes is not None:
            got = min(got, float(ev.bytes))
        per_file.setdefault((ep.pid, ev.path), []).append((ep, ev, got))
    out = []
    for group in per_file.values():
        # the episode that read the most stands for the restore
        ep, ev, _ = max(group, key=lambda g: (g[2] or 0.0, g[0].wall_s))
        first = min(g[1].t for g in group)
        reads = [g[2] for g in group]
        timed_by = ep.timed_by if len(group) == 1 else f"{ep.timed_by}, {len(group)} episodes"
        out.append(
            Restore(
                path=ev.path, bytes=ev.bytes, open_t=first, pid=ep.pid, thread_id=ep.thread,
                episode=ep, wall_s=sum(g[0].wall_s for g in group),
                resolution_s=sum(stated_resolution_s(g[0]) for g in group),
                timed_by=timed_by,
                read_bytes=_at_most(reads, ev.bytes),
                lazy=is_lazy(ev.path),
            )
        )  # fmt: skip
    for path, ev in unmatched_paths.items():
        if path in matched_paths:
            continue  # another open of the file is the restore (a listing, a receipt read)
        out.append(
            Restore(
                path=path, bytes=ev.bytes, open_t=ev.t, pid=None, thread_id=None, episode=None,
                wall_s=None, resolution_s=None, timed_by=FILE_EVENT_ONLY, read_bytes=None,
                lazy=is_lazy(path),
            )
        )  # fmt: skip
    out.sort(key=lambda r: r.open_t)
    return out
