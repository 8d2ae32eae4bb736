"""train.py --ckpt many-async [--overlap]: checkpoints through many.Checkpointer, one in
flight, waited for before exit; a resumed run ends with the weights of an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serwatt.profiler.many import load, verify_chain
from serwatt.profiler.many.checkpointer import OVERLAP_KEY
from serwatt.profiler.workloads import train

COMMON = ("--every", "3", "--size", "0.5", "--backend", "torch")


def _run(tmp: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert train.main(["--dir", str(tmp), *COMMON, *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("overlap", [False, True])
def test_many_async_resumes_to_the_uninterrupted_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overlap: bool
) -> None:
    flag = ("--overlap",) if overlap else ()
    ref = _run(tmp_path / "ref", capsys, "--ckpt", "many", "--steps", "6")
    first = _run(tmp_path / "a", capsys, "--ckpt", "many-async", "--steps", "3", *flag)
    [entry] = first["checkpoints"]
    assert entry["path"] == str(tmp_path / "a" / "async-00000000.many")
    assert entry["cost_s"] == pytest.approx(entry["save_s"] + entry["step_wait_s"], abs=2e-6)
    with load(entry["path"], verify=True) as f:
        assert f.metadata["step"] == 3
        assert (OVERLAP_KEY in f.metadata) == overlap
        if overlap:  # 8 weights, 8 biases and Adam's step and two moments for each
            assert len(f.metadata[OVERLAP_KEY]["overlapped"]) == 16 * 4
    resumed = _run(
        tmp_path / "a", capsys, "--ckpt", "many-async", "--steps", "6", "--resume", *flag
    )
    assert resumed["start_step"] == 3 and resumed["restored_from"] == entry["path"]
    assert resumed["params_blake3"] == ref["params_blake3"] and resumed["loss"] == ref["loss"]
    files = sorted(str(p) for p in (tmp_path / "a").glob("async-*.many"))
    assert len(files) == 2 and verify_chain(files) == []


def test_overlap_is_refused_where_nothing_can_wait_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train.main(["--dir", str(tmp_path), "--ckpt", "many", "--overlap"]) == 2
    assert "--ckpt many-async" in capsys.readouterr().err
    argv = ["--dir", str(tmp_path), "--ckpt", "many-async", "--overlap", "--backend", "numpy"]
    assert train.main(argv) == 2
    assert "--backend torch" in capsys.readouterr().err
    assert train.main(["--dir", str(tmp_path / "none"), "--ckpt", "many-async", "--resume"]) == 2
    assert "no many-async checkpoint" in capsys.readouterr().err
