"""`Checkpointer.checkpoint(state, optimizer=opt, overlap=True)`: the file written while the
next forward and backward passes run equals, slot by slot and bit for bit, a synchronous
checkpoint taken at the same step. Each proof has its control: the same comparison fails
when the step pre-hook is removed, or when the forward pass's buffers are left to the
background copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from serwatt.profiler.many import load, verify_chain
from serwatt.profiler.many.checkpointer import (
    OVERLAP_KEY,
    Checkpointer,
    CheckpointError,
    TornCopyError,
    _Staging,
    covered_slots,
)
from serwatt.profiler.many.state import STATE_KEY
from serwatt.profiler.many.stepgate import StepGate
from serwatt.profiler.workloads.gpt import GPT, GPTConfig, get_batch, make_text

REPO = Path(__file__).resolve().parents[2]
DELAY_S = 0.3  # the injected copy delay: several steps of the small models below


def differing_slots(a: str, b: str) -> list[str]:
    """Names of the slots whose bytes differ between two `.many` files (and any name one has
    and the other lacks), plus "tree" when their state trees differ. Empty: bit-exact."""
    with load(a) as x, load(b) as y:
        out = sorted(set(x) ^ set(y))
        for name in sorted(set(x) & set(y)):
            u, v = x.info(name), y.info(name)
            raw_u = np.asarray(x[name]).reshape(-1).view(np.uint8)
            raw_v = np.asarray(y[name]).reshape(-1).view(np.uint8)
            if (u.dtype, u.shape) != (v.dtype, v.shape) or not np.array_equal(raw_u, raw_v):
                out.append(name)
        if x.metadata.get(STATE_KEY) != y.metadata.get(STATE_KEY):
            out.append("tree")
    return out


@pytest.fixture()
def slow_copy(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The adversarial schedule: the background copy does not start before the next step()
    has been entered, and then not before that step() has finished or DELAY_S have passed.
    With the hook holding step(), the copy starts DELAY_S late and step() waits for it;
    without it, step() updates the tensors first. The event is set when a held copy starts."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    entered, finished, started = threading.Event(), threading.Event(), threading.Event()
    # Global hooks run before the optimizer's own (ours), and after them on the way out.
    pre = register_optimizer_step_pre_hook(lambda opt, args, kwargs: entered.set())
    post = register_optimizer_step_post_hook(lambda opt, args, kwargs: finished.set())
    real = _Staging.copy_slots
    real_checkpoint = Checkpointer.checkpoint

    def checkpoint(self: Checkpointer, *args: Any, **kwargs: Any) -> Any:
        entered.clear()  # before the call: the next step() may come as soon as it returns
        finished.clear()
        return real_checkpoint(self, *args, **kwargs)

    def held(self: _Staging, flat: Any, slots: list[int]) -> None:
        if threading.current_thread() is not threading.main_thread():  # the background copy
            assert entered.wait(timeout=60), "no step() came"
            finished.wait(timeout=DELAY_S)
            started.set()
        real(self, flat, slots)

    monkeypatch.setattr(_Staging, "copy_slots", held)
    monkeypatch.setattr(Checkpointer, "checkpoint", checkpoint)
    try:
        yield started
    finally:
        pre.remove()
        post.remove()


class Trainer:
    """One model, its optimizer and a step function; `step()` is forward, backward, step."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Callable) -> None:
        self.model, self.opt, self.batch, self.it = model, opt, batch, 0

    def step(self) -> float:
        x, y = self.batch(self.it)
        loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.it += 1
        return float(loss.item())

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "iter_num": self.it,
            "rng": torch.get_rng_state(),
        }


def gpt_trainer() -> Trainer:
    torch.manual_seed(1337)
    text = make_text(1337, words=800)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    model = GPT(GPTConfig(vocab_size=len(chars)))
    model.train()
    opt = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95))
    return Trainer(model, opt, lambda it: get_batch(data, it, 1337, 8, 32))


class BatchNormNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 8 * 8, 16),
            torch.nn.BatchNorm1d(16),
            torch.nn.Linear(16, 4),
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.body(x), y)


def batchnorm_trainer() -> Trainer:
    torch.manual_seed(7)
    model = BatchNormNet()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def batch(it: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(it)
        return torch.randn(16, 3, 8, 8, generator=g) * 2 + 1, torch.randint(4, (16,), generator=g)

    return Trainer(model, opt, batch)


def checkpoint_both(
    tmp_path: Path, trainer: Trainer, k: int, *, after: int = 4, **overlap_kwargs: Any
) -> tuple[str, str, Any]:
    """Train to step k; take a synchronous checkpoint and an overlapped one of the same
    state; train `after` more steps (the first waits in the hook while the copy runs).
    Returns (synchronous file, overlapped file, the overlapped checkpoint's Written)."""
    for _ in range(k):
        trainer.step()
    with Checkpointer(tmp_path / "sync") as sync_cp, Checkpointer(tmp_path / "overlap") as cp:
        sync = sync_cp.checkpoint(trainer.state())
        sync_cp.wait()
        staged = cp.checkpoint(
            trainer.state(), optimizer=trainer.opt, overlap=True, **overlap_kwargs
        )
        assert staged.overlapped_slots > 0
        for _ in range(after):
            trainer.step()
        written = cp.wait()
    return sync.path, staged.path, written


def test_gpt_overlapped_checkpoint_is_bit_exact(tmp_path: Path) -> None:
    trainer = gpt_trainer()
    sync, overlapped, written = checkpoint_both(tmp_path, trainer, 5)
    assert differing_slots(sync, overlapped) == []
    with load(overlapped) as f:
        record = f.metadata[OVERLAP_KEY]
    # Every parameter and every AdamW moment went to the background; the causal-mask
    # buffers and the RNG state were copied before the call returned.
    names = set(record["overlapped"])
    assert {"model.transformer%2Ewte%2Eweight", "optimizer.state.0.exp_avg"} <= names
    assert not any(n.endswith("%2Eattn%2Ebias") for n in names) and "rng" not in names
    assert record["synchronous"] == trainer.model.config.n_layer + 1  # n_layer masks + rng
    assert written.overlap_copy_s > 0


@pytest.mark.long  # a third GPT run of the overlap; the bit-exact one stays
def test_gpt_bit_exact_when_step_must_wait_for_a_slowed_copy(
    tmp_path: Path, slow_copy: threading.Event
) -> None:
    trainer = gpt_trainer()
    sync, overlapped, written = checkpoint_both(tmp_path, trainer, 3)
    assert slow_copy.is_set()
    # The first step() arrived while the delayed copy had not started: it waited in the hook.
    assert written.step_wait_s > 0.5 * DELAY_S
    assert differing_slots(sync, overlapped) == []


@pytest.mark.long  # a second GPT run of the overlap; the bit-exact one stays
def test_without_the_hook_the_same_schedule_tears_the_checkpoint(
    tmp_path: Path, slow_copy: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the hook removed, step() runs during the copy and the check fails."""
    monkeypatch.setattr(StepGate, "_before_step", lambda self, opt, args, kwargs: None)
    trainer = gpt_trainer()
    sync, overlapped, written = checkpoint_both(tmp_path, trainer, 3)
    assert slow_copy.is_set() and written.step_wait_s == 0.0
    torn = differing_slots(sync, overlapped)
    assert "model.transformer%2Ewte%2Eweight" in torn and "optimizer.state.0.exp_avg" in torn


def test_batchnorm_buffers_changed_by_forward_are_copied_before_return(
    tmp_path: Path, slow_copy: threading.Event
) -> None:
    trainer = batchnorm_trainer()
    bn = trainer.model.body[1]
    sync, overlapped, written = checkpoint_both(tmp_path, trainer, 4)
    assert written.step_wait_s > 0.5 * DELAY_S
    assert int(bn.num_batches_tracked) == 8  # the forward passes after the call moved them
    assert differing_slots(sync, overlapped) == []
    with load(overlapped) as f:
        names = set(f.metadata[OVERLAP_KEY]["overlapped"])
    assert not any("running" in n or "num_batches" in n for n in names)
    assert any("momentum_buffer" in n for n in names)


def test_batchnorm_buffers_left_to_the_background_copy_are_torn(
    tmp_path: Path, slow_copy: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the synchronous part: treat the buffers as the optimizer's too."""
    import serwatt.profiler.many.checkpointer as checkpointer

    def everything(flat: Any, optimizer: Any, sync: Any = ()) -> list[int]:
        return [i for i, s in enumerate(flat.slots) if s.kind == "torch" and s.length]

    monkeypatch.setattr(checkpointer, "covered_slots", everything)
    trainer = batchnorm_trainer()
    sync, overlapped, _ = checkpoint_both(tmp_path, trainer, 4)
    torn = differing_slots(sync, overlapped)
    assert (
        "model.body%2E1%2Erunning_mean" in torn and "model.body%2E1%2Enum_batches_tracked" in torn
    )
    assert not any("weight" in n or "momentum" in n for n in torn)  # the hook held those


def test_sync_names_tensors_to_copy_before_return(tmp_path: Path) -> None:
    trainer = batchnorm_trainer()
    trainer.step()
    first = trainer.model.body[0].weight
    with Checkpointer(tmp_path) as cp:
        plain = cp.checkpoint(trainer.state(), optimizer=trainer.opt, overlap=True)
        named = cp.checkpoint(trainer.state(), optimizer=trainer.opt, overlap=True, sync=[first])
    assert named.overlapped_slots == plain.overlapped_slots - 1
    assert named.overlapped_bytes == plain.overlapped_bytes - first.numel() * 4
    with load(named.path) as f:
        assert "model.body%2E0%2Eweight" not in f.metadata[OVERLAP_KEY]["overlapped"]
    assert verify_chain([plain.path, named.path]) == []


def test_detect_writes_fails_a_checkpoint_written_during_its_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = threading.Event()  # the background copy starts after the test's write
    real = _Staging.copy_slots

    def held(self: _Staging, flat: Any, slots: list[int]) -> None:
        if threading.current_thread() is not threading.main_thread():
            assert written.wait(timeout=60)
        real(self, flat, slots)

    monkeypatch.setattr(_Staging, "copy_slots", held)
    trainer = batchnorm_trainer()
    trainer.step()
    weight = trainer.model.body[0].weight
    with Checkpointer(tmp_path) as cp:
        staged = cp.checkpoint(
            trainer.state(), optimizer=trainer.opt, overlap=True, detect_writes=True
        )
        with torch.no_grad():
            weight.mul_(2.0)  # outside step(): the contract is broken
        written.set()
        with pytest.raises(CheckpointError, match="written in place") as info:
            cp.wait()
        assert isinstance(info.value.__cause__, TornCopyError)
        assert "model.body%2E0%2Eweight" in str(info.value)
        assert not Path(staged.path).exists()
        # Without the check, the same write goes unseen: that is the user's contract.
        written.clear()
        quiet = cp.checkpoint(trainer.state(), optimizer=trainer.opt, overlap=True)
        with torch.no_grad():
            weight.mul_(0.5)
        written.set()
        assert cp.wait() is not None and Path(quiet.path).exists()


def test_the_hook_is_gone_after_the_step_that_waited(tmp_path: Path) -> None:
    trainer = batchnorm_trainer()
    trainer.step()
    hooks = trainer.opt._optimizer_step_pre_hooks
    with Checkpointer(tmp_path) as cp:
        cp.checkpoint(trainer.state(), optimizer=trainer.opt, overlap=True)
        assert len(hooks) == 1
        trainer.step()
        assert len(hooks) == 0
        # A hook registered after it: removing ours inside step() would break torch's walk
        # over the hooks, so it stays (returning at once) until the next call removes it.
        cp.checkpoint(trainer.state(), optimizer=trainer.opt, overlap=True)
        calls: list[int] = []
        later = trainer.opt.register_step_pre_hook(lambda *a: calls.append(1))
        trainer.step()
        trainer.step()
        assert calls == [1, 1] and len(hooks) == 2
        cp.wait()
        assert list(hooks) == [later.id]
        later.remove()


def test_overlap_needs_the_optimizer_and_covers_only_its_cpu_tensors(tmp_path: Path) -> None:
    trainer = batchnorm_trainer()
    trainer.step()
    with Checkpointer(tmp_path) as cp:
        with pytest.raises(ValueError, match="optimizer="):
            cp.checkpoint(trainer.state(), overlap=True)
        with pytest.raises(ValueError, match="reserved"):
            cp.checkpoint(
                trainer.state(), optimizer=trainer.opt, overlap=True, metadata={OVERLAP_KEY: 1}
            )
        with pytest.raises(TypeError, match="sync="):
            cp.checkpoint(trainer.state(), optimizer=trainer.opt, overlap=True, sync=["w"])
    from serwatt.profiler.many.state import flatten

    state = trainer.state()
    state["copies"] = [p.detach().clone() for p in trainer.model.parameters()]
    flat = flatten(state)
    names = {flat.slots[i].name for i in covered_slots(flat, trainer.opt)}
    params = len(list(trainer.model.parameters()))
    assert len(names) == 2 * params  # each parameter and its momentum buffer, not the clones
    assert not any(n.startswith("copies") or "running" in n for n in names)


# -- what a profiler sees ----------------------------------------------------------------------

HELD_CHILD = textwrap.dedent(
    """
    import sys, threading
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from serwatt.profiler.many.checkpointer import Checkpointer, _Staging

    release = threading.Event()
    real = _Staging.copy_slots

    def held(self, flat, slots):  # the background copy waits for the parent's go
        if threading.current_thread() is not threading.main_thread():
            release.wait(timeout=120)
        real(self, flat, slots)

    _Staging.copy_slots = held
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    cp = Checkpointer(sys.argv[1])
    cp.checkpoint({"model": model.state_dict()}, optimizer=opt, overlap=True)
    register_optimizer_step_pre_hook(lambda *a: print("stepping", flush=True))
    threading.Thread(target=lambda: (sys.stdin.readline(), release.set()), daemon=True).start()
    opt.step()  # waits in the hook until the parent writes a line
    print("stepped", cp.wait().step_wait_s > 0, flush=True)
    """
)


@pytest.mark.long  # a profiled GPT run; test_gpt_overlapped_checkpoint_is_bit_exact stays
def test_the_step_wait_is_a_many_sample_on_the_training_thread(tmp_path: Path) -> None:
    """Real py-spy on a child held in the hook, and serwatt's classifier on its stacks."""
    pyspy = Path(sys.executable).with_name("py-spy")
    child = subprocess.Popen(
        [sys.executable, "-c", HELD_CHILD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "stepping"
        dump = tmp_path / "dump.json"
        for _ in range(50):  # until py-spy sees the main thread inside the hook
            out = subprocess.run(
                [str(pyspy), "dump", "--json", "--pid", str(child.pid)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if "_before_step" in out.stdout:
                break
        dump.write_text(out.stdout)
        main = next(t for t in json.loads(out.stdout) if t.get("thread_name") == "MainThread")
        assert any(f["name"].endswith("_before_step") for f in main["frames"]), main
        explained = subprocess.run(
            [sys.executable, "-m", "serwatt", "classify", str(dump)],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert explained.returncode == 0, explained.stderr
        line = next(ln for ln in explained.stdout.splitlines() if "'MainThread'" in ln)
        assert ": many  rule=many.arena" in line, explained.stdout
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "stepped True"
    finally:
        child.kill()
        child.wait(timeout=60)
