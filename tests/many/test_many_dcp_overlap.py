"""Overlapped checkpoints on 2 real ranks through DCP (`profiler.many.dcp_overlap`): gloo on
the CPU, `dcp.async_save` with background staging into `.many` rank files, the stager's copy
held until the next `step()` has been entered. With the step gate, every rank file equals,
slot by slot and bit for bit, the one a synchronous `dcp.save` wrote at the same step; with
the gate's hook made a no-op, the same schedule tears them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from serwatt.profiler import many  # noqa: E402
from serwatt.profiler.many.dcp import METADATA_FILE, ManyStorageWriter  # noqa: E402
from tests.many.test_many_overlap import DELAY_S, differing_slots  # noqa: E402

WORLD = 2


def _train_step(model: Any, opt: Any, it: int) -> None:
    g = torch.Generator().manual_seed(it)
    x, y = torch.randn(8, 16, generator=g), torch.randint(4, (8,), generator=g)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _hold_staging_until_a_step() -> None:
    """The stager's copy starts after the next step() is entered, then after that step()
    ended or DELAY_S passed (tests/many/test_many_overlap.py's schedule, for DCP's stager)."""
    import threading

    from torch.distributed.checkpoint.staging import DefaultStager
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    entered, finished = threading.Event(), threading.Event()
    register_optimizer_step_pre_hook(lambda *a: entered.set())
    register_optimizer_step_post_hook(lambda *a: finished.set())
    real = DefaultStager._stage

    def held(self: Any, state_dict: Any, **kwargs: Any) -> Any:
        assert entered.wait(timeout=60)
        finished.wait(timeout=DELAY_S)
        return real(self, state_dict, **kwargs)

    DefaultStager._stage = held  # type: ignore[method-assign]


def _job(rank: int, out: Path, gated: bool) -> None:
    from serwatt.profiler.many.dcp_overlap import OverlappedSaver
    from serwatt.profiler.many.stepgate import StepGate

    torch.manual_seed(0)  # the same replicated model on every rank: DCP spreads its items
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for it in range(3):
        _train_step(model, opt, it)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "iter_num": 3}
    dcp.save(state, storage_writer=ManyStorageWriter(out / "sync"))
    if not gated:
        StepGate._before_step = lambda self, *a: None  # type: ignore[method-assign]
    _hold_staging_until_a_step()
    saver = OverlappedSaver()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "iter_num": 3}
    saver.async_save(state, optimizer=opt, storage_writer=ManyStorageWriter(out / "overlap"))
    for it in range(3, 6):  # forward moves BatchNorm's statistics; step() waits (gated)
        _train_step(model, opt, it)
    saver.close()
    (out / f"rank{rank}.wait").write_text(f"{saver.step_wait_s} {' '.join(saver.synchronous)}")


def _worker(rank: int, world: int, rendezvous: str, out: str, gated: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        _job(rank, Path(out), gated)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(out: Path, gated: bool) -> None:
    import torch.multiprocessing as mp

    out.mkdir(parents=True)
    mp.start_processes(
        _worker,
        args=(WORLD, str(out / ".rendezvous"), str(out), gated),
        nprocs=WORLD,
        join=True,
        start_method="spawn",
    )


def _rank_files(out: Path) -> list[str]:
    names = sorted(p.name for p in (out / "sync").iterdir() if p.name != METADATA_FILE)
    assert names == sorted(p.name for p in (out / "overlap").iterdir() if p.name != METADATA_FILE)
    return names


@pytest.mark.long  # two torch ranks training, with and without the gate
def test_two_ranks_overlapped_dcp_save_is_bit_exact_and_without_the_gate_torn(
    tmp_path: Path,
) -> None:
    _spawn(tmp_path / "gated", gated=True)
    _spawn(tmp_path / "ungated", gated=False)
    gated, ungated = tmp_path / "gated", tmp_path / "ungated"
    names = _rank_files(gated)
    assert names == ["rank0.many", "rank1.many"]  # both ranks wrote items
    for name in names:
        for d in ("sync", "overlap"):
            assert many.verify(gated / d / name) == []
        assert differing_slots(str(gated / "sync" / name), str(gated / "overlap" / name)) == []
    for rank in range(WORLD):
        wait, *synchronous = (gated / f"rank{rank}.wait").read_text().split()
        assert float(wait) > 0.5 * DELAY_S  # step() was held for the staging
        assert "model.1.running_mean" in synchronous and not any(
            "weight" in k or "exp_avg" in k for k in synchronous
        )
    torn = [
        n
        for name in _rank_files(ungated)
        for n in differing_slots(str(ungated / "sync" / name), str(ungated / "overlap" / name))
    ]
    assert torn, "without the gate, step() ran during the staging and nothing differed"
