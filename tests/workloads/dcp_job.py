"""A plain torch.distributed.checkpoint (DCP) training job, as a user writes one: an MLP and
Adam on the CPU, one process (no process group), a `dcp.save` with torch's own
FileSystemWriter every `--every` steps into a new directory `OUT/step-<k>/` (DCP writes
`__0_0.distcp` and `.metadata` in it).

    python -m tests.workloads.dcp_job OUT [--steps N] [--every K] [--width W] [--timing FILE]

`--timing FILE` is the job's own truth: each `dcp.save` call's start and end
(CLOCK_MONOTONIC: t0, t1; the host clock file events and episodes are stamped on: w0, w1)
and wall seconds, one JSON line per save.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--timing")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    w = a.width
    model = torch.nn.Sequential(
        torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
        torch.nn.Linear(w, 16),
    )  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    # DCP warns that it runs as a single process when there is no process group
    warnings.filterwarnings("ignore", message=".*single process.*")
    for step in range(1, a.steps + 1):
        x = torch.randn(32, w, generator=gen)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if step % a.every:
            continue
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        w0, t0 = time.time(), time.monotonic()
        dcp.save(state, checkpoint_id=os.path.join(a.out, f"step-{step}"))
        t1, w1 = time.monotonic(), time.time()
        if a.timing:
            row = {"step": step, "t0": t0, "t1": t1, "save_s": t1 - t0, "w0": w0, "w1": w1}
            with open(a.timing, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
