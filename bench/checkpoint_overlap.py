"""Checkpoint stall inside a real training loop: `many.Checkpointer` with and without
`overlap=True`, against DCP's `async_save` with and without background staging.

    .venv/bin/python bench/checkpoint_overlap.py [--size-mb 64] [--repeat 6] [--dir DIR]
        [--json FILE] [--torch-threads N]

The loop is the GPT workload's (profiler/workloads/gpt.py: its model, AdamW, the batch of
step i from (seed, i)), widened so that weights plus AdamW's two moments come to about
--size-mb. Two regimes, each with its own batch (sequences x tokens), calibrated at the
start against the time of one copy of the state into a faulted buffer (the one-copy
floor): *long*, where forward + backward take about 3x the copy, and *short*, about 0.3x
(the printed ratio is the one measured; a regime whose ratio misses its side of 1 says so:
one token's forward and backward take about half a copy of its weights and moments).

Methods, one checkpoint each per round, the order rotated each round:

- many.Checkpointer          `cp.checkpoint(state)`: stall = the call (one copy)
- many.Checkpointer+overlap  `cp.checkpoint(state, optimizer=opt, overlap=True)`: stall =
                             the call + the wait of the next `step()` in the step pre-hook
- dcp.async_save             `dcp.async_save(state, async_stager=DefaultStager(staging in
                             the call))`: stall = the call
- dcp.async_save+staging     `DefaultStager(StagingOptions(use_async_staging=True))`: stall
                             = the call + the wait on `response.staging_completion` that the
                             loop does before `step()` (DCP enforces none; without it the
                             checkpoint is torn)

(each stager kept across checkpoints so it reuses its CPU storages; pinned and shared
memory off: they need an accelerator or a second process). Per checkpoint: the **stall**
(how long the training thread was blocked by the checkpoint), and the **step slowdown**:
the wall time from the call to the end of the next step, less a plain step's time measured
just before in the same round (what the checkpoint cost the loop in all, memory bandwidth
shared with the compute included). Durability is waited for after that, untimed.

Statistics (profiler/intervals.py): mean and 95% Student t interval over rounds; goals on
per-round ratios (geometric mean, t interval of the mean log ratio). Goals, per regime:
overlap stall <= 0.1x many.Checkpointer's (the one-copy stall; long regime only), <= 1x
many.Checkpointer's (never worse), <= 1x dcp.async_save+staging's (the anchor). Verdicts:
confirmed when the whole interval meets the goal, not met when none of it does, undecided
otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from serwatt.profiler.intervals import Interval, geometric_mean_interval, mean_interval, verdict  # noqa: E402
from serwatt.profiler.many.checkpointer import Checkpointer  # noqa: E402
from serwatt.profiler.workloads.gpt import GPT, GPTConfig, get_batch, make_text  # noqa: E402

METHODS = (
    "many.Checkpointer",
    "many.Checkpointer+overlap",
    "dcp.async_save",
    "dcp.async_save+staging",
)
OVERLAP = "many.Checkpointer+overlap"
ONE_COPY = "many.Checkpointer"
ANCHOR = "dcp.async_save+staging"
REGIMES = {"long": 3.0, "short": 0.3}  # forward + backward as a multiple of the copy time
BLOCK = 32
SEED = 1337


class Loop:
    """The GPT workload's training step, at a chosen width and batch."""

    def __init__(self, size_mb: float) -> None:
        torch.manual_seed(SEED)
        text = make_text(SEED, words=4000)
        chars = sorted(set(text))
        self.data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
        n_layer = 4
        # 12 n_embd^2 weights a block, each stored 3 times (value, two AdamW moments), fp32.
        width = math.sqrt(size_mb * 2**20 / (n_layer * 12 * 3 * 4))
        n_embd = max(64, round(width / 64) * 64)
        cfg = GPTConfig(
            block_size=BLOCK, vocab_size=len(chars), n_layer=n_layer, n_head=n_embd // 64,
            n_embd=n_embd, dropout=0.0,
        )  # fmt: skip
        self.model = GPT(cfg)
        self.model.train()
        self.opt = self.model.configure_optimizers(0.1, 3e-4, (0.9, 0.95))
        self.batch, self.tokens = 1, BLOCK  # sequences a step, tokens a sequence
        self.it = 0
        self.step(wait=None)  # AdamW's moments exist from the first step

    def forward_backward(self) -> None:
        x, y = get_batch(self.data, self.it, SEED, self.batch, self.tokens)
        self.model(x, y).backward()

    def step(self, wait: Callable[[], None] | None) -> None:
        self.forward_backward()
        if wait is not None:
            wait()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.it += 1

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "iter_num": self.it,
        }


