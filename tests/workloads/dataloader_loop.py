"""A DataLoader training job that reports its own progress, for bench/overhead.py.

    python dataloader_loop.py LOG_DIR

The job of dataloader_job.py (its samples and collate: two forked workers load dict
samples of tensors and Python metadata, the batches' tensors cross by file descriptor;
a small MLP; a JSON log line every 50 steps, to LOG_DIR/train.jsonl), without the
truth wrappers and without a deadline: it trains until it is killed. Every 0.25 s it
prints `time steps process_cpu` (epoch seconds, training steps so far, the main
process's time.process_time()) to stdout.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# the samples the DataLoader truth test profiles, so the bench runs the same job
from dataloader_job import Samples, _stack_tensors

REPORT_EVERY_S = 0.25


def main() -> None:
    log = Path(sys.argv[1]) / "train.jsonl"
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(
        Samples(1 << 20, tensors=True),
        batch_size=64,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=_stack_tensors,
        persistent_workers=True,  # an epoch's end must not restart the workers mid-phase
    )
    steps = 0
    next_report = time.time()
    with log.open("w") as fh:
        while True:
            for batch in loader:
                loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
                if steps % 50 == 0:
                    fh.write(json.dumps({"step": steps, "loss": loss.item()}) + "\n")
                now = time.time()
                if now >= next_report:
                    print(f"{now} {steps} {time.process_time()}", flush=True)
                    next_report = now + REPORT_EVERY_S


if __name__ == "__main__":
    main()
