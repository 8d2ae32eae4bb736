"""The checkpointing training workload: every format checkpoints, resumes and does the same work."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serwatt.profiler.many import load, verify_chain
from serwatt.profiler.workloads import train

REPO = Path(__file__).resolve().parents[2]


def _run(tmp: Path, *args: str) -> dict[str, Any]:
    return train.train(train.build_parser().parse_args([*args, "--dir", str(tmp)]))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Reference runs: 6 steps straight through, per backend (format does not change the work)."""
    out = {}
    for backend in ("torch", "numpy"):
        tmp = tmp_path_factory.mktemp(f"ref-{backend}")
        out[backend] = _run(
            tmp,
            "--ckpt",
            "pickle",
            "--steps",
            "6",
            "--every",
            "3",
            "--size",
            "0.5",
            "--backend",
            backend,
        )
    return out


@pytest.mark.parametrize("fmt", train.FORMATS)
def test_every_format_checkpoints_and_resumes_to_the_same_weights(
    tmp_path: Path, fmt: str, uninterrupted: dict[str, dict[str, Any]]
) -> None:
    first = _run(
        tmp_path,
        "--ckpt",
        fmt,
        "--steps",
        "3",
        "--every",
        "3",
        "--size",
        "0.5",
        "--backend",
        "torch",
    )
    assert [c["step"] for c in first["checkpoints"]] == [3]
    ckpt_path = Path(first["checkpoints"][0]["path"])
    assert (
        ckpt_path.name == f"ckpt-00000003.{train.EXTENSIONS[fmt]}" and ckpt_path.stat().st_size > 0
    )
    assert not list(tmp_path.glob(".*tmp*"))
    resumed = _run(
        tmp_path,
        "--ckpt",
        fmt,
        "--steps",
        "6",
        "--every",
        "3",
        "--size",
        "0.5",
        "--backend",
        "torch",
        "--resume",
    )
    assert resumed["start_step"] == 3 and resumed["restored_from"] == str(ckpt_path)
    ref = uninterrupted["torch"]
    # Bit-identical weights: the checkpoint carried model and optimizer state exactly.
    assert resumed["params_blake3"] == ref["params_blake3"]
    assert resumed["loss"] == ref["loss"]


@pytest.mark.parametrize("fmt", ["many", "pickle", "safetensors", "msgpack", "json", "protobuf"])
def test_numpy_backend_resumes_too(
    tmp_path: Path, fmt: str, uninterrupted: dict[str, dict[str, Any]]
) -> None:
    _run(
        tmp_path,
        "--ckpt",
        fmt,
        "--steps",
        "3",
        "--every",
        "3",
        "--size",
        "0.5",
        "--backend",
        "numpy",
    )
    resumed = _run(
        tmp_path,
        "--ckpt",
        fmt,
        "--steps",
        "6",
        "--every",
        "3",
        "--size",
        "0.5",
        "--backend",
        "numpy",
        "--resume",
    )
    assert resumed["backend"] == "numpy"
    assert resumed["params_blake3"] == uninterrupted["numpy"]["params_blake3"]


def test_training_actually_learns(tmp_path: Path) -> None:
    early = _run(
        tmp_path / "a", "--ckpt", "many", "--steps", "2", "--every", "100", "--size", "0.5"
    )
    late = _run(
        tmp_path / "b", "--ckpt", "many", "--steps", "60", "--every", "100", "--size", "0.5"
    )
    assert late["loss"] < early["loss"] * 0.9


