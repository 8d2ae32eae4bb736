"""`serwatt demo` end to end: the built-in workload, profiled by the real pipeline."""

from __future__ import annotations

import argparse
import json
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import binom

from serwatt.profiler.cli import demo

REPO = Path(__file__).resolve().parents[2]
# a baseline save missed with no reason the record gives, as measured (docs/benchmarks.md)
UNEXPLAINED_MISS_RATE = 2 / 160


def test_demo_profiles_every_kind_of_work(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "demo", "--workload", "mixed", "--duration", "8",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    cps = doc["codepaths"]
    for cp in ("pickle", "json", "protobuf", "torch", "other"):
        assert cps[cp]["samples"] > 0 and cps[cp]["cpu_s"] > 0, (cp, cps[cp])
    for cp in ("msgpack", "yaml", "safetensors", "many"):
        assert cps[cp]["samples"] == 0
    lines = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("codepath"))
    assert lines[head].split()[:3] == ["codepath", "samples", "CPU-s"]
    assert {ln.split()[0] for ln in lines[head + 1 : head + 11]} == set(cps)
    assert "sampler:" in r.stdout and "elapsed" in r.stderr


def test_a_failing_sampler_is_an_error_line_not_a_traceback(tmp_path: Path) -> None:
    """Fault injection: a py-spy that can never read the workload. The demo must say
    so, stop its workload and exit 1, without a traceback and without waiting out
    the workload's 300 s (on a loaded VM the start alone, torch's import, took 30 s)."""
    import time

    broken = tmp_path / "py-spy"
    broken.write_text("#!/bin/sh\necho 'Error: Failed to get stack traces'\nexit 1\n")
    broken.chmod(0o755)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "demo", "--workload", "mixed", "--duration", "300",
         "--pyspy", str(broken)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "serwatt demo: error: py-spy failed" in r.stderr
    assert "Failed to get stack traces" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 150
    leftover = subprocess.run(
        ["pgrep", "-f", "serwatt.profiler.workloads.demo --duration 300"],
        capture_output=True,
        text=True,
    )
    assert leftover.stdout == "", "the workload was left running"


