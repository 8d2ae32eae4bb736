"""Checkpoint identity across sizes: for each format and state size, `serwatt profile
--checkpoints DIR` on the training workload, a run that saves and a run that resumes, held
against the workload's own perf_counter figures (issue 24, "episode identity").

    .venv/bin/python bench/checkpoint_identity.py [--formats torch,json,many,many-async]
        [--sizes 1,4,16,64,256] [--saves 4] [--rate 100] [--json-max-mb 16] [--json FILE]
        [--backend torch|numpy]

Each cell (format, size) holds when, in its save run, the checkpoints are exactly the files
written, every checkpoint's writer is an episode of the format's own codepath (never an
import, a load or a log line), and the timed stalls are within their stated resolution of
the workload's `save_s` but for the misses a Binomial(n, 0.05) exceeds once in 1,000; and
when its resumed run's one restore is the file the workload restored from, its time not
above the workload's `restore_s` (which also holds load_state_dict) by more than its
error's one-sided 99.9% quantile. tests/attribution/test_checkpoint_identity.py holds the
same rules at 4 MB in CI; this runs them from 1 MB to 256 MB.

--backend numpy trains the workload's numpy model (its smoke test's: no torch import in
each run, a few seconds less per run); the figures in docs/benchmarks.md are torch's.
JSON above --json-max-mb is left out and said so: the workload's JSON encoder takes
~0.4-0.6 s per MB here (a 256 MB save 2-3 minutes, the 64 and 256 MB cells ~25 minutes
together). Exit 0 when every cell run holds, 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from scipy.stats import binom

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serwatt.profiler.attribution.episodes import error_quantile_s  # noqa: E402

SERWATT = [sys.executable, "-m", "serwatt"]
FORMATS = ("torch", "json", "many", "many-async")
SIZES_MB = (1.0, 4.0, 16.0, 64.0, 256.0)
FALSE_FAILURE = 0.001  # per cell: the misses a 95% half-width allows this often


def every_for(size_mb: float) -> int:
    """Steps between saves: the workload's steps grow with its state, so fewer of them keep
    saves about a quarter of a second apart (closer saves can merge into one episode)."""
    return max(2, round(400 / size_mb))


def profile(
    out: Path, name: str, fmt: str, size_mb: float, rate: float, backend: str, *train: str
) -> tuple:
    """(profile document, the workload's summary line) of one run."""
    ckpt = out / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    doc = out / f"{name}.json"
    cmd = [
        *SERWATT, "profile", "--rate", f"{rate:g}", "--window", "2",
        "--checkpoints", str(ckpt), "--json", str(doc), "--",
        sys.executable, "-m", "serwatt.profiler.workloads.train", "--ckpt", fmt, "--size",
        f"{size_mb:g}",
        "--dir", str(ckpt), "--keep", "0", "--backend", backend, *train,
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench/checkpoint_identity.py: {fmt} {size_mb:g} MB {name} exited "
                 f"{r.returncode}:\n{r.stderr[-3000:]}")  # fmt: skip
    summary = next(json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))
    return json.loads(doc.read_text()), summary


