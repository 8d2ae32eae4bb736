"""Terminal escapes from outside the program never reach the terminal raw (issue 21,
finding 6): a target's argv in `serwatt profile`'s table, a record's host fields in
`runs show`/`runs list` and the report, a Prometheus `instance` label and an HTTP error
body in `report --prometheus`. Every such string is printed through the one escape
`many inspect` uses (profiler.terminal_escape.escape_text)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records.host import fingerprint
from serwatt.profiler.records.store import Recorder
from serwatt.profiler.report import build_report, default_cluster, render_text
from tests.records.test_recorder import window
from tests.report_synth import HOST, make_run
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[1]
TITLE = "\x1b]0;PWNED\x07"  # an OSC sequence: sets the terminal's title
CLEAR = "\x1b[2J\x1b[H"  # clears the screen
RAW = ("\x1b", "\x07", "\x9b", "\u202e")  # ESC, BEL, C1 CSI, a bidi override


def assert_no_raw_controls(text: str) -> None:
    found = [c for c in RAW if c in text]
    assert not found, f"raw {found!r} in: {text[:400]!r}"


def test_a_targets_argv_is_escaped_in_the_profile_table() -> None:
    code = "import json\nd = list(range(3000))\nwhile True: s = json.dumps(d)"
    argv0 = f"{TITLE}\u202etrainer\x9b31m"
    target = subprocess.Popen([argv0, "-c", code], executable=sys.executable)
    try:
        time.sleep(0.5)
        ran = subprocess.run(
            [sys.executable, "-m", "serwatt", "profile", "--pid", str(target.pid),
             "--duration", "2"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        target.kill()
        target.wait()
    assert ran.returncode == 0, ran.stderr
    assert_no_raw_controls(ran.stdout + ran.stderr)
    # the run's own line (a 2 s run on a loaded node opens with why its intervals do not hold)
    header = next(ln for ln in ran.stdout.splitlines() if ln.startswith("serwatt profile: pid"))
    assert "\\x1b]0;PWNED\\x07\\u202etrainer\\x9b31m -c import json\\nd" in header, header


def test_the_json_path_is_escaped_when_the_document_cannot_be_written(tmp_path: Path) -> None:
    """The command removes the directory its --json file was to go in: serwatt's own error
    names that path escaped, and the document still reaches stderr (no data lost)."""
    out_dir = tmp_path / f"out{TITLE}{CLEAR}"
    out_dir.mkdir()
    ran = subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", "--duration", "30", "--json",
         str(out_dir / "p.json"), "--", sys.executable, "-c",
         "import shutil, sys, time; shutil.rmtree(sys.argv[1]); time.sleep(0.5)", str(out_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stderr
    assert_no_raw_controls(ran.stdout + ran.stderr)
    assert "cannot write " in ran.stderr and "out\\x1b]0;PWNED\\x07\\x1b[2J" in ran.stderr
    document = ran.stderr[ran.stderr.index("{\n") :]
    assert json.loads(document[: document.rindex("}") + 1])["schema"].startswith("serwatt.")


def _hostile_host() -> dict:
    host = fingerprint()
    host.update(
        hostname=f"node{TITLE}",
        cpu_model=f"EPYC{CLEAR}",
        kernel="6.1\u202e",
        python="3.11\x07",
        gpus=[{"index": 0, "name": f"H200{TITLE}"}],
    )
    return host


@pytest.fixture()
def hostile_record(tmp_path: Path) -> Path:
    path = tmp_path / "runs.sqlite"
    rec = Recorder(path)
    t0 = 1_800_000_000.0
    rec.start_run(
        "run-a", f"trainer{TITLE}", host=_hostile_host(), config={},
        sources={"energy": f"rapl{CLEAR}"}, started_at=t0,
    )  # fmt: skip
    rec.append_window("run-a", window(pid=11, t0=t0, seed=1))
    rec.finish_run("run-a", t0 + 10)
    rec.close()
    return path


def test_a_records_host_fields_are_escaped_in_runs_show_and_list(capsys, hostile_record) -> None:
    shown = serwatt(capsys, "runs", "show", "run-a", "--db", str(hostile_record))
    assert shown.returncode == 0, shown.stderr
    assert_no_raw_controls(shown.stdout)
    assert "node\\x1b]0;PWNED\\x07" in shown.stdout and "rapl\\x1b[2J" in shown.stdout
    listed = serwatt(capsys, "runs", "list", "--db", str(hostile_record))
    assert listed.returncode == 0, listed.stderr
    assert_no_raw_controls(listed.stdout)
    assert "trainer\\x1b]0;PWNED\\x07" in listed.stdout


def test_a_records_host_fields_are_escaped_in_the_report() -> None:
    host = {**HOST, **{k: v for k, v in _hostile_host().items() if k in HOST}}
    base = [make_run(f"b{i}", seed=i, host=host) for i in range(3)]
    cand = [make_run(f"c{i}", seed=10 + i, host=host, ckpt_cpu_s=0.5) for i in range(3)]
    text = render_text(build_report(base, cand, cluster=default_cluster()), full=True)
    assert_no_raw_controls(text)
    assert "node\\x1b]0;PWNED\\x07: EPYC\\x1b[2J\\x1b[H" in text


class _Prometheus:
    """Answers query_range from `answer(query)` -> (status, body); real HTTP, port 0."""

    def __init__(self, answer) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                code, body = answer(query.get("query", [""])[0])
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def prometheus() -> Iterator[type[_Prometheus]]:
    made: list[_Prometheus] = []

    def make(answer) -> _Prometheus:
        made.append(_Prometheus(answer))
        return made[-1]

    yield make  # type: ignore[misc]
    for p in made:
        p.close()


T0 = 1_700_000_000


def _series(metric: dict, per_step: float) -> dict:
    return {"metric": metric, "values": [[T0 + 60 * i, str(per_step * i)] for i in range(11)]}


def _node(variant: str) -> dict:
    return {"job": "serwatt", "instance": f"gpu-{variant}{TITLE}:9464"}


def _answer(query: str) -> tuple[int, bytes]:
    """Two nodes (variant a and b), one target each; the gauges of both."""
    steps = range(11)
    if query.startswith("serwatt_sample_rate_hz"):
        result = [
            {"metric": _node(v), "values": [[T0 + 60 * i, "50"] for i in steps]} for v in "ab"
        ]
    elif query.startswith("serwatt_build_info"):
        result = [
            {"metric": {**_node(v), "version": f"0.1{CLEAR}"},
             "values": [[T0 + 60 * i, "1"] for i in steps]}
            for v in "ab"
        ]  # fmt: skip
    else:
        name, selector = query.split("{", 1)
        variant = selector.split('"')[1]
        result = []
        for cp in CODEPATHS:
            metric = {**_node(variant), "target": f"train{TITLE}", "codepath": cp}
            if name == "serwatt_energy_joules_total":
                metric["source"] = "model"
            rate = {"serwatt_samples_total": 30.0}.get(name, 0.5)
            result.append(_series(metric, rate))
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return 200, json.dumps(doc).encode()


def test_prometheus_labels_are_escaped_in_the_report(capsys, prometheus) -> None:
    server = prometheus(_answer)
    ran = serwatt(
        capsys, "report", "--prometheus", server.url, "--baseline", '{variant="a"}',
        "--candidate", '{variant="b"}', "--range", f"{T0}..{T0 + 600}", "--step", "60s",
        "--allow-mismatch", "--full",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert_no_raw_controls(ran.stdout + ran.stderr)
    assert "gpu-a\\x1b]0;PWNED\\x07:9464/train\\x1b]0;PWNED\\x07@" in ran.stdout


@pytest.mark.parametrize("code", [400, 503])
def test_an_http_error_body_is_escaped(capsys, prometheus, code) -> None:
    error = f"overloaded{TITLE}{CLEAR}"
    server = prometheus(lambda _q: (code, json.dumps({"status": "error", "error": error}).encode()))
    ran = serwatt(
        capsys, "report", "--prometheus", server.url, "--baseline", '{variant="a"}',
        "--candidate", '{variant="b"}', "--range", "30m",
    )  # fmt: skip
    assert ran.returncode == (2 if code == 400 else 1), ran.stderr
    assert_no_raw_controls(ran.stderr)
    assert "overloaded\\x1b]0;PWNED\\x07\\x1b[2J" in ran.stderr
    assert ran.stderr.count("\n") == 1


def test_serwatt_classify_escapes_the_targets_thread_and_frame_names(capsys, tmp_path) -> None:
    """A dump's names are the target's: a frame named with a terminal sequence, a thread
    name with a line break. The decided frame is a json call site in a real file."""
    src = tmp_path / "job.py"
    src.write_text("import json\ndef step(d):\n    return json.dumps(d)\n")
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps([
        {"thread_id": 1, "os_thread_id": 4242, "thread_name": f"Main\n{CLEAR}",
         "frames": [{"name": f"step{TITLE}", "filename": str(src), "line": 3}]},
    ]))  # fmt: skip
    ran = serwatt(capsys, "classify", str(dump))
    assert ran.returncode == 0, ran.stderr
    assert_no_raw_controls(ran.stdout)
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("thread 4242 'Main\\n\\x1b[2J\\x1b[H': json  rule="), lines
    assert lines[1].startswith(f"    decided by frame 0: step\\x1b]0;PWNED\\x07 ({src}:3)"), lines
    assert len(lines) == 2


@pytest.mark.parametrize(
    ("text", "why"),
    [("{}", "expected a JSON list of threads"), ("[1]", "thread 0 is not an object"),
     ('[{"frames": [{"line": 1}]}]', "thread 0: bad frame")],
)  # fmt: skip
def test_serwatt_classify_refuses_what_is_not_a_dump(capsys, tmp_path, text, why) -> None:
    dump = tmp_path / "dump.json"
    dump.write_text(text)
    ran = serwatt(capsys, "classify", str(dump))
    assert ran.returncode == 2 and ran.stdout == "", ran
    assert ran.stderr.startswith("serwatt classify: error: not `py-spy dump --json` output: ")
    assert why in ran.stderr and ran.stderr.count("\n") == 1, ran.stderr
