"""PyTorch DCP through `.many` storage: real ranks (gloo on the CPU, `torch.multiprocessing`
spawn, a free loopback port), real `dcp.save` / `dcp.async_save` / `dcp.load`.

Each rank trains the same small model with AdamW (DCP deduplicates replicated tensors, so the
model's tensors are spread over the rank files), and also holds a DTensor sharded along dim 0.
The 4-rank checkpoint is loaded on 2 ranks with the DTensor sharded along dim 1 (resharding),
compared tensor by tensor. Every rank file and metadata file passes `many.verify`, and the
receipt of each rank's file chains from its previous save to its async save.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from serwatt.profiler import many  # noqa: E402
from serwatt.profiler.many.dcp import (  # noqa: E402
    METADATA_FILE,
    ManyStorageReader,
    ManyStorageWriter,
    decode_metadata,
    encode_metadata,
)

ROWS_PER_RANK, COLS = 6, 5


def _train(seed: int, steps: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Tanh(), torch.nn.Linear(32, 8)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(1234)
    for _ in range(steps):
        x = torch.randn(4, 16, generator=gen)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _full(world: int) -> Any:
    return torch.arange(world * ROWS_PER_RANK * COLS, dtype=torch.float32).reshape(-1, COLS)


def _state(model: Any, opt: Any, step: int, sharded: Any) -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "iter_num": step,
        "config": {"lr": 1e-3, "name": "tiny", "flags": [True, None, float("inf")]},
        "sharded": sharded,
    }


def _template(mesh: Any, saved_world: int, placement: Any) -> dict[str, Any]:
    from torch.distributed.tensor import distribute_tensor

    model, opt = _train(seed=99, steps=1)  # other values, same structure
    zeros = torch.zeros_like(_full(saved_world))
    sd = _state(model, opt, -1, distribute_tensor(zeros, mesh, [placement]))
    sd["config"] = {"lr": 0.0, "name": "", "flags": []}
    return sd


def _assert_same(want: Any, got: Any, where: str = "") -> None:
    from torch.distributed.tensor import DTensor

    if isinstance(want, DTensor):
        assert isinstance(got, DTensor), where
        assert torch.equal(want.full_tensor(), got.full_tensor()), where
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype, where
        assert torch.equal(want, got), where
    elif isinstance(want, dict):
        assert set(want) == set(got), (where, sorted(want), sorted(got))
        for k in want:
            _assert_same(want[k], got[k], f"{where}.{k}")
    elif isinstance(want, list | tuple):
        assert type(want) is type(got) and len(want) == len(got), where
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")
    else:
        assert want == got, (where, want, got)


def _record_stack(out: Path) -> None:
    """Record the real Python stack (qualnames, leaf first) when DCP reaches `many.save`."""
    from serwatt.profiler.many import writer

    target = writer.save.__code__

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is target:
            frames = []
            f = frame
            while f is not None:
                frames.append([f.f_code.co_qualname, f.f_code.co_filename, f.f_lineno])
                f = f.f_back
            out.write_text(json.dumps(frames))
            sys.setprofile(None)

    sys.setprofile(hook)


def _job_save_load(rank: int, world: int, out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    model, opt = _train(seed=0, steps=3)
    sd = _state(model, opt, 3, distribute_tensor(_full(world), mesh, [Shard(0)]))
    if rank == 0:
        _record_stack(out / "stack.json")
    writer = ManyStorageWriter(out / "sync")
    dcp.save(sd, storage_writer=writer)
    sys.setprofile(None)
    got = _template(mesh, world, Shard(0))
    # The checkpoint's own non-tensor values (iter_num, config, param_groups) are byte items.
    dcp.load(got, storage_reader=ManyStorageReader(out / "sync", verify=True, allow_pickle=True))
    _assert_same(sd, got)

    # One more step, then an async save through the same writer (its receipts chain on).
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(7))
    model(x).sum().backward()
    opt.step()
    sd_b = _state(model, opt, 4, distribute_tensor(_full(world) * -2, mesh, [Shard(0)]))
    fut = dcp.async_save(sd_b, storage_writer=writer, checkpoint_id=out / "async")
    fut.result()
    got_b = _template(mesh, world, Shard(0))
    dcp.load(got_b, storage_reader=ManyStorageReader(out / "async", allow_pickle=True))
    _assert_same(sd_b, got_b)
    with pytest.raises(AssertionError):  # the comparison sees a difference
        _assert_same(sd, got_b)


def _job_reshard(rank: int, world: int, out: Path) -> None:
    """Load the 4-rank checkpoint in `out/sync` on this 2-rank group, DTensor on dim 1."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    saved_world = 4
    mesh = init_device_mesh("cpu", (world,))
    got = _template(mesh, saved_world, Shard(1))
    dcp.load(got, storage_reader=ManyStorageReader(out / "sync", verify=True, allow_pickle=True))
    model, opt = _train(seed=0, steps=3)
    full = _full(saved_world)
    want = _state(model, opt, 3, distribute_tensor(full, mesh, [Shard(1)]))
    _assert_same(want, got)
    cols = -(-COLS // world)  # DTensor's uneven Shard(1): ceil-sized chunks first
    local = got["sharded"].to_local()
    assert torch.equal(local, full[:, rank * cols : (rank + 1) * cols]), rank


def _job_two_ranks(rank: int, world: int, out: Path) -> None:
    """A 2-rank save/load/async round trip, then the resharded load of the 4-rank run."""
    _job_save_load(rank, world, out / "two")
    _job_reshard(rank, world, out / "four")
    (out / "two" / f"resharded-{rank}").write_text("ok")


_JOBS = {"save_load": _job_save_load, "two_ranks": _job_two_ranks}


def _worker(rank: int, world: int, rendezvous: str, job: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        _JOBS[job](rank, world, Path(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(job: str, world: int, out: Path) -> None:
    """`torch.multiprocessing.start_processes`, like `mp.spawn`, but through a forkserver
    that imports torch, DCP, DTensor and this module once: fresh interpreters each paying
    the torch import made most of this module's time on a 2-core machine."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(["torch.distributed.tensor", __name__])
    out.mkdir(parents=True, exist_ok=True)
    # a file store in the run's own directory: no TCP port for parallel tests to race for
    rendezvous = out / f".rendezvous-{job}"
    rendezvous.unlink(missing_ok=True)
    mp.start_processes(
        _worker,
        args=(world, str(rendezvous), job, str(out)),
        nprocs=world,
        join=True,
        start_method="forkserver",
    )


def _check_files(out: Path, world: int) -> list[str]:
    """Every file verifies; each rank's async file chains to its sync file; returns names."""
    sync = sorted(p.name for p in (out / "sync").iterdir())
    asyn = sorted(p.name for p in (out / "async").iterdir())
    assert METADATA_FILE in sync and METADATA_FILE in asyn
    rank_files = [n for n in sync if n != METADATA_FILE]
    assert rank_files and set(rank_files) <= {f"rank{r}.many" for r in range(world)}
    for d in ("sync", "async"):
        for name in os.listdir(out / d):
            assert many.verify(out / d / name) == [], (d, name)
    for name in rank_files:
        if name in asyn:
            assert many.verify_chain([out / "sync" / name, out / "async" / name]) == []
    assert many.verify_chain([out / "sync" / METADATA_FILE, out / "async" / METADATA_FILE]) == []
    return rank_files


@pytest.fixture(scope="module")
def ranks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`four/`: saved, async-saved and loaded on 4 ranks; `two/`: the same on 2 ranks, whose
    job then loads `four/sync` resharded. Two spawns in all, to keep the module fast."""
    out = tmp_path_factory.mktemp("dcp")
    _spawn("save_load", 4, out / "four")
    _spawn("two_ranks", 2, out)
    return out


@pytest.mark.long  # two and four gloo ranks (its module fixture)
def test_two_ranks_save_async_save_and_load(ranks_dir: Path) -> None:
    files = _check_files(ranks_dir / "two", 2)
    assert files == ["rank0.many", "rank1.many"]  # both ranks hold DTensor shards


@pytest.mark.long  # two and four gloo ranks (its module fixture)
def test_four_ranks_save_async_save_and_load(ranks_dir: Path) -> None:
    four_rank_dir = ranks_dir / "four"
    files = _check_files(four_rank_dir, 4)
    assert files == [f"rank{r}.many" for r in range(4)]
    # Each rank file holds its own DTensor rows, named by their index ranges.
    for r in range(4):
        names = list(many.load(four_rank_dir / "sync" / f"rank{r}.many"))
        lo, hi = r * ROWS_PER_RANK, (r + 1) * ROWS_PER_RANK
        assert f"sharded[{lo}:{hi},0:{COLS}]" in names, names
    # Replicated model tensors are stored once across the ranks, not once per rank.
    owners = [
        r
        for r in range(4)
        for n in many.load(four_rank_dir / "sync" / f"rank{r}.many")
        if n == "model.0.weight"
    ]
    assert len(owners) == 1


@pytest.mark.long  # two and four gloo ranks (its module fixture)
def test_four_rank_checkpoint_loads_resharded_on_two_ranks(ranks_dir: Path) -> None:
    # The comparison ran in each rank (_job_reshard); each rank marks that it finished.
    assert sorted(p.name for p in (ranks_dir / "two").glob("resharded-*")) == [
        "resharded-0",
        "resharded-1",
    ]


@pytest.mark.long  # two and four gloo ranks (its module fixture)
def test_dcp_stack_under_many_storage_classifies_as_many(ranks_dir: Path) -> None:
    from serwatt.collectors.samples import Frame
    from serwatt.profiler.classify.classifier import Classifier

    stack = json.loads((ranks_dir / "four" / "stack.json").read_text())
    frames = tuple(Frame(name, path, line) for name, path, line in stack)
    assert any(f.filename.endswith("profiler/many/dcp.py") for f in frames)
    # DCP's own save() is the outermost serializer scope (rule torch.distributed-checkpoint);
    # many.arena is marked inner_wins, so the storage writer below it decides.
    outer = [i for i, f in enumerate(frames) if f.filename.endswith("state_dict_saver.py")]
    assert outer, "DCP's save() is on the recorded stack"
    got = Classifier.default().explain(frames)
    assert got.classification.codepath == "many", got
    assert got.classification.rule_id == "many.arena"
    assert got.frame_index is not None and got.frame_index < min(outer)
    assert "inner_wins inside rule torch.distributed-checkpoint" in got.how


def _stacks_during(fn: Any) -> list[tuple[Any, ...]]:
    """Every distinct Python stack (leaf first) at each Python call and each C call while
    `fn()` runs: what a sampler can see. A C call's frame is its caller at the call line."""
    from serwatt.collectors.samples import Frame

    seen: dict[tuple[Any, ...], None] = {}

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "c_call"):
            return
        frames = []
        f = frame
        while f is not None:
            frames.append(Frame(f.f_code.co_qualname, f.f_code.co_filename, f.f_lineno))
            f = f.f_back
        seen[tuple(frames)] = None

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return list(seen)


def _classified(stacks: list[tuple[Any, ...]]) -> list[tuple[Any, tuple[Any, ...]]]:
    from serwatt.profiler.classify.classifier import Classifier

    c = Classifier.default()
    return [(c.classify_frames(s), s) for s in stacks]


def _under(stack: tuple[Any, ...], where: str) -> bool:
    """A frame of `stack` is in file `where` (a path suffix) or in directory `where/`."""
    if where.endswith("/"):
        return any(where in f.filename for f in stack)
    return any(f.filename.endswith(where) for f in stack)


def test_dcp_filesystem_writer_path_still_classifies_as_torch(tmp_path: Path) -> None:
    """DCP's own storage (FileSystemWriter: torch.save per tensor, pickle.dump of the
    metadata) stays torch: inner_wins is .many's, DCP's scope still decides over pickle."""
    from torch.distributed.checkpoint import FileSystemWriter

    model, opt = _train(seed=0, steps=2)
    sd = {"model": model.state_dict(), "optim": opt.state_dict()}
    with pytest.warns(UserWarning, match="single process"):
        stacks = _stacks_during(
            lambda: dcp.save(sd, storage_writer=FileSystemWriter(str(tmp_path / "fs")))
        )
    inside = [s for s in stacks if _under(s, "torch/distributed/checkpoint/state_dict_saver.py")]
    assert len(inside) > 100, len(inside)
    # The storage layer's own frames are on the recorded stacks: torch.save of each tensor
    # under _write_item, and the metadata's pickle.dump in FileSystemWriter.finish.
    assert any(s[0].name == "_write_item" for s in inside)
    assert any(_under(s, "torch/serialization.py") for s in inside)
    assert any(
        s[0].name.endswith("FileSystemWriter.finish") and "pickle.dump(" in _line(s[0])
        for s in inside
    )
    wrong = [(c, s[0]) for c, s in _classified(inside) if c.codepath != "torch"]
    assert not wrong, wrong[:5]


def _line(frame: Any) -> str:
    import linecache

    return linecache.getline(frame.filename, frame.line)


def test_dcp_many_writer_storage_is_many_and_planning_is_torch(tmp_path: Path) -> None:
    """Every stack in a single-process dcp.save through ManyStorageWriter: with a .many
    frame on it, `many` (rule many.arena); without one, DCP's planning, `torch`."""
    model, opt = _train(seed=0, steps=2)
    sd = {"model": model.state_dict(), "optim": opt.state_dict()}
    with pytest.warns(UserWarning, match="single process"):
        stacks = _stacks_during(
            lambda: dcp.save(sd, storage_writer=ManyStorageWriter(tmp_path / "m"))
        )
    inside = [s for s in stacks if _under(s, "torch/distributed/checkpoint/state_dict_saver.py")]
    storage = [s for s in inside if _under(s, "profiler/many/writer.py")]
    planning = [s for s in inside if not _under(s, "profiler/many/")]
    assert len(storage) > 20 and len(planning) > 100, (len(storage), len(planning))
    for c, s in _classified(inside):
        want = ("many", "many.arena") if _under(s, "profiler/many/") else ("torch", None)
        assert c.codepath == want[0], (c, s[:4])
        if want[1]:
            assert c.rule_id == want[1], (c, s[:4])


# -- single process: tampering, corruption and the metadata codec ------------------------


def _single_process_checkpoint(path: Path) -> dict[str, Any]:
    model, opt = _train(seed=0, steps=2)
    sd = {"model": model.state_dict(), "optim": opt.state_dict(), "bf": torch.ones(3).bfloat16()}
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(sd, storage_writer=ManyStorageWriter(path))
    return sd


def _load_into_fresh(path: Path, **kw: Any) -> dict[str, Any]:
    model, opt = _train(seed=5, steps=1)
    sd = {"model": model.state_dict(), "optim": opt.state_dict(), "bf": torch.zeros(3).bfloat16()}
    with pytest.warns(UserWarning, match="single process"):
        # The optimizer's param_groups are byte items: this test's own checkpoint is trusted.
        dcp.load(sd, storage_reader=ManyStorageReader(path, allow_pickle=True, **kw))
    return sd


def test_single_process_round_trip_and_bfloat16(tmp_path: Path) -> None:
    sd = _single_process_checkpoint(tmp_path)
    got = _load_into_fresh(tmp_path, verify=True)
    _assert_same(sd, got)


def test_a_replaced_rank_file_is_refused_by_its_receipt(tmp_path: Path) -> None:
    _single_process_checkpoint(tmp_path)
    sd2 = _single_process_checkpoint(tmp_path / "other")
    del sd2
    # A sound .many file, but not the one the metadata vouches for.
    os.replace(tmp_path / "other" / "rank0.many", tmp_path / "rank0.many")
    # DCP re-raises a rank's error as CheckpointException carrying its traceback text.
    with pytest.raises(CheckpointException, match="ManyFormatError.*does not match"):
        _load_into_fresh(tmp_path)


def test_a_flipped_data_byte_is_caught_with_verify(tmp_path: Path) -> None:
    _single_process_checkpoint(tmp_path)
    path = tmp_path / "rank0.many"
    info = many.load(path).info("model.0.weight")
    with open(path, "r+b") as f:
        f.seek(info.offset)
        b = f.read(1)
        f.seek(info.offset)
        f.write(bytes([b[0] ^ 0x40]))
    _load_into_fresh(tmp_path)  # receipts cover descriptors; bytes are only hashed on verify
    with pytest.raises(CheckpointException, match="content hash mismatch"):
        _load_into_fresh(tmp_path, verify=True)


def test_missing_metadata_names_the_problem(tmp_path: Path) -> None:
    _single_process_checkpoint(tmp_path)
    (tmp_path / METADATA_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="not a complete"):
        ManyStorageReader(tmp_path).read_metadata()


def test_overwrite_false_refuses_an_existing_checkpoint(tmp_path: Path) -> None:
    _single_process_checkpoint(tmp_path)
    model, opt = _train(seed=0, steps=1)
    writer = ManyStorageWriter(tmp_path, overwrite=False)
    with pytest.warns(UserWarning), pytest.raises(CheckpointException, match="overwrite=False"):
        dcp.save({"model": model.state_dict()}, storage_writer=writer)


def test_metadata_codec_round_trips_and_refuses_bad_documents(tmp_path: Path) -> None:
    _single_process_checkpoint(tmp_path)
    md = ManyStorageReader(tmp_path).read_metadata()
    doc = encode_metadata(md)
    back = decode_metadata(json.loads(json.dumps(doc)))
    assert back.state_dict_metadata == md.state_dict_metadata
    assert back.planner_data == md.planner_data
    assert back.storage_data == md.storage_data
    assert isinstance(next(iter(back.planner_data.values())), tuple)

    def bad(mutate: Any, match: str) -> None:
        d = json.loads(json.dumps(doc))
        mutate(d)
        with pytest.raises(many.ManyFormatError, match=match):
            decode_metadata(d)

    bad(lambda d: d.update(format="x"), "manifest")
    bad(lambda d: d["storage_data"][0].update(file="../etc/passwd"), "not a rank file name")
    bad(lambda d: d["storage_data"][0].update(receipt="rcpt_00"), "not a receipt")
    bad(lambda d: d["storage_data"][0].update(fqn="nope"), "not in state_dict_metadata")
    first = next(iter(doc["state_dict_metadata"]))
    bad(lambda d: d["state_dict_metadata"][first].update(dtype="Tensor"), "not a torch dtype")
    bad(lambda d: d["state_dict_metadata"][first]["chunks"][0][0].__setitem__(0, 99), "outside")
    bad(lambda d: d.update(planner_data={"pickle": "x"}), "tagged planner value")
    with pytest.raises(TypeError, match="without pickling"):
        md.planner_data = {"k": object()}
        encode_metadata(md)
