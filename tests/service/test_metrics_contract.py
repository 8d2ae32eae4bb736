"""The metric contract: names, units, HELP, types and label sets, on a fully populated
ledger and on a real daemon's /metrics (`promtool check metrics`)."""

from __future__ import annotations

import re
import shutil
import subprocess

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.service.exporter import METRIC_NAMES, METRICS, make_registry
from serwatt.profiler.service.ledger import Ledger, TargetProcess
from tests.conftest import DaemonScrape
from tests.daemon_support import PYTHON, REPO

DAEMON_DOC = REPO / "docs" / "daemon.md"

# The contract as the issue states it, then serwatt's additions: name -> labels. Every
# per-codepath counter carries `direction` (encode / decode / unknown; checkpoint-truth
# issue, section 1).
CONTRACT = {
    "serwatt_samples_total": {"target", "codepath", "direction"},
    "serwatt_cpu_seconds_total": {"target", "codepath", "direction"},
    "serwatt_energy_joules_total": {"target", "codepath", "direction", "source"},
    "serwatt_node_cpu_energy_joules_total": {"source"},
    "serwatt_unattributed_energy_joules_total": {"source"},
    "serwatt_gpu_idle_seconds_total": {"gpu"},
    "serwatt_gpu_wait_seconds_total": {"target", "codepath", "direction", "gpu"},
    "serwatt_gpu_wait_energy_joules_total": {"target", "codepath", "direction", "gpu"},
    "serwatt_target_up": {"target"},
    "serwatt_target_info": {"target", "pid", "python", "cpu_source"},
    "serwatt_sampler_errors_total": {"target", "kind"},
    "serwatt_push_errors_total": {"kind"},
    "serwatt_collector_up": {"collector"},
    "serwatt_collector_duration_seconds": {"collector"},
    "serwatt_build_info": {"version"},
    # serwatt's own additions: what the daemon costs and the rate its budget allows
    "serwatt_self_cpu_seconds_total": {"part"},
    "serwatt_sample_rate_hz": set(),
    "serwatt_cpu_budget_cores": set(),
}

# The HELP text users and dashboards read, written out: a change here is a change of the
# contract, made on purpose in both places.
HELP = {
    "serwatt_samples_total": "Stack samples of the target's threads classified into the "
    "codepath, by direction (encode, decode, unknown).",
    "serwatt_cpu_seconds_total": "Measured per-thread CPU seconds of the target attributed to "
    "the codepath, by direction (each thread's CPU delta spread over its samples).",
    "serwatt_energy_joules_total": "CPU package energy attributed to the target's codepath, by "
    "direction, in joules; source is rapl (measured) or model (estimated).",
    "serwatt_node_cpu_energy_joules_total": "CPU package energy of the whole node over the "
    "daemon's sampling slots, in joules.",
    "serwatt_unattributed_energy_joules_total": "Node CPU energy that no target codepath "
    "received (other processes, idle, unsampled targets), in joules.",
    "serwatt_gpu_idle_seconds_total": "Seconds the GPU ran no kernel, from NVML utilization "
    "samples.",
    "serwatt_gpu_wait_seconds_total": "Seconds a GPU the target uses sat idle while the "
    "target's host threads were in the codepath, by direction.",
    "serwatt_gpu_wait_energy_joules_total": "GPU energy spent idle while the target's host "
    "threads were in the codepath, by direction, in joules.",
    "serwatt_target_up": "1 if at least one process of the configured target is being "
    "profiled, else 0.",
    "serwatt_target_info": "One series per profiled process of the target (value 1): its pid, "
    "Python version and what weighed its last window's CPU (cpu_source: kernel, the "
    "scheduler timeline; estimate, the fallback; unknown before its first window).",
    "serwatt_sampler_errors_total": "Sampling windows of the target that failed, by kind "
    "(target_gone, not_python, ptrace_denied, unsupported_python, ...).",
    "serwatt_push_errors_total": "Profile pushes to Pyroscope that failed or were dropped, by "
    "kind (timeout, connect, http_status, redirect, queue_full, ...).",
    "serwatt_collector_up": "1 if the collector's last use succeeded, 0 if it failed or is "
    "unavailable.",
    "serwatt_collector_duration_seconds": "Seconds the collector's last use took.",
    "serwatt_build_info": "serwatt build information (value 1).",
    "serwatt_self_cpu_seconds_total": "CPU seconds serwatt itself used: part=daemon (the "
    "daemon process, all its threads) or samplers (its py-spy processes, counted as each "
    "window's py-spy exits).",
    "serwatt_sample_rate_hz": "Samples per second the daemon's windows run at now: "
    "sample_rate_hz from the config, or less while cpu_budget_cores holds it down.",
    "serwatt_cpu_budget_cores": "The CPU the daemon and its samplers may use on average, in "
    "cores (cpu_budget_cores; no series when no budget is configured).",
}


def _documented() -> dict[str, tuple[str, set[str]]]:
    """docs/daemon.md's metric table: name -> (type as exposed, labels). An info metric
    ("gauge (info)") is a gauge in the text format."""
    rows = re.findall(
        r"^\| `(serwatt_[a-z_]+)` \| (counter|gauge|gauge \(info\)) \| ?([a-z_, ]*?) ?\| .+\|$",
        DAEMON_DOC.read_text(),
        re.M,
    )
    assert rows, f"{DAEMON_DOC} has no metric table"
    return {
        name: (kind.split()[0], {label for label in labels.replace(",", " ").split()})
        for name, kind, labels in rows
    }


