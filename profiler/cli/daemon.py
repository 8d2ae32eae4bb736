"""`serwatt daemon --config FILE`: load the config, set up logging, run the service.
`serwatt daemon --example-config`: print the example config shipped in the package."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from serwatt.profiler.exitcodes import EXIT_CONFIG
from serwatt.profiler.profile.pprof import pprof_bytes
from serwatt.profiler.profile.stack_profile import StackProfile
from serwatt.profiler.service.config import ConfigError, load_config
from serwatt.profiler.service.daemon import Daemon, setup_logging
from serwatt.profiler.service.pyroscope_push import ProfileEncoder

# The `pyroscope:` push sends what `serwatt profile --pprof` writes: the CLI hands the
# profile driver's encoder to the daemon, which may not import it.
PPROF_ENCODER = ProfileEncoder(
    new=StackProfile,
    encode=lambda stacks, started_at, duration_s, rate_hz: pprof_bytes(
        stacks, started_at=started_at, duration_s=duration_s, rate_hz=rate_hz
    ),
)


def configure(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="daemon config (YAML); start from the one --example-config prints",
    )
    which.add_argument(
        "--example-config",
        action="store_true",
        help="print the example config (every key, its default and why) and exit",
    )


def example_config() -> str:
    """The example config as shipped: package data of the wheel, configs/ in a checkout."""
    return (
        resources.files("serwatt")
        .joinpath("configs")
        .joinpath("serwatt.example.yaml")
        .read_text(encoding="utf-8")
    )


def run(args: argparse.Namespace) -> int:
    if args.example_config:
        sys.stdout.write(example_config())
        return 0
    return serve(args.config)


def serve(config_path: Path, **daemon_options: Any) -> int:
    """The daemon over the config at `config_path` until SIGTERM; its exit code.
    daemon_options: Daemon's keywords (tests shorten the py-spy kill grace and the
    overrun delays, which the config does not set)."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"serwatt daemon: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.log_level)
    limit_malloc_arenas()
    return Daemon(config, profile_encoder=PPROF_ENCODER, **daemon_options).run()


# glibc's mallopt parameter for the arena count (malloc.h)
_M_ARENA_MAX = -8
MALLOC_ARENAS = 2


def limit_malloc_arenas() -> None:
    """At most MALLOC_ARENAS glibc malloc arenas for the daemon's threads.

    Each window runs on a new thread, and glibc hands threads arenas of their own (up
    to 8 per core); py-spy's JSON and the window's parse land in whichever one, and the
    freed space stays mapped per arena. bench/soak.py measured RSS 74 MB after 5 minutes
    and still rising ~0.26 MB/min at 30 minutes with the default, against 45 MB with two
    arenas (benchmarks.md, section 12). MALLOC_ARENA_MAX in the environment wins;
    elsewhere than glibc this does nothing."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    if mallopt(_M_ARENA_MAX, MALLOC_ARENAS) != 1:
        logging.getLogger("serwatt.daemon").debug("mallopt(M_ARENA_MAX) refused")
