"""Config loading and validation: every problem reported with key path and line, exit 78."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from serwatt.profiler.exitcodes import EXIT_CONFIG
from serwatt.profiler.service.config import (
    DEFAULT_RUN_TEMPLATE,
    RUN_PLACEHOLDERS,
    ConfigError,
    load_config,
    parse_listen,
)
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "serwatt.example.yaml"
SERWATT = [sys.executable, "-m", "serwatt"]


def write(tmp_path: Path, text: str, name: str = "serwatt.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def problems_of(path: Path) -> list[tuple[str, int | None, str]]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return [(p.key_path, p.line, p.message) for p in info.value.problems]


MINIMAL = """
targets:
  - name: trainer
    match: {cmdline: 'train\\.py'}
"""


def test_example_config_is_valid_and_documents_every_default() -> None:
    config = load_config(EXAMPLE)
    defaults = load_config(write_tmp_minimal())
    # Every key of the example carries the default value, so the two configs agree.
    for name in (
        "listen",
        "sample_rate_hz",
        "window_s",
        "rescan_s",
        "max_concurrent_samplers",
        "cpu_budget_cores",
        "timing_rate_hz",
        "collector_modes",
        "cpu_tdp_w",
        "record_dir",
        "retention_days",
        "rules_files",
        "path_sysfs",
        "path_procfs",
        "log_level",
    ):
        assert getattr(config, name) == getattr(defaults, name), name
    assert config.targets[0].run == DEFAULT_RUN_TEMPLATE
    assert config.targets[0].match.cmdline is not None
    assert config.targets[0].match.cmdline.search("python train.py --lr 3")
    assert config.raw["sample_rate_hz"] == 50  # the parsed YAML rides along for records


def write_tmp_minimal() -> Path:
    import tempfile

    d = Path(tempfile.mkdtemp())
    return write(d, MINIMAL)


def test_example_config_mentions_every_key_the_loader_accepts() -> None:
    text = EXAMPLE.read_text()
    for key in (
        "listen:",
        "sample_rate_hz:",
        "window_s:",
        "rescan_s:",
        "max_concurrent_samplers:",
        "cpu_budget_cores:",
        "timing_rate_hz:",
        "log_level:",
        "targets:",
        "cmdline:",
        "exe:",
        "systemd_unit:",
        "cgroup:",
        "environ:",
        "pid_file:",
        "run:",
        "rapl:",
        "nvml:",
        "tdp_w:",
        "dir:",
        "retention_days:",
        "rules_files:",
        "sysfs:",
        "procfs:",
    ):
        assert key in text, key
    for placeholder in RUN_PLACEHOLDERS:
        assert "{" + placeholder + "}" in text


def test_check_config_passes_on_the_example() -> None:
    """`python -m serwatt check-config` as a user runs it (the others call main())."""
    out = subprocess.run(
        [*SERWATT, "check-config", str(EXAMPLE)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert "ok: 1 target(s) (trainer)" in out.stdout


def test_check_config_reports_all_problems_with_lines_and_exits_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        """
        listen: "localhost:99999"
        sample_rate_hz: -3
        window_s: "ten"
        lisen: 1
        targets:
          - name: trainer
            match:
              cmdline: 'train(\\.py'
            run: "{unit}-{start}"
        """,
    )
    out = serwatt(capsys, "check-config", str(path))
    assert out.returncode == EXIT_CONFIG == 78
    err = out.stderr
    assert f"{path}:1: listen: bad listen address 'localhost:99999'" in err
    assert f"{path}:2: sample_rate_hz: must be greater than 0, got -3" in err
    assert f"{path}:3: window_s: must be a number, got str 'ten'" in err
    assert f"{path}:4: lisen: unknown key 'lisen' (did you mean 'listen'?)" in err
    assert f"{path}:8: targets[0].match.cmdline: bad regular expression" in err
    assert f"{path}:9: targets[0].run: unknown placeholder(s) {{start}}" in err
    assert "6 problem(s)" in err


def test_check_config_on_a_missing_file_exits_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = serwatt(capsys, "check-config", str(tmp_path / "nope.yaml"))
    assert out.returncode == 78
    assert "file not found" in out.stderr


def test_minimal_config_gets_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    assert config.listen == "127.0.0.1:9977"
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9977)
    assert config.sample_rate_hz == 50.0 and config.window_s == 10.0
    assert config.collector_modes == {"rapl": "auto", "nvml": "auto"}
    assert config.cpu_tdp_w is None
    assert config.cpu_budget_cores is None  # no budget: every window at sample_rate_hz
    assert config.record_dir == Path("/var/lib/serwatt/runs")
    assert config.path_procfs == Path("/proc") and config.path_sysfs == Path("/sys")
    assert config.source_path == (tmp_path / "serwatt.yaml").absolute()
    (target,) = config.targets
    assert target.name == "trainer" and target.run == DEFAULT_RUN_TEMPLATE
    assert target.match.criteria() == ("cmdline",)


def test_full_config_values(tmp_path: Path) -> None:
    (tmp_path / "extra.yaml").write_text(GOOD_RULES)
    (tmp_path / "host" / "sys" / "class").mkdir(parents=True)
    (tmp_path / "host" / "proc").mkdir(parents=True)
    (tmp_path / "host" / "proc" / "stat").write_text("btime 1\n")
    config = load_config(
        write(
            tmp_path,
            """
            listen: "[::1]:9100"
            sample_rate_hz: 97.5
            window_s: 5
            rescan_s: 1
            max_concurrent_samplers: 3
            cpu_budget_cores: 0.25
            timing_rate_hz: 25
            log_level: debug
            targets:
              - name: trainer
                match:
                  cmdline: 'train\\.py'
                  exe: 'python3\\.\\d+$'
                  systemd_unit: trainer
                  cgroup: '^/system\\.slice/'
                  environ: {RANK: 0, JOB: "abc"}
                  pid_file: run/trainer.pid
                run: "{host}-{unit}-{start_time}"
              - name: eval.job-2
                match: {systemd_unit: eval.scope}
            collectors:
              rapl: {enabled: true}
              nvml: {enabled: false}
              cpu_model: {tdp_w: 280}
            record: {dir: records, retention_days: 0.5}
            classify: {rules_files: [extra.yaml]}
            paths: {sysfs: host/sys, procfs: host/proc}
            """,
        )
    )
    assert (config.listen_host, config.listen_port) == ("::1", 9100)
    assert config.sample_rate_hz == 97.5 and config.window_s == 5.0 and config.rescan_s == 1.0
    assert config.max_concurrent_samplers == 3 and config.log_level == "debug"
    assert config.cpu_budget_cores == 0.25 and config.timing_rate_hz == 25.0
    assert config.collector_modes == {"rapl": "required", "nvml": "off"}
    assert config.cpu_tdp_w == 280.0
    assert config.record_dir == tmp_path / "records"  # relative to the config file
    assert config.retention_days == 0.5
    assert config.rules_files == (tmp_path / "extra.yaml",)
    assert config.path_sysfs == tmp_path / "host/sys"
    assert config.path_procfs == tmp_path / "host/proc"
    trainer, evaljob = config.targets
    m = trainer.match
    assert m.systemd_unit == "trainer.service"  # suffix added
    assert dict(m.environ) == {"RANK": "0", "JOB": "abc"}  # YAML ints become env strings
    assert m.pid_file == tmp_path / "run" / "trainer.pid"
    assert set(m.criteria()) == {"cmdline", "exe", "systemd_unit", "cgroup", "environ", "pid_file"}
    assert evaljob.match.systemd_unit == "eval.scope"


@pytest.mark.parametrize(
    ("snippet", "key_path", "line", "fragment"),
    [
        ("window_s: 0.5", "window_s", 1, "must be at least 1"),
        ("window_s: .nan", "window_s", 1, "finite"),
        ("max_concurrent_samplers: 2.5", "max_concurrent_samplers", 1, "must be an integer"),
        ("max_concurrent_samplers: true", "max_concurrent_samplers", 1, "must be an integer"),
        ("sample_rate_hz: 5000", "sample_rate_hz", 1, "at most 1000"),
        ("cpu_budget_cores: 0", "cpu_budget_cores", 1, "greater than 0"),
        ("timing_rate_hz: -1", "timing_rate_hz", 1, "at least 0"),
        ("timing_rate_hz: 0.5", "timing_rate_hz", 1, "must be an integer"),
        ("cpu_budget_cores: 10%", "cpu_budget_cores", 1, "a number or null"),
        ("listen: 9977", "listen", 1, "must be a string"),
        ("listen: '127.0.0.1'", "listen", 1, "must be HOST:PORT"),
        ("listen: ':9977'", "listen", 1, "host is empty"),
        ("listen: '::1:9977'", "listen", 1, "[ADDR]:PORT"),
        ("listen: '300.1.1.1:80'", "listen", 1, "neither an IPv4 address nor a host name"),
        ("listen: 'host:http'", "listen", 1, "not a number"),
        ("log_level: loud", "log_level", 1, "must be one of debug, info, warning, error"),
        (
            "collectors: {rapl: {enabled: maybe}}",
            "collectors.rapl.enabled",
            1,
            "auto, required, off, true, false",
        ),
        ("collectors: {rapl: {on: auto}}", "collectors.rapl[True]", 1, "keys must be strings"),
        ('collectors: {"a\\nb": 1}', "collectors['a\\nb']", 1, "unknown key"),
        ("record: {'my dir': x}", "record['my dir']", 1, "unknown key"),
        ("collectors: {gpu: {}}", "collectors.gpu", 1, "unknown key 'gpu'"),
        ("collectors: {cpu_model: {tdp_w: -1}}", "collectors.cpu_model.tdp_w", 1, "greater"),
        ("record: {retention_days: 0}", "record.retention_days", 1, "greater than 0"),
        ("record: [1]", "record", 1, "must be a mapping, got a list"),
        ("record: {dir: ''}", "record.dir", 1, "must not be empty"),
        ("classify: {rules_files: x.yaml}", "classify.rules_files", 1, "list of paths"),
        ("paths: {sysfs: 3}", "paths.sysfs", 1, "must be a string"),
        ("paths: {procfs: /sys}", "paths.procfs", 1, "does not look like a procfs"),
        ("paths: {sysfs: /proc}", "paths.sysfs", 1, "/proc/class is missing"),
        ("listen: a\nlisten: b", "listen", 2, "duplicate key"),
    ],
)
def test_single_problem(
    tmp_path: Path, snippet: str, key_path: str, line: int, fragment: str
) -> None:
    path = write(tmp_path, snippet + "\n" + MINIMAL)
    found = problems_of(path)
    assert any(k == key_path and ln == line and fragment in m for k, ln, m in found), found


@pytest.mark.parametrize(
    ("target_yaml", "key_path", "fragment"),
    [
        ("{match: {cmdline: x}}", "targets[0].name", "needs a name"),
        ("{name: 'a b', match: {cmdline: x}}", "targets[0].name", "not a valid target name"),
        ("{name: t}", "targets[0].match", "say which processes"),
        ("{name: t, match: {}}", "targets[0].match", "at least one criterion"),
        ("{name: t, match: {cmdline: '(['}}", "targets[0].match.cmdline", "bad regular expr"),
        ("{name: t, match: {exe: '*py'}}", "targets[0].match.exe", "bad regular expression"),
        ("{name: t, match: {cgroup: [a]}}", "targets[0].match.cgroup", "must be a string"),
        ("{name: t, match: {comm: x}}", "targets[0].match.comm", "unknown key 'comm'"),
        ("{name: t, match: {environ: [A]}}", "targets[0].match.environ", "must be a mapping"),
        ("{name: t, match: {environ: {A: null}}}", "targets[0].match.environ.A", "string"),
        ("{name: t, match: {cmdline: x}, run: '{gpu}'}", "targets[0].run", "unknown placeholder"),
        ("{name: t, match: {cmdline: x}, run: 'fixed'}", "targets[0].run", "no placeholder"),
        ("{name: t, match: {cmdline: x}, run: '{pid'}", "targets[0].run", "bad template"),
        ("{name: t, match: {cmdline: x}, run: '{pid!r}'}", "targets[0].run", "no format spec"),
        ("{name: t, match: {cmdline: x}, extra: 1}", "targets[0].extra", "unknown key"),
    ],
)
def test_target_problems(tmp_path: Path, target_yaml: str, key_path: str, fragment: str) -> None:
    path = write(tmp_path, f"targets:\n  - {target_yaml}\n")
    found = problems_of(path)
    assert any(k == key_path and ln == 2 and fragment in m for k, ln, m in found), found


def test_duplicate_target_names_and_no_targets(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        targets:
          - {name: t, match: {cmdline: a}}
          - {name: t, match: {cmdline: b}}
        """,
    )
    assert problems_of(path) == [
        ("targets[1].name", 3, "target name 't' is already used by targets[0]")
    ]
    assert problems_of(write(tmp_path, "targets: []\n"))[0][:2] == ("targets", 1)
    assert problems_of(write(tmp_path, "listen: '127.0.0.1:1'\n"))[0][0] == "targets"


