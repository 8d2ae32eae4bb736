"""`serwatt check-config FILE|-`: validate a daemon config as the daemon will load it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serwatt.profiler.classify.rules import RuleError, load_rules
from serwatt.profiler.exitcodes import EXIT_CONFIG
from serwatt.profiler.service.config import (
    Config,
    ConfigError,
    ConfigProblem,
    load_config,
    parse_config,
)
from serwatt.profiler.terminal_escape import escape_text
from serwatt.profiler.yamlcheck import read_yaml_stream

STDIN = Path("<stdin>")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", type=Path, help="the daemon config (YAML) to validate; - reads standard input"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing when the config is valid"
    )


def check_rules(config: Config) -> None:
    """Load the config's extra codepath rules as the daemon will; raises ConfigError."""
    if not config.rules_files:
        return
    try:
        load_rules(list(config.rules_files), builtin=True)
    except RuleError as exc:
        raise ConfigError(
            config.source_path,
            [ConfigProblem("classify.rules_files", None, f"bad rules file {exc}")],
        ) from None


def run(args: argparse.Namespace) -> int:
    try:
        if str(args.file) == "-":
            config = parse_config(read_yaml_stream(sys.stdin.buffer, STDIN), STDIN)
        else:
            config = load_config(args.file)
        check_rules(config)
    except ConfigError as exc:
        print(f"serwatt check-config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if not args.quiet:
        names = ", ".join(
            t.name
            + (f" {{{', '.join(f'{k}={v}' for k, v in t.labels.items())}}}" if t.labels else "")
            + (f" checkpoints {escape_text(str(t.checkpoints))}" if t.checkpoints else "")
            for t in config.targets
        )
        print(
            f"{config.source_path}: ok: {len(config.targets)} target(s) ({names}), "
            f"listen {config.listen}, {config.sample_rate_hz:g} Hz, {config.window_s:g} s windows, "
            + "".join(f"{name} {mode}, " for name, mode in config.collector_modes.items())
            + f"records in {config.record_dir}"
            + (
                f", profiles pushed to {escape_text(config.pyroscope.ingest_url())} every "
                f"{config.pyroscope.period_s:g} s"
                if config.pyroscope is not None
                else ""
            )
        )
    return 0
