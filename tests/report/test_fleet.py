"""A fleet on loopback: three real daemons (two `variant: torch`, one `variant: many`) watching
real training workloads (profiler/workloads/train.py checkpointing with torch.save and with
`.many`), one real Prometheus (Debian's) scraping them with the recording rules loaded,
and Prometheus `remote_write` into a real VictoriaMetrics (Debian's, single node). Each
daemon's NVML is the replayed H200 (tests/replayed_daemon.py): this machine has no GPU,
and the GPU rules and panels need GPU series.

One fleet (module fixture, ~70 s) backs every test here: the stored per-variant totals
against the daemons' own run records, the recording rules and dashboard panels on both
stores, and `serwatt report --prometheus` against both stores, with its errors.

The workloads are killed after ~30 s of training, so the daemons' counters freeze: once
both stores hold a scrape taken after that, their totals must equal the records' sums
(float rounding only). The report's range starts before the daemons do, so its totals
are the records' totals less what the first scrape already held: some prefix of each
daemon's windows (the scrape-timing term; nearly always empty).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from serwatt.profiler.exitcodes import EXIT_RUNTIME, EXIT_USAGE
from tests import dashboards
from tests.daemon_support import DaemonProc, daemon_config, stop_process, wait_for
from tests.ports import listening_port, prometheus_port
from tests.serwatt_cli import Ran, serwatt

# the fleet: three daemons, Prometheus and VictoriaMetrics, long enough for every rule
# and panel to have data
pytestmark = pytest.mark.long

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "configs" / "prometheus" / "serwatt.rules.yml"
# Each daemon: (variant, checkpoint format). Two baseline nodes, one candidate.
NODES = (("torch", "torch"), ("torch", "torch"), ("many", "many"))
TRAIN_S = 30.0  # training time watched after every node has samples
PANELS_WAIT_S = 90.0  # more, at most, for every dashboard panel to have data
WINDOW_S = 2
STEP_S = 4  # the report's window: two daemon windows, four scrapes
# In the processes' command lines the daemons match: a fleet sees only its own processes,
# whatever another test process runs beside it.
MARK = f"fleet{os.getpid()}"


@dataclass
class Node:
    variant: str
    daemon: DaemonProc
    workload: subprocess.Popen
    db: Path

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.daemon.port}"


@dataclass
class Fleet:
    nodes: list[Node]
    prom: int  # Prometheus port
    vm: int  # VictoriaMetrics port
    started_at: float  # before any daemon
    killed_at: float  # when the workloads were killed (the panels are read just before)
    frozen_at: float  # after every workload was killed and both stores caught up
    tmp: Path


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=15) as resp:
        return json.load(resp)


def query(port: int, expr: str, at: float | None = None) -> list[dict]:
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(params)
    doc = _get_json(url)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def _by(result: list[dict], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} missing: `make system-deps` installs Debian's {name}")
    return path


def _daemon_config(tmp: Path, i: int, variant: str) -> str:
    targets: dict[str, str | dict[str, object]] = {
        "trainer": {
            "cmdline": f"{MARK}-ckpt-{i}",
            "labels": {"variant": variant, "job_name": "fleet-test"},
        }
    }
    # The last node also watches a "sidecar" that py-spy cannot read (not Python), so the
    # fleet has sampler errors for the dashboards' error panels to show.
    if i == 2:
        targets["sidecar"] = f"{MARK}-notpy"
    return daemon_config(
        tmp / f"runs-{i}",
        targets,
        rapl=False,
        sample_rate_hz=20,
        window_s=WINDOW_S,
        cpu_budget_cores=2,  # far above its use: the rate stays; the gauge is exported
    )


def _prometheus_config(tmp: Path, vm_port: int) -> Path:
    # The daemons' ports are known only once they listen (port 0): Prometheus, started
    # first, reads them from a file_sd file written then (it watches the file).
    cfg: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "serwatt", "file_sd_configs": [{"files": [str(_targets_file(tmp))]}]}
        ],
        "rule_files": [str(RULES)],
        "remote_write": [
            {
                "url": f"http://127.0.0.1:{vm_port}/api/v1/write",
                "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms"},
            }
        ],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _targets_file(tmp: Path) -> Path:
    return tmp / "serwatt-targets.json"


def _write_targets(tmp: Path, ports: list[int]) -> None:
    new = tmp / "serwatt-targets.json.new"
    new.write_text(json.dumps([{"targets": [f"127.0.0.1:{p}" for p in ports]}]))
    new.replace(_targets_file(tmp))  # whole, at once: Prometheus never reads half a file


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    out = open(log, "wb")  # noqa: SIM115 (lives as long as the process)
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def _ready(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Any:
    tmp = tmp_path_factory.mktemp("fleet")
    procs: list[subprocess.Popen] = []
    daemons: list[DaemonProc] = []
    try:
        vm = _start(
            [
                _binary("victoria-metrics"),
                "-httpListenAddr=127.0.0.1:0",
                f"-storageDataPath={tmp / 'vm'}",
                "-retentionPeriod=1d",
                "-search.latencyOffset=0s",  # show the newest points (default: hide 30 s)
                "-search.disableCache",
            ],
            tmp / "vm.log",
        )
        procs.append(vm)
        vm_port = listening_port(vm)
        wait_for(lambda: _ready(vm_port, "/health"), 30, "VictoriaMetrics to listen")
        _write_targets(tmp, [])
        prometheus = _start(
            [
                _binary("prometheus"),
                f"--config.file={_prometheus_config(tmp, vm_port)}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                "--web.listen-address=127.0.0.1:0",
                "--storage.tsdb.retention.time=1h",
            ],
            tmp / "prometheus.log",
        )
        procs.append(prometheus)
        prom_port = prometheus_port(prometheus, tmp / "prometheus.log")
        wait_for(lambda: _ready(prom_port, "/-/ready"), 60, "Prometheus to be ready")
        started_at = time.time()
        impostor = tmp / f"{MARK}-notpy" / "python3"
        impostor.parent.mkdir()
        shutil.copy("/bin/sleep", impostor)
        procs.append(subprocess.Popen([str(impostor), "600"]))
        nodes = []
        for i, (variant, ckpt) in enumerate(NODES):
            cfg = tmp / f"serwatt-{i}.yaml"
            cfg.write_text(_daemon_config(tmp, i, variant))
            work = _start(
                [sys.executable, "-m", "serwatt.profiler.workloads.train", "--ckpt", ckpt]
                + ["--steps", "100000", "--every", "2", "--size", "8"]
                + ["--dir", str(tmp / f"{MARK}-ckpt-{i}")],
                tmp / f"train-{i}.log",
            )
            procs.append(work)
            # every node's GPU replayed (this machine has none), listing its workload
            replayed = [sys.executable, "-m", "tests.replayed_daemon", "--config", str(cfg)]
            replayed += ["--timeline", "h200_checkpoint_stall", "--gpu-pid", str(work.pid)]
            d = DaemonProc(cfg, None, tmp / f"daemon-{i}.log", argv=replayed)
            daemons.append(d)
            nodes.append(Node(variant, d, work, tmp / f"runs-{i}" / "runs.sqlite"))
        _write_targets(tmp, [n.daemon.port for n in nodes])

        def every_node_scraped() -> bool:
            got = _by(query(prom_port, "serwatt_samples_total{codepath='other'} > 0"), "instance")
            return set(got) == {n.instance for n in nodes}

        wait_for(every_node_scraped, 90, "Prometheus to hold samples of every node", 0.5)

        def every_node_checkpointed() -> bool:
            logs = [(tmp / f"train-{i}.log").read_text(errors="replace") for i in range(3)]
            return all("checkpoint step=" in text for text in logs)

        wait_for(every_node_checkpointed, 120, "every workload's first checkpoint", 0.5)
        time.sleep(TRAIN_S)
        # On a loaded VM (load 10-17) a variant's rate5m series can still be empty after
        # TRAIN_S: watch on, up to PANELS_WAIT_S, until every panel query has data in both
        # stores. A panel that never gets any still fails test_every_dashboard_panel_has_data.
        panels = [
            e
            for d in dashboards.DASHBOARDS
            for _t, e in dashboards.panel_queries(d, rate_interval="10s")
        ]
        until = time.monotonic() + PANELS_WAIT_S
        while time.monotonic() < until and not all(
            query(port, expr) for port in (prom_port, vm_port) for expr in panels
        ):
            time.sleep(2.0)
        time.sleep(2.0)  # the panels are read 1 s before the kill
        killed_at = time.time()
        for n in nodes:
            n.workload.send_signal(signal.SIGKILL)
            n.workload.wait(timeout=10)

        def all_down(port: int) -> bool:
            up = _by(query(port, "serwatt_target_up{target='trainer'}"), "instance")
            return len(up) == len(nodes) and not any(up.values())

        wait_for(lambda: all_down(prom_port), 30, "every target down in Prometheus", 0.5)
        time.sleep(3)  # scrapes after the last window was applied
        wait_for(lambda: all_down(vm_port), 30, "every target down in VictoriaMetrics", 0.5)
        time.sleep(2)  # remote_write's batch deadline is 1 s
        yield Fleet(nodes, prom_port, vm_port, started_at, killed_at, time.time(), tmp)
    finally:
        for d in daemons:  # all at once: each takes a few seconds to finish its window
            if d.proc.poll() is None:
                d.signal(signal.SIGTERM)
        for d in daemons:
            d.stop()
        for p in procs:  # the stores' data is thrown away with tmp: no clean shutdown
            stop_process(p)


def _record_windows(db: Path) -> list[float]:
    """CPU-seconds of each of the trainer's windows in the record, in commit order."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT w.window_id, SUM(c.cpu_s) FROM windows w"
            " JOIN runs r ON r.run_id = w.run_id"
            " JOIN window_codepaths c ON c.window_id = w.window_id"
            " WHERE r.target = 'trainer' GROUP BY w.window_id ORDER BY w.window_id"
        ).fetchall()
    finally:
        con.close()
    return [float(cpu or 0.0) for _wid, cpu in rows]


