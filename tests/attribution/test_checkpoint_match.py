"""profiler.attribution.checkpoints.match on timelines laid out by hand: which episode wrote
each file and which is its stall, for a synchronous save and for many.Checkpointer's
background writes (one in flight, the next call waiting for it; close() after the last)."""

from __future__ import annotations

from dataclasses import replace

from serwatt.collectors.fsevents import OPENED, WRITTEN, FileEvent
from serwatt.profiler.attribution.checkpoints import match
from serwatt.profiler.attribution.episodes import Episode

PID = 100
MAIN, WRITER = PID, 101  # the main thread's tid is the pid
RES = 0.005


def ep(
    thread: int,
    start: float,
    end: float,
    *,
    durable: bool = False,
    main: bool | None = None,
    direction: str = "unknown",
) -> Episode:
    return Episode(
        pid=PID, thread=thread, codepath="many", start=start, end=end, wall_s=end - start,
        period_s=0.01, resolution_s=RES, cpu_s=(end - start) / 2,
        main_thread=(thread == MAIN) if main is None else main, durable=durable,
        direction=direction,
    )  # fmt: skip


def written(t: float, k: int) -> FileEvent:
    return FileEvent(t=t, kind=WRITTEN, path=f"/ckpt/async-{k}.many", bytes=1 << 20)


def _match(events: list[FileEvent], episodes: list[Episode]):  # noqa: ANN202
    return match(events, episodes, cpu_s=lambda *_: 0.0, read_bytes=lambda *_: 0.0)


def test_a_call_waiting_for_the_write_in_flight_is_the_next_checkpoints_stall() -> None:
    # call 0 copies 10 ms and hands over; write 0 runs 0.30 s; call 1 starts 0.1 s into it,
    # waits for it (so it spans write 0's event) and copies; write 1 follows
    stall0, write0 = ep(MAIN, 10.00, 10.01), ep(WRITER, 10.01, 10.31, durable=True)
    stall1, write1 = ep(MAIN, 10.11, 10.32), ep(WRITER, 10.32, 10.62, durable=True)
    m = _match([written(10.31, 0), written(10.62, 1)], [stall0, write0, stall1, write1])
    assert [c.episode for c in m.checkpoints] == [write0, write1]
    assert [c.stall for c in m.checkpoints] == [stall0, stall1]
    assert [c.stall_s for c in m.checkpoints] == [stall0.wall_s, stall1.wall_s]
    assert m.unmatched == ()


def test_close_after_the_last_save_is_not_part_of_its_stall() -> None:
    # the last call copies 10 ms, then close() waits the whole write: one main episode
    main = ep(MAIN, 20.00, 20.32)
    write = ep(WRITER, 20.01, 20.31, durable=True)
    (c,) = _match([written(20.31, 7)], [main, write]).checkpoints
    assert c.episode is write and c.stall is main
    assert abs(c.stall_s - 0.01) < 1e-9
    assert c.resolution_s == 2 * RES
    assert c.timed_by.endswith("ended where its background write began")
    assert abs(c.async_tail_s - 0.30) < 1e-9


def test_a_hasher_outliving_the_write_in_the_samples_is_not_the_writer() -> None:
    # .many's hashing thread, started and joined inside the write, whose last cell runs on
    # past the file; its tid unknown to py-spy. The watch stamped the file 5 ms late.
    stall = ep(MAIN, 30.00, 30.01)
    write = ep(WRITER, 30.01, 30.305, durable=True)
    hasher = ep(102, 30.01, 30.90, main=None)
    (c,) = _match([written(30.31, 0)], [stall, write, hasher]).checkpoints
    assert c.episode is write and c.stall is stall and c.stall_s == stall.wall_s


