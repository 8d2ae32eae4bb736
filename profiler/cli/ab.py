"""`serwatt ab`: A/B two commands (or one, with torch.save swapped for `.many`) in one go.

    serwatt ab --baseline 'CMD...' --candidate 'CMD...' [--repeats N]
               [--order interleaved|random --seed S] [--prepare 'CMD'] [--resume-args 'ARGS']
               [--cold-restore] [--checkpoints DIR [--checkpoint-glob G]] [--record DB]
               [--json F] [--html F] [--full] [--cluster F | --project] [--skip-warmup N]
    serwatt ab --swap torch --checkpoints DIR [--resume-args 'ARGS'] -- CMD ARGS...

Each run is `serwatt profile --record DB --run-id ab-<start>-<side>-<k> --checkpoints DIR`
(profiler/profile/ab.py runs them); at the end the report is built over every run of each
side, as `serwatt report` builds it, and opens with a headline of at most three lines.
"""

from __future__ import annotations

import argparse
import html
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from serwatt.profiler import safeio
from serwatt.profiler.cli.argtypes import Number, add_report_view_options, check_output_option
from serwatt.profiler.cli.main import UsageError
from serwatt.profiler.exitcodes import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from serwatt.profiler.profile.ab import (
    ORDERS,
    SWAPS,
    Ab,
    AbError,
    AbOptions,
    AbResult,
    PlannedRun,
    RunFailed,
    RunOutcome,
    perturbation,
    split_command,
)
from serwatt.profiler.records.store import Recorder, RecordError
from serwatt.profiler.report import (
    InputError,
    ReportRefused,
    build_report,
    projection_cluster,
    render_html,
    render_text,
    stats,
)
from serwatt.profiler.report.from_records import load_runs
from serwatt.profiler.report.render_text import (
    change_text,
    fmt,
    n_text,
    p_text,
    untimed_restore_bound,
    warmup_text,
)
from serwatt.profiler.terminal_escape import escape_text
from serwatt.profiler.yamlcheck import ConfigError

INTERRUPTED = 130  # a shell's code for SIGINT, as `serwatt` itself returns on Ctrl-C
MAX_REPEATS = 10_000
SHOWN_COMMAND = 60  # characters of a command the headline quotes


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "serwatt ab --baseline 'CMD...' --candidate 'CMD...' [--repeats N] [options]\n"
        "       serwatt ab --swap torch --checkpoints DIR [--resume-args 'ARGS'] -- CMD ARGS..."
    )
    parser.add_argument("--baseline", metavar="'CMD...'", help="the baseline's command")
    parser.add_argument("--candidate", metavar="'CMD...'", help="the candidate's command")
    parser.add_argument(
        "--swap",
        choices=SWAPS,
        help="the candidate is the baseline's own command with torch.save/torch.load replaced "
        "by serwatt.profiler.many.torch_compat (an injected sitecustomize; the job is not changed)",
    )
    parser.add_argument(
        "--repeats",
        type=Number(int, min=0, max=MAX_REPEATS),
        metavar="N",
        help="runs per side (default: the fewest at which the stall comparison can reach "
        "significance after correction, printed before the runs start)",
    )
    parser.add_argument(
        "--order",
        choices=ORDERS,
        default="interleaved",
        help="ABAB... (default) or a seeded random order",
    )
    parser.add_argument(
        "--seed",
        type=Number(int, min=0, max=2**63 - 1),
        metavar="S",
        help="with --order random: the shuffle's seed (default 0)",
    )
    parser.add_argument("--prepare", metavar="'CMD'", help="run before each run (as hyperfine's)")
    parser.add_argument(
        "--resume-args",
        metavar="'ARGS'",
        help="follow each run by the same command with ARGS appended (e.g. '--resume'), "
        "recorded on the same side, so restore is measured",
    )
    parser.add_argument(
        "--cold-restore",
        action="store_true",
        help="evict the run's checkpoint files from the page cache (fsync, then "
        "posix_fadvise DONTNEED, confirmed with mincore) before its resumed run",
    )
    parser.add_argument(
        "--checkpoints",
        type=Path,
        metavar="DIR",
        help="the job's checkpoint directory, watched in every run; '{dir}' in a command "
        "becomes a directory of that run's own under DIR",
    )
    parser.add_argument(
        "--checkpoint-glob",
        metavar="GLOB",
        help="with --checkpoints: the file names that are checkpoints, as for `serwatt "
        "profile` (fnmatch; default: no temp files, no TensorBoard event files)",
    )
    parser.add_argument(
        "--record", type=Path, metavar="DB", help="the run record (default ./ab-<start>.sqlite)"
    )
    parser.add_argument("--json", type=Path, metavar="F", help="write serwatt.report/1 JSON")
    parser.add_argument("--html", type=Path, metavar="F", help="write a self-contained HTML page")
    add_report_view_options(parser, cluster_metavar="F")
    parser.add_argument(
        "--skip-warmup",
        type=Number(int, min=0, max=MAX_REPEATS),
        default=0,
        metavar="N",
        help="leave out each run's first N checkpoint episodes (default 0)",
    )
    parser.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="report runs that are not comparable, each mismatch a caveat",
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS... (with --swap)")