def _record_codepath(db: Path, codepath: str) -> float:
    con = sqlite3.connect(db)
    try:
        (total,) = con.execute(
            "SELECT COALESCE(SUM(c.cpu_s), 0) FROM window_codepaths c"
            " JOIN windows w ON w.window_id = c.window_id JOIN runs r ON r.run_id = w.run_id"
            " WHERE r.target = 'trainer' AND c.codepath = ?",
            (codepath,),
        ).fetchone()
    finally:
        con.close()
    return float(total)


def _variant_totals(fleet: Fleet) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in fleet.nodes:
        out[n.variant] = out.get(n.variant, 0.0) + sum(_record_windows(n.db))
    return out


@pytest.mark.parametrize("store", ["prometheus", "victoriametrics"])
def test_per_variant_totals_equal_the_records(fleet, store):
    port = fleet.prom if store == "prometheus" else fleet.vm
    records = _variant_totals(fleet)
    assert set(records) == {"torch", "many"} and all(v > 0 for v in records.values()), records
    stored = _by(
        query(port, 'sum by (variant) (serwatt_cpu_seconds_total{variant!=""})'), "variant"
    )
    assert set(stored) == set(records), stored
    for variant, total in records.items():
        assert math.isclose(stored[variant], total, rel_tol=1e-9), (variant, stored, records)
    # The checkpoint codepath of each variant is where its checkpoints went.
    by_cp = {
        (r["metric"]["variant"], r["metric"]["codepath"]): float(r["value"][1])
        for r in query(port, 'sum by (variant, codepath) (serwatt_cpu_seconds_total{variant!=""})')
    }
    for variant, cp in (("torch", "torch"), ("many", "many")):
        want = sum(_record_codepath(n.db, cp) for n in fleet.nodes if n.variant == variant)
        assert want > 0, (variant, cp)
        assert math.isclose(by_cp[(variant, cp)], want, rel_tol=1e-9), (variant, cp, by_cp)
    # Every node's series carry its instance and its config labels; node series do not.
    series = query(port, "serwatt_target_up{target='trainer'}")
    assert {(s["metric"]["instance"], s["metric"]["variant"]) for s in series} == {
        (n.instance, n.variant) for n in fleet.nodes
    }
    assert all(s["metric"]["job_name"] == "fleet-test" for s in series)
    assert all("variant" not in s["metric"] for s in query(port, "serwatt_build_info"))
    # The landing page's series count is what the store saw in each scrape.
    scraped = _by(query(port, 'scrape_samples_scraped{job="serwatt"}'), "instance")
    for n in fleet.nodes:
        page = n.daemon.get("/")
        m = re.search(r"Series exported: (\d+) = ", page)
        assert m and int(m.group(1)) == scraped[n.instance], (n.instance, scraped, page)


