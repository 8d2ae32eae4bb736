"""`serwatt daemon --config FILE`: load the config, set up logging, run the service."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler.exitcodes import EXIT_CONFIG
from profiler.service.config import ConfigError, load_config
from profiler.service.daemon import Daemon, setup_logging


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        type=Path,
        metavar="FILE",
        help="daemon config (YAML); see configs/serwatt.example.yaml",
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"serwatt daemon: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.log_level)
    return Daemon(config).run()