def needed_repeats(family: int = 1) -> int:
    """The fewest runs per side at which a test in a Holm family of `family` can reach
    p < alpha: the run is the test's unit, whatever its checkpoints."""
    n = stats.MIN_RUNS
    while stats.min_attainable_p(n, n, family) >= stats.ALPHA:
        n += 1
    return n


def _options(args: argparse.Namespace, record: Path) -> AbOptions:
    rest = list(args.cmd or [])
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.swap is not None:
        if args.candidate is not None:
            raise AbError(
                "--swap makes the candidate from the baseline's command: give no --candidate"
            )
        if (args.baseline is None) == (not rest):
            raise AbError("--swap: give the job's command once, as -- CMD ARGS... or --baseline")
        baseline = tuple(rest) if rest else split_command(args.baseline, "--baseline")
        candidate = baseline
    else:
        if rest:
            raise AbError(
                "-- CMD is the command for --swap; without it give --baseline 'CMD' "
                "and --candidate 'CMD'"
            )
        if args.baseline is None or args.candidate is None:
            raise AbError(
                "give --baseline 'CMD...' and --candidate 'CMD...' (or --swap torch -- CMD...)"
            )
        baseline = split_command(args.baseline, "--baseline")
        candidate = split_command(args.candidate, "--candidate")
    if args.seed is not None and args.order != "random":
        raise AbError("--seed orders the runs of --order random: give that too")
    return AbOptions(
        baseline=baseline,
        candidate=candidate,
        repeats=args.repeats if args.repeats is not None else needed_repeats(),
        record=record,
        order=args.order,
        seed=(args.seed or 0) if args.order == "random" else None,
        swap=args.swap,
        prepare=split_command(args.prepare, "--prepare") if args.prepare is not None else (),
        resume_args=tuple(shlex.split(args.resume_args)) if args.resume_args else (),
        cold_restore=args.cold_restore,
        # absolute: the job may change directory before it writes {dir}
        checkpoints=args.checkpoints.absolute() if args.checkpoints is not None else None,
        checkpoint_glob=args.checkpoint_glob,
    )