def test_many_checkpoints_form_a_verified_chain_and_hold_the_state(tmp_path: Path) -> None:
    run = _run(
        tmp_path, "--ckpt", "many", "--steps", "9", "--every", "3", "--size", "0.5", "--keep", "0"
    )
    paths = [c["path"] for c in run["checkpoints"]]
    assert len(paths) == 3
    assert verify_chain(paths) == []
    ckpt = load(paths[-1])
    assert ckpt.metadata["step"] == 9 and ckpt.metadata["format"] == "many"
    names = list(ckpt)
    assert "model.0.weight" in names and "optim.0.exp_avg_sq" in names
    assert ckpt["model.0.weight"].shape == (run["width"], run["width"])
    # The resumed run continues the chain from the checkpoint it restored.
    more = _run(
        tmp_path,
        "--ckpt",
        "many",
        "--steps",
        "12",
        "--every",
        "3",
        "--size",
        "0.5",
        "--keep",
        "0",
        "--resume",
    )
    assert verify_chain([*paths, more["checkpoints"][0]["path"]]) == []


def test_keep_prunes_old_checkpoints(tmp_path: Path) -> None:
    _run(
        tmp_path,
        "--ckpt",
        "safetensors",
        "--steps",
        "8",
        "--every",
        "2",
        "--size",
        "0.2",
        "--keep",
        "2",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000006.safetensors",
        "ckpt-00000008.safetensors",
    ]


def test_size_sets_the_checkpoint_size(tmp_path: Path) -> None:
    run = _run(tmp_path, "--ckpt", "safetensors", "--steps", "1", "--every", "1", "--size", "4")
    assert 3.5e6 < run["checkpoints"][0]["bytes"] < 4.5e6


def test_module_entry_point_and_usage_errors(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "serwatt.profiler.workloads.train"]
    ok = subprocess.run(
        [
            *cmd,
            "--ckpt",
            "many",
            "--steps",
            "2",
            "--every",
            "1",
            "--size",
            "0.2",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout)
    assert summary["final_step"] == 2 and len(summary["checkpoints"]) == 2
    assert "checkpoint step=2 format=many" in ok.stderr
    empty = tmp_path / "empty"
    bad = subprocess.run(
        [*cmd, "--ckpt", "torch", "--resume", "--dir", str(empty)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert bad.returncode == 2 and "no torch checkpoint" in bad.stderr
    worse = subprocess.run(
        [*cmd, "--ckpt", "xml"], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert worse.returncode == 2 and "invalid choice" in worse.stderr


def test_batches_depend_only_on_seed_and_step() -> None:
    a, _ = train.batch(0, 5, 16)
    b, _ = train.batch(0, 5, 16)
    c, _ = train.batch(0, 6, 16)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


class _RunsCode:
    """A pickle that, loaded with pickle.load, runs os.system (a planted checkpoint)."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return (os.system, ("touch {marker}",))


def test_resume_refuses_a_pickle_that_would_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    planted = tmp_path / "ckpt-00000009.pkl"
    payload = pickle.dumps({"meta": {}, "tensors": {"w": _RunsCode()}}, protocol=5).replace(
        b"touch {marker}", f"touch {marker}".encode()
    )
    planted.write_bytes(payload)
    with pytest.raises(train.UsageError) as info:
        _run(tmp_path, "--ckpt", "pickle", "--steps", "12", "--every", "3", "--resume")
    assert not marker.exists()  # nothing in the file ran
    assert str(planted) in str(info.value) and "system" in str(info.value)
    assert "remove it" in str(info.value)
    # the workload's own pickles still resume (numpy arrays of every kind it writes)
    doc = {"meta": {"step": 3}, "tensors": {
        "c": np.ones((2, 3), np.float32), "f16": np.ones(3, np.float16),
        "strided": np.ones((4, 4))[:, ::2], "scalar": np.float64(2.5),
    }}  # fmt: skip
    ok = tmp_path / "ok.pkl"
    ok.write_bytes(pickle.dumps(doc, protocol=5))
    tensors, meta = train.load_pickle(ok)
    assert meta == {"step": 3} and set(tensors) == set(doc["tensors"])
    for k, v in doc["tensors"].items():
        assert np.array_equal(tensors[k], v) and tensors[k].dtype == v.dtype