def test_problems_in_different_places_are_all_reported_in_line_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        window_s: -1
        targets:
          - name: ok
            match: {cmdline: 'x'}
          - name: bad
            match: {cmdline: '('}
        record:
          retention_days: forever
        bogus: 1
        """,
    )
    found = problems_of(path)
    assert [(k, ln) for k, ln, _ in found] == [
        ("window_s", 1),
        ("targets[1].match.cmdline", 6),
        ("record.retention_days", 8),
        ("bogus", 9),
    ]


def test_not_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    ((key, line, message),) = problems_of(write(tmp_path, "targets:\n  - name: [unclosed\n"))
    assert line is not None and line >= 2 and "not valid YAML" in message
    found = problems_of(write(tmp_path, "- a\n- b\n"))
    assert found[0][2].startswith("must be a mapping")
    found = problems_of(write(tmp_path, ""))
    assert "empty" in found[0][2]
    marker = tmp_path / "executed"
    found = problems_of(
        write(tmp_path, f"window_s: !!python/object/apply:os.system ['touch {marker}']\n")
    )
    assert found[0][1] == 1 and "bad YAML value" in found[0][2]
    assert not marker.exists()  # unsafe tags are refused, never executed


def test_config_error_message_names_file_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "window_s: 0\n" + MINIMAL)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:1: window_s: must be at least 1, got 0" in str(info.value)


def test_parse_listen() -> None:
    assert parse_listen("0.0.0.0:1") == ("0.0.0.0", 1)
    assert parse_listen("node-1.example:65535") == ("node-1.example", 65535)
    assert parse_listen("[fe80::1]:9977") == ("fe80::1", 9977)
    for bad in ("", "x", "a:0", "[::1]9977", "[zz]:1", "a:-1"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_raw_is_the_parsed_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "window_s: 7\n" + MINIMAL)
    config = load_config(path)
    assert dict(config.raw) == yaml.safe_load(path.read_text())


GOOD_RULES = """\
schema: serwatt.codepaths/1
rules:
  - id: my.fastjson
    codepath: json
    layer: python
    file: mylib/fastjson.py
    function: dumps
"""


def test_rules_files_must_exist_and_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good.yaml").write_text(GOOD_RULES)
    cfg = write(tmp_path, MINIMAL + "classify:\n  rules_files: [good.yaml, missing.yaml]\n")
    assert problems_of(cfg) == [
        (
            "classify.rules_files[1]",
            5,
            f"no such rules file: {tmp_path / 'missing.yaml'} (relative paths are relative "
            "to the config file)",
        )
    ]
    cfg = write(tmp_path, MINIMAL + "classify:\n  rules_files: [good.yaml]\n")
    ok = serwatt(capsys, "check-config", str(cfg))
    assert ok.returncode == 0, ok.stderr
    # A rules file that parses as YAML but is not valid rules: check-config loads it as the
    # daemon will and reports the rules error (exit 78) before anything starts.
    (tmp_path / "good.yaml").write_text(GOOD_RULES.replace("codepath: json", "codepath: xml"))
    bad = serwatt(capsys, "check-config", str(cfg))
    assert bad.returncode == 78
    assert "classify.rules_files: bad rules file" in bad.stderr and "good.yaml" in bad.stderr
