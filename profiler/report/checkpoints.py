"""A side's checkpoints and restores for the A/B report: which episodes are its
checkpoints (the files a `--checkpoints DIR` watch saw written, matched to their stall
episodes, or without a watch the heuristic), how many, what durability was seen and is
known, and its restores. profiler.report.build assembles the sections from these."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from serwatt.profiler.attribution.checkpoints import FILE_EVENT_ONLY as FILE_ONLY
from serwatt.profiler.attribution.checkpoints import PART_OF, STAMP_SLACK_S
from serwatt.profiler.classify.codepaths import KNOWN_DURABLE
from serwatt.profiler.report.inputs import CheckpointInput, EpisodeInput, RunInput
from serwatt.profiler.terminal_escape import escape_text

if TYPE_CHECKING:
    from serwatt.profiler.report.sides import Side

# How a side's checkpoints were found: the files its `--checkpoints DIR` watch saw
# completed, or (no watch) the serialization codepath with the most main-thread episode
# wall time, every episode of it a checkpoint
FILE_EVENTS = "file events"
HEURISTIC = "heuristic"


def quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    return {
        "p50": float(np.percentile(a, 50)),
        "p95": float(np.percentile(a, 95)),
        "max": float(a.max()),
        "mean": float(a.mean()),
    }


_EpisodesByKey = dict[tuple[Any, ...], EpisodeInput]


def _stalls(
    run: RunInput, skip: int
) -> tuple[_EpisodesByKey, list[tuple[CheckpointInput, EpisodeInput | None]]]:
    """A file-event run's episodes by (pid, thread, start), and its checkpoints after the
    first `skip` (in event order), each with the episode its stall points at (None: none;
    a checkpoint without stall_s has no stall whatever it points at)."""
    by_key: _EpisodesByKey = {(e.pid, e.thread, e.start): e for e in run.episodes or ()}
    # a checkpoint directory's files are its save's breakdown, the directory the checkpoint
    saves = [c for c in run.checkpoints or () if not (c.timed_by or "").startswith(PART_OF)]
    ordered = sorted(saves, key=lambda c: c.event_t)[skip:]
    return by_key, [(c, by_key.get((c.pid, c.stall_thread, c.stall_start))) for c in ordered]


def stall_episodes(run: RunInput, skip: int) -> tuple[list[EpisodeInput], int]:
    """A file-event run's checkpoints after the first `skip` (in event order) as their stall
    episodes, each with the checkpoint's stall_s as wall_s (profiler/attribution/
    checkpoints.py trims a stall that spans its file event) and durable when an fsync was
    seen in the stall or in the file's writer (a background writer fsyncs where the
    training thread only copied), and how many of them have no stall episode (file event
    only, or one episode several files' events fall in)."""
    matched, without = [], 0
    by_key, checkpoints = _stalls(run, skip)
    for c, e in checkpoints:
        if e is None or c.stall_s is None:
            without += 1
            continue
        writer = by_key.get((c.pid, c.thread_id, c.episode_start))
        durable = e.durable or (writer is not None and writer.durable)
        # the stall begins where its save function began preparing (episodes.py)
        start = e.start - (e.prepared_s or 0.0)
        end = max(start, start + c.stall_s)
        matched.append(replace(e, wall_s=c.stall_s, start=start, end=end, durable=durable))
    return matched, without


def waits_after_call(run: RunInput, skip: int) -> list[tuple[float, float]]:
    """(stall_s, wait_s) per file-event checkpoint after the first `skip` that has a stall
    episode and a writer episode on another thread: wait_s is how long the training thread
    waited for it after its call returned and before its file was complete. That is the
    next `optimizer.step()` held in a pre-hook in profiler/many until an overlapped copy is
    done (`many.Checkpointer.checkpoint(..., overlap=True)`), or a `wait()`/`close()` for
    the write, seen as the main thread's episodes of the stall's codepath that begin after
    the stall episode ends and end by the file's event (within the watch's STAMP_SLACK_S),
    and are no checkpoint's stall; 0 when none was sampled (a wait shorter than a sample
    period can escape them, as a stall can). A checkpoint whose call went unsampled is left
    out: its writer episode is no anchor (a background writer's saves a step or two apart
    merge into one episode that began at an earlier file)."""
    waits = []
    stalls = {(x.pid, x.stall_thread, x.stall_start) for x in run.checkpoints or ()}
    by_key, checkpoints = _stalls(run, skip)
    # no checkpoint's stall can be a wait: left out once, not per checkpoint
    others = [w for w in run.episodes or () if (w.pid, w.thread, w.start) not in stalls]
    for c, e in checkpoints:
        writer = by_key.get((c.pid, c.thread_id, c.episode_start))
        if e is None or c.stall_s is None or writer is None or writer.main_thread:
            continue  # no call seen, or the file written in the call: nothing after it
        wait = sum(
            w.wall_s
            for w in others
            if (w.pid, w.thread) == (c.pid, c.stall_thread)
            and w.codepath == e.codepath
            and w.start >= e.end
            and w.end <= c.event_t + STAMP_SLACK_S
        )
        waits.append((c.stall_s, wait))
    return waits


def wait_fields(side: Side, skip: int) -> dict[str, Any]:
    """The training thread's wait for a checkpoint after its call (waits_after_call: an
    overlapped copy's wait in the next `optimizer.step()`, or a wait for the write), beside
    the stall and summed with it, means over the checkpoints whose call was seen and whose
    file a background thread wrote. None without file events (the heuristic's episodes
    say nothing of which file they wrote) and when there are no such checkpoints."""
    pairs = [p for r in side.runs for p in waits_after_call(r, skip)] if side.file_events else []
    if not pairs:
        return dict.fromkeys(
            ("wait_s_per_checkpoint", "waits_seen", "wait_checkpoints",
             "stall_and_wait_s_per_checkpoint"),
        )  # fmt: skip
    return {
        "wait_s_per_checkpoint": float(np.mean([w for _s, w in pairs])),
        "waits_seen": sum(w > 0 for _s, w in pairs),
        "wait_checkpoints": len(pairs),
        "stall_and_wait_s_per_checkpoint": float(np.mean([s + w for s, w in pairs])),
    }


def untimed_stall_floor(
    side: Side, untimed: int, eps: Sequence[EpisodeInput], warnings: list[Any]
) -> float | None:
    """The stall mean with the side's `untimed` files (no stall sampled) taken as 0 s, a
    floor under the mean of its timed stalls `eps`, and a warning saying why the two
    differ: a stall shorter than a sample period leaves no episode, so the timed ones are
    the longer ones (an overlapped call of a few ms is mostly unsampled). The warning only
    where the two means differ by more than the stalls' resolution. None when every file
    was timed."""
    if not untimed or not eps:
        return None
    floor = float(sum(e.wall_s for e in eps)) / (len(eps) + untimed)
    timed_mean = float(np.mean([e.wall_s for e in eps]))
    if timed_mean - floor <= max(e.resolution_s for e in eps):
        return floor  # within what the stalls are timed to: not worth a warning
    rates = [r.rate_hz for r in side.runs if r.rate_hz > 0]
    period = f", {1000.0 / min(rates):.3g} ms at the slowest run's rate" if rates else ""
    warnings.append(
        {
            "scope": "checkpoint",
            "side": side.name,
            "message": f"{side.name}: {untimed} of {len(eps) + untimed} checkpoint files have no "
            f"stall sampled (shorter than a sample period{period}, or in a gap between "
            f"windows); the stall figures are over the {len(eps)} timed ones and read high "
            f"when short stalls go unsampled: with the untimed taken as 0 s the mean is "
            f"{floor:.3g} s",
        }
    )
    return floor


def checkpoint_choice(side: Side, given: str | None) -> tuple[str | None, str, bool]:
    """(codepath, how it was chosen, main-thread episodes only)."""
    if side.file_events:
        if given is not None:
            return given, "given (checkpoints identified by file events)", True
        counts: dict[str, int] = {}
        for r in side.runs:
            for e in stall_episodes(r, 0)[0]:
                counts[e.codepath] = counts.get(e.codepath, 0) + 1
        if not counts:
            return None, "no checkpoint file matched a training-thread episode", True
        best = max(sorted(counts), key=lambda c: counts[c])
        return best, "the codepath of the checkpoints' file events' episodes", True
    episodes = side.episodes
    main = [e for e in episodes if e.main_thread]
    if given is not None:
        return given, "given", any(e.codepath == given for e in main)
    if not side.has_episodes:
        return None, side.no_episodes, False
    pool, how = (main, "main thread") if main else (episodes, "any thread (none on the main)")
    if not pool:
        return None, "no serialization episodes recorded", False
    wall: dict[str, float] = {}
    for e in pool:
        wall[e.codepath] = wall.get(e.codepath, 0.0) + e.wall_s
    best = max(sorted(wall), key=lambda c: wall[c])
    return best, f"most episode wall time on the {how}", bool(main)


def durability(episodes: Sequence[EpisodeInput]) -> str | None:
    """What the samples saw: an fsync in how many of the checkpoints (None: none)."""
    if not episodes:
        return None
    return f"fsync seen in {sum(e.durable for e in episodes)} of {len(episodes)}"


def known_durable(
    codepath: str | None, episodes: Sequence[EpisodeInput]
) -> tuple[bool | None, str]:
    """(whether the side's saver makes its checkpoints durable, why). True when its
    codepath's writer always does (KNOWN_DURABLE) or an fsync was seen in any checkpoint;
    None when none was seen, which is not proof of none (an fsync of d seconds escapes
    the samples with probability exp(-d/period)), so never "not durable"."""
    if codepath in KNOWN_DURABLE:
        return True, f"known: {KNOWN_DURABLE[codepath]}"
    seen = durability(episodes)
    if seen is None:
        return None, "no checkpoints"
    if any(e.durable for e in episodes):
        return True, seen
    return None, f"unknown: {seen} (an fsync shorter than a sample period can escape them)"


def checkpoint_runs(
    side: Side, cp: str | None, main_only: bool, skip: int
) -> list[tuple[str, list[EpisodeInput], int]]:
    """Per run: (run id, its checkpoint episodes in time order after the skipped warm-up,
    how many were skipped)."""
    out = []
    for r in side.runs:
        if r.checkpoints is not None:
            eps, _without = stall_episodes(r, skip)
            out.append((r.run_id, eps, min(skip, len(r.checkpoints))))
            continue
        eps = [
            e
            for e in (r.episodes or ())
            if cp is not None and e.codepath == cp and (e.main_thread or not main_only)
        ]
        eps.sort(key=lambda e: e.start)
        out.append((r.run_id, eps[skip:], min(skip, len(eps))))
    return out


def watched_checkpoints(side: Side, skip: int) -> list[CheckpointInput]:
    """The file-event checkpoints of the side's watched runs, each run's first `skip` left
    out as warm-up: a directory written in one save is one, its files not counted again."""
    return [
        c for r in side.runs if r.checkpoints is not None for c, _files in _save_members(r, skip)
    ]


def files_written(side: Side, skip: int) -> int | None:
    """The files the side's watched checkpoints after warm-up are made of (a directory's
    save counts its files); None without file events."""
    if not side.file_events:
        return None
    return sum(
        len(files) or 1
        for r in side.runs
        if r.checkpoints is not None
        for _c, files in _save_members(r, skip)
    )


def checkpoint_count(side: Side, eps: Sequence[EpisodeInput], skip: int) -> int:
    """Checkpoints after warm-up: every file written (file-event-only ones included) on a
    watched run, every checkpoint episode on a heuristic one."""
    if side.file_events:
        return len(watched_checkpoints(side, skip))
    return len(eps)


def file_event_fields(side: Side, skip: int) -> dict[str, Any]:
    """What file events add to a side's checkpoint figures: how they were identified, how
    many have no stall episode, the CPU on every thread and the background tail."""
    if not side.file_events:
        return {
            "identified_by": HEURISTIC,
            "file_event_only": None,
            "cpu_s_all_threads_per_checkpoint": None,
            "async_tail_s": None,
        }
    watched = watched_checkpoints(side, skip)
    cpu = [c.cpu_s_all_threads for c in watched if c.cpu_s_all_threads is not None]
    tail = [c.async_tail_s for c in watched if c.async_tail_s is not None]
    without = sum(stall_episodes(r, skip)[1] for r in side.runs)
    return {
        "identified_by": FILE_EVENTS,
        "file_event_only": without,
        "cpu_s_all_threads_per_checkpoint": float(np.mean(cpu)) if cpu else None,
        "cpu_s_all_threads_checkpoints": len(cpu),
        "async_tail_s": quantiles(tail),
    }


RESTORE_SOURCE = (
    "measured: reads of checkpoint files under --checkpoints (inotify IN_OPEN), each timed "
    "by the main thread's decode episode spanning it, to ± resolution_s"
)


LAZY_RESTORE_NOTE = (
    "lazy format (.many, safetensors): tensors are read on first use, so the open is not "
    "all of the restore"
)


def restore_side(side: Side) -> dict[str, Any]:
    """One side's restores: how many, their wall time (file-event-only ones counted, not
    timed), storage bytes read by the process over its runs, and whether the page cache
    served them (no storage reads) or storage did."""
    if not side.file_events:
        return {
            "restores": None,
            "note": "no --checkpoints watch: restores are not identified",
            "source": "unavailable: the runs were recorded without --checkpoints",
        }
    restores = [x for r in side.runs for x in r.restores]
    timed = [x.wall_s for x in restores if x.wall_s is not None]
    read = [r.read_bytes for r in side.runs]
    read_bytes = None if any(b is None for b in read) else int(sum(b or 0 for b in read))
    if not restores or read_bytes is None:
        cache = None
    elif read_bytes == 0:
        cache = "warm: no storage reads over the runs (the page cache held the files)"
    else:
        cache = f"cold: {read_bytes} bytes read from storage over the runs"
    lazy = any(x.lazy for x in restores)
    # An interval two sampling periods long holds a tick however the ticks fall: a restore
    # no sample fell in was shorter (while the sampler kept pace; the slowest run's rate).
    rates = [r.rate_hz for r in side.runs if r.rate_hz > 0]
    untimed = len(restores) - len(timed)
    return {
        "restores": len(restores),
        "file_event_only": untimed,
        "file_event_only_below_s": 2.0 / min(rates) if untimed and rates else None,
        "wall_s": quantiles(timed),
        "resolution_s": max((x.resolution_s or 0.0 for x in restores), default=None),
        "read_bytes": read_bytes,
        "read_bytes_source": sorted({str(r.read_bytes_source) for r in side.runs}),
        "cache": cache,
        "lazy": lazy,
        "note": LAZY_RESTORE_NOTE if lazy else None,
        "source": RESTORE_SOURCE,
    }


def restore_section(sides: tuple[Side, Side], checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """`restore.<side>` and `restore.wall_s`: the comparison the checkpoint section's
    secondary family tested (checkpoint.restore_s, one computation), or None and why."""
    out: dict[str, Any] = {s.name: restore_side(s) for s in sides}
    out["wall_s"] = checkpoint.get("restore_s")
    if out["wall_s"] is None:
        missing = [s.name for s in sides if not out[s.name].get("wall_s")]
        out["note"] = "restore not compared: no timed restore on " + " and ".join(missing)
    return out


SAVE_FILES_SOURCE = (
    "measured: each file's bytes at its file event, its codepath and time from the py-spy "
    "episode that wrote it (± resolution_s); a file whose episode also wrote others of its "
    "save has no time of its own (shared), one no episode spans none (file event only)"
)


def _save_members(run: RunInput, skip: int) -> list[tuple[CheckpointInput, list[CheckpointInput]]]:
    """A file-event run's checkpoints after the first `skip` (as `_stalls` counts them),
    each with the files of its directory's save (profiler/attribution/checkpoints.py keeps
    them, timed_by PART_OF): those under its directory completed after the same
    directory's save before it and by its own last file."""
    ordered = sorted(run.checkpoints or (), key=lambda c: c.event_t)
    parts = [c for c in ordered if (c.timed_by or "").startswith(PART_OF)]
    rows = [c for c in ordered if not (c.timed_by or "").startswith(PART_OF)]
    out = []
    previous: dict[str, float] = {}  # a directory -> its save before's last file
    for i, row in enumerate(rows):
        after = previous.get(row.path, float("-inf"))
        previous[row.path] = row.event_t
        under = row.path.rstrip(os.sep) + os.sep
        members = [
            p for p in parts if p.path.startswith(under) and after < p.event_t <= row.event_t
        ]
        if i >= skip:
            out.append((row, members))
    return out


def save_files(side: Side, skip: int) -> dict[str, Any] | None:
    """The files of the side's checkpoints made of several (a directory written in one save),
    per file name and codepath over its saves after warm-up, and per save: bytes, and the
    time of the episode that wrote each file where that episode wrote no other file of its
    save. Names are relative to the checkpoint's directory, escaped (the job names them).
    None without file events or without such a checkpoint."""
    if not side.file_events:
        return None
    saves: list[dict[str, Any]] = []
    for r in side.runs:
        by_key: _EpisodesByKey = {(e.pid, e.thread, e.start): e for e in r.episodes or ()}
        for row, members in _save_members(r, skip):
            if len(members) < 2:
                continue
            writers = [by_key.get((m.pid, m.thread_id, m.episode_start)) for m in members]
            shared = Counter(id(w) for w in writers if w is not None)
            files = []
            for m, w in zip(members, writers, strict=True):
                alone = w is not None and shared[id(w)] == 1
                files.append(
                    {
                        "name": escape_text(os.path.relpath(m.path, row.path)),
                        "codepath": w.codepath if w is not None else None,
                        "bytes": m.bytes,
                        "writer_s": w.wall_s if alone and w is not None else None,
                        "resolution_s": w.resolution_s if w is not None else None,
                        "thread": None if w is None else "training" if w.main_thread else "other",
                        "timed": "measured" if alone else "shared" if w is not None else FILE_ONLY,
                    }
                )
            saves.append(
                {
                    "run_id": r.run_id,
                    "checkpoint": escape_text(os.path.basename(row.path.rstrip(os.sep))),
                    "stall_s": row.stall_s,
                    "resolution_s": row.resolution_s,
                    "files": files,
                }
            )
    if not saves:
        return None
    groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for s in saves:
        for f in s["files"]:
            groups.setdefault((f["name"], f["codepath"]), []).append(f)
    per_file = []
    for (name, codepath), fs in groups.items():
        sizes = [f["bytes"] for f in fs if f["bytes"] is not None]
        timed = [f["writer_s"] for f in fs if f["writer_s"] is not None]
        per_file.append(
            {
                "name": name,
                "codepath": codepath,
                "saves": len(fs),
                "bytes_mean": float(np.mean(sizes)) if sizes else None,
                "writer_s_mean": float(np.mean(timed)) if timed else None,
                "timed": len(timed),
                "shared": sum(f["timed"] == "shared" for f in fs),
                "file_event_only": sum(f["timed"] == FILE_ONLY for f in fs),
                "resolution_s": max(
                    (f["resolution_s"] for f in fs if f["resolution_s"] is not None), default=None
                ),
                "threads": sorted({f["thread"] for f in fs if f["thread"] is not None}),
            }
        )
    per_file.sort(key=lambda f: (-(f["bytes_mean"] or 0.0), f["name"], f["codepath"] or ""))
    return {
        "saves": len(saves),
        "per_file": per_file,
        "per_save": saves,
        "source": SAVE_FILES_SOURCE,
    }
