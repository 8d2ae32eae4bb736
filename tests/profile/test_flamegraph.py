"""`serwatt profile --html FILE` (alias --flamegraph) on a real json job, opened in
headless Chromium (Debian's `chromium`, as tests/report/test_report_html.py): the run's
page holds the table, the flame graph and the episodes over time, in that order; the
vendored d3-flame-graph renders, the job's own json.dumps call site is a frame, coloured
as the json codepath; nothing overflows at 1400 and 800 px."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.profiler.profile.flamegraph import COLOURS
from tests import headless_chromium
from tests.workloads.targets import find_interpreter

REPO = Path(__file__).resolve().parents[2]
PY312 = str(find_interpreter(("3.12.1", "3.13.0", "3.12")))

JOB = """import json, time


def save_state(d):
    return json.dumps(d)  # line 5: the call site the flame graph must show


def step(n):
    return sum(i * i for i in range(n))


d = {"k%d" % i: [i, str(i)] for i in range(20000)}  # ~30 ms a call: episodes
until = time.process_time() + 3.0  # its own CPU, however busy the machine is
while time.process_time() < until:
    save_state(d)
    step(200000)
"""


@pytest.fixture(scope="module")
def run_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the page, the job) of one real profile of JOB."""
    tmp = tmp_path_factory.mktemp("flame")
    job = tmp / "job.py"
    job.write_text(JOB)
    page = tmp / "flame.html"
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", "--rate", "100",
         "--html", str(page), "--", PY312, str(job)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return page, job


def test_flame_graph_renders_in_chromium_with_the_call_site_coloured(
    run_page: tuple[Path, Path], tmp_path: Path
) -> None:
    page, job = run_page
    text = page.read_text()
    assert "http://" not in text.split("<script>")[0] and "<script src" not in text
    dom = headless_chromium.run(
        tmp_path, "--window-size=1400,900", "--virtual-time-budget=5000", "--dump-dom",
        page.as_uri(),
    )  # fmt: skip
    assert 'data-rendered="1"' in dom, dom[-2000:]
    # every frame is a <g> with a rect and a <title> (d3-flame-graph's label handler)
    frames = re.findall(r'<g [^>]*class="frame"[^>]*>(.*?)</g>', dom, flags=re.S)
    assert len(frames) > 5, dom[-3000:]
    site = f"save_state ({job.parent.name}/job.py:5)"
    hits = [f for f in frames if site in f]
    assert hits, [re.findall(r"<title>(.*?)\n", f) for f in frames][:30]
    fill = re.search(r'<rect[^>]*fill="([^"]+)"', hits[0])
    assert fill and fill.group(1).lower() == COLOURS["json"], hits[0][:500]
    assert "codepath json" in hits[0]
    # the arithmetic beside it is `other`, in other's colour, never json's (a frame with
    # a sample or two of another codepath under it is pale: mixed)
    step = [re.search(r'fill="([^"]+)"', f).group(1) for f in frames if "step (" in f]
    assert COLOURS["other"] in step and COLOURS["json"] not in step, step
    # the episodes over time: json's calls, in json's colour
    episodes = re.findall(r'<rect class="episode" data-codepath="(\w+)"[^>]*fill="([^"]+)"', dom)
    assert ("json", COLOURS["json"]) in episodes, episodes[:10]
    # the single-run page: the table, the flame graph, the episodes, in that order, the
    # table shown (not folded) with the job's json row
    assert re.findall(r"<h2[^>]*>(.*?)</h2>", dom) == [
        "By codepath", "Flame graph", "Episodes over time"
    ]  # fmt: skip
    table = re.search(r'<pre class="table">(.*?)</pre>', dom, flags=re.S)
    assert table and re.search(r"^\s*json\b.*\d", table.group(1), flags=re.M), dom[:3000]
    assert "<details" not in dom


MEASURE = """<script>
(function () {
  var vw = document.documentElement.clientWidth, out = {vw: vw, past: []};
  out.scrollWidth = document.documentElement.scrollWidth;
  document.querySelectorAll("svg, pre, #chart").forEach(function (el) {
    var box = el.getBoundingClientRect();
    if (box.right > vw + 1) out.past.push(el.tagName + " " + (el.id || el.className));
  });
  document.body.setAttribute("data-measured", JSON.stringify(out));
})();
</script>"""


@pytest.mark.parametrize("width", [1400, 800])
def test_the_page_fits_the_window(run_page: tuple[Path, Path], tmp_path: Path, width: int) -> None:
    page, _job = run_page
    copy = tmp_path / "measured.html"
    copy.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom = headless_chromium.run(
        tmp_path, "--hide-scrollbars", f"--window-size={width},900",
        "--virtual-time-budget=5000", "--dump-dom", copy.as_uri(),
    )  # fmt: skip
    got = re.search(r'data-measured="([^"]*)"', dom)
    assert got, dom[-1500:]
    m = json.loads(html.unescape(got.group(1)))
    assert m["scrollWidth"] <= m["vw"] and m["past"] == [], m


def test_target_strings_in_the_page_are_never_markup() -> None:
    from serwatt.profiler.profile.flamegraph import render_page
    from serwatt.profiler.profile.stack_profile import StackFigures, StackProfile

    hostile = "</script><img src=x onerror=alert(1)>&amp;"
    stacks = StackProfile()
    stacks.stacks[(((hostile, "/x.py", 1), ("main", "/x.py", 9)), "json", "encode")] = StackFigures(
        samples=3, cpu_s=0.5
    )
    page = render_page(stacks, title=hostile, summary=hostile, table=hostile)
    body = page.split("<script>")[0] + page.split("</script>")[-1]
    assert "<img" not in page and "</script><img" not in page
    assert "&lt;/script&gt;&lt;img" in body  # the title and table, as text
    assert "\\u003c/script\\u003e\\u003cimg" in page  # the frame name, inside the JSON
