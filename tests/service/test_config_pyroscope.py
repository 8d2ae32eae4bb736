"""The `pyroscope:` config section: each problem named with its key and the fix, the
credentials read from a file and never shown, check-config naming the push, and the
example config's commented section valid once uncommented."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from serwatt.profiler.exitcodes import EXIT_CONFIG
from serwatt.profiler.service.config import ConfigError, load_config, parse_config
from serwatt.profiler.service.config_pyroscope import PyroscopeConfig
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "serwatt.example.yaml"

TARGETS = """
targets:
  - name: trainer
    match: {cmdline: 'train\\.py'}
    labels: {variant: a-1}
"""


def config(tmp_path: Path, section: str, targets: str = TARGETS) -> Path:
    path = tmp_path / "serwatt.yaml"
    path.write_text(textwrap.dedent(targets).lstrip() + textwrap.dedent(section))
    return path


def problems(path: Path) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return [(p.key_path, p.message) for p in info.value.problems]


def test_absent_or_empty_means_no_push(tmp_path: Path) -> None:
    assert load_config(config(tmp_path, "")).pyroscope is None
    assert load_config(config(tmp_path, "pyroscope:\n")).pyroscope is None


def test_a_full_section_loads_with_its_defaults(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abc.def\n")
    cfg = load_config(
        config(
            tmp_path,
            f"pyroscope:\n  url: https://p:4040/x/\n  auth: {{bearer_token_file: {token}}}\n",
        )
    ).pyroscope
    assert cfg == PyroscopeConfig(url="https://p:4040/x/", bearer_token_file=token)
    assert cfg.ingest_url() == "https://p:4040/x/ingest"
    assert (cfg.period_s, cfg.timeout_s, cfg.app_name) == (60.0, 10.0, "serwatt-{target}")


@pytest.mark.parametrize(
    ("section", "key", "says"),
    [
        ("pyroscope: {period_s: 5}", "pyroscope.url", "missing: where to push"),
        ("pyroscope: {url: ftp://p:21}", "pyroscope.url", "must be http://HOST"),
        ("pyroscope: {url: 'http://u:pw@p:4040'}", "pyroscope.url", "basic_auth_file instead"),
        ("pyroscope: {url: 'http://p:4040?a=1'}", "pyroscope.url", "must not have a query"),
        ("pyroscope: {url: 'http://p:99999'}", "pyroscope.url", "not a URL"),
        ("pyroscope: {url: 'http://p', period_s: 0}", "pyroscope.period_s", "at least 1"),
        ("pyroscope: {url: 'http://p', period_s: 5, timeout_s: 5}", "pyroscope.timeout_s",
         "lower timeout_s or raise period_s"),
        ("pyroscope: {url: 'http://p', app_name: 'a.{target}'}", "pyroscope.app_name",
         "profile-type suffix"),
        ("pyroscope: {url: 'http://p', app_name: 'a-{pid}'}", "pyroscope.app_name",
         "placeholders are {target}, {host}"),
        ("pyroscope: {url: 'http://p', tenant_id: 'a b'}", "pyroscope.tenant_id", "tenant IDs"),
        ("pyroscope: {url: 'http://p', auth: {bearer_token_file: /nonexistent/t}}",
         "pyroscope.auth.bearer_token_file", "Pyroscope credentials"),
        ("pyroscope: {url: 'http://p', auth: {token: x}}", "pyroscope.auth.token", "unknown key"),
        ("pyroscope: {url: 'http://p', every: 5}", "pyroscope.every", "allowed here: url"),
    ],
)  # fmt: skip
def test_each_problem_names_its_key_and_the_fix(tmp_path, section, key, says) -> None:
    got = problems(config(tmp_path, section + "\n"))
    assert any(k == key and says in m for k, m in got), got


def test_credential_files_are_checked_and_never_echoed(tmp_path: Path) -> None:
    basic = tmp_path / "basic"
    basic.write_text("no-colon-secret\n")
    token = tmp_path / "token"
    token.write_text("two words-secret\n")
    for name, file in (("basic_auth_file", basic), ("bearer_token_file", token)):
        got = problems(
            config(tmp_path, f"pyroscope:\n  url: http://p\n  auth: {{{name}: {file}}}\n")
        )
        assert [k for k, _ in got] == [f"pyroscope.auth.{name}"], got
        assert "must hold one line" in got[0][1] and "secret" not in got[0][1], got
    both = (
        "pyroscope:\n  url: http://p\n"
        f"  auth: {{basic_auth_file: {basic}, bearer_token_file: {token}}}\n"
    )
    assert any("not both" in m for _, m in problems(config(tmp_path, both)))


def test_a_label_value_pyroscope_cannot_hold_is_refused_only_with_a_push(tmp_path: Path) -> None:
    targets = TARGETS.replace("variant: a-1", "variant: 'a,b'")
    assert load_config(config(tmp_path, "", targets)).pyroscope is None
    got = problems(config(tmp_path, "pyroscope: {url: 'http://p'}\n", targets))
    assert [k for k, _ in got] == ["targets[0].labels.variant"], got
    assert "Pyroscope series name" in got[0][1]


def test_check_config_names_the_push_and_refuses_a_bad_section(tmp_path: Path, capsys) -> None:
    ok = serwatt(
        capsys,
        "check-config",
        str(config(tmp_path, "pyroscope: {url: 'http://p:4040', period_s: 15}\n")),
    )
    assert ok.returncode == 0, ok.stderr
    assert "profiles pushed to http://p:4040/ingest every 15 s" in ok.stdout
    bad = serwatt(capsys, "check-config", str(config(tmp_path, "pyroscope: {url: 'gopher://p'}\n")))
    assert bad.returncode == EXIT_CONFIG
    assert re.search(r":\d+: pyroscope\.url: must be http://HOST", bad.stderr), bad.stderr


def test_the_examples_commented_section_is_valid_once_uncommented(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    assert load_config(EXAMPLE).pyroscope is None  # shipped disabled
    block = text[text.index("# pyroscope:") :]
    lines = [ln[2:] for ln in block.splitlines() if ln.startswith("# ")]
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    section = "\n".join(lines).replace("/etc/serwatt/pyroscope-token", str(token))
    cfg = parse_config(TARGETS + section + "\n", tmp_path / "x.yaml").pyroscope
    assert cfg == PyroscopeConfig(url="http://pyroscope.monitoring:4040", bearer_token_file=token)