def tensors(state: Any) -> list[torch.Tensor]:
    if isinstance(state, dict):
        return [t for v in state.values() for t in tensors(v)]
    if isinstance(state, list | tuple):
        return [t for v in state for t in tensors(v)]
    return [state] if isinstance(state, torch.Tensor) else []


def one_copy_s(state: dict[str, Any]) -> float:
    """The median of 5 copies of every tensor of the state into faulted buffers."""
    srcs = [t.detach().reshape(-1).view(torch.uint8).numpy() for t in tensors(state)]
    dsts = [np.ones_like(s) for s in srcs]
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for d, s in zip(dsts, srcs, strict=True):
            np.copyto(d, s)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def forward_backward_s(loop: Loop) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        loop.forward_backward()
        times.append(time.perf_counter() - t0)
        loop.opt.zero_grad(set_to_none=True)
    return float(np.median(times))


class Methods:
    """One checkpointer or stager per method, kept across checkpoints."""

    def __init__(self, workdir: Path) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.workdir = workdir
        self.plain = Checkpointer(workdir / "many", keep=1)
        self.overlap = Checkpointer(workdir / "overlap", keep=1)
        self.sync_stager = DefaultStager(StagingOptions(False, False, False, False))
        self.async_stager = DefaultStager(StagingOptions(False, False, True, False))
        self.seq = 0

    def checkpoint(self, method: str, loop: Loop) -> tuple[float, float, float]:
        """Checkpoint, run the next step as training would; (call_s, wait_s, window_s): the
        call, the training thread's wait after it (in the step pre-hook, or on DCP's staging
        future), and the time from the call to the end of the next step. Returns after the
        checkpoint is durable."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemWriter

        state = loop.state()
        waited = [0.0]
        if method in (ONE_COPY, OVERLAP):
            cp = self.plain if method == ONE_COPY else self.overlap
            t0 = time.perf_counter()
            if method == OVERLAP:
                cp.checkpoint(state, optimizer=loop.opt, overlap=True)
            else:
                cp.checkpoint(state)
            t1 = time.perf_counter()
            loop.step(wait=None)
            t2 = time.perf_counter()
            written = cp.wait()
            assert written is not None
            return t1 - t0, written.step_wait_s, t2 - t0
        self.seq += 1
        d = self.workdir / f"dcp-{self.seq:04d}"
        stager = self.async_stager if method == ANCHOR else self.sync_stager
        t0 = time.perf_counter()
        response = dcp.async_save(
            state,
            storage_writer=FileSystemWriter(str(d)),
            checkpoint_id=str(d),
            async_stager=stager,
            no_dist=True,
        )
        t1 = time.perf_counter()

        def staged() -> None:  # before step(): DCP does not make the loop wait
            w0 = time.perf_counter()
            if isinstance(response, dcp.state_dict_saver.AsyncSaveResponse):
                response.staging_completion.result()
            waited[0] = time.perf_counter() - w0

        loop.step(wait=staged)
        t2 = time.perf_counter()
        if isinstance(response, dcp.state_dict_saver.AsyncSaveResponse):
            response.upload_completion.result()
        else:
            response.result()
        shutil.rmtree(d, ignore_errors=True)
        return t1 - t0, waited[0], t2 - t0

    def close(self) -> None:
        self.plain.close()
        self.overlap.close()
        self.sync_stager.close()
        self.async_stager.close()


def plain_step_s(loop: Loop) -> float:
    t0 = time.perf_counter()
    loop.step(wait=None)
    return time.perf_counter() - t0


def run_regime(
    loop: Loop, methods: Methods, repeat: int, multiple: float, copy_s: float
) -> dict[str, Any]:
    loop.batch, loop.tokens = 1, BLOCK
    per_token = forward_backward_s(loop) / BLOCK
    tokens = max(1, round(multiple * copy_s / per_token))
    while True:  # per-token time is not linear at a few tokens: halve until on its side
        loop.batch, loop.tokens = max(1, tokens // BLOCK), min(tokens, BLOCK)
        fb = forward_backward_s(loop)
        if tokens == 1 or (fb >= copy_s) == (multiple >= 1):
            break
        tokens = tokens // 2 if multiple < 1 else tokens * 2
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    for r in range(repeat + 1):  # round 0 is the warm-up, not counted
        order = METHODS[r % len(METHODS) :] + METHODS[: r % len(METHODS)]
        for method in order:
            base = plain_step_s(loop)
            call, wait, window = methods.checkpoint(method, loop)
            if r:
                samples[method].append(
                    {
                        "stall_s": call + wait,
                        "call_s": call,
                        "wait_s": wait,
                        "slowdown_s": window - base,
                        "plain_step_s": base,
                    }
                )
    return {
        "batch": loop.batch,
        "tokens": loop.tokens,
        "forward_backward_s": fb,
        "ratio": fb / copy_s,
        "samples": samples,
    }


def ms(iv: Interval) -> str:
    lo, hi = iv.bounds()
    return f"{iv.estimate * 1e3:8.2f} ms (95% CI {lo * 1e3:.2f}-{hi * 1e3:.2f})"


def summarize(regime: str, res: dict[str, Any]) -> dict[str, Any]:
    s = res["samples"]
    out: dict[str, Any] = {"methods": {}, "goals": []}
    for m in METHODS:
        stall = mean_interval([x["stall_s"] for x in s[m]])
        slow = mean_interval([x["slowdown_s"] for x in s[m]])
        out["methods"][m] = {
            "stall_s": stall.estimate,
            "stall_ci95": list(stall.bounds()),
            "slowdown_s": slow.estimate,
            "slowdown_ci95": list(slow.bounds()),
        }
        print(f"  {m:26s} stall {ms(stall)}   step slowdown {ms(slow)}")
        if m in (OVERLAP, ANCHOR):
            call = mean_interval([x["call_s"] for x in s[m]])
            wait = mean_interval([x["wait_s"] for x in s[m]])
            out["methods"][m].update(call_s=call.estimate, wait_s=wait.estimate)
            what = "step pre-hook" if m == OVERLAP else "staging future"
            print(f"  {'':26s}   = call {ms(call)} + wait in the {what} {ms(wait)}")
    plain = mean_interval([x["plain_step_s"] for v in s.values() for x in v])
    print(f"  {'a plain step':26s}       {ms(plain)}")
    goals = [(ONE_COPY, 1.0), (ANCHOR, 1.0)]
    if res["ratio"] >= 1:
        goals.insert(0, (ONE_COPY, 0.1))
    for other, goal in goals:
        ratios = [a["stall_s"] / b["stall_s"] for a, b in zip(s[OVERLAP], s[other], strict=True)]
        iv = geometric_mean_interval(ratios)
        v = verdict(iv, at_most=goal)
        lo, hi = iv.bounds()
        print(
            f"  goal {OVERLAP} stall <= {goal:g}x {other}'s: ratio {iv.estimate:.3f} "
            f"(95% CI {lo:.3f}-{hi:.3f}, {iv.n} rounds): {v.upper()}"
        )
        out["goals"].append(
            {"vs": other, "at_most": goal, "ratio": iv.estimate, "ci95": [lo, hi], "verdict": v}
        )
    if (res["ratio"] >= 1) != (REGIMES[regime] >= 1):
        side = "longer" if res["ratio"] >= 1 else "shorter"
        print(f"  ({regime}: forward + backward came out {side} than the copy at this size)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=64, help="state size (default 64 MiB)")
    ap.add_argument("--repeat", type=int, default=6, help="rounds after the warm-up (>= 2)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--json", type=Path, help="write every sample and the summary here")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args(argv)
    if args.repeat < 2 or args.size_mb <= 0:
        print("checkpoint_overlap: --repeat >= 2 and --size-mb > 0", file=sys.stderr)
        return 2
    torch.set_num_threads(args.torch_threads)
    workdir = Path(tempfile.mkdtemp(prefix="serwatt-overlap-", dir=args.dir))
    doc: dict[str, Any] = {"size_mb": args.size_mb, "repeat": args.repeat}
    try:
        loop = Loop(args.size_mb)
        state = loop.state()
        nbytes = sum(t.numel() * t.element_size() for t in tensors(state))
        copy_s = one_copy_s(state)
        load1 = os.getloadavg()[0]
        print(
            f"state {nbytes / 2**20:.1f} MiB (GPT n_layer 4, n_embd {loop.model.config.n_embd}); "
            f"one copy {copy_s * 1e3:.2f} ms; {args.repeat} rounds + 1 warm-up, interleaved; "
            f"load average {load1:.2f} on {os.cpu_count()} CPUs"
        )
        doc.update(state_bytes=nbytes, one_copy_s=copy_s, load_average_start=load1)
        methods = Methods(workdir)
        try:
            for regime, multiple in REGIMES.items():
                res = run_regime(loop, methods, args.repeat, multiple, copy_s)
                print(
                    f"{regime}: batch {res['batch']}x{res['tokens']} tokens, forward + backward "
                    f"{res['forward_backward_s'] * 1e3:.2f} ms = {res['ratio']:.2f}x the copy"
                )
                res["summary"] = summarize(regime, res)
                doc[regime] = res
        finally:
            methods.close()
        doc["load_average_end"] = os.getloadavg()[0]
        print(f"load average at the end {doc['load_average_end']:.2f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
