"""The Prometheus scrape snippet is valid for promtool and agrees with the daemon config."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from serwatt.profiler.service.config import load_config

REPO = Path(__file__).resolve().parents[2]
SNIPPET = REPO / "configs" / "prometheus" / "serwatt.yml"
EXAMPLE = REPO / "configs" / "serwatt.example.yaml"


def test_promtool_accepts_the_scrape_config() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make system-deps` installs Debian's prometheus"
    out = subprocess.run(
        [promtool, "check", "config", str(SNIPPET)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_promtool_rejects_a_broken_copy(tmp_path: Path) -> None:
    # A copy beside its rules file: the scrape timeout is the only thing wrong with it.
    shutil.copy(SNIPPET.parent / "serwatt.rules.yml", tmp_path)
    intact, broken = tmp_path / "intact.yml", tmp_path / "broken.yml"
    intact.write_text(SNIPPET.read_text())
    assert "scrape_timeout: 5s" in SNIPPET.read_text()
    broken.write_text(SNIPPET.read_text().replace("scrape_timeout: 5s", "scrape_timeout: 50s"))
    ok, bad = (
        subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True)
        for path in (intact, broken)
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # a timeout longer than the interval is refused, naming the rule and the job
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert (
        'scrape timeout greater than scrape interval for scrape config with job name "serwatt"'
        in bad.stdout + bad.stderr
    ), bad.stdout + bad.stderr


def test_scrape_job_matches_the_example_daemon_config() -> None:
    config = load_config(EXAMPLE)
    prom = yaml.safe_load(SNIPPET.read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "serwatt"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [config.listen]
    interval_s = float(job["scrape_interval"].rstrip("s"))
    assert interval_s <= config.window_s
