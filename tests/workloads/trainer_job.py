"""A stock Hugging Face `Trainer` job, as a user writes one: a small GPT-2 from a config
(random init, nothing downloaded), synthetic tokens, a checkpoint every `--save-steps`.

    python -m tests.workloads.trainer_job OUT [--steps N] [--save-steps K] [--resume]
                                              [--timing FILE]

Each checkpoint is a directory `OUT/checkpoint-<step>/` of a Trainer's files:
model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json,
training_args.bin (a pickled TrainingArguments), config.json, generation_config.json.
`--resume` continues from the newest checkpoint for `--save-steps` more steps (so the
resumed run restores, then trains and saves once). `--timing FILE` is the job's own
truth: each `Trainer._save_checkpoint` call's start and end (CLOCK_MONOTONIC, the clock
serwatt's episodes use) and wall seconds, one JSON line per save; the Trainer itself is
not changed, the subclass only times the call.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

SEQ = 32
VOCAB = 256


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


class TimedTrainer(Trainer):
    timing: str | None = None

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        t0 = time.monotonic()
        super()._save_checkpoint(model, trial)
        t1 = time.monotonic()
        if self.timing:
            with open(self.timing, "a") as f:
                step = self.state.global_step
                f.write(json.dumps({"step": step, "t0": t0, "t1": t1, "save_s": t1 - t0}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=10)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--timing")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=128, n_layer=2, n_head=2, use_cache=False
    )
    model = GPT2LMHeadModel(config)
    steps = a.steps + (a.save_steps if a.resume else 0)
    args = TrainingArguments(
        output_dir=a.out,
        max_steps=steps,
        save_steps=a.save_steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=10,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = TimedTrainer(model=model, args=args, train_dataset=Tokens(steps * 8))
    trainer.timing = a.timing
    trainer.train(resume_from_checkpoint=True if a.resume else None)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