def _exposed(text: str, what: str) -> dict[str, str]:
    """The exposition's `# HELP` or `# TYPE` lines: name -> text."""
    lines = re.findall(rf"^# {what} (\S+) (.*)$", text, re.M)
    assert len(lines) == len(dict(lines)), lines  # one per family
    return dict(lines)


def _full_ledger() -> Ledger:
    ledger = Ledger()
    ledger.set_targets(["trainer", "loader"])
    ledger.declare_energy_source("rapl")
    ledger.declare_gpu(0)
    ledger.declare_gpu(1)
    ledger.add_window(
        "trainer",
        samples={("pickle", "encode"): 3, ("other", "unknown"): 1},
        cpu_s={("pickle", "encode"): 0.3, ("other", "unknown"): 0.1},
        energy_j={("pickle", "encode"): 9.0},
        energy_source="rapl",
        gpu_wait_s={("pickle", "encode", 0): 0.2},
        gpu_wait_energy_j={("pickle", "encode", 0): 14.0},
    )
    ledger.add_node_energy("rapl", node_j=100.0, unattributed_j=91.0)
    ledger.add_gpu_idle(0, 1.5)
    ledger.add_sampler_error("loader", "ptrace_denied")
    ledger.add_push_error("timeout")
    ledger.set_target_processes(
        "trainer", [TargetProcess(10, "3.11.7"), TargetProcess(11, "3.10.13")]
    )
    ledger.set_collector("rapl", up=True, duration_s=0.001)
    ledger.add_self_cpu("daemon", 1.5)
    ledger.add_self_cpu("samplers", 4.0)
    ledger.set_sampling(rate_hz=27.0, budget_cores=0.1)
    ledger.publish()
    return ledger


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_spec_is_the_issue_contract():
    assert {m.name: set(m.labels) for m in METRICS} == CONTRACT
    documented = _documented()
    assert {name: labels for name, (_kind, labels) in documented.items()} == CONTRACT
    exposed_types = {m.name: "gauge" if m.type == "info" else m.type for m in METRICS}
    assert exposed_types == {name: kind for name, (kind, _labels) in documented.items()}


def test_names_units_and_types_follow_prometheus_conventions():
    for m in METRICS:
        assert re.fullmatch(r"serwatt_[a-z_]+", m.name)
        assert m.name.endswith("_total") == (m.type == "counter"), m.name
        # Base units only: seconds, joules; never ms/us/watts gauges.
        assert not re.search(r"_(milli|micro|ms|us|watts?|kj|wh)(_|$)", m.name), m.name
        if "energy" in m.name:
            assert "_joules" in m.name
        if m.name.endswith(("seconds_total", "seconds")):
            assert "_seconds" in m.name
        # pid is a label only on the info metric (cardinality).
        assert ("pid" in m.labels) == (m.name == "serwatt_target_info")
        assert m.help.endswith(".") and len(m.help) > 20


def test_exposition_has_help_type_and_exact_label_sets():
    text = generate_latest(make_registry(_full_ledger().snapshot)).decode()
    assert _exposed(text, "HELP") == HELP
    assert _exposed(text, "TYPE") == {name: kind for name, (kind, _) in _documented().items()}
    seen: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert s.name in METRIC_NAMES, s.name
            assert set(s.labels) == CONTRACT[s.name], (s.name, s.labels)
            assert s.value >= 0
            key = (s.labels.get("codepath", ""), s.labels.get("direction", ""))
            seen.setdefault(s.name, set()).add(key)
    assert set(seen) == METRIC_NAMES  # every metric has samples on a populated ledger
    for name in (
        "serwatt_samples_total",
        "serwatt_cpu_seconds_total",
        "serwatt_energy_joules_total",
        "serwatt_gpu_wait_seconds_total",
        "serwatt_gpu_wait_energy_joules_total",
    ):
        # zeros included: the 9 serializers both ways and unknown, `other` unknown only
        assert seen[name] == {
            (cp, d)
            for cp in CODEPATHS
            for d in (("encode", "decode", "unknown") if cp != "other" else ("unknown",))
        }, name


def test_promtool_accepts_the_populated_exposition(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make system-deps` installs Debian's prometheus"
    text = generate_latest(make_registry(_full_ledger().snapshot))
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=60
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_promtool_on_a_real_daemon(daemon_scrape: DaemonScrape) -> None:
    text = daemon_scrape.text
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=60
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr
    # HELP and TYPE even for families with no series on this node (no GPU here)
    assert _exposed(text, "HELP") == HELP
    assert "serwatt_gpu_wait_seconds_total{" not in text
    # The daemon's own process is never a labelled target.
    assert f'pid="{daemon_scrape.pid}"' not in text
    assert daemon_scrape.exit_code == 0, daemon_scrape.log


def test_python_m_profiler_is_the_entry_point():
    # The daemon tests run `python -m profiler daemon`; the console script is the same main.
    proc = subprocess.run(
        [PYTHON, "-m", "serwatt", "daemon", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--config" in proc.stdout
