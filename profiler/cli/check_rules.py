"""`serwatt check-rules FILE...`: validate codepath rule files as the daemon and `serwatt
classify --rules` load them (with the built-in rules, so a clash of ids is found too)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serwatt.profiler.classify.rules import RuleError, load_rules
from serwatt.profiler.exitcodes import EXIT_CONFIG, EXIT_OK
from serwatt.profiler.terminal_escape import escape_text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE", help="a rule file (YAML)")


def run(args: argparse.Namespace) -> int:
    try:
        rules = load_rules(list(args.files), builtin=True)
    except RuleError as exc:
        print(f"serwatt check-rules: {escape_text(str(exc), backslash=False)}", file=sys.stderr)
        return EXIT_CONFIG
    for path in args.files:
        ids = [r.id for r in rules.rules if r.origin.startswith(f"{path}:")]
        shown = escape_text(f"{path}: {len(ids)} rule(s): {', '.join(ids) or '-'}")
        print(f"ok: {shown}")
    return EXIT_OK