def test_a_synchronous_save_with_a_hashing_thread_stays_the_main_threads() -> None:
    # many.save_state on the main thread: the hasher runs inside it and never fsyncs
    main = ep(MAIN, 40.00, 40.30, durable=True)
    hasher = ep(102, 40.01, 40.29)
    (c,) = _match([written(40.30, 0)], [main, hasher]).checkpoints
    assert c.episode is main and c.stall is main and c.stall_s == main.wall_s
    assert c.async_tail_s == 0.0


def test_one_files_reads_in_two_episodes_are_one_restore() -> None:
    # many.Checkpointer reads the newest receipt when it is made; the job loads it later
    receipt = ep(MAIN, 50.00, 50.01)
    load = ep(MAIN, 54.00, 54.05)
    path = "/ckpt/async-3.many"
    opens = [FileEvent(t=t, kind=OPENED, path=path, bytes=4096) for t in (50.005, 54.01)]
    reads = {50.0: 0.0, 54.0: 1e6}
    m = match(opens, [receipt, load], cpu_s=lambda *_: 0.0, read_bytes=lambda p, t0, t1: reads[t0])
    (r,) = m.restores
    assert r.path == path and r.episode is load and r.open_t == 50.005
    assert abs(r.wall_s - 0.06) < 1e-9 and r.resolution_s == 2 * RES
    # the reads counted over its episodes, no more than the file holds (4096 bytes)
    assert r.read_bytes == 4096 and r.timed_by.endswith("2 episodes")
    assert m.unmatched == ()


def test_a_write_seen_only_merged_with_the_one_before_gets_no_stall() -> None:
    # saves two steps apart: the writer thread's two writes show as one episode (begun in
    # a window gap), and call 1 (the wait for write 0, copy 1, close()'s wait) is one main
    # episode; where write 1 began is not seen, so neither is call 1's own stall
    stall0 = ep(MAIN, 60.00, 60.08)
    writes = replace(ep(WRITER, 60.08, 60.83, durable=True), edge_unknown_s=0.3)
    hasher = replace(ep(102, 60.09, 60.83), edge_unknown_s=0.3)
    call1 = ep(MAIN, 60.23, 60.47)
    m = _match([written(60.25, 0), written(60.46, 1)], [stall0, writes, hasher, call1])
    first, second = m.checkpoints
    assert first.episode is writes and first.stall is stall0 and first.stall_s == stall0.wall_s
    assert second.stall is None and second.stall_s is None
    # nor where its span starts: the writer's episode began before write 0's event, so the
    # process's CPU from there is both checkpoints'; the first's span starts at its stall
    assert second.cpu_s_all_threads is None and first.cpu_s_all_threads == 0.0


def test_a_thread_idle_in_many_frames_across_sync_saves_is_not_their_writer() -> None:
    # sync `.many` saves on the main thread, each durable; a pool thread of .many's sits in
    # its frames from before the first save to after the last (a 4 s episode of `many`)
    idle = ep(WRITER, 100.70, 104.60)
    saves = [ep(MAIN, 100.71 + 0.4 * k, 100.90 + 0.4 * k, durable=True) for k in range(3)]
    events = [written(s.end, k) for k, s in enumerate(saves)]
    m = _match(events, [idle, *saves])
    assert [c.episode for c in m.checkpoints] == saves
    assert [c.stall for c in m.checkpoints] == saves
    assert [c.stall_s for c in m.checkpoints] == [s.wall_s for s in saves]


def test_a_write_done_as_its_call_returns_is_the_background_threads() -> None:
    # A fresh-clone CI run: the last save's copy ran 74.335-74.349 on the main thread and
    # handed a 4 MB write over at 74.340, whose file was complete at 74.348, 1 ms before
    # the copy's episode ended; the writer's fsync went unseen, and its episode ran on
    # past the event. The write is the background thread's, its stall the main thread's.
    main = ep(MAIN, 74.335, 74.349)
    write = ep(WRITER, 74.340, 75.273)
    (c,) = _match([written(74.348, 3)], [main, write]).checkpoints
    assert c.episode is write and c.stall is main
    assert c.stall_s == main.wall_s  # the main thread's time in the call
    # a main episode that runs on well past the event wrote the file itself
    long_main = ep(MAIN, 74.335, 74.50)
    (c,) = _match([written(74.348, 3)], [long_main, write]).checkpoints
    assert c.episode is long_main
    # and another codepath's thread spanning the event is not the writer
    other = replace(write, codepath="pickle")
    (c,) = _match([written(74.348, 3)], [main, other]).checkpoints
    assert c.episode is main


