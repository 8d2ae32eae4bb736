"""Hostile configs: regexes that backtrack forever, files too big to read, a FIFO as the config.

User regexes (match.cmdline, match.exe, match.cgroup) run on every process at every rescan,
so they are compiled with RE2, whose matching is linear in the text. Config and cluster
files are read through one bounded reader (profiler.yamlcheck.read_yaml_file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
import re2

from serwatt.profiler import yamlcheck
from serwatt.profiler.exitcodes import EXIT_CONFIG
from serwatt.profiler.report import load_cluster
from serwatt.profiler.service.config import ConfigError, load_config
from tests.daemon_support import (
    PYTHON,
    REPO,
    daemon_config,
    start_daemon,
    start_workload,
    stop_process,
    total,
    wait_for,
)

SERWATT = [PYTHON, "-m", "serwatt"]
RE2_TYPE = type(re2.compile("x"))
MAX_YAML_BYTES = 1024 * 1024  # the documented limit (yamlcheck.MAX_YAML_BYTES)
# (a+)+$ against "aaaa…b": a backtracking engine tries every split of the a-run, 2**n ways.
HOSTILE = "(a+)+$"
A_RUN = "a" * 5000 + "b"


def _check_config(path: Path, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SERWATT, "check-config", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout_s,
    )


# ------------------------------------------------------------------ regexes


def test_every_user_regex_is_compiled_with_re2(tmp_path: Path) -> None:
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        f"targets:\n  - name: t\n    match: {{cmdline: '{HOSTILE}', exe: '{HOSTILE}', "
        f"cgroup: '{HOSTILE}'}}\n"
    )
    match = load_config(cfg).targets[0].match
    for regex in (match.cmdline, match.exe, match.cgroup):
        assert isinstance(regex, RE2_TYPE), type(regex)
        assert regex.pattern == HOSTILE
    # The hostile pattern decides a long non-matching text at once (linear time).
    assert match.cmdline is not None and match.cmdline.search(A_RUN) is None
    assert match.cmdline.search("a" * 5000) is not None


def test_a_backtracking_pattern_does_not_stall_discovery_of_real_processes(
    tmp_path: Path,
) -> None:
    """A real process whose command line is a long a-run, and a config whose first target
    is (a+)+$: a backtracking engine would never finish this rescan (2**5000 steps); RE2
    finishes it, and the second target is found behind the hostile one."""
    marker = f"hostile-marker-{os.getpid()}"
    victim = subprocess.Popen(
        [PYTHON, "-c", "import time; time.sleep(120)", marker, A_RUN], stdout=subprocess.DEVNULL
    )
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        "targets:\n"
        f"  - name: evil\n    match: {{cmdline: '{HOSTILE}'}}\n"
        f"  - name: marked\n    match: {{cmdline: '{marker}'}}\n"
    )
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from serwatt.profiler.service.config import load_config
        from serwatt.profiler.service.discovery import discover
        found = discover(load_config(Path(sys.argv[1])).targets)
        print(" ".join(f"{d.pid}:{d.target}" for d in found))
        """
    )
    try:
        wait_for(lambda: Path(f"/proc/{victim.pid}/cmdline").read_bytes().count(b"a") > 5000, 30,
                 "the victim's command line")  # fmt: skip
        try:
            # The bound is ~1000x what RE2 needs here and infinitely less than backtracking.
            out = subprocess.run(
                [PYTHON, "-c", script, str(cfg)],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=60,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("discovery did not finish: the hostile regex backtracks")
        assert out.returncode == 0, out.stderr
        assert f"{victim.pid}:marked" in out.stdout.split(), out.stdout
    finally:
        stop_process(victim)


@pytest.mark.parametrize(
    ("pattern", "hint"),
    [
        (r"(\w+) \1", "backreference"),
        (r"(?P<x>a)(?P=x)", "backreference"),
        (r"train(?=\.py)", "lookahead"),
        (r"train(?!\.py)", "lookahead"),
        (r"(?<=python )train", "lookbehind"),
        (r"(?<!x)train", "lookbehind"),
        (r"train\.py\Z", r"\z"),
    ],
)
def test_python_only_syntax_is_refused_with_the_key_line_and_fix(
    tmp_path: Path, pattern: str, hint: str
) -> None:
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        f"log_level: info\ntargets:\n  - name: t\n    match:\n      cmdline: '{pattern}'\n"
    )
    out = _check_config(cfg)
    assert out.returncode == EXIT_CONFIG, out.stdout + out.stderr
    line = next(ln for ln in out.stderr.splitlines() if "targets[0].match.cmdline" in ln)
    assert line.strip().startswith(f"{cfg}:5: targets[0].match.cmdline:"), line
    assert "RE2" in line and hint in line, line
    assert "re2.cc" not in out.stderr  # RE2's own logging stays quiet


