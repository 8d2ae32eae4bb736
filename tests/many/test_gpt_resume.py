"""The done-when check of issue 13: a small GPT checkpoints through the torch.save drop-in
(and through the async Checkpointer, copying while the next iteration computes with
--overlap), is SIGKILLed after a checkpoint, resumes from the
`.many` file and continues with exactly the losses of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serwatt.profiler.many import load, verify, verify_chain
from serwatt.profiler.many.checkpointer import OVERLAP_KEY, Checkpointer

REPO = Path(__file__).resolve().parents[2]
ITERS, EVERY = 24, 6


def _cmd(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "serwatt.profiler.workloads.gpt",
        "--out-dir",
        str(out),
        "--iters",
        str(ITERS),
        "--every",
        str(EVERY),
        *extra,
    ]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def _losses(lines: list[dict[str, Any]]) -> dict[int, float]:
    return {line["iter"]: line["loss"] for line in lines if "iter" in line}


def _run(out: Path, *extra: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        _cmd(out, *extra), env=_env(), capture_output=True, text=True, timeout=300, check=True
    )
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    lines = _run(tmp_path_factory.mktemp("gpt-ref"))
    losses = _losses(lines)
    assert sorted(losses) == list(range(ITERS))
    assert losses[ITERS - 1] < losses[0]  # it trains
    return losses


@pytest.mark.long  # GPT training killed and resumed, three modes
@pytest.mark.parametrize("mode", ["sync", "async", "overlap"])
def test_gpt_killed_after_a_checkpoint_resumes_with_identical_losses(
    tmp_path: Path, reference: dict[int, float], mode: str
) -> None:
    extra = {"sync": (), "async": ("--async",), "overlap": ("--async", "--overlap")}[mode]
    proc = subprocess.Popen(_cmd(tmp_path, *extra), env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    for raw in proc.stdout:
        seen.append(json.loads(raw))
        if seen[-1].get("checkpoint") == 2 * EVERY:
            proc.send_signal(signal.SIGKILL)  # mid-training, right after a durable checkpoint
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _losses(seen).items() <= reference.items()
    if mode != "sync":
        files = [p for _, p in Checkpointer(tmp_path).checkpoints()]
        assert files and verify_chain(files) == []
        with load(files[-1]) as newest:
            record = newest.metadata.get(OVERLAP_KEY)
        # --overlap left the parameters and moments to the background copy; --async did not.
        assert (record is not None and len(record["overlapped"]) > 100) == (mode == "overlap")
    else:
        assert verify(tmp_path / "ckpt.many") == []

    resumed = _losses(_run(tmp_path, "--resume", *extra))
    start = min(resumed)
    assert start >= 2 * EVERY and start % EVERY == 0
    assert sorted(resumed) == list(range(start, ITERS))
    assert resumed == {i: reference[i] for i in range(start, ITERS)}
