"""`serwatt runs list|show`: print what the run records hold.

The records are read from `--db FILE`, or `DIR/runs.sqlite` for `--dir DIR`, or the
`record.dir` of `--config FILE`; by default the systemd unit's record dir.
Reading never writes: it is safe while the daemon is appending.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.cli.main import UsageError
from serwatt.profiler.exitcodes import EXIT_RUNTIME
from serwatt.profiler.records.host import describe
from serwatt.profiler.records.sources import sources_text
from serwatt.profiler.records.store import (
    RECORD_FILENAME,
    Recorder,
    RecordError,
    RunDetail,
    RunSummary,
)
from serwatt.profiler.service.config import ConfigError, load_config
from serwatt.profiler.terminal_escape import escape_text

DEFAULT_RECORD_DIR = Path("/var/lib/serwatt/runs")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="runs_command", metavar="ACTION")

    def add_source(p: argparse.ArgumentParser) -> None:
        g = p.add_mutually_exclusive_group()
        g.add_argument("--db", type=Path, help="a record file (runs.sqlite)")
        g.add_argument(
            "--dir",
            type=Path,
            help=f"a record dir holding {RECORD_FILENAME} (default {DEFAULT_RECORD_DIR})",
        )
        g.add_argument("--config", type=Path, help="use the record.dir of this daemon config")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    add_source(sub.add_parser("list", help="one line per recorded run"))
    show = sub.add_parser("show", help="one run: host, sources, per-codepath totals")
    show.add_argument("run_id", help="a run id from `serwatt runs list`")
    show.add_argument(
        "--windows", action="store_true", help="also list every window (in --json: window_list)"
    )
    add_source(show)


def _record_path(args: argparse.Namespace) -> Path:
    if args.db is not None:
        return args.db
    if args.config is not None:
        try:
            return load_config(args.config).record_dir / RECORD_FILENAME
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    return (args.dir if args.dir is not None else DEFAULT_RECORD_DIR) / RECORD_FILENAME


def _shown(text: object) -> str:
    """A record's text for the terminal (run ids, targets, host fields, sources): a
    record file is outside input, so non-printable characters are escaped."""
    return escape_text(str(text), backslash=False)


def _utc(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _summary_json(s: RunSummary) -> dict:
    return {
        "run_id": s.run_id,
        "target": s.target,
        "started_at": s.started_at,
        "ended_at": s.ended_at,
        "last_seen_at": s.last_seen_at,
        "windows": s.windows,
        "pids": list(s.pids),
        "samples": s.samples,
        "cpu_s": s.cpu_s,
        "energy_j": s.energy_j,
        "energy_sources": list(s.energy_sources),
        "pythons": list(s.pythons),
        "pyspy_samples": s.pyspy_samples,
        "pyspy_errors": s.pyspy_errors,
        "serwatt_version": s.serwatt_version,
    }


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Columns aligned; the first `left` columns (names) left-aligned, numbers right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in lines
    )


def _energy_text(joules: float | None, sources: tuple[str, ...] | list[str]) -> str:
    if joules is None:
        return "unavailable" if not sources else f"- ({'/'.join(sources)})"
    return f"{joules:.1f} ({'/'.join(sources)})"


def _list(rec: Recorder, as_json: bool) -> int:
    runs = rec.runs()
    if as_json:
        print(
            json.dumps(
                {
                    "schema": "serwatt.runs/1",
                    "record": str(rec.path),
                    "runs": [_summary_json(s) for s in runs],
                },
                indent=2,
            )
        )
        return 0
    if not runs:
        print(f"{_shown(rec.path)}: no runs recorded")
        return 0
    rows = [
        [
            _shown(s.run_id),
            _shown(s.target),
            _utc(s.started_at),
            "running" if s.ended_at is None else _utc(s.ended_at),
            str(s.windows),
            ",".join(map(str, s.pids[:4])) + ("…" if len(s.pids) > 4 else ""),
            str(s.samples),
            f"{s.cpu_s:.2f}",
            _shown(_energy_text(s.energy_j, s.energy_sources)),
        ]
        for s in runs
    ]
    header = [
        "RUN",
        "TARGET",
        "STARTED (UTC)",
        "ENDED (UTC)",
        "WINDOWS",
        "PIDS",
        "SAMPLES",
        "CPU_S",
        "ENERGY_J (SOURCE)",
    ]
    print(_table(header, rows, left=2))
    return 0


def _show(detail: RunDetail, windows: bool) -> str:
    s = detail.summary
    out = [
        f"run {s.run_id}  target {s.target}  recorded by serwatt {s.serwatt_version}",
        f"  started {_utc(s.started_at)} UTC, "
        + ("still running" if s.ended_at is None else f"ended {_utc(s.ended_at)} UTC")
        + f", {s.windows} window(s), pids {', '.join(map(str, s.pids)) or '-'}",
        f"  host: {describe(detail.host)}",
        f"  sources: {sources_text(detail.sources)}",
    ]
    if s.pythons:
        out.append(f"  target Python: {', '.join(s.pythons)}")
    out.append(f"  py-spy: {s.pyspy_samples} samples taken, {s.pyspy_errors} errors")
    # these lines hold the record's text; the tables below numbers, codepaths and sources
    out = [_shown(line) for line in out]
    total_cpu = sum(t.cpu_s for t in detail.codepaths.values())
    rows = []
    for cp in CODEPATHS:
        t = detail.codepaths[cp]
        share = t.cpu_s / total_cpu if total_cpu > 0 else 0.0
        rows.append(
            [
                cp,
                str(t.samples),
                f"{t.cpu_s:.3f}",
                f"{share:.1%}",
                f"{t.wall_s:.2f}",
                str(t.low_confidence_samples),
                "-" if t.energy_j is None else f"{t.energy_j:.2f}",
                "-" if t.gpu_wait_s is None else f"{t.gpu_wait_s:.2f}",
            ]
        )
    out.append("")
    out.append(
        _table(
            [
                "CODEPATH",
                "SAMPLES",
                "CPU_S",
                "CPU_SHARE",
                "WALL_S",
                "LOW_CONF",
                "ENERGY_J",
                "GPU_WAIT_S",
            ],
            rows,
        )
    )
    out.append("  ('-': not measured in any window of this run)")
    if windows:
        out.append("")
        out.append(
            _table(
                ["WINDOW", "PID", "START (UTC)", "WALL_S", "CPU_S", "SAMPLES", "ERRORS", "ENERGY"],
                [
                    [
                        str(w.window_id),
                        str(w.pid),
                        _utc(w.started_at),
                        f"{w.ended_at - w.started_at:.1f}",
                        f"{w.cpu_s:.3f}",
                        str(sum(c.get("samples", 0) for c in w.codepaths.values())),
                        str(w.errors.get("pyspy_errors", 0)),
                        "-" if w.energy is None else _shown(w.energy.get("source")),
                    ]
                    for w in detail.windows
                ],
            )
        )
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    if not getattr(args, "runs_command", None):
        raise UsageError("say what to do: `serwatt runs list` or `serwatt runs show RUN_ID`")
    path = _record_path(args)
    try:
        rec = Recorder(path, readonly=True)
    except RecordError as exc:
        hint = "" if path.exists() else " (give --db FILE, --dir DIR or --config FILE)"
        print(f"serwatt runs: {_shown(exc)}{hint}", file=sys.stderr)
        return EXIT_RUNTIME
    with rec:
        try:
            return _run(rec, args)
        except RecordError as exc:  # a damaged file: one line naming it and the fix
            print(f"serwatt runs: {_shown(exc)}", file=sys.stderr)
            return EXIT_RUNTIME


def _run(rec: Recorder, args: argparse.Namespace) -> int:
    if args.runs_command == "list":
        return _list(rec, args.json)
    try:
        detail = rec.run(args.run_id, windows=args.windows)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    if args.json:
        print(json.dumps(detail.to_json(include_windows=args.windows), indent=2))
    else:
        print(_show(detail, args.windows))
    return 0
