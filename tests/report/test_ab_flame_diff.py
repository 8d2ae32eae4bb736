"""The A/B page's differential flame graph (baseline -> candidate) in headless Chromium:
the vendored d3-flame-graph draws it, a known call site is a frame coloured by its
change (red: more CPU in the candidate, blue: less), the sides are normalised per run,
a run recorded without stacks is named, and nothing overflows at 1400 and 800 px; and
end to end, from two real `serwatt profile --record` runs through `serwatt report`."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from serwatt.profiler.report import build_report, render_html
from tests.report.test_ab_page_layout import _chrome, _measure
from tests.report_synth import make_run
from tests.workloads.targets import find_interpreter

MAIN = ("main", "/job/train.py", 40)
SAVE = ("save_state", "/job/train.py", 5)  # the call site: json.dumps under it
DUMPS = ("dumps", "/usr/lib/python3.12/json/__init__.py", 231)
PICKLE = ("save_pickle", "/job/train.py", 9)  # only the baseline's
STEP = ("step", "/job/train.py", 12)
HOSTILE = ("</script><img src=x onerror=alert(1)>", "/x.py", 1)


def _stacks(json_s: float, pickle_s: float) -> tuple:
    return (
        ((DUMPS, SAVE, MAIN), "json", "encode", 10, json_s),
        ((STEP, MAIN), "other", "unknown", 40, 2.0),
        ((HOSTILE, MAIN), "other", "unknown", 1, 0.05),
        *([((PICKLE, MAIN), "pickle", "encode", 5, pickle_s)] if pickle_s else []),
    )


def _report(*, candidate_runs: int = 3, old_run: bool = False) -> dict[str, Any]:
    # baseline: 0.1 CPU-s of json a run; candidate: 0.3, over a different number of runs
    base = [replace(make_run(f"b{i}", seed=i), stacks=_stacks(0.1, 0.2)) for i in range(2)]
    if old_run:
        base.append(make_run("b-before-stacks", seed=9))  # recorded before schema 8
    cand = [
        replace(make_run(f"c{i}", seed=10 + i), stacks=_stacks(0.3, 0.0))
        for i in range(candidate_runs)
    ]
    return build_report(base, cand)


def test_the_sides_are_summed_and_normalised_per_run() -> None:
    st = _report(old_run=True)["stacks"]
    assert (st["baseline"]["runs"], st["candidate"]["runs"]) == (2, 3)
    assert st["baseline"]["without"] == ["b-before-stacks"]
    site = [s for s in st["stacks"] if s["codepath"] == "json"]
    assert len(site) == 1 and site[0]["frames"][-1].startswith("dumps (json/__init__.py:231)")
    assert (site[0]["baseline"], site[0]["candidate"]) == (0.1, 0.3)
    gone = [s for s in st["stacks"] if s["codepath"] == "pickle"]
    assert (gone[0]["baseline"], gone[0]["candidate"]) == (0.2, 0.0)


def _rgb(fill: str) -> tuple[int, ...]:
    got = re.fullmatch(r"rgb\((\d+), ?(\d+), ?(\d+)\)", fill.replace(" ", ""))
    assert got, fill
    return tuple(int(x) for x in got.groups())


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("flame_diff") / "report.html"
    out.write_text(render_html(_report(old_run=True)), encoding="utf-8")
    return out


def test_the_diff_renders_with_the_call_site_coloured_by_its_change(
    page: Path, tmp_path: Path
) -> None:
    text = page.read_text()
    assert "<img" not in text and "\\u003c/script\\u003e\\u003cimg" in text  # JSON, not markup
    assert "<script src" not in text and "http://" not in text.split("<script>")[0]
    dom = _chrome(tmp_path, "--window-size=1400,900", "--virtual-time-budget=5000",
                  "--dump-dom", page.as_uri())  # fmt: skip
    assert re.search(r'id="serwatt-flame-diff"[^>]*data-rendered="1"', dom), dom[-2000:]
    frames = re.findall(r'<g [^>]*class="frame"[^>]*>(.*?)</g>', dom, flags=re.S)
    assert len(frames) >= 6, dom[-3000:]
    fill = {
        name: re.search(r'<rect[^>]*fill="([^"]+)"', f).group(1)
        for f in frames
        for name in re.findall(r"<title>(.*?)\n", f)
    }
    site = "save_state (job/train.py:5)"
    assert site in fill, sorted(fill)
    hit = next(f for f in frames if f"<title>{site}" in f)
    assert "baseline 0.100 → candidate 0.300 CPU-s per run (+0.200), codepath json" in hit
    r, g, b = _rgb(fill[site])
    assert r > g + 50 and r > b + 50, fill[site]  # red: more in the candidate
    r, g, b = _rgb(fill["save_pickle (job/train.py:9)"])
    assert b > r + 50 and b > g + 50  # blue: only in the baseline
    assert _rgb(fill["step (job/train.py:12)"]) == (220, 220, 220)  # unchanged: grey
    assert html.escape(f"{HOSTILE[0]} (/x.py:1)", quote=False) in fill  # drawn as text
    flat = re.sub(r"<[^>]+>", "", dom)
    assert "baseline run b-before-stacks: no stacks recorded for this run " in flat
    assert "(recorded before schema 8, or by a sampler that folds none)" in flat
    assert "more CPU in the candidate" in flat and "Baseline → candidate" in flat


@pytest.mark.parametrize("width", [1400, 800])
def test_nothing_overflows(page: Path, tmp_path: Path, width: int) -> None:
    m = _measure(page, tmp_path, width)
    assert m["scrollWidth"] <= m["vw"], m
    assert m["clipped"] == [], m["clipped"]


def test_a_page_without_stacks_says_so_and_has_no_script(tmp_path: Path) -> None:
    report = build_report([make_run("b0", seed=1)], [make_run("c0", seed=2)])
    page = render_html(report)
    assert "<script" not in page and "Content-Security-Policy" not in page
    assert "No differential flame graph: no run of the baseline and the candidate recorded" in page
    why = "no stacks recorded for this run (recorded before schema 8, or by a sampler"
    assert f"b0</code>: {why}" in page and f"c0</code>: {why}" in page


def test_past_the_cap_the_smallest_stacks_are_summed_per_codepath(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from serwatt.profiler.report import stack_diff

    monkeypatch.setattr(stack_diff, "MAX_REPORT_STACKS", 1)
    st = _report()["stacks"]
    assert st["not_drawn_one_by_one"] == 3
    assert [r["frames"][-1] for r in st["stacks"]][0] == "step (job/train.py:12)"
    rest = {r["codepath"]: r for r in st["stacks"][1:]}
    assert set(rest) == {"json", "other", "pickle"}
    assert all(r["frames"] == [stack_diff.SMALLER] for r in rest.values())
    assert (rest["json"]["baseline"], rest["json"]["candidate"]) == (0.1, 0.3)
    assert sum(r["candidate"] for r in st["stacks"]) == pytest.approx(2.35)


E2E_JOB = """import json, sys, time