def _recording_rules() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [
        (rule["record"], rule["expr"])
        for group in doc.get("groups", [])
        for rule in group.get("rules", [])
        if "record" in rule
    ]


@pytest.mark.parametrize("store", ["prometheus", "victoriametrics"])
def test_every_recording_rule_has_data(fleet, store):
    port = fleet.prom if store == "prometheus" else fleet.vm
    rules = _recording_rules()
    assert rules, "the rules file records nothing"
    at = fleet.killed_at - 1
    empty = [name for name, _expr in rules if not query(port, name, at)]
    assert not empty, f"recording rules with no data in {store}: {empty}"


@pytest.mark.parametrize("store", ["prometheus", "victoriametrics"])
def test_every_dashboard_panel_has_data(fleet, store):
    port = fleet.prom if store == "prometheus" else fleet.vm
    checked, empty = 0, []
    for path in dashboards.DASHBOARDS:
        for title, expr in dashboards.panel_queries(path, rate_interval="10s"):
            checked += 1
            if not query(port, expr, fleet.killed_at - 1):
                empty.append((path.name, title, expr))
    assert checked, "no panel query was checked"
    assert not empty, f"panels with no data in {store}: {empty}"


# --------------------------------------------------------------------------- the report


def _report(
    capsys: pytest.CaptureFixture[str], fleet: Fleet, port: int, *args: str
) -> tuple[Ran, Path]:
    """`serwatt report --json FILE ARGS` in process (tests/report/test_report_e2e.py runs the
    command as a subprocess); its run and the document's path."""
    out = fleet.tmp / f"report-{port}-{len(list(fleet.tmp.glob('report-*')))}.json"
    return serwatt(capsys, "report", "--json", str(out), *args), out


