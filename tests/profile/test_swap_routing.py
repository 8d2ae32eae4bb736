"""`--swap torch` in a job's own interpreter: serwatt's drop-in is loaded from serwatt's
tree, never looked up on the job's path; it degrades to "not applied" (a warning, the log)
when it cannot load; per file, what `.many` stores goes to `.many` and the rest to the
original torch.save; torch.load hands the original only files this job wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from serwatt.profiler.many.format import MAGIC
from serwatt.profiler.profile.ab import SWAP_DIR, SWAP_ENV, SWAP_LOG_ENV

PY = sys.executable
ZIP = b"PK\x03\x04"

# A job with a module of its own named `serwatt`, saving one state .many can store and one
# it cannot (a pickled object), loading both back; then a torch.save file it never wrote.
JOB = """
import argparse, json, os, sys
import torch
import serwatt
d = sys.argv[1]
state = {"w": torch.arange(4.0), "step": 3, "rng": [1, (2.5, None)]}
torch.save(state, os.path.join(d, "state.pt"))
torch.save(argparse.Namespace(lr=0.1), os.path.join(d, "args.bin"))
state = torch.load(os.path.join(d, "state.pt"))
args = torch.load(os.path.join(d, "args.bin"), weights_only=False)
try:
    torch.load(os.path.join(d, "foreign.pt"), weights_only=False)
    foreign = "read"
except Exception as exc:
    foreign = type(exc).__name__
print(json.dumps({"mine": serwatt.MINE, "step": state["step"], "w": state["w"].tolist(),
                  "lr": args.lr, "foreign": foreign, "save": torch.save.__module__}))