def save_state(d):
    return json.dumps(d)  # line 5: the call site the diff must show


def step(n):
    return sum(i * i for i in range(n))


d = {"k%d" % i: [i, str(i)] for i in range(int(sys.argv[1]))}
until = time.process_time() + 2.0  # its own CPU, however busy the machine is
while time.process_time() < until:
    save_state(d)
    step(200000)
"""


def test_recorded_profiles_give_the_diff_end_to_end(tmp_path: Path) -> None:
    """Two real `serwatt profile --record` runs (the candidate dumps 8x the dict), then
    `serwatt report --html`: the job's save_state call site is a frame of the diff, red."""
    py = str(find_interpreter(("3.12.1", "3.13.0", "3.12")))
    repo = Path(__file__).resolve().parents[2]
    job, db, page = tmp_path / "job.py", tmp_path / "runs.sqlite", tmp_path / "ab.html"
    job.write_text(E2E_JOB)
    serwatt = [sys.executable, "-m", "serwatt"]
    for run_id, keys in (("base", "5000"), ("cand", "40000")):
        r = subprocess.run(
            [*serwatt, "profile", "--rate", "100", "--record", str(db), "--run-id", run_id,
             "--", py, str(job), keys],
            cwd=repo, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [*serwatt, "report", "--db", str(db), "--baseline", "base", "--candidate", "cand",
         "--html", str(page)],
        cwd=repo, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    dom = _chrome(tmp_path, "--window-size=1400,900", "--virtual-time-budget=5000",
                  "--dump-dom", page.as_uri())  # fmt: skip
    assert re.search(r'id="serwatt-flame-diff"[^>]*data-rendered="1"', dom), dom[-2000:]
    site = f"save_state ({tmp_path.name}/job.py:5)"
    frames = re.findall(r'<g [^>]*class="frame"[^>]*>(.*?)</g>', dom, flags=re.S)
    hit = [f for f in frames if f"<title>{site}\n" in f]
    assert hit, [re.findall(r"<title>(.*?)\n", f) for f in frames][:30]
    assert "codepath json" in hit[0], hit[0][:400]
    r_, g_, b_ = _rgb(re.search(r'<rect[^>]*fill="([^"]+)"', hit[0]).group(1))
    assert r_ > g_ + 50 and r_ > b_ + 50, hit[0][:400]  # the candidate's 8x dumps: more
