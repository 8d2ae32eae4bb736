"""`serwatt profile -- CMD` where CMD is a wrapper that execs Python in the same pid (a
pyenv shim, `env`, a launcher), and a run that sampled nothing. With a real shim script:
serwatt probed the pid once, while it was still the shim, then printed a table of zeros
with `other 100.0%` on 0.00 CPU-s and exited 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.workloads.targets import find_interpreter

REPO = Path(__file__).resolve().parents[2]
PY312 = str(find_interpreter(("3.12.1", "3.13.0", "3.12")))

# a pyenv-like shim: some shell work first (pyenv's takes 50-300 ms), then exec, so the
# pid serwatt launched is a shell when first probed and Python afterwards
SHIM = """#!/bin/sh
sleep 1.5
exec "{python}" "$@"
"""

JSON_WORK = (
    "import json, time\n"
    "d = list(range(3000))\n"
    "until = time.monotonic() + 3.0\n"
    "while time.monotonic() < until: json.dumps(d)\n"
)


def _serwatt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_shim_that_execs_python_is_followed_and_said(tmp_path: Path) -> None:
    shim = tmp_path / "python3"
    shim.write_text(SHIM.format(python=PY312))
    shim.chmod(0o755)
    out = tmp_path / "p.json"
    r = _serwatt("--rate", "100", "--hide-zero", "--json", str(out), "--",
                 str(shim), "-c", JSON_WORK)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"exec'd into Python ({PY312} -c" in r.stderr, r.stderr
    doc = json.loads(out.read_text())
    # 3 s of json.dumps at 100 Hz: ~300 samples; the old code had 0
    assert doc["codepaths"]["json"]["samples"] > 100, doc["codepaths"]["json"]
    assert doc["target"]["python"] is not None
    # --hide-zero: codepaths with no figure at all are not rows; json is
    rows = [ln.split()[0] for ln in r.stdout.splitlines()[2:] if ln and not ln[0].isspace()]
    assert "json" in rows and "protobuf" not in rows and "yaml" not in rows, r.stdout
    assert "all-zero codepaths not shown: " in r.stdout and "protobuf" in r.stdout


def test_a_run_that_sampled_nothing_says_so_first_and_exits_non_zero(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    r = _serwatt("--json", str(out), "--", "sleep", "1")  # never Python
    assert r.returncode == 1, (r.stdout, r.stderr)
    first = r.stdout.splitlines()[0]
    assert first.startswith("serwatt profile: NOTHING WAS SAMPLED: 0 samples"), r.stdout
    assert "nothing was sampled" in r.stderr
    # a share of 0 CPU-s is n/a, not other's 100%
    other = next(ln for ln in r.stdout.splitlines() if ln.startswith("other "))
    total = next(ln for ln in r.stdout.splitlines() if ln.startswith("total "))
    assert "n/a" in other and "%" not in other.split("[")[0], other
    assert "n/a" in total and "100.0%" not in total, total
    doc = json.loads(out.read_text())
    assert all(c["share"] is None for c in doc["codepaths"].values())
