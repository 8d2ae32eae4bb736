"""`serwatt demo`: the mission on an embedded default, an A/B comparison end to end.

`--workload train` (the default) is `serwatt ab` on the training workload
(profiler/workloads/train.py): the baseline checkpoints with synchronous torch.save (+
fsync + rename), the candidate with `many.Checkpointer` (`--ckpt many-async`: the
training thread stalls for one copy, the write happens behind it; `--overlap`: the copy of
the weights and optimizer state runs during the next step, whose `optimizer.step()` waits
for it); `--repeats` runs per
side, interleaved, each followed by a resumed run from a cold page cache, so save stall
and restore are both measured. Then the A/B report (text, JSON, HTML) with the default
cluster projection, all under `--out`. `--workload mixed` profiles the built-in mixed
workload (profiler/workloads/demo.py) for `--duration` seconds and prints its table.

Each workload runs in a separate Python process, the way a training script would, and
is profiled through the same session as `serwatt profile -- CMD`.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from serwatt.collectors.pyspy import SamplingError
from serwatt.profiler.cli import ab
from serwatt.profiler.cli.argtypes import Number, check_output_option
from serwatt.profiler.cli.main import UsageError
from serwatt.profiler.cli.profile import (
    BAD_INPUT_ERRORS,
    add_common_options,
    run_session,
    validate_common,
    write_outputs,
)
from serwatt.profiler.exitcodes import EXIT_RUNTIME
from serwatt.profiler.profile.session import ProfileSession, SessionResult
from serwatt.profiler.profile.setup import ProfileSetup

SIDES = (("baseline", "torch"), ("candidate", "many-async"))
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
        "--steps", type=Number(int, min=1), default=48,
        help="train: steps per run, and as many again in its resumed run (default 48)",
    )  # fmt: skip
    parser.add_argument(
        "--every", type=Number(int, min=1), default=6,
        help="train: checkpoint every K steps (default 6)",
    )  # fmt: skip
    parser.add_argument(
        "--repeats", type=Number(int, min=2, max=50), default=2,
        help="train: runs per side, each resumed once (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--overlap", action="store_true",
        help="train: the candidate checkpoints with overlap=True (the weights and optimizer "
        "state copied while the next step's forward and backward run)",
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


def _common_defaults() -> dict[str, Any]:
    parser = argparse.ArgumentParser(add_help=False)
    add_common_options(parser)
    return vars(parser.parse_args([]))


def run(args: argparse.Namespace) -> int:
    if args.workload == "mixed":
        return _mixed(args, validate_common(args))
    # the train demo's runs are `serwatt profile` runs made by `serwatt ab`, at its defaults
    given = [k for k, v in _common_defaults().items() if k != "json" and getattr(args, k, v) != v]
    if given:
        shown = ", ".join("--" + k.replace("_", "-") for k in sorted(given))
        raise UsageError(
            f"{shown}: profile options apply to --workload mixed; the train demo is `serwatt ab` "
            "at serwatt profile's defaults (run `serwatt ab` yourself to change them)"
        )
    return _train_ab(args)


def _train_command(ckpt: str, args: argparse.Namespace) -> str:
    overlap = ["--overlap"] if args.overlap and ckpt == SIDES[1][1] else []
    return shlex.join(
        [
            sys.executable, "-m", "serwatt.profiler.workloads.train", "--ckpt", ckpt, *overlap,
            "--steps", str(args.steps), "--every", str(args.every), "--size", f"{args.size:g}",
            "--dir", "{dir}",
        ]
    )  # fmt: skip


def _train_ab(args: argparse.Namespace) -> int:
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot create it: {exc.strerror or exc}") from None
    # everything the demo writes goes under --out: no other user may be able to plant there
    check_output_option("--out", args.out / "report.html")
    record = args.out / "runs.sqlite"
    record.unlink(missing_ok=True)  # the demo's own record: this A/B's runs only
    ckpt = args.out / "ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    ckpt.mkdir()
    report_json = args.json if args.json is not None else args.out / "report.json"
    (_, base), (_, cand) = SIDES
    ab_args = [
        "--baseline", _train_command(base, args), "--candidate", _train_command(cand, args),
        "--repeats", str(args.repeats), "--resume-args", f"--resume --steps {2 * args.steps}",
        "--cold-restore", "--checkpoints", str(ckpt), "--record", str(record),
        "--json", str(report_json), "--html", str(args.out / "report.html"),
    ]  # fmt: skip
    parser = argparse.ArgumentParser(prog="serwatt ab")
    ab.configure(parser)
    print(
        f"serwatt demo: serwatt ab, torch.save against many.Checkpointer"
        f"{' (overlap=True)' if args.overlap else ''}, {args.size:g} MB "
        f"every {args.every} steps, {args.repeats} runs a side, each resumed from a cold cache",
        file=sys.stderr,
    )
    return ab.run(parser.parse_args(ab_args))


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


def _mixed(args: argparse.Namespace, setup: ProfileSetup) -> int:
    cmd = [
        sys.executable,
        "-m",
        "serwatt.profiler.workloads.demo",
        "--duration",
        f"{args.duration:g}",
    ]
    print(f"serwatt demo: profiling `{' '.join(cmd)}` at {args.rate:g} Hz", file=sys.stderr)
    proc = subprocess.Popen(cmd)
    session = setup.session(
        proc.pid, command="python -m serwatt.profiler.workloads.demo", proc=proc
    )
    result = _run_launched(session, proc)
    if result is None:
        return EXIT_RUNTIME
    rc = write_outputs(setup.document(result), args, result)
    if proc.returncode != 0:
        print(f"serwatt demo: the workload exited with {proc.returncode}", file=sys.stderr)
        return EXIT_RUNTIME
    return rc
