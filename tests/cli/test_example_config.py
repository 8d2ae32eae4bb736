"""`serwatt daemon --example-config` prints the shipped example, and `check-config -` checks
piped YAML as it checks a file (issue 48: an operator's first command needs no checkout)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.profiler.exitcodes import EXIT_CONFIG, EXIT_USAGE
from serwatt.profiler.yamlcheck import MAX_YAML_BYTES
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[2]


def test_example_config_is_the_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    ran = serwatt(capsys, "daemon", "--example-config")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == (REPO / "configs" / "serwatt.example.yaml").read_text(encoding="utf-8")


def test_example_config_piped_into_check_config_stdin_passes() -> None:
    example = subprocess.run(
        [sys.executable, "-m", "serwatt", "daemon", "--example-config"],
        capture_output=True, check=True, cwd=REPO,
    )  # fmt: skip
    checked = subprocess.run(
        [sys.executable, "-m", "serwatt", "check-config", "-"],
        input=example.stdout, capture_output=True, cwd=REPO,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr.decode()
    assert checked.stdout.decode().startswith("<stdin>: ok: 1 target(s) (trainer)")


def test_check_config_stdin_names_stdin_in_its_problems(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"targets: []\nlisten: nowhere\n"))
    monkeypatch.setattr(sys, "stdin", stdin)
    ran = serwatt(capsys, "check-config", "-")
    assert ran.returncode == EXIT_CONFIG
    assert "<stdin>:2: listen" in ran.stderr, ran.stderr


def test_check_config_stdin_is_bounded_like_a_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    big = b"# " + b"x" * MAX_YAML_BYTES + b"\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(big)))
    ran = serwatt(capsys, "check-config", "-")
    assert ran.returncode == EXIT_CONFIG
    assert f"more than {MAX_YAML_BYTES} bytes" in ran.stderr, ran.stderr


def test_daemon_takes_a_config_or_prints_the_example_not_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    both = serwatt(capsys, "daemon", "--config", "x.yaml", "--example-config")
    assert both.returncode == EXIT_USAGE and "not allowed with" in both.stderr, both.stderr
    neither = serwatt(capsys, "daemon")
    assert neither.returncode == EXIT_USAGE
    assert "one of the arguments --config --example-config is required" in neither.stderr