def test_a_wait_after_the_last_save_is_not_the_writer_of_the_file_written_under_it() -> None:
    # A serial-pass CI run: the last save's copy and the `.wait()` before exit were one main
    # episode (no encode call in its stack), beginning 0.18 s before the writer thread's
    # encode episode and running on past the file; the writer's fsync went unseen. The
    # file is the writer's; the main episode, spanning the whole write, is no stall of it.
    main = ep(MAIN, 18.148, 18.80)
    write = ep(WRITER, 18.331, 18.36, direction="encode")
    (c,) = _match([written(18.36, 3)], [main, write]).checkpoints
    assert c.episode is write and c.thread_id == WRITER
    # a main episode whose stack named the encode call is the synchronous save itself
    (c,) = _match([written(18.36, 3)], [replace(main, direction="encode"), write]).checkpoints
    assert c.episode.thread == MAIN


def test_a_checkpoint_without_a_stall_has_no_cpu_figure() -> None:
    # A CI run of tests/attribution/test_async_checkpoint_cpu.py: the last save's 256 MB
    # copy went unseen, its writer's first sample came late, and the process's CPU from
    # there to the file read 95% short of the job's. Without a stall the save's start is
    # not known, so neither is its CPU; with one, the span starts at the stall.
    cpu = {10.00: 1.0, 10.20: 0.05}  # by the span's start: from the call, from the writer
    stall, write = ep(MAIN, 10.00, 10.19), ep(WRITER, 10.20, 10.31, durable=True)
    seen = match(
        [written(10.31, 0)], [stall, write], cpu_s=lambda pid, t0, t1: cpu[t0],
        read_bytes=lambda *_: 0.0,
    )  # fmt: skip
    assert seen.checkpoints[0].cpu_s_all_threads == 1.0
    unseen = match(
        [written(10.31, 0)], [write], cpu_s=lambda pid, t0, t1: cpu[t0],
        read_bytes=lambda *_: 0.0,
    )  # fmt: skip
    (c,) = unseen.checkpoints
    assert c.episode is write and c.stall is None and c.cpu_s_all_threads is None


def test_a_stall_begins_where_its_save_function_began_preparing() -> None:
    # save_json's tolist() for 80 ms before json.dump's 0.2 s (episodes.py prepared_s)
    dump = replace(ep(MAIN, 50.08, 50.28, durable=True), samples=20, prepared_s=0.08)
    spent: list[tuple[float, float]] = []

    def cpu_s(pid: int, lo: float, hi: float) -> float:
        spent.append((lo, hi))
        return 0.0

    (c,) = match([written(50.28, 0)], [dump], cpu_s=cpu_s, read_bytes=lambda *_: 0.0).checkpoints
    assert c.stall is dump and abs(c.stall_s - 0.28) < 1e-9
    # timed by sample counts: 2*sqrt(n) periods over its 20 + 8 ticks, not its 20 alone
    assert abs(c.resolution_s - (RES + 0.02 * (28**0.5 - 20**0.5))) < 1e-9
    assert spent == [(50.0, 50.28)]  # the CPU of every thread from the preparation on
    # timed by stack changes, the edges' error does not grow with the ticks between them
    by_changes = replace(dump, timed_by="stack changes")
    (c,) = _match([written(50.28, 0)], [by_changes]).checkpoints
    assert abs(c.stall_s - 0.28) < 1e-9 and c.resolution_s == RES
