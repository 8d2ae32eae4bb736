"""Any YAML document gives either a Config or a ConfigError listing placed problems:
never another exception (bad input always gets a clear error)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serwatt.profiler.service.config import Config, ConfigError, parse_config

KEYS = [
    "listen", "sample_rate_hz", "window_s", "rescan_s", "max_concurrent_samplers", "log_level",
    "targets", "collectors", "record", "classify", "paths", "name", "match", "run", "cmdline",
    "exe", "systemd_unit", "cgroup", "environ", "pid_file", "rapl", "nvml", "cpu_model",
    "enabled", "tdp_w", "dir", "retention_days", "rules_files", "sysfs", "procfs",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["auto", "127.0.0.1:9977", "train\\.py", "(", "{pid}", "{x}", "[::1]:1"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=4),
    ),
    max_leaves=12,
)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_any_document_is_a_config_or_placed_problems(doc: dict) -> None:
    text = yaml.safe_dump(doc)
    base = Path(tempfile.gettempdir()) / "serwatt-fuzz.yaml"
    try:
        config = parse_config(text, base)
    except ConfigError as exc:
        assert exc.problems
        for p in exc.problems:
            assert isinstance(p.key_path, str) and p.message
            assert p.line is None or 1 <= p.line <= text.count("\n") + 1
        assert str(exc).count("\n") == len(exc.problems)
    else:
        assert isinstance(config, Config) and config.targets


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_config_or_placed_problems(text: str) -> None:
    try:
        parse_config(text, Path("/tmp/serwatt-fuzz.yaml"))
    except ConfigError as exc:
        assert exc.problems and all(p.message for p in exc.problems)
