"""`serwatt ab --swap torch`: the injected sitecustomize swaps torch.save/torch.load for
profiler.many.torch_compat in the job and its Python children, still runs the job's own
sitecustomize, does nothing without SERWATT_SWAP; and an A/B whose swap took no effect is
refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.profiler.exitcodes import EXIT_USAGE
from serwatt.profiler.many.format import MAGIC
from serwatt.profiler.profile.ab import SWAP_DIR, SWAP_ENV

PY = sys.executable

JOB = """
import json, os, subprocess, sys
import torch
d = sys.argv[1]
torch.save({"w": torch.arange(4.0), "step": 3}, os.path.join(d, "parent.pt"))
back = torch.load(os.path.join(d, "parent.pt"), weights_only=True)
child = subprocess.run([sys.executable, "-c",
    "import sys, torch; torch.save({'x': torch.ones(2)}, sys.argv[1])",
    os.path.join(d, "child.pt")], check=True)
print(json.dumps({"own_site": os.environ.get("OWN_SITE"), "step": back["step"],
                  "w": back["w"].tolist(), "save": torch.save.__module__}))
"""


def _job(tmp_path: Path, swap: bool) -> dict[str, object]:
    own = tmp_path / "own"
    own.mkdir(exist_ok=True)
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITE'] = 'ran'\n")
    env = dict(os.environ, PYTHONPATH=f"{SWAP_DIR}:{own}")
    env.pop(SWAP_ENV, None)
    if swap:
        env[SWAP_ENV] = "torch"
    out = subprocess.run(
        [PY, "-c", JOB, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(json.loads(out.stdout.splitlines()[-1]))


def test_swap_reaches_the_job_and_its_children(tmp_path: Path) -> None:
    got = _job(tmp_path, swap=True)
    assert got == {
        "own_site": "ran",
        "step": 3,
        "w": [0.0, 1.0, 2.0, 3.0],
        "save": "serwatt.profiler.many.torch_compat",
    }
    for name in ("parent.pt", "child.pt"):
        assert (tmp_path / name).read_bytes()[:8] == MAGIC, name


@pytest.mark.long  # a second real A/B of the swap (test_swap_reaches_the_job_and_its_children)
def test_no_swap_without_the_variable(tmp_path: Path) -> None:
    got = _job(tmp_path, swap=False)
    assert got["own_site"] == "ran" and got["save"] != "serwatt.profiler.many.torch_compat"
    assert (tmp_path / "parent.pt").read_bytes()[:4] == b"PK\x03\x04"  # torch's own zip


@pytest.mark.long  # a third real A/B of the swap
def test_a_swap_that_took_no_effect_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    # checkpoints with pickle, not torch.save: the swap cannot change them
    write = "open(sys.argv[1] + '/state.pkl', 'wb').write(pickle.dumps(list(range(9))))"
    job = [PY, "-c", "import pickle, sys, time; time.sleep(1); " + write, "{dir}"]
    r = subprocess.run(
        [
            PY,
            "-m",
            "serwatt",
            "ab",
            "--swap",
            "torch",
            "--repeats",
            "2",
            "--checkpoints",
            "ck",
            "--record",
            "r.sqlite",
            "--",
            *job,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == EXIT_USAGE, r.stderr
    ck = tmp_path / "ck"
    run_dir = next(ck.glob("ab-*/candidate-1"))
    assert (
        f"the swap took no effect: no .many file written in {run_dir}; does the job call "
        "torch.save?" in r.stderr
    )
    assert "Traceback" not in r.stderr
