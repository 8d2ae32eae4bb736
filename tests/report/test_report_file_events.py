"""build_report on runs recorded with a `--checkpoints DIR` watch: the checkpoints are the
files written (profiler/attribution/checkpoints.py matched each to its stall episode), not
the codepath with the most main-thread episode wall time; a side identified one way is not
compared with a side identified the other way unless mismatches are allowed."""

from __future__ import annotations

import dataclasses

import pytest

from serwatt.profiler.report import ReportRefused, build_report, render_text
from serwatt.profiler.report.inputs import CheckpointInput, EpisodeInput, RestoreInput, RunInput
from tests.report_synth import make_run


def _log_lines(run: RunInput, n: int, wall_s: float) -> tuple[EpisodeInput, ...]:
    """Main-thread json episodes (a training loop's log lines) between the checkpoints,
    together longer than the checkpoints: the heuristic takes them for the checkpoints."""
    first = run.episodes[0] if run.episodes else None
    assert first is not None
    return tuple(
        dataclasses.replace(
            first,
            codepath="json",
            start=first.start + 2.5 + 6.0 * k,
            end=first.start + 2.5 + 6.0 * k + wall_s,
            wall_s=wall_s,
            cpu_s=wall_s,
        )  # fmt: skip
        for k in range(n)
    )


def watched(run_id: str, *, seed: int, lost: int = 1) -> RunInput:
    """A `.many` run whose every checkpoint episode wrote a file (the stall trimmed to the
    file event, as the matcher does), `lost` more files no episode spans, an import's short
    `many` episode before the first save, and log lines that outweigh the saves."""
    run = make_run(run_id, seed=seed, codepath="many", stall_s=0.2)
    saves = list(run.episodes or ())
    first = saves[0]
    import_ep = dataclasses.replace(
        first, start=first.start - 0.9, end=first.start - 0.893, wall_s=0.007, cpu_s=0.007
    )
    checkpoints = [
        CheckpointInput(
            path=f"/ckpt/step{k}.many",
            bytes=1 << 20,
            event_t=e.end,
            pid=e.pid,
            thread_id=e.thread,
            episode_start=e.start,
            stall_thread=e.thread,
            stall_start=e.start,
            stall_s=e.wall_s * 0.9,
            resolution_s=e.resolution_s,
            timed_by="sample edges",
            cpu_s_all_threads=e.cpu_s * 2.0,
            async_tail_s=0.0,
        )  # fmt: skip
        for k, e in enumerate(saves)
    ]
    end = saves[-1].end
    checkpoints += [
        CheckpointInput(
            path=f"/ckpt/lost{k}.many",
            bytes=1 << 20,
            event_t=end + 0.5 + k,
            pid=first.pid,
            thread_id=None,
            episode_start=None,
            stall_thread=None,
            stall_start=None,
            stall_s=None,
            resolution_s=None,
            timed_by="file event only",
            cpu_s_all_threads=None,
            async_tail_s=None,
        )  # fmt: skip
        for k in range(lost)
    ]
    episodes = (import_ep, *saves, *_log_lines(run, len(saves), 0.5))
    return dataclasses.replace(run, episodes=episodes, checkpoints=tuple(checkpoints))


def test_file_events_count_every_file_and_no_import_or_log_line() -> None:
    base = [watched("torch-1", seed=1), watched("torch-2", seed=2)]
    base = [dataclasses.replace(r, episodes=tuple(
        dataclasses.replace(e, codepath="torch") if e.codepath == "many" else e
        for e in r.episodes or ()
    )) for r in base]  # fmt: skip
    cand = [watched("many-1", seed=3, lost=2), watched("many-2", seed=4, lost=0)]
    report = build_report(base, cand)
    ck = report["checkpoint"]
    c = ck["candidate"]
    files = [x for r in cand for x in r.checkpoints or ()]
    stalls = sorted(x.stall_s for x in files if x.stall_s is not None)
    assert c["identified_by"] == "file events"
    assert c["codepath"] == "many" and ck["baseline"]["codepath"] == "torch"
    assert c["checkpoints"] == len(files) and c["file_event_only"] == 2
    assert c["episodes"] == len(stalls)  # the import's 7 ms episode is not one of them
    assert c["stall_values_s"] == pytest.approx(stalls, abs=1e-12)  # the trimmed stall
    all_threads = [x.cpu_s_all_threads for x in files if x.cpu_s_all_threads is not None]
    assert c["cpu_s_all_threads_per_checkpoint"] == pytest.approx(
        sum(all_threads) / len(all_threads)
    )
    assert report["candidate"]["checkpoints"] == len(files)
    assert report["candidate"]["checkpoints_identified_by"] == "file events"
    assert ck["stall_s"]["n_within"] == [ck["baseline"]["episodes"], c["episodes"]]
    assert ck["stall_s"]["n"] == [len(base), len(cand)]  # runs: the test's unit

    # the same runs without the watch: the log lines outweigh the saves and pass for them
    blind = [dataclasses.replace(r, checkpoints=None) for r in cand]
    blind_base = [dataclasses.replace(r, checkpoints=None) for r in base]
    guessed = build_report(blind_base, blind)["checkpoint"]["candidate"]
    assert guessed["identified_by"] == "heuristic" and guessed["codepath"] == "json"
    assert guessed["file_event_only"] is None


