"""One vocabulary for turning a collector (or the sampler priority) on, off or required:
the CLI takes what the config file says and the config takes what the CLI says. The
CLI refused `--nvml false`; the config refused `enabled: required` and `enabled: "off"`."""

from __future__ import annotations

from pathlib import Path

import pytest

from serwatt.profiler.cli.main import build_parser
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "serwatt.example.yaml"
WORDS = {"auto": "auto", "required": "required", "off": "off", "true": "required",
         "false": "off", '"off"': "off"}  # fmt: skip


@pytest.mark.parametrize(("word", "meaning"), WORDS.items())
def test_the_config_takes_the_clis_words(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, word: str, meaning: str
) -> None:
    text = EXAMPLE.read_text()
    assert "  nvml: {enabled: auto}" in text
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(text.replace("  nvml: {enabled: auto}", f"  nvml: {{enabled: {word}}}"))
    ran = serwatt(capsys, "check-config", str(cfg))
    assert ran.returncode == 0, ran.stderr
    assert f"nvml {meaning}," in ran.stdout, ran.stdout


@pytest.mark.parametrize(("word", "meaning"), [(w, m) for w, m in WORDS.items() if '"' not in w])
@pytest.mark.parametrize("option", ["--rapl", "--nvml", "--sampler-priority"])
def test_the_cli_takes_the_configs_words(option: str, word: str, meaning: str) -> None:
    args = build_parser(configure_all=True).parse_args(["profile", option, word, "--", "x"])
    assert getattr(args, option[2:].replace("-", "_")) == meaning


def test_a_wrong_word_names_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    ran = serwatt(capsys, "profile", "--nvml", "maybe", "--", "x")
    assert ran.returncode == 2
    assert "invalid choice: 'maybe' (choose from 'auto', 'required', 'off')" in ran.stderr