def _whole_run(fleet: Fleet) -> str:
    return f"{fleet.started_at - 5:.3f}..{fleet.frozen_at:.3f}"


def _prefix_sums(windows: list[float]) -> list[float]:
    # any prefix: on a loaded VM a store's first scrape of a node can come many windows in
    # (a fresh-clone run's held 8 CPU-s); a sum matching to 1e-9 by chance is still unlikely
    return [sum(windows[:k]) for k in range(len(windows) + 1)]


def _explained_by_first_scrape(fleet: Fleet, variant: str, got: float) -> bool:
    """records - report = what each node's first scrape held: a prefix of its windows."""
    nodes = [n for n in fleet.nodes if n.variant == variant]
    windows = [_record_windows(n.db) for n in nodes]
    total = sum(sum(w) for w in windows)
    return any(
        math.isclose(total - sum(held), got, rel_tol=1e-9, abs_tol=1e-9)
        for held in itertools.product(*(_prefix_sums(w) for w in windows))
    )


@pytest.mark.parametrize("store", ["prometheus", "victoriametrics"])
def test_report_from_promql_agrees_with_the_records(fleet, store, capsys):
    port = fleet.prom if store == "prometheus" else fleet.vm
    html = fleet.tmp / f"report-{store}.html"
    proc, out = _report(
        capsys,
        fleet,
        port,
        "--prometheus", f"http://127.0.0.1:{port}",
        "--baseline", '{variant="torch"}',
        "--candidate", '{variant="many"}',
        "--range", _whole_run(fleet),
        "--step", f"{STEP_S}s",
        "--html", str(html),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "PromQL range queries" in proc.stdout  # the first screen says where it read
    caveats = [ln for ln in proc.stdout.splitlines() if ln.lstrip().startswith("! ")]
    assert any("host fingerprints" in ln for ln in caveats), proc.stdout
    doc = json.loads(out.read_text())
    assert doc["schema"] == "serwatt.report/1" and doc["receipt"].startswith("rcpt_")
    assert doc["source"]["kind"] == "promql"
    assert doc["source"]["url"] == f"http://127.0.0.1:{port}"
    assert doc["source"]["sides"]["baseline"]["selector"] == '{variant="torch"}'
    want_runs = {
        side: sorted(n.instance for n in fleet.nodes if n.variant == variant)
        for side, variant in (("baseline", "torch"), ("candidate", "many"))
    }
    for side, instances in want_runs.items():
        assert sorted(r.split("/", 1)[0] for r in doc[side]["runs"]) == instances, doc[side]
        assert doc[side]["energy_source"] == "model"
        assert doc[side]["episodes"] is None and "Prometheus" in doc[side]["episodes_note"]
        assert doc[side]["serwatt_version"] and doc[side]["rate_hz"] == [20.0]
    # The run is the test's unit: each instance's series is one run (no run spans two
    # instances), its ~8 steps of 4 s the windows inside it.
    assert doc["baseline"]["blocks"] == 2 and doc["candidate"]["blocks"] == 1, doc["baseline"]
    for side, variant in (("baseline", "torch"), ("candidate", "many")):
        got = doc["total"]["cpu_s"]["total"][side]
        assert _explained_by_first_scrape(fleet, variant, got), (side, got)
    torch_cpu, many_cpu = doc["codepaths"]["torch"]["cpu_s"], doc["codepaths"]["many"]["cpu_s"]
    assert torch_cpu["total"]["baseline"] > 0 and many_cpu["total"]["candidate"] > 0
    # the direction label read back: each side's split of a codepath sums to its total
    ways = doc["direction"]
    assert ways["sides"] == {"baseline": "measured", "candidate": "measured"}, ways["sides"]
    split = sum(v["baseline"]["cpu_s"] for v in ways["codepaths"]["torch"].values())
    assert split == pytest.approx(torch_cpu["total"]["baseline"], rel=1e-5, abs=1e-5)
    # two baseline nodes and one candidate: one run on a side is not tested, and says so
    assert torch_cpu["n"] == [2, 1] and torch_cpu["n_unit"] == "runs", torch_cpu
    assert torch_cpu["p"] is None and "needs at least 2 runs per side" in torch_cpu["note"]
    assert torch_cpu["n_within"][0] >= 4 and torch_cpu["n_within_unit"] == "windows"
    assert any("host fingerprints" in c for c in doc["caveats"])
    assert doc["checkpoint"]["stall_s"] is None  # no episodes in Prometheus, said so
    assert doc["projection"] is None  # an estimate, made only on --cluster FILE or --project
    page = html.read_text()
    assert "PromQL range queries to" in page and 'data-chart="codepath-bars"' in page


def test_report_before_and_after_one_selector(fleet, capsys):
    """Two time ranges of one selector: the before/after-a-rollout form."""
    mid = (fleet.started_at + fleet.frozen_at) / 2
    proc, out = _report(
        capsys,
        fleet,
        fleet.vm,
        "--prometheus", f"http://127.0.0.1:{fleet.vm}",
        "--selector", '{job_name="fleet-test", variant="torch"}',
        "--baseline-range", f"{fleet.started_at - 5:.3f}..{mid:.3f}",
        "--candidate-range", f"{mid:.3f}..{fleet.frozen_at:.3f}",
        "--step", f"{STEP_S}s",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert len(doc["baseline"]["runs"]) == 2 and len(doc["candidate"]["runs"]) == 2
    assert set(doc["baseline"]["runs"]).isdisjoint(doc["candidate"]["runs"])
    totals = doc["total"]["cpu_s"]["total"]
    assert totals["baseline"] > 0 and totals["candidate"] > 0, totals
    assert doc["source"]["sides"]["baseline"]["end"] == doc["source"]["sides"]["candidate"]["start"]


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--prometheus", "ftp://x", "--range", "1m"], EXIT_USAGE, "not an http(s) URL"),
        (["--prometheus", "http://127.0.0.1:1", "--range", "1m"], EXIT_RUNTIME, "cannot reach"),
        (["--prometheus", "{prom}", "--range", "1m", "--baseline", "variant=torch"],
         EXIT_USAGE, "label matchers in braces"),
        (["--prometheus", "{prom}", "--range", "1m", "--baseline", '{variant="nope"}'],
         EXIT_USAGE, "no serwatt_cpu_seconds_total series match"),
        (["--prometheus", "{prom}", "--range", "1m", "--baseline", '{variant=~"("}'],
         EXIT_USAGE, "refused the query (400)"),
        (["--prometheus", "{prom}/nothing-here", "--range", "1m"], EXIT_USAGE, "404"),
        (["--prometheus", "{prom}", "--range", "30 minutes"], EXIT_USAGE, "not a duration"),
        (["--prometheus", "{prom}", "--range", "1m", "--db", "x.sqlite"], EXIT_USAGE, "--db"),
        (["--prometheus", "{prom}", "--range", "1m", "--step", "1ms"], EXIT_USAGE, "--step"),
    ],
)  # fmt: skip
def test_report_errors_name_the_problem_and_the_fix(fleet, args, code, words, capsys):
    base = f"http://127.0.0.1:{fleet.prom}"
    args = [a.replace("{prom}", base) for a in args]
    if "--baseline" not in args:
        args += ["--baseline", '{variant="torch"}']
    out = fleet.tmp / "refused.json"
    args += ["--candidate", '{variant="many"}', "--json", str(out)]
    ran = serwatt(capsys, "report", *args)
    assert ran.returncode == code, ran.stderr
    assert words in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert not out.exists()