def test_skip_warmup_leaves_out_each_runs_first_files() -> None:
    base = [watched("a-1", seed=1, lost=0), watched("a-2", seed=2, lost=0)]
    cand = [watched("b-1", seed=3, lost=0), watched("b-2", seed=4, lost=0)]
    n = sum(len(r.checkpoints or ()) for r in cand)
    c = build_report(base, cand, skip_warmup=2)["checkpoint"]["candidate"]
    assert c["checkpoints"] == n - 4 and c["episodes"] == n - 4
    assert c["warmup"]["skipped"] == 4


def test_a_heuristic_side_against_a_file_event_side_is_refused_unless_allowed() -> None:
    base = [
        dataclasses.replace(watched("torch-1", seed=1), checkpoints=None),
        dataclasses.replace(watched("torch-2", seed=2), checkpoints=None),
    ]
    cand = [watched("many-1", seed=3), watched("many-2", seed=4)]
    with pytest.raises(ReportRefused) as info:
        build_report(base, cand)
    assert [m.field for m in info.value.mismatches] == ["checkpoints identified by"]
    text = str(info.value)
    assert "heuristic (no --checkpoints) (torch-1, torch-2)" in text
    assert "file events (many-1, many-2)" in text
    report = build_report(base, cand, allow_mismatch=True)
    assert report["caveats"] == [
        "not comparable: checkpoints identified by differs: heuristic (no --checkpoints) "
        "(torch-1, torch-2); file events (many-1, many-2)"
    ]
    assert report["checkpoint"]["baseline"]["identified_by"] == "heuristic"
    assert report["checkpoint"]["candidate"]["identified_by"] == "file events"


def _resumed(run: RunInput, walls: list[float | None], read_bytes: int, lazy: bool) -> RunInput:
    """`run` resumed from checkpoints: one restore per wall (None: a file-event-only one)."""
    restores = tuple(
        RestoreInput(
            path=f"/ckpt/r{k}",
            bytes=1 << 20,
            open_t=run.started_at + k,
            pid=4242,
            thread_id=4242 if w is not None else None,
            episode_start=None,
            wall_s=w,
            resolution_s=0.02 if w is not None else None,
            timed_by="sample counts" if w is not None else "file event only",
            read_bytes=None,
            lazy=lazy,
        )  # fmt: skip
        for k, w in enumerate(walls)
    )
    return dataclasses.replace(
        run,
        restores=restores,
        restore_s=tuple(w for w in walls if w is not None),
        read_bytes=read_bytes,
        read_bytes_source="/proc/<pid>/io read_bytes",
    )