"""


Ran = tuple[dict[str, Any], str, list[dict[str, Any]]]


def _run(tmp_path: Path, *, extra_path: str = "") -> Ran:
    mine = tmp_path / "mine"
    mine.mkdir(exist_ok=True)
    (mine / "serwatt.py").write_text("MINE = 'the job own'\n")
    torch.save({"x": torch.ones(2)}, tmp_path / "foreign.pt")
    log = tmp_path / "swap.jsonl"
    # the job's interpreter cannot import serwatt: only the swap directory and the job's
    # own modules on its path, run from a directory that is not serwatt's
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {
        "PYTHONPATH": ":".join(p for p in (str(SWAP_DIR), extra_path, str(mine)) if p),
        SWAP_ENV: "torch",
        SWAP_LOG_ENV: str(log),
    }
    out = subprocess.run(
        [PY, "-c", JOB, str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return json.loads(out.stdout.splitlines()[-1]), out.stderr, lines


def test_swap_loads_without_serwatt_on_the_jobs_path_and_routes_per_file(tmp_path: Path) -> None:
    got, stderr, log = _run(tmp_path)
    assert got == {
        "mine": "the job own",  # the job's own `serwatt` module, not serwatt's
        "step": 3,
        "w": [0.0, 1.0, 2.0, 3.0],
        "lr": 0.1,
        "foreign": "ManyFormatError",  # a torch.save file it never wrote stays refused
        "save": "serwatt.profiler.many.torch_compat",
    }, stderr
    assert (tmp_path / "state.pt").read_bytes()[:8] == MAGIC
    assert (tmp_path / "args.bin").read_bytes()[:4] == ZIP
    saves = {Path(e["path"]).name: e for e in log if e["event"] == "save"}
    assert [e["event"] for e in log if e["event"] != "save"] == ["applied"]
    assert saves["state.pt"]["to"] == "many"
    assert saves["args.bin"]["to"] == "torch" and "Namespace" in saves["args.bin"]["why"]
    for name, e in saves.items():
        assert e["bytes"] == (tmp_path / name).stat().st_size


def test_swap_that_cannot_load_warns_and_leaves_torch_as_is(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "blake3").mkdir(parents=True)
    (broken / "blake3" / "__init__.py").write_text("raise ImportError('no blake3 in this env')\n")
    got, stderr, log = _run(tmp_path, extra_path=str(broken))
    assert "NOT applied" in stderr and "no blake3 in this env" in stderr
    assert got["save"] == "torch.serialization" and got["foreign"] == "read"
    assert (tmp_path / "state.pt").read_bytes()[:4] == ZIP
    assert [e["event"] for e in log] == ["not_applied"]
    assert "no blake3 in this env" in log[0]["why"]


def test_compat_error_names_the_root_with_a_separator(tmp_path: Path) -> None:
    from serwatt.profiler.many import torch_compat

    with pytest.raises(TypeError) as err:
        torch_compat.save(object(), tmp_path / "x.many")
    assert str(err.value).startswith("the state's root: builtins.object cannot be stored")
    assert not (tmp_path / "x.many").exists()


def test_swap_problems_lists_every_file_and_passes_numpy_rng_state(tmp_path: Path) -> None:
    import argparse
    import random

    import numpy as np

    from serwatt.profiler.profile.pickle_scan import swap_problems

    # a Trainer's rng_state.pth: python's and numpy's RNG states and a torch byte tensor
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.ones(3)}
    torch.save(rng, tmp_path / "rng_state.pth")
    torch.save(argparse.Namespace(lr=0.1), tmp_path / "training_args.bin")
    torch.save({"o": argparse.ArgumentParser}, tmp_path / "other.bin")
    (tmp_path / "broken.pt").write_bytes(b"PK\x03\x04" + b"\0" * 40)
    damaged, pickled = swap_problems(
        sorted(str(p) for p in tmp_path.iterdir() if p.name != "rng_state.pth")
        + [str(tmp_path / "rng_state.pth")]
    )
    assert [d.split(":")[0] for d in damaged] == ["broken.pt"]
    assert pickled == [
        "other.bin pickles argparse.ArgumentParser",
        "training_args.bin pickles argparse.Namespace",
    ]
    # what the check passes, the drop-in really stores
    from serwatt.profiler.many import torch_compat

    torch_compat.save(rng, tmp_path / "rng.many")
    back = torch_compat.load(tmp_path / "rng.many")
    assert back["numpy"][0] == "MT19937" and (back["numpy"][1] == rng["numpy"][1]).all()


def test_tensorboard_events_are_not_checkpoint_files(tmp_path: Path) -> None:
    from serwatt.collectors.fsevents import name_filter
    from serwatt.profiler.profile.checkpoint_files import snapshot

    run = tmp_path / "runs" / "Dec07_host"
    run.mkdir(parents=True)
    (run / "events.out.tfevents.1765110000.host.123.0").write_bytes(b"x")
    (tmp_path / "checkpoint-20").mkdir()
    (tmp_path / "checkpoint-20" / "optimizer.pt").write_bytes(b"y")
    assert [Path(p).name for p in snapshot(tmp_path)] == ["optimizer.pt"]
    assert not name_filter(None)("events.out.tfevents.1765110000.host.123.0")


def test_ab_takes_checkpoint_glob_as_profile_does(tmp_path: Path) -> None:
    import argparse

    from serwatt.profiler.cli import ab as cli_ab
    from serwatt.profiler.profile.ab import Ab, AbError
    from serwatt.profiler.profile.checkpoint_files import snapshot

    parser = argparse.ArgumentParser()
    cli_ab.configure(parser)
    args = parser.parse_args(
        ["--swap", "torch", "--checkpoints", str(tmp_path), "--checkpoint-glob", "*.pt",
         "--repeats", "2", "--", "python", "job.py"]
    )  # fmt: skip
    opts = cli_ab._options(args, tmp_path / "r.sqlite")
    assert opts.checkpoint_glob == "*.pt"
    (tmp_path / "a.pt").write_bytes(b"1")
    (tmp_path / "trainer_state.json").write_text("{}")
    assert [Path(p).name for p in snapshot(tmp_path, opts.checkpoint_glob)] == ["a.pt"]
    args = parser.parse_args(["--checkpoint-glob", "*.pt", "--baseline", "a", "--candidate", "b"])
    with pytest.raises(AbError, match="--checkpoint-glob needs --checkpoints"):
        Ab(cli_ab._options(args, tmp_path / "r.sqlite")).check()


def test_yaml_set_up_at_import_is_not_serialization() -> None:
    from serwatt.collectors.samples import Frame
    from serwatt.profiler.classify.classifier import Classifier

    site = "/venv/lib/python3.11/site-packages"
    resolver = Frame("BaseResolver.add_implicit_resolver", f"{site}/yaml/resolver.py", 30)
    importing = (
        resolver,
        Frame("<module>", f"{site}/yaml/resolver.py", 170),
        Frame("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241),
        Frame("<module>", f"{site}/yaml/__init__.py", 8),
        Frame("<module>", "/srv/train.py", 3),
    )
    c = Classifier.default()
    assert c.classify_frames(importing).codepath == "other"
    # the same function called by the job after the import is yaml's
    called = (resolver, Frame("main", "/srv/train.py", 40), Frame("<module>", "/srv/train.py", 50))
    assert c.classify_frames(called).codepath == "yaml"
    # a script's own body is no import: a rule over the script's functions still holds
    # (a module body counts as an import only below importlib's frames)
    called_at_top = (resolver, Frame("<module>", f"{site}/yaml/resolver.py", 170))
    assert c.classify_frames(called_at_top).codepath == "yaml"


def test_a_restore_one_page_short_of_cached_is_not_labelled_100_percent() -> None:
    from serwatt.profiler.profile.page_cache import cache_label

    assert cache_label(0.9996) == "partly cached (99%)"
    assert (cache_label(1.0), cache_label(0.0)) == ("warm", "cold")


def test_ab_refuses_when_the_swap_did_not_apply_and_counts_what_went_where(
    tmp_path: Path,
) -> None:
    from serwatt.profiler.profile.ab import Ab, AbError, AbOptions, PlannedRun

    ab = Ab(AbOptions(baseline=("x",), candidate=("x",), repeats=2, record=tmp_path / "r"))
    run = PlannedRun(1, "candidate", 1, False, "ab-x-candidate-1", tmp_path, ("x",))
    log = tmp_path / "log.jsonl"
    saves = [
        {"pid": 1, "event": "applied"},
        {"pid": 1, "event": "save", "to": "many", "bytes": 100},
        {"pid": 1, "event": "save", "to": "torch", "bytes": 7},
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in saves))
    assert ab._swap_saves(log, run) == {"many": [1, 100], "torch": [1, 7]}
    # the resumed run appends to its pair's log: only its own lines count
    why = "ModuleNotFoundError: No module named 'blake3'"
    with log.open("a") as f:
        f.write(json.dumps({"pid": 2, "event": "not_applied", "why": why}) + "\n")
    with pytest.raises(AbError, match="did not apply in 1 of the job's processes.*blake3"):
        ab._swap_saves(log, replace_run(run))


def replace_run(run: Any) -> Any:
    from dataclasses import replace

    return replace(run, resumed=True, run_id=run.run_id + "-resumed")
