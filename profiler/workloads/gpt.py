"""A small GPT (character-level transformer LM, AdamW, CPU) checkpointing through `.many`.

    python -m serwatt.profiler.workloads.gpt --out-dir DIR [--iters N] [--every K] [--async
        [--overlap]]
        [--resume]

The model and training loop follow the usual single-file GPT recipe: token and position
embeddings, pre-LayerNorm blocks of causal self-attention and an MLP, a language-model head
tied to the token embedding, AdamW with decayed and undecayed parameter groups, warmup plus
cosine learning rate, gradient clipping, dropout. Every K iterations it saves the usual
nested checkpoint dict

    {"model": ..., "optimizer": ..., "model_args": {...}, "iter_num": ..., "best_val_loss": ...,
     "config": {...}, "rng": torch.get_rng_state()}

through `profiler.many.torch_compat` (`DIR/ckpt.many`, replaced atomically each time), or with
`--async` through a `Checkpointer` (`DIR/ckpt-<seq>.many`, written in the background).
`--overlap` (with `--async`) passes the optimizer and `overlap=True`: the parameters and AdamW
moments are copied while the next iteration's forward and backward run, and its
`optimizer.step()` waits in a step pre-hook for that copy (the line of each durable checkpoint
then also says how long: `step_wait_s`). `--resume` loads the newest checkpoint and continues.
The text is generated from the seed and the batch of iteration i depends only on (seed, i),
so a resumed run computes exactly the losses of an uninterrupted one.

Each iteration prints one JSON line `{"iter": i, "loss": x}` (the float exactly, as repr);
each durable checkpoint prints `{"checkpoint": iter_num, "path": ...}`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from serwatt.profiler.many import torch_compat as ckpt
from serwatt.profiler.many.checkpointer import Checkpointer, Written

WORDS = (
    "the a model learns to predict next token from context while loss falls and "
    "gradients flow through attention heads into layers of weights"
).split()


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 48
    dropout: float = 0.1
    bias: bool = True


class CausalSelfAttention(nn.Module):
    bias: torch.Tensor  # the causal mask buffer (named as in the usual GPT checkpoints)

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        mask = torch.tril(torch.ones(config.block_size, config.block_size))
        self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(0, idx.size(1), dtype=torch.long)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying: the checkpoint holds two names for one tensor (stored once).
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.transformer(idx))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizers(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float]
    ) -> torch.optim.AdamW:
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        nodecay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": nodecay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def make_text(seed: int, words: int = 4000) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def get_batch(
    data: torch.Tensor, it: int, seed: int, batch_size: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    # The batch of iteration `it` depends only on (seed, it): resuming replays the same data.
    g = torch.Generator().manual_seed(seed * 1_000_003 + it)
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=g)
    x = torch.stack([data[i : i + block_size] for i in ix.tolist()])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix.tolist()])
    return x, y


def get_lr(it: int, config: dict[str, Any]) -> float:
    warmup, max_iters, lr, min_lr = (
        config["warmup_iters"],
        config["max_iters"],
        config["learning_rate"],
        config["min_lr"],
    )
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    ratio = (it - warmup) / max(1, max_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (lr - min_lr)


def _emit(obj: dict[str, Any], lock: threading.Lock) -> None:
    with lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # one thread: deterministic and kind to a shared machine
    torch.manual_seed(args.seed)
    text = make_text(args.seed)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    config = {
        "max_iters": args.iters,
        "warmup_iters": max(1, args.iters // 10),
        "learning_rate": 3e-3,
        "min_lr": 3e-4,
        "batch_size": 8,
        "weight_decay": 0.1,
        "betas": (0.9, 0.95),
        "grad_clip": 1.0,
        "seed": args.seed,
        "eval_only": False,
    }
    model_args = asdict(GPTConfig(vocab_size=len(chars)))
    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    lock = threading.Lock()
    checkpointer = None
    if args.async_ckpt:

        def durable(w: Written) -> None:
            line: dict[str, Any] = {"checkpoint": w.metadata["iter_num"], "path": w.path}
            if args.overlap:
                line["step_wait_s"] = w.step_wait_s
            _emit(line, lock)

        checkpointer = Checkpointer(out, prefix="ckpt", keep=2, on_written=durable)
    iter_num = 0
    best_val_loss = 1e9
    checkpoint: dict[str, Any] | None = None
    if args.resume:
        path = checkpointer.latest() if checkpointer else os.path.join(out, "ckpt.many")
        if path is None or not os.path.exists(path):
            raise SystemExit(f"--resume: no checkpoint in {out}")
        checkpoint = ckpt.load(path, map_location="cpu")
        model_args = checkpoint["model_args"]
        iter_num = checkpoint["iter_num"]
        best_val_loss = checkpoint["best_val_loss"]
    model = GPT(GPTConfig(**model_args))
    optimizer = model.configure_optimizers(
        config["weight_decay"], config["learning_rate"], config["betas"]
    )
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["rng"])
        checkpoint = None
    model.train()
    while iter_num < config["max_iters"]:
        lr = get_lr(iter_num, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(data, iter_num, args.seed, config["batch_size"], model_args["block_size"])
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        best_val_loss = min(best_val_loss, value)
        _emit({"iter": iter_num, "loss": value}, lock)
        iter_num += 1
        if iter_num % args.every == 0:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "model_args": model_args,
                "iter_num": iter_num,
                "best_val_loss": best_val_loss,
                "config": config,
                "rng": torch.get_rng_state(),
            }
            if checkpointer is not None:
                checkpointer.checkpoint(
                    state,
                    metadata={"iter_num": iter_num},
                    optimizer=optimizer,
                    overlap=args.overlap,
                )
            else:
                path = os.path.join(out, "ckpt.many")
                ckpt.save(state, path)
                _emit({"checkpoint": iter_num, "path": path}, lock)
    if checkpointer is not None:
        checkpointer.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", required=True, help="where checkpoints go")
    p.add_argument("--iters", type=int, default=60, help="training iterations in total")
    p.add_argument("--every", type=int, default=10, help="checkpoint every K iterations")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    p.add_argument(
        "--async",
        dest="async_ckpt",
        action="store_true",
        help="checkpoint with a background Checkpointer instead of torch_compat.save",
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="with --async: copy the parameters and optimizer state while the next iteration "
        "computes; its optimizer.step() waits for that copy",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.iters < 1 or args.every < 1:
        print("--iters and --every must be at least 1", file=sys.stderr)
        return 2
    if args.overlap and not args.async_ckpt:
        print("--overlap needs --async (it overlaps the Checkpointer's copy)", file=sys.stderr)
        return 2
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
