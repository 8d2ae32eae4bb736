"""A stock PyTorch Lightning job, as a user writes one: an MLP on synthetic tensors, CPU,
`ModelCheckpoint(dirpath=OUT, every_n_train_steps=K, save_top_k=-1)`.

    python -m tests.workloads.lightning_job OUT [--steps N] [--save-steps K] [--width W]
                                               [--timing FILE]

Each checkpoint is one file `OUT/step=<step>.ckpt`, which Lightning writes the way it always
does: `torch.save` into memory, then an fsspec transaction that writes a temp file outside
OUT and moves it in. `--timing FILE` is the job's own truth: each
`ModelCheckpoint._save_checkpoint` call's start and end (CLOCK_MONOTONIC, the clock
serwatt's episodes use) and wall seconds, one JSON line per save; Lightning itself is not
changed, the subclass only times the call.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

BATCH = 32


class MLP(pl.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 1),
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class TimedCheckpoint(ModelCheckpoint):
    timing: str | None = None

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        t0 = time.monotonic()
        super()._save_checkpoint(trainer, filepath)
        t1 = time.monotonic()
        if self.timing:
            with open(self.timing, "a") as f:
                row = {"step": trainer.global_step, "path": filepath, "t0": t0, "t1": t1}
                f.write(json.dumps({**row, "save_s": t1 - t0}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=10)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--timing")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.steps * BATCH, 64, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)
    ckpt = TimedCheckpoint(
        dirpath=a.out, filename="{step}", every_n_train_steps=a.save_steps, save_top_k=-1
    )
    ckpt.timing = a.timing
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=a.steps,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ckpt],
    )
    trainer.fit(MLP(a.width), data)


if __name__ == "__main__":
    main()
