"""Would a validation library do the run record's checks as well, and as cheaply? The record's
checks (profiler/records/validation.py) against pydantic and msgspec doing the same ones.

    .venv/bin/python bench/record_validation.py [--windows 400] [--blocks 12] [--dir /var/tmp]
                                                [--json FILE]

Two places check values. Reading: every row of `window_codepaths` is checked to hold the
SQL types its table declares and finite numbers (`_check_row`: one set lookup of the row's
types in the common case); a month-long run reads ~2M such values. Writing: every number
of an appended window goes through `_finite` (window and codepath figures, energy per
codepath), inside the append the daemon times (bench/record_append.py).

The rows are the real ones: a fresh record under --dir gets --windows windows through the
public Recorder API (as bench/record_append.py appends them), and its window_codepaths rows
are read back as sqlite3 returns them. Each library is given the same rule: strict types
(no text for a number, no float for an integer), finite numbers, NULL where the column
allows it. Before timing, every checker is shown the same damaged rows (text, a blob,
infinity, NaN, a float where an integer goes) and must refuse each: a checker that lets one
through is reported and its timing means nothing.

Timing: --blocks rounds, each timing every checker over all the rows (and over the values
of every appended window), in a rotated order so none always runs first. Per block, each
library's time over the record's is a ratio; the bench prints each ratio's mean with its
95% Student t interval over the blocks (profiler/intervals.py), and what each costs per
append beside the append itself, measured in the same run. The goal a library has to meet
to replace the hand-written checks: no slower on the read path (ratio <= 1) and under 1%
of an append on the write path; each verdict is read off its interval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serwatt.profiler.attribution.window_records import EnergyRecord  # noqa: E402
from serwatt.profiler.classify.codepaths import CODEPATHS  # noqa: E402
from serwatt.profiler.intervals import Interval, mean_interval, verdict  # noqa: E402
from serwatt.profiler.records.reader import (  # noqa: E402
    _WINDOW_CODEPATH_KINDS,
    _WINDOW_CODEPATH_SIGNATURES,
)
from serwatt.profiler.records.store import Recorder  # noqa: E402
from serwatt.profiler.records.validation import _check_row, _finite  # noqa: E402

try:
    import msgspec
    import pydantic
except ImportError as exc:  # the test extra installs both: pip install -e '.[test]'
    sys.exit(f"record_validation: {exc.name} is not installed: pip install -e '.[test]'")

RUN_ID = "bench-record-validation"
APPEND_BLOCKS = 4  # blocks of the append measured beside the checks

_SELECT_ROWS = (
    "SELECT window_id, codepath, samples, cpu_s, wall_s, low_confidence_samples, energy_j,"
    " energy_source, gpu_wait_s, gpu_wait_energy_j FROM window_codepaths ORDER BY window_id"
)

# damaged rows every checker must refuse (the column named in each); no NaN among them:
# SQLite stores a NaN as NULL, so a row read back never holds one
DAMAGED: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("text in cpu_s", (1, "pickle", 3, "1.5", 2.0, 0, None, None, None, None)),
    ("infinity in wall_s", (1, "pickle", 3, 1.5, math.inf, 0, None, None, None, None)),
    ("a blob for codepath", (1, b"pickle", 3, 1.5, 2.0, 0, None, None, None, None)),
    ("a float in samples", (1, "pickle", 3.0, 1.5, 2.0, 0, None, None, None, None)),
    ("-infinity in gpu_wait_s", (1, "pickle", 3, 1.5, 2.0, 0, None, None, -math.inf, None)),
)


def _msgspec_row() -> Callable[[tuple[Any, ...]], object]:
    # finite: bounds refuse infinities, and NaN fails every comparison
    f = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
    row_type = tuple[int, str, int, f, f, int, f | None, str | None, f | None, f | None]  # type: ignore[valid-type]
    return lambda row: msgspec.convert(row, row_type, strict=True)


def _pydantic_row() -> Callable[[tuple[Any, ...]], object]:
    f = Annotated[float, pydantic.Strict(), pydantic.AllowInfNan(False)]
    i = Annotated[int, pydantic.Strict()]
    s = Annotated[str, pydantic.Strict()]
    row_type = tuple[i, s, i, f, f, i, f | None, s | None, f | None, f | None]  # type: ignore[valid-type]
    return pydantic.TypeAdapter(row_type).validate_python


def _record_row(row: tuple[Any, ...]) -> None:
    _check_row(row, _WINDOW_CODEPATH_KINDS, _WINDOW_CODEPATH_SIGNATURES, "window_codepaths")


ROW_CHECKERS: dict[str, Callable[[tuple[Any, ...]], object]] = {
    "record": _record_row,
    "pydantic": _pydantic_row(),
    "msgspec": _msgspec_row(),
}


def _record_values(values: Sequence[float]) -> None:
    for v in values:
        _finite(v, "value")


def _pydantic_values() -> Callable[[Sequence[float]], object]:
    f = Annotated[float, pydantic.AllowInfNan(False)]
    return pydantic.TypeAdapter(list[f]).validate_python  # type: ignore[valid-type]


def _msgspec_values() -> Callable[[Sequence[float]], object]:
    f = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
    return lambda values: msgspec.convert(values, list[f])  # type: ignore[valid-type]


VALUE_CHECKERS: dict[str, Callable[[Sequence[float]], object]] = {
    "record": _record_values,
    "pydantic": _pydantic_values(),
    "msgspec": _msgspec_values(),
}


def refusals() -> dict[str, list[str]]:
    """For each checker, the damaged rows it let through (every one must be refused)."""
    let_through: dict[str, list[str]] = {name: [] for name in ROW_CHECKERS}
    for name, check in ROW_CHECKERS.items():
        for what, row in DAMAGED:
            try:
                check(row)
            except (ValueError, msgspec.ValidationError):  # pydantic's is a ValueError
                continue
            let_through[name].append(what)
    return let_through


def appended_values(window: Any, energy: EnergyRecord) -> list[float]:
    """The numbers Recorder.append_window passes through _finite for one window."""
    e = window.errors
    out = [window.started_at, window.ended_at, window.rate_hz, window.cpu_s, e.behind_s]
    for cp in CODEPATHS:
        cw = window.codepaths[cp]
        out += [cw.cpu_s, cw.wall_s]
    out += list(energy.codepaths_j.values())
    return out


def build_record(record: Path, windows: int, blocks: int) -> dict[str, Any]:
    """A record of `windows` full windows (bench/record_append.py's), the append timed in
    `blocks` blocks; its window_codepaths rows as sqlite3 returns them and each window's
    checked values."""
    sys.path.insert(0, str(REPO / "bench"))
    from record_append import full_window

    rng = random.Random(1)
    ws = [full_window(i, rng) for i in range(windows)]
    energy = EnergyRecord(source="rapl", codepaths_j={cp: 1.0 for cp in CODEPATHS})
    cpu: list[float] = []
    edges = [round(k * windows / blocks) for k in range(blocks + 1)]
    with Recorder(record) as rec:
        rec.start_run(RUN_ID, "bench", host={}, config={}, sources={"energy": "rapl"})
        for a, b in zip(edges, edges[1:], strict=False):
            c = time.process_time()
            for w in ws[a:b]:
                rec.append_window(RUN_ID, w, energy=energy)
            cpu.append((time.process_time() - c) / (b - a))
    db = sqlite3.connect(f"file:{record}?mode=ro", uri=True)
    try:
        rows = db.execute(_SELECT_ROWS).fetchall()
    finally:
        db.close()
    return {
        "rows": rows,
        "values": [appended_values(w, energy) for w in ws],
        "append_cpu_s_by_block": cpu,
    }


# what a process that reads records would pay first: the library's import and the row
# checker built (the record's checks are plain functions, imported with the reader)
_STARTUP = {
    "pydantic": "import pydantic\nfrom typing import Annotated\n"
    "f = Annotated[float, pydantic.Strict(), pydantic.AllowInfNan(False)]\n"
    "i = Annotated[int, pydantic.Strict()]\ns = Annotated[str, pydantic.Strict()]\n"
    "pydantic.TypeAdapter(tuple[i, s, i, f, f, i, f | None, s | None, f | None, f | None])",
    "msgspec": "import msgspec",
}


def startup_s(lib: str) -> float:
    """Wall seconds a fresh interpreter spends importing `lib` and building its checker."""
    code = f"import time\nt = time.perf_counter()\n{_STARTUP[lib]}\nprint(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _timed(fn: Callable[[Any], object], items: Sequence[Any]) -> float:
    """CPU seconds per item of fn over items (process_time: the checks do no I/O)."""
    t = time.process_time()
    for item in items:
        fn(item)
    return (time.process_time() - t) / len(items)


def measure(rows: Sequence[tuple], values: Sequence[list[float]], blocks: int) -> dict[str, Any]:
    """Per block, every checker's CPU per row and per window's values, in rotated order."""
    names = list(ROW_CHECKERS)
    per_row: dict[str, list[float]] = {n: [] for n in names}
    per_append: dict[str, list[float]] = {n: [] for n in names}
    startup: dict[str, list[float]] = {lib: [] for lib in _STARTUP}
    for k in range(blocks):
        order = names[k % len(names) :] + names[: k % len(names)]
        for n in order:
            per_row[n].append(_timed(ROW_CHECKERS[n], rows))
            per_append[n].append(_timed(VALUE_CHECKERS[n], values))
            if n in startup:
                startup[n].append(startup_s(n))
    return {
        "row_cpu_s_by_block": per_row,
        "append_check_cpu_s_by_block": per_append,
        "startup_s_by_block": startup,
    }


def ratio_interval(num: Sequence[float], den: Sequence[float]) -> Interval:
    return mean_interval([a / b for a, b in zip(num, den, strict=True)])


def figures(built: dict[str, Any], timed: dict[str, Any]) -> dict[str, Any]:
    """The ratios, the write-side cost as a share of the append, and the verdicts."""
    row, app = timed["row_cpu_s_by_block"], timed["append_check_cpu_s_by_block"]
    append = mean_interval(built["append_cpu_s_by_block"])
    out: dict[str, Any] = {
        "rows": len(built["rows"]),
        "append_cpu_s": append.estimate,
        "append_cpu_s_ci95": list(append.bounds()) if append.has_interval else None,
        "libraries": {},
    }
    for lib in ("pydantic", "msgspec"):
        read = ratio_interval(row[lib], row["record"])
        # the library's extra CPU per append, as a share of the append's own CPU
        extra = mean_interval(
            [(a - b) / append.estimate for a, b in zip(app[lib], app["record"], strict=True)]
        )
        start = mean_interval(timed["startup_s_by_block"][lib])
        saved_per_row = (sum(row["record"]) - sum(row[lib])) / len(row[lib])
        out["libraries"][lib] = {
            "startup_s": start.estimate,
            "startup_s_ci95": list(start.bounds()) if start.has_interval else None,
            # rows a read must hold before the per-row saving pays for the start-up
            "break_even_rows": start.estimate / saved_per_row if saved_per_row > 0 else None,
            "read_ratio": read.estimate,
            "read_ratio_ci95": list(read.bounds()) if read.has_interval else None,
            "read_verdict": verdict(read, at_most=1.0),
            "row_cpu_us": 1e6 * sum(row[lib]) / len(row[lib]),
            "write_extra_share_of_append": extra.estimate,
            "write_extra_share_ci95": list(extra.bounds()) if extra.has_interval else None,
            "write_verdict": verdict(extra, at_most=0.01),
        }
    out["record_row_cpu_us"] = 1e6 * sum(row["record"]) / len(row["record"])
    out["record_append_check_cpu_us"] = 1e6 * sum(app["record"]) / len(app["record"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--windows", type=int, default=400)
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.windows < APPEND_BLOCKS or args.blocks < 2:
        ap.error(f"need --windows >= {APPEND_BLOCKS} and --blocks >= 2")
    let_through = refusals()
    workdir = Path(tempfile.mkdtemp(prefix="serwatt-record-validation-", dir=args.dir))
    try:
        built = build_record(workdir / "runs.sqlite", args.windows, APPEND_BLOCKS)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    fig = figures(built, measure(built["rows"], built["values"], args.blocks))
    fig |= {"let_through": let_through, "blocks": args.blocks, "loadavg": os.getloadavg()}
    print(
        f"record validation: {fig['rows']} window_codepaths rows of {args.windows} windows, "
        f"{args.blocks} blocks; the append {1e3 * fig['append_cpu_s']:.3f} ms of CPU"
    )
    for name, missed in let_through.items():
        shown = "refuses every damaged row" if not missed else f"LETS THROUGH {', '.join(missed)}"
        print(f"  {name:<9} {shown} ({len(DAMAGED)} kinds)")
    print(
        f"  the record's checks: {fig['record_row_cpu_us']:.3f} us per row read, "
        f"{fig['record_append_check_cpu_us']:.2f} us per window appended"
    )
    for lib, f in fig["libraries"].items():
        share = f["write_extra_share_of_append"]
        ci = f["write_extra_share_ci95"]
        ci_text = f" (95% CI {100 * ci[0]:+.2f}..{100 * ci[1]:+.2f})" if ci else ""
        print(
            f"  {lib:<9} read: {f['row_cpu_us']:.3f} us per row, "
            f"{_ratio(f)}x the "
            f"record's: <= 1x {f['read_verdict']}; write: {100 * share:+.2f}% of an append"
            f"{ci_text}: < 1% {f['write_verdict']}"
        )
        even = f["break_even_rows"]
        print(
            f"            start-up (import and checker) {1e3 * f['startup_s']:.0f} ms per process: "
            + (
                f"the per-row saving pays for it from {even:,.0f} rows read"
                if even is not None
                else "no per-row saving to pay for it"
            )
        )
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2))
    return 0


def _ratio(f: dict[str, Any]) -> str:
    ci = f["read_ratio_ci95"]
    if ci is None:
        return f"{f['read_ratio']:.2f}"
    return f"{f['read_ratio']:.2f} (95% CI {ci[0]:.2f}-{ci[1]:.2f})"


if __name__ == "__main__":
    raise SystemExit(main())
