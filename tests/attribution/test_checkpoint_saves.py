"""A checkpoint directory's files completed in one save are one checkpoint (issue 47 ask 2):
the Trainer's layout, model by safetensors, optimizer by torch, state by json."""

from __future__ import annotations

from dataclasses import replace

from serwatt.collectors.fsevents import WRITTEN, FileEvent
from serwatt.profiler.attribution.checkpoints import PART_OF, STAMP_SLACK_S, match
from serwatt.profiler.attribution.episodes import Episode

PID = 100
RES = 0.005


def ep(codepath: str, start: float, end: float) -> Episode:
    return Episode(
        pid=PID, thread=PID, codepath=codepath, start=start, end=end, wall_s=end - start,
        period_s=0.01, resolution_s=RES, cpu_s=(end - start) / 2, main_thread=True,
        durable=False, direction="encode",
    )  # fmt: skip


def written(t: float, path: str) -> FileEvent:
    return FileEvent(t=t, kind=WRITTEN, path=path, bytes=100)


def test_a_trainer_checkpoint_directory_is_one_save_with_its_files_as_breakdown() -> None:
    # save 1 at 10.0-10.40: config.json (unsampled), model.safetensors, optimizer.pt,
    # trainer_state.json last (unsampled, at 10.40); save 2 the same, 5 s later; a file in
    # DIR itself stays a checkpoint of its own
    eps, evs = [], []
    for k, t in ((10, 10.0), (20, 15.0)):
        d = f"/out/checkpoint-{k}"
        model = replace(ep("safetensors", t + 0.05, t + 0.15), prepared_s=0.03)
        # the second save's last stall runs on past its files (the thread's next work,
        # classified torch): the save still ends at its last file
        optim = ep("torch", t + 0.16, t + (0.35 if k == 10 else 1.5))
        eps += [model, optim]
        evs += [
            written(t + 0.01, f"{d}/config.json"),
            written(t + 0.15, f"{d}/model.safetensors"),
            written(t + 0.35, f"{d}/optimizer.pt"),
            written(t + 0.40, f"{d}/trainer_state.json"),
        ]
    lone = ep("torch", 30.0, 30.2)
    m = match(
        [*evs, written(30.2, "/out/final.pt")], [*eps, lone],
        cpu_s=lambda *_: 0.0, read_bytes=lambda *_: 0.0, root="/out",
    )  # fmt: skip
    saves = [c for c in m.checkpoints if not c.timed_by.startswith(PART_OF)]
    assert [c.path for c in saves] == ["/out/checkpoint-10", "/out/checkpoint-20", "/out/final.pt"]
    for c, t in zip(saves[:2], (10.0, 15.0), strict=True):
        # from config.json (+0.01, done before the model's save began preparing at +0.02)
        # to the last file the training thread wrote (+0.40)
        assert c.stall_s is not None and abs(c.stall_s - (0.40 - 0.01)) < 1e-9
        assert c.resolution_s is not None and c.resolution_s >= STAMP_SLACK_S
        assert c.bytes == 400 and c.stall is not None and c.stall.codepath == "safetensors"
        assert abs(c.stall.start - c.stall.prepared_s - (t + 0.02)) < 1e-9
    assert saves[2].stall is lone and saves[2].stall_s == lone.wall_s
    parts = [c for c in m.checkpoints if c.timed_by.startswith(PART_OF)]
    assert len(parts) == 8 and all(c.stall_s is None for c in parts)
    by_file = {c.path.rsplit("/", 1)[1]: c.episode for c in parts[:4]}
    assert by_file["model.safetensors"] is not None
    assert by_file["model.safetensors"].codepath == "safetensors"
    assert by_file["optimizer.pt"] is not None and by_file["optimizer.pt"].codepath == "torch"


def test_without_a_root_files_are_matched_one_by_one_as_before() -> None:
    a, b = ep("safetensors", 1.0, 1.1), ep("torch", 1.1, 1.3)
    m = match(
        [written(1.1, "/out/c/m.safetensors"), written(1.3, "/out/c/o.pt")], [a, b],
        cpu_s=lambda *_: 0.0, read_bytes=lambda *_: 0.0,
    )  # fmt: skip
    assert [c.stall for c in m.checkpoints] == [a, b]