def test_restores_are_counted_timed_and_compared_per_side() -> None:
    walls_b = [[1.2, 1.3, 1.1, 1.25, 1.15, 1.22], [1.18, 1.28, 1.21, 1.19, 1.3, None]]
    walls_c = [[0.011, 0.012, 0.010, 0.013, 0.011, 0.012], [0.012, 0.010, 0.011, 0.012, 0.011]]
    base = [
        _resumed(watched(f"torch-{k}", seed=k), w, 64 << 20, lazy=False)
        for k, w in enumerate(walls_b, 1)
    ]
    cand = [
        _resumed(watched(f"many-{k}", seed=k + 2), w, 0, lazy=True)
        for k, w in enumerate(walls_c, 1)
    ]
    report = build_report(base, cand)
    restore = report["restore"]
    b, c = restore["baseline"], restore["candidate"]
    assert (b["restores"], b["file_event_only"]) == (12, 1)
    assert (c["restores"], c["file_event_only"]) == (11, 0)
    # the untimed one was shorter than two 50 Hz periods; no bound where all were timed
    assert (b["file_event_only_below_s"], c["file_event_only_below_s"]) == (0.04, None)
    timed_b = [w for ws in walls_b for w in ws if w is not None]
    assert b["wall_s"]["mean"] == pytest.approx(sum(timed_b) / len(timed_b))
    assert b["read_bytes"] == 2 * (64 << 20) and b["cache"].startswith("cold: ")
    assert c["read_bytes"] == 0 and c["cache"].startswith("warm: ")
    assert c["lazy"] is True and "first use" in c["note"] and b["note"] is None
    # the comparison is the checkpoint section's secondary restore test, computed once
    assert restore["wall_s"] is report["checkpoint"]["restore_s"]
    # two resumed runs a side: the run is the unit, so 100x is not significant (2+2 runs
    # cannot reach p < 0.05) and the report says so rather than count 12+11 restores
    assert restore["wall_s"]["ratio"] < 0.02 and restore["wall_s"]["significant"] is False
    assert restore["wall_s"]["n"] == [2, 2] and restore["wall_s"]["n_within"] == [11, 11]
    assert restore["wall_s"]["ci95"] is None


def test_runs_without_restores_say_so() -> None:
    base = [watched("a-1", seed=1), watched("a-2", seed=2)]
    cand = [watched("b-1", seed=3), watched("b-2", seed=4)]
    restore = build_report(base, cand)["restore"]
    assert restore["wall_s"] is None and restore["baseline"]["restores"] == 0
    assert restore["note"] == "restore not compared: no timed restore on baseline and candidate"
    blind = build_report(
        [dataclasses.replace(r, checkpoints=None) for r in base],
        [dataclasses.replace(r, checkpoints=None) for r in cand],
    )["restore"]
    assert blind["baseline"]["restores"] is None
    assert blind["baseline"]["source"].startswith("unavailable: ")


def test_the_table_shows_files_written_and_the_restores() -> None:
    base = [_resumed(watched("torch-1", seed=1), [1.2, None], 64 << 20, lazy=False)]
    cand = [_resumed(watched("many-1", seed=3, lost=2), [0.011], 0, lazy=True)]
    report = build_report(base, cand)
    text = render_text(report, full=True)
    files = next(ln for ln in text.splitlines() if ln.strip().startswith("files written"))
    assert files.split()[2:4] == [
        str(report["checkpoint"]["baseline"]["files_written"]),
        str(report["checkpoint"]["candidate"]["files_written"]),
    ]
    # one file per save: as many files as checkpoints
    assert (
        report["checkpoint"]["baseline"]["files_written"]
        == (report["checkpoint"]["baseline"]["checkpoints"])
    )
    untimed = next(ln for ln in text.splitlines() if "untimed (files)" in ln)
    assert untimed.split()[2:4] == ["1", "2"]
    assert (
        "restore: baseline: 2 (1 untimed, each under 40 ms: no sample); cold: 67108864 bytes"
        in text
    )
    assert "restore: candidate: 1 (0 untimed); warm: " in text
    assert max(len(ln) for ln in text.splitlines()) <= 100


def test_a_background_writers_fsync_makes_its_checkpoint_durable() -> None:
    # many.Checkpointer: the training thread copies (no fsync), a thread of its own writes
    # and fsyncs the file; "fsync seen in" counts the checkpoint's, not only the copy's
    def background(run: RunInput) -> RunInput:
        copies = {(e.thread, e.start): e for e in run.episodes or ()}
        writers, files = [], []
        for c in run.checkpoints or ():
            stall = copies.get((c.stall_thread, c.stall_start))
            if stall is None:
                files.append(c)
                continue
            w = dataclasses.replace(
                stall, thread=stall.thread + 1, main_thread=False, start=stall.end,
                end=stall.end + 0.05, wall_s=0.05, durable=len(writers) % 2 == 0,
            )  # fmt: skip
            writers.append(w)
            files.append(dataclasses.replace(c, thread_id=w.thread, episode_start=w.start))
        copied = tuple(dataclasses.replace(e, durable=False) for e in run.episodes or ())
        return dataclasses.replace(run, episodes=(*copied, *writers), checkpoints=tuple(files))

    base = [watched("b-1", seed=1), watched("b-2", seed=2)]
    cand = [background(watched("c-1", seed=3)), background(watched("c-2", seed=4))]
    ck = build_report(base, cand)["checkpoint"]
    n = ck["candidate"]["episodes"]
    fsynced = sum(
        e.durable for r in cand for e in r.episodes or () if not e.main_thread
    )  # every other writer fsynced where the samples saw it
    assert 0 < fsynced < n
    assert ck["candidate"]["durable"] == f"fsync seen in {fsynced} of {n}"