class Progress:
    """Run k of 2N with elapsed time and ETA: a rich progress bar on a terminal, one line
    per run on a pipe (stderr, so stdout is the report)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.t0 = time.monotonic()
        self.bar: Any = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self.bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self.task = self.bar.add_task("serwatt ab", total=total)
            self.bar.start()

    def started(self, planned: PlannedRun, _result: AbResult) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=escape_text(planned.run_id))

    def ended(self, outcome: RunOutcome, result: AbResult) -> None:
        done = len(result.outcomes)
        elapsed = time.monotonic() - self.t0
        eta = elapsed / done * (self.total - done)
        line = f"run {done}/{self.total} {run_line(outcome)}"
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False)
            self.bar.update(self.task, advance=1)
        else:
            print(
                f"serwatt ab: {line}; elapsed {elapsed:.0f} s, ETA {eta:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_line(o: RunOutcome) -> str:
    parts = [f"exit {o.exit_code} in {o.wall_s:.1f} s"]
    if o.checkpoint_files is not None:
        parts.append(f"{o.checkpoint_files} checkpoint files ({o.many_files} .many)")
    if o.run.resumed:
        if o.restores is not None:
            parts.append(f"{o.restores} opened for restore")
        if o.restore_cache is not None:
            parts.append(f"restore {o.restore_cache}")
    return escape_text(f"{o.run.run_id}: " + ", ".join(parts))


def _say(text: str) -> None:
    print(f"serwatt ab: {escape_text(text, backslash=False)}", file=sys.stderr)


def _recorded(result: AbResult | None, record: Path) -> None:
    """What the record holds, so a stopped A/B loses nothing: the command that reports it."""
    if result is None or not result.outcomes:
        return
    ok = {s: result.run_ids(s) for s in ("baseline", "candidate")}
    _say(f"{record} keeps the {sum(len(v) for v in ok.values())} completed runs")
    if ok["baseline"] and ok["candidate"]:
        _say(
            f"report them: serwatt report --db {shlex.quote(str(record))} --baseline "
            f"{' '.join(ok['baseline'])} --candidate {' '.join(ok['candidate'])}"
        )


def run(args: argparse.Namespace) -> int:
    record = args.record or Path(f"ab-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.sqlite")
    for option, path in (("--json", args.json), ("--html", args.html)):
        if path is not None:
            check_output_option(option, path)
    try:
        cluster = projection_cluster(args.cluster, args.project)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        opts = _options(args, record)
        ab = Ab(opts)
        ab.check()
    except AbError as exc:
        raise UsageError(str(exc)) from None
    need = needed_repeats()
    restore_need = needed_repeats(family=2)
    _say(
        f"the stall comparison (one test) can reach p < {stats.ALPHA:g} from {need} runs per "
        f"side: the run is the unit (its checkpoints share its cache, node and warm-up), so "
        f"more checkpoints per run make each run's mean steadier but never replace runs"
        + (
            f"; restore, one per resumed run, in a family of at least 2 tests needs {restore_need}"
            if opts.resume_args
            else ""
        )
    )
    _say(
        f"{opts.repeats} runs per side{' (the default)' if args.repeats is None else ''}, "
        f"{opts.order}"
        + (f" (seed {opts.seed})" if opts.seed is not None else "")
        + f", {len(ab.plan())} runs in all, recorded in {record}"
    )
    progress = Progress(len(ab.plan()))
    ab.on_start, ab.on_run = progress.started, progress.ended
    try:
        result = ab.run()
    except RunFailed as exc:
        progress.stop()
        o = exc.outcome
        _say(f"error: {exc}; stderr ends:")
        for line in o.stderr_tail.splitlines()[-12:]:
            print(f"  {escape_text(line)}", file=sys.stderr)
        _recorded(exc.result, record)
        return o.exit_code
    except AbError as exc:
        progress.stop()
        _say(f"error: {exc}")
        return exc.exit_code
    finally:
        progress.stop()
    return _report(args, opts, result, cluster)


def _report(args: argparse.Namespace, opts: AbOptions, result: AbResult, cluster: Any) -> int:
    ids = {s: result.run_ids(s) for s in ("baseline", "candidate")}
    partial = None
    if result.interrupted:
        partial = (
            f"partial: stopped by Ctrl-C after {len(result.outcomes)} of {len(result.plan)} runs"
        )
        _say(partial)
    if not ids["baseline"] or not ids["candidate"]:
        _say("no report: a side has no completed run")
        _recorded(result, opts.record)
        return INTERRUPTED if result.interrupted else EXIT_RUNTIME
    try:
        with Recorder(opts.record, readonly=True) as rec:
            baseline = load_runs(rec, ids["baseline"])
            candidate = load_runs(rec, ids["candidate"])
        report = build_report(
            baseline,
            candidate,
            cluster=cluster,
            allow_mismatch=args.allow_mismatch,
            skip_warmup=args.skip_warmup,
        )
    except (RecordError, InputError, KeyError) as exc:
        _say(f"error: cannot build the report: {exc}")
        _recorded(result, opts.record)
        return EXIT_RUNTIME
    except ReportRefused as exc:
        print(
            f"serwatt ab: error: {exc.shown()}\n(--allow-mismatch reports them anyway)",
            file=sys.stderr,
        )
        _recorded(result, opts.record)
        return EXIT_USAGE
    report["source"] = {"kind": "run records", "file": str(opts.record)}
    report["ab"] = ab_section(opts, result)
    report["ab"]["headline"] = headline(report, opts)
    report["ab"]["perturbation"] = perturbation(result.outcomes)
    report["caveats"].append(report["ab"]["perturbation"])
    if partial is not None:
        report["ab"]["partial"] = partial
        report["caveats"].append(partial)
    text = render_text(report, full=args.full)
    print("\n".join(escape_text(line) for line in report["ab"]["headline"]))
    print()
    print(text, end="")
    try:
        if args.json is not None:
            safeio.write_text(args.json, json.dumps(report, indent=2, allow_nan=False) + "\n")
        if args.html is not None:
            safeio.write_text(args.html, with_headline(render_html(report), report))
    except OSError as exc:
        _say(f"cannot write: {exc}")
        return EXIT_RUNTIME
    print()
    print("\n".join(escape_text(line) for line in closing(report, args.html, args.json)))
    return INTERRUPTED if result.interrupted else EXIT_OK


def ab_section(opts: AbOptions, result: AbResult) -> dict[str, Any]:
    return {
        "order": opts.order,
        "seed": opts.seed,
        "repeats": opts.repeats,
        "swap": opts.swap,
        "cold_restore": opts.cold_restore,
        "baseline_command": list(opts.baseline),
        "candidate_command": list(opts.candidate),
        "resume_args": list(opts.resume_args),
        "runs": [o.to_json() for o in result.outcomes],
    }


def _shown_command(argv: list[str]) -> str:
    text = shlex.join(argv)
    return text if len(text) <= SHOWN_COMMAND else text[: SHOWN_COMMAND - 1] + "…"


def _verdict(m: dict[str, Any] | None, unit: str = "s") -> str | None:
    if not m:
        return None
    return (
        f"baseline {fmt(m.get('baseline'))} {unit}, candidate {fmt(m.get('candidate'))} "
        f"{unit}: {change_text(m)} (p Holm {p_text(m)}, n {n_text(m)})"
    )


def _restore_missing(report: dict[str, Any], label: str) -> str:
    """The headline's restore line when none was compared: 'not measured' when no run
    restored, else which side's restores were seen but none timed (a lazy open is often
    shorter than the sampling can time) and how many."""
    sides = report.get("restore") or {}
    seen = {
        name: side
        for name in ("baseline", "candidate")
        if isinstance(side := sides.get(name), dict) and side.get("restores")
    }
    if not seen:
        return "restore: not measured"
    untimed = [
        f"{name}: {side.get('file_event_only') or 0} of {side['restores']} seen only as a "
        "file event" + untimed_restore_bound(side)
        for name, side in seen.items()
        if not side.get("wall_s")
    ]
    return f"restore{label}: not compared, no timed restore ({'; '.join(untimed) or 'see report'})"


def headline(report: dict[str, Any], opts: AbOptions) -> list[str]:
    """Three lines: the stall verdict with its interval, the restore's (or 'restore: not
    measured'), and what was compared; a fourth with the stall's change without each run's
    first checkpoint when a warm-up is flagged."""
    ck = report["checkpoint"]
    stall = _verdict(ck.get("stall_s"))
    lines = [
        f"stall per checkpoint: {stall}"
        if stall
        else f"stall per checkpoint: not compared ({ck.get('note') or 'no episodes'})"
    ]
    restore = _verdict(ck.get("restore_s"))
    caches = sorted({r["restore_cache"] for r in report["ab"]["runs"] if r.get("restore_cache")})
    label = f" ({', '.join(caches)})" if caches else ""
    lines.append(f"restore{label}: {restore}" if restore else _restore_missing(report, label))
    if opts.swap is not None:
        what = (
            f"`{_shown_command(list(opts.baseline))}` with torch.save/torch.load as "
            "serwatt.profiler.many.torch_compat (candidate) and as is (baseline)"
        )
    else:
        what = (
            f"baseline `{_shown_command(list(opts.baseline))}` against candidate "
            f"`{_shown_command(list(opts.candidate))}`"
        )
    done = report["ab"]["runs"]
    per_side = {
        s: sum(1 for r in done if r["side"] == s and not r["resumed"])
        for s in ("baseline", "candidate")
    }
    lines.append(
        f"compared: {what}; {per_side['baseline']}+{per_side['candidate']} runs, "
        f"{opts.order}"
        + (", each resumed" if opts.resume_args else "")
        + (f"; {swap_split(done)}" if opts.swap is not None else "")
    )
    if ck.get("stall_s") and (warm := warmup_text(ck["stall_s"])) is not None:
        lines.append(f"warm-up: {warm}")
    return lines


def _files_bytes(pair: list[int]) -> str:
    return f"{pair[0]} files ({fmt(pair[1] / 1e6)} MB)"


def swap_split(runs: list[dict[str, Any]]) -> str:
    """What each side's runs wrote under DIR, by format, summed: the swap sends what `.many`
    cannot store to the original torch.save, so the comparison is of these shares."""
    parts = []
    for side in ("baseline", "candidate"):
        total = {"many": [0, 0], "torch": [0, 0]}
        for r in runs:
            got = r.get("written")
            if r["side"] != side or not got:
                continue
            for kind, pair in total.items():
                files, size = got.get(kind) or (0, 0)
                total[kind] = [pair[0] + files, pair[1] + size]
        parts.append(
            f"{side} wrote {_files_bytes(total['many'])} as .many and "
            f"{_files_bytes(total['torch'])} through torch.save"
        )
    return ", ".join(parts)


def closing(report: dict[str, Any], html_path: Path | None, json_path: Path | None) -> list[str]:
    """The three lines `serwatt ab` ends with, below the long report: the stall per
    checkpoint before and after with its interval and verdict, the restore likewise with
    the storage bytes each side's runs read, and where the page is."""
    stall, restore = report["ab"]["headline"][:2]
    sides = report.get("restore") or {}
    read = {
        name: side.get("read_bytes")
        for name in ("baseline", "candidate")
        if isinstance(side := sides.get(name), dict) and side.get("restores")
    }
    if read:
        restore += "; read from storage: " + ", ".join(
            f"{name} {fmt(b / 1e6)} MB" if isinstance(b, int) else f"{name} not measured"
            for name, b in read.items()
        )
    if html_path is not None:
        where = f"HTML report: {html_path}"
    elif json_path is not None:
        where = f"JSON report: {json_path} (--html FILE writes the page)"
    else:
        where = "report: the text above (--html FILE writes the page, --json FILE the document)"
    return [stall, restore, where]


def with_headline(page: str, report: dict[str, Any]) -> str:
    """The HTML page with the headline first in its body, before any table."""
    block = "".join(
        f"<p><strong>{html.escape(line)}</strong></p>" for line in report["ab"]["headline"]
    )
    section = f'<section id="ab-headline">{block}</section>'
    head, sep, body = page.partition("<body>")
    return head + sep + section + body if sep else section + page
