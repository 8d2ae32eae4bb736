"""`serwatt demo`: the mission on an embedded default, an A/B comparison end to end.

`--workload train` (the default) profiles the training workload
(profiler/workloads/train.py) twice, once checkpointing with torch.save and once with
`.many`, same steps and checkpoint interval, records both runs, prints each profile,
then the A/B report with the default cluster projection, and writes the HTML report.
`--workload mixed` profiles the built-in mixed workload (profiler/workloads/demo.py)
for `--duration` seconds and prints its table.

Each workload runs in a separate Python process, the way a training script would, and
is profiled through the same session as `serwatt profile -- CMD`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from collectors.pyspy import SamplingError
from profiler import safeio
from profiler.cli.argtypes import Number, check_output_option
from profiler.cli.main import UsageError
from profiler.cli.profile import (
    BAD_INPUT_ERRORS,
    add_common_options,
    document,
    make_classifier,
    make_pyspy,
    new_session,
    prepare_energy,
    run_session,
    validate_common,
    write_outputs,
)
from profiler.cli.report import anchored_receipts, checkpoint_chain
from profiler.exitcodes import EXIT_OK, EXIT_RUNTIME
from profiler.profile.record_sink import RecordSink
from profiler.profile.session import ProfileSession, SessionResult
from profiler.profile.table import render_table
from profiler.records.store import Recorder
from profiler.report import build_report, default_cluster, render_html, render_text
from profiler.report.from_records import load_runs

SIDES = (("baseline", "torch"), ("candidate", "many"))
TRAIN_WINDOW_S = 2.0
MIXED_WINDOW_S = 5.0  # the `serwatt profile` default


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload", choices=("train", "mixed"), default="train",
        help="train: torch.save against .many, A/B report (default); mixed: the mixed demo",
    )  # fmt: skip
    parser.add_argument(
        "--duration", type=Number(float, above=0, unit="s"), default=20.0, metavar="S",
        help="mixed workload: how long it runs (default 20)",
    )  # fmt: skip
    parser.add_argument(
        "--steps", type=Number(int, min=1), default=40, help="train: steps per side (default 40)"
    )
    parser.add_argument(
        "--every", type=Number(int, min=1), default=4,
        help="train: checkpoint every K steps (default 4)",
    )  # fmt: skip
    parser.add_argument(
        "--size", type=Number(float, above=0, unit="MB"), default=64.0,
        help="train: checkpoint size in MB (default 64)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=Path("runs/demo"), metavar="DIR",
        help="train: where the run records, checkpoints and report go (default runs/demo)",
    )  # fmt: skip
    add_common_options(parser)
    # The A/B needs windows enough to block for its statistics: shorter ones by default.
    parser.set_defaults(window=None)


def run(args: argparse.Namespace) -> int:
    if args.window is None:
        args.window = TRAIN_WINDOW_S if args.workload == "train" else MIXED_WINDOW_S
    validate_common(args)
    if args.workload == "mixed":
        return _mixed(args)
    return _train_ab(args)


def _train_side(args: argparse.Namespace, side: str, ckpt: str, record: Path) -> int | None:
    """Profile one side into the record; returns an exit code on failure, else None."""
    ckpt_dir = args.out / f"ckpt-{ckpt}"
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "profiler.workloads.train", "--ckpt", ckpt,
        "--steps", str(args.steps), "--every", str(args.every), "--size", f"{args.size:g}",
        "--dir", str(ckpt_dir),
    ]  # fmt: skip
    print(f"serwatt demo: [{side}: {ckpt}] profiling `{' '.join(cmd[1:])}`", file=sys.stderr)
    prepare_energy(args)  # a fresh tracker and energy sink per side
    ckpt_dir.mkdir(parents=True)
    args.record_sink = RecordSink(
        record, target="demo", run_id=f"demo-{ckpt}", tracker=args.tracker, checkpoints=ckpt_dir
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    session = new_session(
        args, proc.pid, make_pyspy(args), make_classifier(), command=" ".join(cmd[1:]), proc=proc
    )
    result = _run_launched(session, proc)
    if result is None:
        return EXIT_RUNTIME
    print(f"\n== {side}: checkpoints through {ckpt} ==")
    print(render_table(document(result, args)))
    if proc.returncode != 0:
        print(f"serwatt demo: the {ckpt} workload exited with {proc.returncode}", file=sys.stderr)
        return EXIT_RUNTIME
    return None


def _train_ab(args: argparse.Namespace) -> int:
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot create it: {exc.strerror or exc}") from None
    # everything the demo writes goes under --out: no other user may be able to plant there
    check_output_option("--out", args.out / "report.html")
    record = args.out / "runs.sqlite"
    record.unlink(missing_ok=True)  # the demo's own record: one fresh pair of runs
    for side, ckpt in SIDES:
        failed = _train_side(args, side, ckpt, record)
        if failed is not None:
            return failed
    with Recorder(record, readonly=True) as rec:
        baseline, candidate = (load_runs(rec, [f"demo-{ckpt}"]) for _, ckpt in SIDES)
        anchored = anchored_receipts(rec, [f"demo-{ckpt}" for _, ckpt in SIDES])
    report = build_report(
        baseline,
        candidate,
        cluster=default_cluster(),
        allow_mismatch=True,
        checkpoints=checkpoint_chain(args.out / "ckpt-many", anchored),
    )
    print()
    print(render_text(report))
    html = args.out / "report.html"
    report_json = args.json if args.json is not None else args.out / "report.json"
    try:
        safeio.write_text(html, render_html(report))
        safeio.write_text(report_json, json.dumps(report, indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        print(f"serwatt demo: cannot write the report: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    print(f"\nserwatt demo: HTML report: {html.resolve()}")
    print(f"serwatt demo: report JSON: {report_json}; records: {record}")
    return EXIT_OK


def _run_launched(session: ProfileSession, proc: subprocess.Popen[bytes]) -> SessionResult | None:
    """Profile a workload the demo launched; on failure stop it. Bad input (the session
    refused the target) is a usage error; serwatt's own sampling failing is one error line
    and None."""
    try:
        return run_session(session, proc)
    except BAD_INPUT_ERRORS as exc:
        proc.kill()
        proc.wait()
        raise UsageError(str(exc)) from exc
    except SamplingError as exc:
        proc.kill()
        proc.wait()
        print(f"serwatt demo: error: {exc}", file=sys.stderr)
        return None
    finally:
        if proc.poll() is None:
            proc.wait()


def _mixed(args: argparse.Namespace) -> int:
    spy = make_pyspy(args)
    classifier = make_classifier()
    cmd = [sys.executable, "-m", "profiler.workloads.demo", "--duration", f"{args.duration:g}"]
    print(f"serwatt demo: profiling `{' '.join(cmd)}` at {args.rate:g} Hz", file=sys.stderr)
    proc = subprocess.Popen(cmd)
    session = new_session(
        args, proc.pid, spy, classifier, command="python -m profiler.workloads.demo", proc=proc
    )
    result = _run_launched(session, proc)
    if result is None:
        return EXIT_RUNTIME
    rc = write_outputs(document(result, args), args)
    if proc.returncode != 0:
        print(f"serwatt demo: the workload exited with {proc.returncode}", file=sys.stderr)
        return EXIT_RUNTIME
    return rc