def _overlapped(run: RunInput, waits: list[float]) -> RunInput:
    """many.Checkpointer with overlap=True: the training thread's call (the stall), the file
    written by a thread of its own and complete 0.4 s after the call; in between, the next
    optimizer.step() of checkpoint k waits `waits[k % len(waits)]` s for the copy in a
    `many` episode of the training thread (0: none sampled). Beside them, episodes the
    wait must not take in: a log line's json episode inside the same span, and a `many`
    episode that ends after the file was complete."""
    copies = {(e.thread, e.start): e for e in run.episodes or ()}
    extra: list[EpisodeInput] = []
    files = []
    k = 0
    for c in run.checkpoints or ():
        stall = copies.get((c.stall_thread, c.stall_start))
        if stall is None:
            files.append(c)
            continue
        event = stall.end + 0.4

        def on_main(
            codepath: str, start: float, wall: float, s: EpisodeInput = stall
        ) -> EpisodeInput:
            return dataclasses.replace(
                s, codepath=codepath, start=start, end=start + wall, wall_s=wall, cpu_s=wall
            )

        writer = dataclasses.replace(
            stall, thread=stall.thread + 1, main_thread=False, start=stall.end, end=event,
            wall_s=event - stall.end,
        )  # fmt: skip
        extra += [
            writer,
            on_main("json", stall.end + 0.05, 0.02),
            on_main("many", event - 0.01, 0.2),
        ]
        if waits[k % len(waits)]:
            extra.append(on_main("many", stall.end + 0.1, waits[k % len(waits)]))
        files.append(
            dataclasses.replace(
                c, thread_id=writer.thread, episode_start=writer.start, event_t=event
            )
        )
        k += 1
    return dataclasses.replace(
        run, episodes=(*(run.episodes or ()), *extra), checkpoints=tuple(files)
    )


def _call_unsampled(run: RunInput) -> RunInput:
    """The run's first checkpoint with its call too short for a sample: no stall episode,
    only its background writer (and its wait after)."""
    first, *rest = run.checkpoints or ()
    episodes = tuple(
        e
        for e in run.episodes or ()
        if (e.pid, e.thread, e.start) != (first.pid, first.stall_thread, first.stall_start)
    )
    untimed = dataclasses.replace(
        first, stall_thread=None, stall_start=None, stall_s=None, timed_by="sample counts"
    )
    return dataclasses.replace(run, episodes=episodes, checkpoints=(untimed, *rest))