def test_the_train_demo_refuses_profile_options_it_would_not_use(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "serwatt", "demo", "--rate", "75", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "--rate: profile options apply to --workload mixed" in r.stderr
    assert not (tmp_path / "runs.sqlite").exists()


def test_demo_overlap_is_passed_to_the_candidate_alone() -> None:
    # `serwatt demo --overlap`: the candidate's many.Checkpointer copies during the next step;
    # the baseline's torch.save has nothing to overlap, and without the flag neither does
    parser = argparse.ArgumentParser()
    demo.configure(parser)
    (_, base), (_, cand) = demo.SIDES
    for argv, want in ((["--overlap"], True), ([], False)):
        args = parser.parse_args(argv)
        assert ("--overlap" in shlex.split(demo._train_command(cand, args))) == want
        assert "--overlap" not in shlex.split(demo._train_command(base, args))


@pytest.mark.serial  # eight profiled training runs
def test_the_train_demo_is_serwatt_ab_of_torch_save_against_the_checkpointer(
    tmp_path: Path,
) -> None:
    """`make demo`'s job with fewer steps: torch.save against many.Checkpointer, two runs a
    side, each resumed from a cold page cache; every checkpoint file counted, restores
    measured, the report's headline printed and its files written under --out."""
    r = subprocess.run(
        # the demo's own 64 MB: at 32 MB or less the Checkpointer's copy (its stall) is often
        # too short for a 50 Hz sample, and no stall of a run's 2 saves may be timed
        # the demo's spacing too: 6 steps (~0.3 s here) between saves; at 2 (~0.1 s) a faster
        # CI machine's two saves of a run were 2.5 samples apart and read as one episode
        [sys.executable, "-m", "serwatt", "demo", "--steps", "12", "--every", "6", "--out",
         str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "report.json").read_text())
    runs = doc["ab"]["runs"]
    assert [(x["side"], x["resumed"]) for x in runs] == [
        ("baseline", False), ("baseline", True), ("candidate", False), ("candidate", True)
    ] * 2  # fmt: skip
    assert all(x["exit_code"] == 0 for x in runs)
    for side in ("baseline", "candidate"):
        ck = doc["checkpoint"][side]
        # 2 saves in each run, 2 more in each resumed run (steps 12 -> 24, every 6)
        assert ck["identified_by"] == "file events" and ck["checkpoints"] == 8, ck
        assert doc["restore"][side]["restores"] >= 2, doc["restore"][side]
    # every torch.save is timed but one py-spy did not watch (a save that overlapped the
    # restart between two windows, about 0.3 s in every 5 s, can leave no episode) or one
    # in a window that says its sources were not loaded by the classify deadline (its
    # fsync then reads as no durability call, so the episode ends before the file does),
    # or two whose steps between ran in such a restart, so their stalls were joined as one
    assert doc["checkpoint"]["baseline"]["codepath"] == "torch"
    lost = _saves_not_seen(tmp_path / "runs.sqlite", "%-baseline-%")
    assert len(lost) == doc["checkpoint"]["baseline"]["file_event_only"]
    # and, rarely, one with none of those reasons: the first torch.save of a process with no
    # sample in either py-spy run (2 of 160 baseline saves in ~20 fresh-clone suite runs, 0 of
    # ~250 in runs of the demo's job alone; cause not found, docs/benchmarks.md "The train
    # demo's unexplained misses"). Allowed: what Binomial(8, 2/160) exceeds once in 1,000 runs
    unexplained = [path for path, why in lost if not why]
    allowed = int(binom.ppf(0.999, 8, UNEXPLAINED_MISS_RATE))
    assert len(unexplained) <= allowed, _around(tmp_path / "runs.sqlite", unexplained)
    assert all(x["many_files"] > 0 for x in runs if x["side"] == "candidate")
    assert all(x["restore_cache"] for x in runs if x["resumed"]), runs
    assert r.stdout.startswith("stall per checkpoint: ")  # the headline first
    assert (tmp_path / "report.html").is_file()
    # the defaults give a tested stall: 2 runs a side, each resumed, are 4+4 runs (the
    # run is the unit), where p can reach 0.05; and the first screen fits a terminal
    stall = doc["checkpoint"]["stall_s"]
    assert stall["n"] == [4, 4] and stall["can_reach_significance"], stall
    assert len(r.stdout.splitlines()) <= 40, r.stdout


def _saves_not_seen(db_path: Path, runs: str) -> list[tuple[str, str]]:
    """The checkpoints with no stall of their own of the runs `runs` matches, each with why
    serwatt could not see its save (at most save_s before its file), or "" when it should
    have (one seen without a stall, such as two saves read as one episode):
    "joined" when its save shares a stall joined across a restart gap (_joined_at_gap),
    "gap" when it may have run in a restart between windows (a gap under a second: a
    lost window, such as an abandoned last one, is longer), "deadline" when the window
    it ran in reported sources not loaded by the classify deadline."""
    save_s, margin_s = 0.5, 0.5  # longer than the demo's 64 MB torch.save; py-spy's start
    db = sqlite3.connect(db_path)
    try:
        lost = db.execute(
            "SELECT run_id, path, event_t, timed_by, stall_thread, stall_start FROM checkpoints"
            " WHERE run_id LIKE ? AND stall_s IS NULL",
            (runs,),
        ).fetchall()
        out = []
        for run_id, path, t, timed_by, thread, start in lost:
            if timed_by != "file event only":  # seen, but no stall of its own
                out.append((path, "joined" if _joined_at_gap(db, run_id, thread, start) else ""))
                continue
            rows = db.execute(
                "SELECT started_at, ended_at, notes_json FROM windows WHERE run_id = ?"
                " ORDER BY started_at",
                (run_id,),
            ).fetchall()
            windows = [(a, b) for a, b, _ in rows]
            late = any(
                a <= t
                and t - save_s <= b
                and any("classify deadline" in n for n in json.loads(notes))
                for a, b, notes in rows
            )
            started, ended = db.execute(
                "SELECT started_at, ended_at FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            edges = [started, *(x for w in windows for x in w), ended]
            gaps = [(g0, g1) for g0, g1 in zip(edges[::2], edges[1::2], strict=True)]
            near = any(
                g1 - g0 < 1.0 and g0 - margin_s <= t and t - save_s <= g1 + margin_s
                for g0, g1 in gaps
            )
            out.append((path, "gap" if near else "deadline" if late else ""))
        return out
    finally:
        db.close()


def _joined_at_gap(db: sqlite3.Connection, run_id: str, thread: int | None, start: float) -> bool:
    """Whether the stall that several saves share was joined across a restart gap between
    windows (its unknown_s, time not observed) that falls between two of its files' events:
    the training steps between those saves ran in the gap, so serwatt could not see them
    apart. Two saves read as one inside a window (too close for the episode rules) are
    not excused."""
    row = db.execute(
        "SELECT end, unknown_s FROM episodes WHERE run_id = ? AND thread = ? AND start = ?",
        (run_id, thread, start),
    ).fetchone()
    if row is None or not row[1]:
        return False
    events = [
        t for (t,) in db.execute(
            "SELECT event_t FROM checkpoints WHERE run_id = ? AND stall_start = ?"
            " ORDER BY event_t",
            (run_id, start),
        )
    ]  # fmt: skip
    windows = db.execute(
        "SELECT started_at, ended_at FROM windows WHERE run_id = ? ORDER BY started_at",
        (run_id,),
    ).fetchall()
    gaps = [(a[1], b[0]) for a, b in zip(windows, windows[1:], strict=False)]
    return any(
        t0 <= g1 and g0 <= t1 for t0, t1 in zip(events, events[1:], strict=False) for g0, g1 in gaps
    )


def _around(db_path: Path, paths: list[str]) -> str:
    """What the record holds near each of these checkpoints' file events: its run's windows
    (edges against the event, py-spy's errors, the notes) and the episodes within 3 s, so
    a failure says which part of the pipeline lost the save."""
    db = sqlite3.connect(db_path)
    try:
        out = []
        for path in paths:
            run_id, t, timed_by = db.execute(
                "SELECT run_id, event_t, timed_by FROM checkpoints WHERE path = ?", (path,)
            ).fetchone()
            out.append(f"{path}: {run_id}, timed by {timed_by}")
            for a, b, n, errs, notes in db.execute(
                "SELECT started_at, ended_at, pyspy_samples, pyspy_errors, notes_json"
                " FROM windows WHERE run_id = ? ORDER BY started_at",
                (run_id,),
            ):
                out.append(
                    f"  window {a - t:+.3f}..{b - t:+.3f} s: {n} samples, {errs} errors, {notes}"
                )
            for thread, cp, a, b, n, tb, d in db.execute(
                "SELECT thread, codepath, start, end, samples, timed_by, direction FROM episodes"
                " WHERE run_id = ? AND end >= ? AND start <= ? ORDER BY start",
                (run_id, t - 3.0, t + 3.0),
            ):
                out.append(
                    f"  episode {thread} {cp} {a - t:+.3f}..{b - t:+.3f} s, {n} samples, {tb}, {d}"
                )
        return "\n".join(out)
    finally:
        db.close()
