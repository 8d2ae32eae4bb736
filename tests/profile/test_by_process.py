"""The per-process view (issue 22 item 4): each codepath's figures per process, in the
document (`codepaths.<cp>.processes`) and under `serwatt profile --by process`.

A real `serwatt profile -- python script` whose script starts a Python child that does
json while the parent pickles: the rows must put each serializer on its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.profile.table import COMMAND_SHOWN

REPO = Path(__file__).resolve().parents[2]
SERWATT = [sys.executable, "-m", "serwatt"]
HOSTILE_ARG = "\x1b]0;PWNED\x07"  # an argv that would retitle the terminal if printed raw

SCRIPT = textwrap.dedent(
    """
    import json, pickle, subprocess, sys, time

    data = {"k%d" % i: [i, str(i), float(i)] for i in range(2000)}
    time.sleep(1.0)  # serwatt attaches to both processes before the work
    if sys.argv[1] == "child":
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            json.dumps(data)
    else:
        child = subprocess.Popen([sys.executable, sys.argv[0], "child", sys.argv[2]])
        until = time.monotonic() + 4.0
        while time.monotonic() < until:
            pickle.dumps(data)
        sys.exit(child.wait())
    """
)


def _rows(doc: dict, codepath: str) -> dict[int, dict]:
    return {p["pid"]: p for p in doc["codepaths"][codepath]["processes"]}


@pytest.mark.serial
def test_a_child_doing_json_and_a_parent_pickling_are_separate_rows(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    (tmp_path / "pc.py").write_text(SCRIPT)
    # run from tmp_path, so the commands are short enough for the table to show whole
    r = subprocess.run(
        [*SERWATT, "profile", "--by", "process", "--json", str(out), "--",
         sys.executable, "pc.py", "parent", HOSTILE_ARG],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    parent = doc["target"]["pid"]
    children = [t for t in doc["targets"] if t["pid"] != parent and t["samples"]]
    assert len(children) == 1, doc["targets"]
    child = children[0]["pid"]
    assert {t["pid"]: t["role"] for t in doc["targets"]} == {parent: "main", child: "worker"}

    pickle_rows, json_rows = _rows(doc, "pickle"), _rows(doc, "json")
    # the parent pickles, the child does json: each serializer's CPU is on its own process
    # a failure names where the parent's CPU went and what the sampler said of its windows
    seen = {
        cp: [p["cpu_s"] for p in row.get("processes", ()) if p["pid"] == parent]
        for cp, row in doc["codepaths"].items()
    }
    # (the parent's own record first: pytest cuts a long message, and a CI run lost all of
    # the parent's rows with no py-spy error to say why)
    mine = next(t for t in doc["targets"] if t["pid"] == parent)
    assert pickle_rows.get(parent, {}).get("cpu_s", 0.0) > 0.5, (mine, doc["sampler"], seen)
    assert json_rows[child]["cpu_s"] > 0.5, json_rows
    assert pickle_rows.get(child, {}).get("cpu_s", 0.0) < 0.1 * pickle_rows[parent]["cpu_s"]
    assert json_rows.get(parent, {}).get("cpu_s", 0.0) < 0.1 * json_rows[child]["cpu_s"]
    assert pickle_rows[parent]["role"] == "main" and json_rows[child]["role"] == "worker"
    assert json_rows[child]["command"] == f"{sys.executable} pc.py child {HOSTILE_ARG}"  # raw
    # the parent's pickling ran on its main thread, 4 s of it
    assert 2.0 < pickle_rows[parent]["main_thread_wall_s"] <= doc["duration_s"]
    assert (
        doc["codepaths"]["pickle"]["main_thread_wall_s"]
        == pickle_rows[parent]["main_thread_wall_s"]
    )
    # the processes' rows add up to their codepath's figures
    for cp in CODEPATHS:
        row, procs = doc["codepaths"][cp], doc["codepaths"][cp]["processes"]
        assert sum(p["cpu_s"] for p in procs) == pytest.approx(row["cpu_s"], abs=1e-4), cp
        assert sum(p["samples"] for p in procs) == row["samples"], cp
        assert sum(p["wall_s"] for p in procs) == pytest.approx(row["wall_s"], abs=1e-4), cp

    # the table: under each codepath's row, a row per process; the command escaped
    lines = r.stdout.splitlines()
    assert "\x1b" not in r.stdout and "\\x1b]0;PWNED\\x07" in r.stdout

    def under(codepath: str) -> list[str]:
        start = next(i for i, line in enumerate(lines) if line.startswith(f"{codepath} "))
        block = []
        for line in lines[start + 1 :]:
            if not line.startswith("  ") or line.startswith("  unmapped"):
                break
            block.append(line)
        return block

    pickle_block, json_block = under("pickle"), under("json")
    assert pickle_block[0].split()[0] == str(parent) and " main " in pickle_block[0]
    assert f"{pickle_rows[parent]['cpu_s']:.2f}" in pickle_block[0]
    assert json_block[0].split()[0] == str(child) and " worker " in json_block[0]
    # the command cell, escaped, shortened with "..." past COMMAND_SHOWN characters (how
    # many of the argv's show depends on the interpreter's path)
    cell = json_block[0].split(" worker ", 1)[1]
    shown = f"{sys.executable} pc.py child \\x1b]0;PWNED\\x07"
    assert cell == shown or (
        len(cell) == COMMAND_SHOWN and cell.endswith("...") and shown.startswith(cell[:-3])
    ), (cell, shown)


@pytest.mark.serial
def test_profile_writes_its_document_and_exits_quietly_when_stdout_is_gone(
    tmp_path: Path,
) -> None:
    out = tmp_path / "p.json"
    read_end, write_end = os.pipe()
    os.close(read_end)  # `serwatt profile ... | head` with head already gone
    try:
        r = subprocess.run(
            [*SERWATT, "profile", "--by", "process", "--json", str(out), "--",
             sys.executable, "-c", "import time; time.sleep(1.5)"],
            cwd=REPO, stdout=write_end, stderr=subprocess.PIPE, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write_end)
    err = r.stderr.decode(errors="replace")
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert r.returncode == 141, (r.returncode, err)
    assert json.loads(out.read_text())["schema"] == "serwatt.profile/1"