def check_cell(fmt: str, save: tuple, resume: tuple) -> dict[str, Any]:
    """The cell's figures and its verdict ('holds' or 'fails', with each failed check)."""
    doc, summary = save
    saves = {c["path"]: c["save_s"] for c in summary["checkpoints"]}
    found = sorted(c["path"] for c in doc["checkpoints"])
    codepath = fmt.removesuffix("-async")
    failed = []
    if found != sorted(saves):
        failed.append(f"checkpoints {len(found)} against {len(saves)} files written")
    strangers = [
        c["episode"]["codepath"]
        for c in doc["checkpoints"]
        if c["episode"] is not None and c["episode"]["codepath"] != codepath
    ]
    if strangers:
        failed.append(f"{len(strangers)} checkpoint(s) written by {sorted(set(strangers))}")
    timed = [c for c in doc["checkpoints"] if c["stall_s"] is not None and c["path"] in saves]
    misses = [c for c in timed if abs(c["stall_s"] - saves[c["path"]]) > c["resolution_s"]]
    allowed = int(binom.ppf(1 - FALSE_FAILURE, len(timed), 0.05)) if timed else 0
    if not timed:
        failed.append("no stall timed")
    elif len(misses) > allowed:
        failed.append(f"{len(misses)} stalls outside resolution, {allowed} allowed")
    rdoc, rsummary = resume
    restores = rdoc["restores"] or []
    restore: dict[str, Any] = {"job_s": rsummary.get("restore_s"), "wall_s": None}
    if [r["path"] for r in restores] != [rsummary["restored_from"]]:
        failed.append(f"restores {[r['path'] for r in restores]}, not the file read back")
    elif restores[0]["wall_s"] is not None:
        r = restores[0]
        error_s = error_quantile_s(r["resolution_s"], r["timed_by"], FALSE_FAILURE)
        restore.update(wall_s=r["wall_s"], error_s=error_s, lazy=r["lazy"])
        if r["wall_s"] > rsummary["restore_s"] + error_s:
            failed.append(
                f"restore {r['wall_s']:.4f} s above the job's {rsummary['restore_s']:.4f} s"
            )
    return {
        "files": len(saves),
        "checkpoints": len(found),
        "timed": len(timed),
        "misses": len(misses),
        "allowed": allowed,
        "file_event_only": sum(c["episode"] is None for c in doc["checkpoints"]),
        "restore": restore,
        "verdict": "fails" if failed else "holds",
        "failed": failed,
    }


def run_cell(fmt: str, size_mb: float, saves: int, rate: float, backend: str) -> dict[str, Any]:
    every = every_for(size_mb)
    with tempfile.TemporaryDirectory(prefix="serwatt-identity-") as tmp:
        out = Path(tmp)
        steps = saves * every
        save = profile(
            out, "save", fmt, size_mb, rate, backend, "--steps", str(steps), "--every", str(every)
        )
        resume = profile(out, "resume", fmt, size_mb, rate, backend, "--steps", str(steps + every),
                         "--every", str(every), "--resume")  # fmt: skip
    return {"format": fmt, "size_mb": size_mb, "every": every, **check_cell(fmt, save, resume)}


def line(cell: dict[str, Any]) -> str:
    r = cell["restore"]
    restore = (
        "no time (no sample)"
        if r.get("wall_s") is None
        else f"{r['wall_s']:.4f} s (job {r['job_s']:.4f})"
    )
    return (
        f"{cell['format']:<11} {cell['size_mb']:>6g} {cell['files']:>5} {cell['checkpoints']:>5} "
        f"{cell['timed']:>5} {cell['misses']:>3}/{cell['allowed']:<3} {restore:<28} "
        f"{cell['verdict'].upper()}" + (f": {'; '.join(cell['failed'])}" if cell["failed"] else "")
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument(
        "--sizes", default=",".join(f"{s:g}" for s in SIZES_MB), help="MB, comma-separated"
    )
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--json-max-mb", type=float, default=16.0)
    p.add_argument("--json", type=Path, help="write the cells as JSON")
    p.add_argument("--backend", choices=("torch", "numpy"), default="torch")
    args = p.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or args.saves < 1:
        p.error(f"--formats from {','.join(FORMATS)} (not {unknown}); --saves >= 1")
    try:
        sizes = [float(s) for s in args.sizes.split(",") if s]
    except ValueError:
        p.error(f"--sizes: numbers of MB, comma-separated (not {args.sizes!r})")
    cells, skipped = [], []
    print("format        MB files ckpts timed miss    restore (serwatt, job)       verdict")
    for size in sizes:
        for fmt in formats:
            if fmt == "json" and size > args.json_max_mb:
                skipped.append(f"json {size:g} MB (over --json-max-mb {args.json_max_mb:g})")
                continue
            cell = run_cell(fmt, size, args.saves, args.rate, args.backend)
            cells.append(cell)
            print(line(cell), flush=True)
    for s in skipped:
        print(f"skipped: {s}")
    held = sum(c["verdict"] == "holds" for c in cells)
    print(f"cells: {held} of {len(cells)} hold")
    if args.json:
        args.json.write_text(json.dumps({"cells": cells, "skipped": skipped}, indent=1) + "\n")
    return 0 if held == len(cells) else 1


if __name__ == "__main__":
    sys.exit(main())