def test_an_overlapped_checkpoints_wait_in_step_is_shown_beside_its_stall_and_summed() -> None:
    waits = [0.06, 0.0, 0.03]
    base = [watched("b-1", seed=1, lost=0), watched("b-2", seed=2, lost=0)]
    cand = [
        _call_unsampled(_overlapped(watched("c-1", seed=3, lost=0), waits)),
        _overlapped(watched("c-2", seed=4, lost=0), waits),
    ]
    report = build_report(base, cand)
    ck = report["checkpoint"]
    c = ck["candidate"]
    stalls = [x.stall_s for r in cand for x in r.checkpoints or () if x.stall_s is not None]
    # each file's wait where its call was seen; the file whose call went unsampled is left
    # out (its wait episode is not taken by the next file either)
    pairs = [
        (x.stall_s, waits[k % len(waits)])
        for r in cand
        for k, x in enumerate(r.checkpoints or ())
        if x.stall_s is not None
    ]
    per = [w for _s, w in pairs]
    assert len(pairs) == c["episodes"] == c["wait_checkpoints"] == len(stalls)
    assert c["wait_s_per_checkpoint"] == pytest.approx(sum(per) / len(per), abs=1e-9)
    assert c["waits_seen"] == sum(w > 0 for w in per)
    assert c["stall_and_wait_s_per_checkpoint"] == pytest.approx(
        sum(a + w for a, w in pairs) / len(pairs), abs=1e-9
    )
    # the stall is the call alone: the wait is beside it, not in it
    assert sorted(c["stall_values_s"]) == pytest.approx(sorted(stalls), abs=1e-12)
    # a side that writes on the training thread has no wait to show
    assert ck["baseline"]["wait_s_per_checkpoint"] is None
    text = render_text(report, full=True)
    row = next(ln for ln in text.splitlines() if "+ wait after s" in ln)
    assert row.split()[4:6] == ["-", f"{c['wait_s_per_checkpoint']:.3g}"]
    assert f"waits seen: -, {c['waits_seen']} of {len(per)}" in row
    total = next(ln for ln in text.splitlines() if "= stall + wait s" in ln)
    assert total.split()[5:7] == ["-", f"{c['stall_and_wait_s_per_checkpoint']:.3g}"]
    # without a wait seen anywhere the rows still say it was looked for: 0
    plain = [watched("c-1", seed=3, lost=0), watched("c-2", seed=4, lost=0)]
    quiet = build_report(base, [_overlapped(r, [0.0]) for r in plain])
    assert quiet["checkpoint"]["candidate"]["wait_s_per_checkpoint"] == 0.0
    assert "+ wait after s" in render_text(quiet, full=True)
    assert "+ wait after s" not in render_text(build_report(base, plain), full=True)


def test_the_next_checkpoints_call_is_not_the_wait_of_the_one_before() -> None:
    # one save in flight: the next call waits for the write still going, so its stall can
    # end just after the earlier file's event, inside that file's window; it is a stall
    run = _overlapped(watched("c-1", seed=3, lost=0), [0.0])
    first, second, *rest = run.checkpoints or ()
    episodes = list(run.episodes or ())
    i = next(
        k
        for k, e in enumerate(episodes)
        if (e.thread, e.start) == (second.stall_thread, second.stall_start)
    )
    first_stall = next(
        e for e in episodes if (e.thread, e.start) == (first.stall_thread, first.stall_start)
    )
    start = first_stall.end + 0.2
    episodes[i] = dataclasses.replace(
        episodes[i], start=start, end=first.event_t + 0.02, wall_s=first.event_t + 0.02 - start
    )
    moved = dataclasses.replace(
        run,
        episodes=tuple(episodes),
        checkpoints=(first, dataclasses.replace(second, stall_start=start), *rest),
    )
    base = [watched("b-1", seed=1, lost=0), watched("b-2", seed=2, lost=0)]
    c = build_report(base, [moved, _overlapped(watched("c-2", seed=4, lost=0), [0.0])])
    assert c["checkpoint"]["candidate"]["waits_seen"] == 0


def test_untimed_files_give_a_floor_under_the_stall_mean_and_a_warning_when_it_matters() -> None:
    # files with no stall sampled are left out of the stall figures, which then read high
    # when the untimed ones were short (an overlapped call of a few ms): the report says
    # so, with the mean that takes them as 0 s
    base = [watched("b-1", seed=1, lost=0), watched("b-2", seed=2, lost=0)]
    cand = [watched("c-1", seed=3, lost=12), watched("c-2", seed=4, lost=12)]
    report = build_report(base, cand)
    c = report["checkpoint"]["candidate"]
    stalls = [x.stall_s for r in cand for x in r.checkpoints or () if x.stall_s is not None]
    assert c["file_event_only"] == 24
    assert c["stall_mean_untimed_as_0_s"] == pytest.approx(sum(stalls) / (len(stalls) + 24))
    assert report["checkpoint"]["baseline"]["stall_mean_untimed_as_0_s"] is None
    [w] = [
        w
        for w in report["warnings"]
        if w["scope"] == "checkpoint" and "no stall sampled" in w["message"]
    ]
    assert w["side"] == "candidate"
    assert f"24 of {len(stalls) + 24} checkpoint files have no stall sampled" in w["message"]
    assert "no stall sampled" in render_text(report, full=True)
    # one untimed file among many moves the mean by less than the stalls are timed to
    few = build_report(base, [watched("c-1", seed=3, lost=1), watched("c-2", seed=4, lost=0)])
    assert few["checkpoint"]["candidate"]["stall_mean_untimed_as_0_s"] is not None
    assert not [w for w in few["warnings"] if "no stall sampled" in w["message"]]