def test_a_restores_read_bytes_are_its_files_never_the_processes() -> None:
    from serwatt.collectors.fsevents import OPENED

    def opened(t: float, path: str, size: int) -> FileEvent:
        return FileEvent(t=t, kind=OPENED, path=path, bytes=size)

    both = replace(ep("torch", 1.0, 1.2), direction="decode")  # json + optimizer in one
    alone = replace(ep("torch", 2.0, 2.2), direction="decode")
    m = match(
        [opened(1.01, "/out/c/trainer_state.json", 800), opened(1.05, "/out/c/optimizer.pt", 9000),
         opened(2.01, "/out/c/rng_state.pth", 1000)],
        [both, alone], cpu_s=lambda *_: 0.0,
        read_bytes=lambda *_: 11_600_000.0,  # the process read a dataset meanwhile
    )  # fmt: skip
    got = {r.path.rsplit("/", 1)[1]: r.read_bytes for r in m.restores}
    # the shared episode is the optimizer's load, and its reads are no one file's
    assert got == {"optimizer.pt": None, "rng_state.pth": 1000.0}


def test_a_runs_restore_is_all_it_read_back_not_a_mean_over_files() -> None:
    from types import SimpleNamespace

    from serwatt.profiler.report.from_records import _run_restore_s

    files = [SimpleNamespace(wall_s=w) for w in (0.002, 0.110, None, 0.001)]
    assert _run_restore_s(files) == (0.113,)  # type: ignore[arg-type]
    assert _run_restore_s([]) == ()


def _saves_of(m):  # noqa: ANN001, ANN202
    return [c for c in m.checkpoints if not c.timed_by.startswith(PART_OF)]


def test_a_loosely_resolved_stall_counts_for_the_save_whose_files_it_holds() -> None:
    # the second save's episode is timed by sample counts with a second of unknown edge:
    # its tolerance reaches back over the first save's files, which have their own stall
    first = ep("torch", 10.0, 10.3)
    second = replace(ep("many", 10.6, 13.0), edge_unknown_s=1.0)
    m = match(
        [written(9.7, "/out/checkpoint-10/c.json"), written(10.3, "/out/checkpoint-10/o.pt"),
         written(10.61, "/out/checkpoint-20/c.json"), written(10.7, "/out/checkpoint-20/o.pt")],
        [first, second], cpu_s=lambda *_: 0.0, read_bytes=lambda *_: 0.0, root="/out",
    )  # fmt: skip
    a, b = _saves_of(m)
    assert (a.stall, b.stall) == (first, second)
    assert b.stall_s is not None and abs(b.stall_s - 0.1) < 1e-9  # to its last file


def test_a_rewritten_directory_is_one_save_per_rewrite_and_a_slow_save_is_one() -> None:
    eps = [ep("torch", 1.0, 1.1), ep("torch", 5.0, 5.1), ep("torch", 9.0, 9.1)]
    evs = [written(1.1, "/out/latest/w.pt"), written(5.1, "/out/latest/w.pt"),
           written(7.0, "/out/slow/a.json"), written(9.1, "/out/slow/w.pt")]  # fmt: skip
    m = match(evs, eps, cpu_s=lambda *_: 0.0, read_bytes=lambda *_: 0.0, root="/out")
    assert [c.path for c in _saves_of(m)] == ["/out/latest", "/out/latest", "/out/slow"]


def test_the_threads_serialization_just_before_a_saves_first_stall_is_the_save() -> None:
    # the files were stamped together, late (the watch thread descheduled): every one is
    # nearest the optimizer's episode, none the model's safetensors episode just before it
    model = replace(ep("safetensors", 5.00, 5.05), prepared_s=0.10)
    optim = ep("torch", 5.05, 5.20)
    late = [written(5.20, f"/out/checkpoint-30/{n}") for n in ("model.safetensors", "o.pt")]
    m = match(late, [model, optim], cpu_s=lambda *_: 0.0, read_bytes=lambda *_: 0.0, root="/out")
    (save,) = _saves_of(m)
    assert save.stall is model and save.stall_s is not None
    assert abs(save.stall_s - (5.20 - 4.90)) < 1e-9
