"""`serwatt report`: the A/B report of baseline runs against candidate runs.

    serwatt report --baseline RUN [RUN...] --candidate RUN [RUN...] [--db FILE | --dir DIR]
                   [--json FILE] [--html FILE] [--full] [--cluster FILE.yaml | --project]
                   [--checkpoints DIR]
                   [--allow-mismatch]
    serwatt report --verify REPORT.json [--db FILE | --dir DIR]
    serwatt report --prometheus URL --baseline SELECTOR --candidate SELECTOR --range 30m
                   [--step 60s] [--json FILE] [--html FILE] [--cluster FILE.yaml | --project]
    serwatt report --prometheus URL --selector SELECTOR
                   --baseline-range START..END --candidate-range START..END

Runs come from run records (`serwatt profile --record`, or the daemon's record dir);
several runs per side are repeats. With --prometheus they come from PromQL range
queries to Prometheus or VictoriaMetrics (profiler/report/from_prometheus.py): one run
per scraped target, its windows the query's steps. docs/report.md explains every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from serwatt.profiler import safeio
from serwatt.profiler.cli.argtypes import Number, add_report_view_options, check_output_option
from serwatt.profiler.cli.main import UsageError
from serwatt.profiler.cli.runs import DEFAULT_RECORD_DIR
from serwatt.profiler.exitcodes import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from serwatt.profiler.many import chain_head
from serwatt.profiler.many.torch_compat import directory_chain
from serwatt.profiler.records.store import RECORD_FILENAME, Recorder, RecordError
from serwatt.profiler.report import (
    InputError,
    ReportRefused,
    build_report,
    projection_cluster,
    prom_args,
    render_html,
    render_text,
    verify_receipt,
)
from serwatt.profiler.report import from_prometheus as promql
from serwatt.profiler.report.build import SCHEMA1_NOTE
from serwatt.profiler.report.from_records import load_runs
from serwatt.profiler.report.prom_error import PrometheusError
from serwatt.profiler.terminal_escape import escape_text
from serwatt.profiler.yamlcheck import ConfigError

MAX_CHECKPOINT_FILES = 10_000  # a directory is hostile input too: bound what is verified


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baseline", nargs="+", metavar="RUN",
        help="baseline run id(s); with --prometheus one selector, e.g. '{variant=\"torch\"}'",
    )  # fmt: skip
    parser.add_argument(
        "--candidate", nargs="+", metavar="RUN",
        help="candidate run id(s); with --prometheus one selector, e.g. '{variant=\"many\"}'",
    )  # fmt: skip
    prom = parser.add_argument_group("from Prometheus or VictoriaMetrics (PromQL)")
    prom.add_argument(
        "--prometheus", metavar="URL",
        help="the HTTP API root, e.g. http://localhost:9090 or http://localhost:8428",
    )  # fmt: skip
    prom.add_argument(
        "--selector", metavar="SELECTOR",
        help="the selector of a side that has no --baseline/--candidate of its own "
        "(before/after a rollout: one selector, two ranges)",
    )  # fmt: skip
    prom.add_argument(
        "--range", dest="time_range", metavar="RANGE",
        help="both sides' time range: a duration ending now (30m) or START..END "
        "(RFC 3339, epoch seconds, now, now-1h)",
    )  # fmt: skip
    prom.add_argument("--baseline-range", metavar="RANGE", help="the baseline's own range")
    prom.add_argument("--candidate-range", metavar="RANGE", help="the candidate's own range")
    prom.add_argument(
        "--step", metavar="DURATION",
        help=f"window length: the query step (default: the range / "
        f"{prom_args.DEFAULT_WINDOWS}, at least {prom_args.MIN_DEFAULT_STEP_S:g} s); "
        "at least the daemon's window_s",
    )  # fmt: skip
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--db", type=Path, help="a record file (runs.sqlite)")
    src.add_argument(
        "--dir",
        type=Path,
        help=f"a record dir holding {RECORD_FILENAME} (default {DEFAULT_RECORD_DIR})",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write serwatt.report/1 JSON")
    parser.add_argument(
        "--html", type=Path, metavar="FILE", help="write a self-contained HTML page"
    )
    add_report_view_options(parser, cluster_metavar="FILE.yaml")
    parser.add_argument(
        "--checkpoints", type=Path, metavar="DIR",
        help="verify every .many file in DIR and put its receipt chain in the report",
    )  # fmt: skip
    parser.add_argument(
        "--allow-mismatch", action="store_true",
        help="report runs that are not comparable, with each mismatch as a caveat",
    )  # fmt: skip
    parser.add_argument(
        "--skip-warmup", type=Number(int, min=0), default=0, metavar="N",
        help="leave out each run's first N checkpoint episodes (page cache and allocator "
        "warm-up); the report prints what was skipped (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--verify", type=Path, metavar="REPORT.json",
        help="recompute a report's receipt from the records and say whether they still back it",
    )  # fmt: skip


def _record_path(args: argparse.Namespace) -> Path:
    if args.db is not None:
        return args.db
    return (args.dir if args.dir is not None else DEFAULT_RECORD_DIR) / RECORD_FILENAME


def _open(args: argparse.Namespace) -> Recorder:
    """The record file, read-only; a RecordError (missing, damaged) is left to `run`."""
    return Recorder(_record_path(args), readonly=True)


def _load(rec: Recorder, ids: list[str], side: str) -> list[Any]:
    try:
        return load_runs(rec, ids)
    except KeyError as exc:
        raise UsageError(f"--{side}: {exc.args[0]}") from None
    except InputError as exc:
        raise UsageError(f"--{side}: a damaged record in {rec.path}: {exc}") from None


def anchored_receipts(rec: Recorder, run_ids: list[str]) -> dict[str, list[str]]:
    """receipt -> the runs whose records anchored it (saw the file written)."""
    anchored: dict[str, list[str]] = {}
    for run_id in run_ids:
        for row in rec.receipts(run_id):
            anchored.setdefault(row["receipt"], []).append(run_id)
    return anchored


def checkpoint_chain(directory: Path, anchored: dict[str, list[str]]) -> dict[str, Any]:
    """Verify every .many file in a directory (oldest first) and its receipt chain, and
    whether the chain's head is a receipt a run anchored in its record (`anchored`:
    receipt -> the run ids that saw it written)."""
    if not directory.is_dir():
        raise UsageError(f"--checkpoints {directory}: not a directory")
    files = directory_chain(directory)
    if not files:
        # a chain of no files is no evidence: "sound" over nothing would read as a pass
        raise UsageError(
            f"--checkpoints {directory}: no .many files in {directory}; point it at the "
            "directory the .many run wrote its checkpoints to"
        )
    if len(files) > MAX_CHECKPOINT_FILES:
        raise UsageError(
            f"--checkpoints {directory}: {len(files)} .many files, more than "
            f"{MAX_CHECKPOINT_FILES}; point it at one run's checkpoint directory"
        )
    chain = chain_head(files)
    head = str(chain.head) if chain.head is not None else None
    return {
        "dir": str(directory),
        "files": len(files),
        "sound": chain.first_break is None,
        "head": head,  # of the longest sound prefix of the chain
        "length": chain.length,
        "first_break": chain.first_break,
        "anchored_by": anchored.get(head, []) if head is not None else [],
        "anchor_note": (
            "the head is a receipt the named run(s) recorded as written: the chain was not cut "
            "short or rewritten since"
            if head is not None and anchored.get(head)
            else "the head is not a receipt any compared run recorded (`serwatt profile "
            "--checkpoints DIR --record ...` anchors them): a chain cut short or rewritten "
            "with recomputed hashes would look the same"
        ),
        "proves": "consistency of each file and link (BLAKE3), not who wrote them",
    }


def _verify(args: argparse.Namespace) -> int:
    try:
        report = safeio.read_json(args.verify)
    except safeio.InputFileError as exc:
        raise UsageError(f"--verify {args.verify}: cannot read a report: {exc.problem}") from None
    if not isinstance(report, dict) or report.get("schema") != "serwatt.report/1":
        raise UsageError(f"--verify {args.verify}: not a serwatt.report/1 document")
    if (report.get("source") or {}).get("kind") == "promql":
        raise UsageError(
            f"--verify {args.verify}: made from PromQL, not run records; re-run its queries "
            "(the report's source.sides) to check it"
        )
    ids: dict[str, list[str]] = {}
    for side in ("baseline", "candidate"):
        named = (report.get(side) or {}).get("runs")
        if not (isinstance(named, list) and all(isinstance(i, str) for i in named)):
            raise UsageError(f"--verify {args.verify}: the report does not name its {side} runs")
        ids[side] = named
    with _open(args) as rec:
        try:
            baseline = load_runs(rec, ids["baseline"])
            candidate = load_runs(rec, ids["candidate"])
        except (KeyError, InputError) as exc:
            print(f"serwatt report: not backed: {_shown(exc)}", file=sys.stderr)
            return EXIT_RUNTIME
    problems = verify_receipt(report, baseline, candidate)
    if problems:
        for p in problems:
            print(f"serwatt report: not backed: {_shown(p)}", file=sys.stderr)
        return EXIT_RUNTIME
    print(f"{args.verify}: {report['receipt']}: the records still back every number")
    return EXIT_OK


def _side_query(args: argparse.Namespace, side: str, now: float) -> promql.SideQuery:
    given = getattr(args, side)
    if given is not None and len(given) != 1:
        raise UsageError(f"--{side}: with --prometheus give one selector, got {len(given)}")
    selector = given[0] if given else args.selector
    if selector is None:
        raise UsageError(
            f"--{side}: give a selector, e.g. --{side} '{{variant=\"torch\"}}', or --selector "
            "for both sides"
        )
    option = f"--{side}" if given else "--selector"
    text = getattr(args, f"{side}_range") or args.time_range
    if text is None:
        raise UsageError(f"give --range 30m (both sides) or --{side}-range START..END")
    start, end = prom_args.parse_range(
        text, f"--{side}-range" if getattr(args, f"{side}_range") else "--range", now=now
    )
    step = prom_args.parse_duration(args.step, "--step") if args.step else None
    return promql.SideQuery(
        name=side,
        selector=prom_args.check_selector(selector, option),
        start=start,
        end=end,
        step_s=step if step is not None else prom_args.default_step(start, end),
    )


def _from_prometheus(args: argparse.Namespace) -> tuple[list[Any], list[Any], dict[str, Any]]:
    for name in ("db", "dir", "verify", "checkpoints"):
        if getattr(args, name) is not None:
            raise UsageError(
                f"--{name} reads run records; --prometheus reads PromQL: give one of them"
            )
    now = time.time()
    try:
        base = _side_query(args, "baseline", now)
        cand = _side_query(args, "candidate", now)
        if (base.selector, base.start, base.end) == (cand.selector, cand.start, cand.end):
            raise UsageError(
                "both sides are the same selector over the same range: give two selectors "
                "(--baseline, --candidate) or two ranges (--baseline-range, --candidate-range)"
            )
        return promql.load_sides(args.prometheus, base, cand)
    except PrometheusError as exc:
        if exc.usage:
            raise UsageError(str(exc)) from None
        raise _RuntimeFailure(str(exc)) from None


class _RuntimeFailure(Exception):
    """A server or network failure: printed as one line, exit 1."""


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except _RuntimeFailure as exc:
        print(f"serwatt report: error: {_shown(exc)}", file=sys.stderr)
        return EXIT_RUNTIME
    except RecordError as exc:  # a missing or damaged record: one line naming it and the fix
        print(f"serwatt report: error: {_shown(exc)}", file=sys.stderr)
        return EXIT_RUNTIME


def _shown(text: object) -> str:
    """An error for the terminal: it quotes server text, labels, run ids and paths from
    outside the program, so non-printable characters are escaped."""
    return escape_text(str(text), backslash=False)


def _run(args: argparse.Namespace) -> int:
    if args.prometheus is None:
        for flag, value in (
            ("--selector", args.selector),
            ("--range", args.time_range),
            ("--baseline-range", args.baseline_range),
            ("--candidate-range", args.candidate_range),
            ("--step", args.step),
        ):
            if value is not None:
                raise UsageError(f"{flag} is for --prometheus URL (PromQL); runs need none")
    if args.verify is not None:
        if args.baseline or args.candidate:
            raise UsageError("--verify takes a report and the records, not --baseline/--candidate")
        return _verify(args)
    if args.prometheus is None and (not args.baseline or not args.candidate):
        raise UsageError("give --baseline RUN... and --candidate RUN... (see `serwatt runs list`)")
    for option, path in (("--json", args.json), ("--html", args.html)):
        if path is not None:
            check_output_option(option, path)
    try:
        cluster = projection_cluster(args.cluster, args.project)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    checkpoints = None
    if args.prometheus is not None:
        baseline, candidate, source = _from_prometheus(args)
        no_episodes = promql.NO_EPISODES_NOTE
        caveats = [promql.HOST_CAVEAT]
    else:
        with _open(args) as rec:
            baseline = _load(rec, args.baseline, "baseline")
            candidate = _load(rec, args.candidate, "candidate")
            anchored = anchored_receipts(rec, [*args.baseline, *args.candidate])
        checkpoints = (
            checkpoint_chain(args.checkpoints, anchored) if args.checkpoints is not None else None
        )
        source = {"kind": "run records", "file": str(_record_path(args))}
        no_episodes, caveats = SCHEMA1_NOTE, []
    try:
        report = build_report(
            baseline,
            candidate,
            cluster=cluster,
            allow_mismatch=args.allow_mismatch,
            skip_warmup=args.skip_warmup,
            checkpoints=checkpoints,
            no_episodes_note=no_episodes,
        )
        report["source"] = source
        report["caveats"] += caveats
    except ReportRefused as exc:
        print(
            f"serwatt report: error: {exc.shown()}\n"
            "(--allow-mismatch reports them anyway, each mismatch printed as a caveat)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except InputError as exc:
        raise UsageError(str(exc)) from None
    print(render_text(report, full=args.full))
    try:
        if args.json is not None:
            safeio.write_text(args.json, json.dumps(report, indent=2, allow_nan=False) + "\n")
        if args.html is not None:
            safeio.write_text(args.html, render_html(report))
            print(f"serwatt report: HTML report: {args.html}", file=sys.stderr)
    except OSError as exc:
        print(f"serwatt report: cannot write: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    return EXIT_OK