def test_a_pattern_bad_in_every_engine_is_still_a_bad_regular_expression(tmp_path: Path) -> None:
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text("targets:\n  - name: t\n    match: {exe: '*py'}\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    [problem] = info.value.problems
    assert problem.key_path == "targets[0].match.exe" and problem.line == 3
    assert problem.message.startswith("bad regular expression '*py'")


# ------------------------------------------------------------------ size


def _padded(text: str, size: int) -> str:
    """`text` then a comment line, `size` bytes in all (a valid YAML document)."""
    pad = size - len(text.encode()) - 3
    assert pad > 0
    return text + "#" + "x" * pad + "\n\n"


MINIMAL = "targets:\n  - name: trainer\n    match: {cmdline: 'train\\.py'}\n"


def test_read_yaml_file_bound_is_exact(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(_padded(MINIMAL, 4096))
    assert yamlcheck.read_yaml_file(f, missing_hint="-", max_bytes=4096) == f.read_text()
    f.write_text(_padded(MINIMAL, 4097))
    with pytest.raises(ConfigError) as info:
        yamlcheck.read_yaml_file(f, missing_hint="-", max_bytes=4096)
    message = info.value.problems[0].message
    assert "4097 bytes" in message and "4096" in message


def test_check_config_refuses_a_config_over_the_limit(tmp_path: Path) -> None:
    assert yamlcheck.MAX_YAML_BYTES == MAX_YAML_BYTES
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(_padded(MINIMAL, 2 * MAX_YAML_BYTES))
    out = _check_config(cfg)
    assert out.returncode == EXIT_CONFIG, out.stdout
    assert f"{cfg}:-: <document>: the file is {2 * MAX_YAML_BYTES} bytes" in out.stderr
    assert "at most 1048576 bytes (1 MiB)" in out.stderr


def test_a_fifo_as_the_config_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "serwatt.yaml"
    os.mkfifo(fifo)
    try:
        out = _check_config(fifo, timeout_s=30)
    except subprocess.TimeoutExpired:
        pytest.fail("check-config blocked opening a FIFO")
    assert out.returncode == EXIT_CONFIG
    assert "not a regular file" in out.stderr


def test_the_daemon_refuses_to_start_on_a_config_over_the_limit(tmp_path: Path) -> None:
    cfg = tmp_path / "serwatt.yaml"
    text = daemon_config(tmp_path / "runs", {"t": "nothing"})
    cfg.write_text(_padded(text, MAX_YAML_BYTES + 1))
    try:
        out = subprocess.run(
            [*SERWATT, "daemon", "--config", str(cfg)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the daemon started on a config over the limit")
    assert out.returncode == EXIT_CONFIG
    assert f"the file is {MAX_YAML_BYTES + 1} bytes" in out.stderr


def test_sighup_with_a_config_over_the_limit_keeps_the_running_config(tmp_path: Path) -> None:
    work = start_workload(tmp_path, "bighup_trainer")
    targets = {"trainer": "bighup_trainer"}
    d = start_daemon(tmp_path, targets)
    cfg = tmp_path / "serwatt.yaml"
    try:
        d.wait_metric("serwatt_samples_total", 5, target="trainer")
        # Valid YAML that would add a target, padded past the limit.
        bigger = daemon_config(tmp_path / "runs", targets | {"loader": "nope"})
        cfg.write_text(_padded(bigger, 3 * MAX_YAML_BYTES))
        d.signal(signal.SIGHUP)
        wait_for(lambda: "reload rejected" in d.log(), 30, "the rejected reload in the log")
        assert f"the file is {3 * MAX_YAML_BYTES} bytes" in d.log()
        before = total(d.metrics(), "serwatt_samples_total", target="trainer")
        m = d.wait_metric("serwatt_samples_total", before + 5, target="trainer")
        assert not any(dict(lab).get("target") == "loader" for _n, lab in m)
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)


def test_a_cluster_file_over_the_limit_is_refused(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(_padded("gpus: 1000\n", MAX_YAML_BYTES + 10))
    with pytest.raises(ConfigError) as info:
        load_cluster(cluster)
    assert f"the file is {MAX_YAML_BYTES + 10} bytes" in str(info.value)
    out = subprocess.run(
        [*SERWATT, "report", "--baseline", "a", "--candidate", "b", "--cluster", str(cluster),
         "--db", str(tmp_path / "none.sqlite")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert f"the file is {MAX_YAML_BYTES + 10} bytes" in out.stderr, out.stderr
