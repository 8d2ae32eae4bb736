"""`targets[].labels`: checked by check-config (key + line), on every per-target series,
never on node series, and the landing page's series count equals the real /metrics."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serwatt.profiler.exitcodes import EXIT_CONFIG
from serwatt.profiler.service.config import (
    MAX_LABEL_VALUE_LEN,
    MAX_TARGET_LABELS,
    RESERVED_LABELS,
    ConfigError,
    load_config,
)
from serwatt.profiler.service.exporter import METRICS, MetricsServer, make_registry, series_count
from serwatt.profiler.service.ledger import Ledger, TargetProcess

SERWATT = [sys.executable, "-m", "serwatt"]
REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, labels_yaml: str) -> Path:
    path = tmp_path / "serwatt.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            targets:
              - name: trainer
                match: {cmdline: 'train\\.py'}
            """
        )
        + textwrap.indent(labels_yaml, "    ")
    )
    return path


def _problems(path: Path) -> list[tuple[str, int | None, str]]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return [(p.key_path, p.line, p.message) for p in info.value.problems]


def test_good_labels_are_kept_sorted(tmp_path):
    cfg = load_config(_write(tmp_path, "labels: {variant: many, job_name: gpt-7b}\n"))
    assert dict(cfg.targets[0].labels) == {"job_name": "gpt-7b", "variant": "many"}
    assert list(cfg.targets[0].labels) == ["job_name", "variant"]


def test_no_labels_is_an_empty_mapping(tmp_path):
    cfg = load_config(_write(tmp_path, ""))
    assert dict(cfg.targets[0].labels) == {}


@pytest.mark.parametrize(
    ("labels", "key", "line", "words"),
    [
        ("labels:\n  '1bad': x\n", "targets[0].labels.1bad", 5, "not a Prometheus label name"),
        ("labels:\n  'bad-name': x\n", "targets[0].labels.bad-name", 5, "label name"),
        ("labels:\n  __meta: x\n", "targets[0].labels.__meta", 5, "'__'"),
        ("labels:\n  target: x\n", "targets[0].labels.target", 5, "serwatt or Prometheus"),
        ("labels:\n  instance: x\n", "targets[0].labels.instance", 5, "reserved"),
        ("labels:\n  codepath: x\n", "targets[0].labels.codepath", 5, "reserved"),
        ("labels:\n  variant: 2\n", "targets[0].labels.variant", 5, "quote it"),
        ("labels:\n  variant: ''\n", "targets[0].labels.variant", 5, "1-128 printable"),
        ("labels:\n  variant: [a]\n", "targets[0].labels.variant", 5, "must be a string"),
        ("labels: many\n", "targets[0].labels", 4, "must be a mapping"),
        ("labels:\n  ok: x\n  ok: y\n", "targets[0].labels.ok", 6, "duplicate key"),
    ],
)
def test_bad_labels_are_reported_with_key_and_line(tmp_path, labels, key, line, words):
    problems = _problems(_write(tmp_path, labels))
    assert [(k, ln) for k, ln, _m in problems] == [(key, line)], problems
    assert words in problems[0][2]


def test_value_length_and_key_count_are_bounded(tmp_path):
    long = "v" * (MAX_LABEL_VALUE_LEN + 1)
    problems = _problems(_write(tmp_path, f"labels: {{variant: {long}}}\n"))
    assert [(k, ln) for k, ln, _ in problems] == [("targets[0].labels.variant", 4)]
    assert load_config(_write(tmp_path, f"labels: {{variant: {long[:-1]}}}\n"))
    many = ", ".join(f"k{i}: v" for i in range(MAX_TARGET_LABELS + 1))
    problems = _problems(_write(tmp_path, f"labels: {{{many}}}\n"))
    assert [(k, ln) for k, ln, _ in problems] == [("targets[0].labels", 4)]
    assert f"more than {MAX_TARGET_LABELS}" in problems[0][2]
    fits = ", ".join(f"k{i}: v" for i in range(MAX_TARGET_LABELS))
    assert len(load_config(_write(tmp_path, f"labels: {{{fits}}}\n")).targets[0].labels) == 8


def test_every_serwatt_label_is_reserved():
    own = {label for spec in METRICS for label in spec.labels}
    assert own <= RESERVED_LABELS
    assert {"job", "instance"} <= RESERVED_LABELS


def test_check_config_names_the_key_and_line_and_exits_78(tmp_path):
    path = _write(tmp_path, "labels:\n  variant: many\n  gpu: '0'\n")
    out = subprocess.run(
        [*SERWATT, "check-config", str(path)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == EXIT_CONFIG, out
    assert "serwatt.yaml:6: targets[0].labels.gpu: " in out.stderr, out.stderr
    ok = _write(tmp_path, "labels: {variant: many}\n")
    out = subprocess.run(
        [*SERWATT, "check-config", str(ok)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0 and "variant=many" in out.stdout, out


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.set_targets(["trainer", "loader"], {"trainer": {"variant": "many", "job_name": "gpt"}})
    ledger.declare_energy_source("model")
    ledger.declare_gpu(0)
    ledger.add_window(
        "trainer", samples={("pickle", "encode"): 3}, cpu_s={("pickle", "encode"): 0.3}
    )
    ledger.add_sampler_error("loader", "target_gone")
    ledger.set_target_processes("trainer", [TargetProcess(11, "3.11.7"), TargetProcess(12, "3")])
    ledger.set_collector("pyspy", up=True, duration_s=1.0)
    ledger.set_sampling(rate_hz=50, budget_cores=0.2)
    ledger.add_self_cpu("daemon", 0.1)
    ledger.publish()
    return ledger


def test_labels_on_every_per_target_series_only_and_the_count_matches_metrics():
    ledger = _ledger()
    srv = MetricsServer("127.0.0.1:0", make_registry(ledger.snapshot), ledger.snapshot)
    srv.start()
    try:
        with urllib.request.urlopen(f"http://{srv.address}/metrics", timeout=10) as r:
            text = r.read().decode()
        with urllib.request.urlopen(f"http://{srv.address}/", timeout=10) as r:
            page = r.read().decode()
    finally:
        srv.close()
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    per_target = {m.name for m in METRICS if "target" in m.labels}
    seen_per_target = 0
    for s in samples:
        if s.name in per_target:
            seen_per_target += 1
            want = {"variant": "many", "job_name": "gpt"} if s.labels["target"] == "trainer" else {}
            got = {k: v for k, v in s.labels.items() if k in ("variant", "job_name")}
            assert got == want, s
        else:
            assert "variant" not in s.labels and "job_name" not in s.labels, s
    assert seen_per_target > 40
    count = series_count(ledger.snapshot())
    assert count.total == len(samples), (count, len(samples))
    assert count.gpus == 1 and count.energy_sources == 1 and count.processes == 2
    match = re.search(r"Series exported: (\d+) = 2 target\(s\)", page)
    assert match and int(match.group(1)) == len(samples), page
    assert "job_name=gpt, variant=many" in page
