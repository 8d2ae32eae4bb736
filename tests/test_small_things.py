"""Issue 22 item 5, the small things a user hits: thread-seconds labelled as such beside the
main thread's wall, a negative saving printed as a cost, the assumed cluster said, an
empty checkpoint directory refused, torch_compat chaining within a directory, and every
subcommand quiet when its reader closes the pipe."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from serwatt.profiler import many
from serwatt.profiler.many import torch_compat as ckpt
from serwatt.profiler.records.host import fingerprint
from serwatt.profiler.records.store import Recorder
from serwatt.profiler.report import build_report, default_cluster, load_cluster, render_text
from serwatt.profiler.report.cluster import parse_cluster
from serwatt.profiler.report.render_text import fmt
from tests.records.test_recorder import window
from tests.report_synth import make_run
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[1]
SERWATT = [sys.executable, "-m", "serwatt"]
BROKEN_PIPE_EXIT = 141  # 128 + SIGPIPE, what a shell reports for `yes | head`

THREADS = textwrap.dedent(
    """
    import sys, threading, time

    def spin(until):
        x = 0
        while time.monotonic() < until:
            x += 1

    until = time.monotonic() + float(sys.argv[1])
    threads = [threading.Thread(target=spin, args=(until,)) for _ in range(3)]
    for t in threads:
        t.start()
    spin(until)
    for t in threads:
        t.join()
    """
)


@pytest.mark.serial
def test_wall_time_over_threads_is_labelled_thread_s_beside_the_main_threads_wall(
    tmp_path: Path,
) -> None:
    script, out = tmp_path / "threads.py", tmp_path / "p.json"
    script.write_text(THREADS)
    r = subprocess.run(
        [*SERWATT, "profile", "--json", str(out), "--", sys.executable, str(script), "4"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    other = doc["codepaths"]["other"]
    # four threads spinning 4 s: thread-seconds well past the run's length ...
    assert other["wall_s"] > 1.5 * doc["duration_s"], (other, doc["duration_s"])
    # ... and one thread's wall within it, most of the spin
    assert 2.0 < other["main_thread_wall_s"] <= doc["duration_s"], (other, doc["duration_s"])
    assert all("main_thread_wall_s" in row for row in doc["codepaths"].values())
    assert "thread-seconds" in doc["wall_s_method"]
    head = next(line for line in r.stdout.splitlines() if line.startswith("codepath"))
    assert "thread-s" in head and "main s" in head and "wall s" not in head, head
    row = next(line for line in r.stdout.splitlines() if line.startswith("other "))
    assert f"{other['wall_s']:.2f}" in row and f"{other['main_thread_wall_s']:.2f}" in row, row


def _projection_text(cand_stall_s: float, cluster=None) -> tuple[dict, str]:
    # 4 runs a side: the fewest whose arrangements give the stall ratio an interval
    base = [make_run(f"torch-{i}", seed=i, stall_s=0.4) for i in range(4)]
    cand = [
        make_run(f"many-{i}", seed=10 + i, codepath="many", ckpt_cpu_s=0.5, stall_s=cand_stall_s)
        for i in range(4)
    ]
    report = build_report(base, cand, cluster=cluster or default_cluster())
    return report["projection"], render_text(report)


def _row(text: str, label: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(label))


# storage fast enough that the measured stalls, not its bandwidth, set each δ
FAST_STORAGE = "storage_write_gb_s: 1000000\n"


def test_a_negative_saving_is_printed_as_a_cost() -> None:
    fast = parse_cluster(FAST_STORAGE, Path("fast.yaml"))
    proj, text = _projection_text(cand_stall_s=1.6, cluster=fast)  # the candidate stalls 4x
    gpu_h = proj["saved"]["gpu_h"]
    assert gpu_h["value"] < 0, gpu_h
    row = _row(text, "GPU-h / year")
    assert f"costs {fmt(-gpu_h['value'])}" in row, row
    lo, hi = gpu_h["ci95"]
    assert f"[{fmt(-hi)}, {fmt(-lo)}]" in row, row  # the cost's interval
    saved_cell = row.split(fmt(proj["candidate"]["gpu_hours_per_year"]), 1)[1]
    assert "-" not in saved_cell and "−" not in saved_cell, row
    assert f"costs {fmt(-proj['saved']['lost_fraction'])}" in _row(text, "lost fraction")
    assert "costs N: a negative saving" in text
    # a positive saving stays a plain number
    proj, text = _projection_text(cand_stall_s=0.1, cluster=fast)
    assert proj["saved"]["gpu_h"]["value"] > 0
    assert "costs" not in _row(text, "GPU-h / year") and "costs N:" not in text


def test_the_projection_says_in_one_line_when_the_cluster_is_assumed(tmp_path: Path) -> None:
    proj, text = _projection_text(cand_stall_s=0.1)
    lines = [line for line in text.splitlines() if "cluster assumed" in line]
    assert len(lines) == 1 and "no --cluster FILE.yaml" in lines[0], lines
    assert "Llama 3 405B" in lines[0] and "arXiv 2407.21783" in lines[0], lines
    assert proj["cluster_assumed"] == lines[0].strip()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("gpus: 64\ngpus_per_node: 8\n")
    proj, text = _projection_text(cand_stall_s=0.1, cluster=load_cluster(cluster))
    assert proj["cluster_assumed"] is None and "cluster assumed" not in text


@pytest.fixture()
def record(tmp_path: Path) -> Path:
    path = tmp_path / "runs.sqlite"
    rec = Recorder(path)
    t0 = 1_800_000_000.0
    for i, run_id in enumerate(("run-a", "run-b")):
        start = t0 + 100 * i
        rec.start_run(
            run_id, "trainer", host=fingerprint(), config={}, sources={"energy": "model"},
            started_at=start,
        )  # fmt: skip
        for k in range(3):
            rec.append_window(run_id, window(pid=11, t0=start + 5 * k, seed=k + 3 * i))
        rec.finish_run(run_id, start + 20)
    rec.close()
    return path


@pytest.mark.parametrize("present", [[], ["ckpt-1.pt", "notes.txt"]])
def test_report_checkpoints_over_no_many_files_is_refused(
    capsys: pytest.CaptureFixture[str], record: Path, tmp_path: Path, present: list[str]
) -> None:
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    for name in present:
        (ckpts / name).write_bytes(b"not a .many file")
    argv = ["report", "--db", str(record), "--baseline", "run-a", "--candidate", "run-b"]
    r = serwatt(capsys, *argv, "--allow-mismatch", "--checkpoints", str(ckpts))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and f"no .many files in {ckpts}" in r.stderr, r.stderr
    assert "sound" not in r.stdout
    # the same report with a .many file there goes through and verifies it
    many.save(ckpts / "ckpt-2.many", {"w": np.arange(4.0)})
    json_out = tmp_path / "r.json"
    r = serwatt(capsys, *argv, "--allow-mismatch", "--checkpoints", str(ckpts), "--json",
                str(json_out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    files = json.loads(json_out.read_text())["checkpoint_files"]
    assert files["files"] == 1 and files["sound"] is True, files


def _state(k: int) -> dict:
    return {"step": k, "w": np.full(8, float(k))}


def test_torch_compat_save_chains_within_its_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    receipts = [ckpt.save(_state(k), run / f"ckpt-{k}.many") for k in range(3)]
    prevs = [many.load(run / f"ckpt-{k}.many").prev_receipt for k in range(3)]
    assert prevs == [None, receipts[0], receipts[1]]
    chain = ckpt.directory_chain(run)
    assert chain == [str(run / f"ckpt-{k}.many") for k in range(3)]
    assert many.verify_chain(chain) == []
    # the same path saved again chains to the newest other file, never to itself
    again = ckpt.save(_state(9), run / "ckpt-2.many")
    assert many.load(run / "ckpt-2.many").prev_receipt == receipts[1] != again
    # a file that is not .many is passed over
    (run / "ckpt-3.many").write_bytes(b"PK\x03\x04 a torch.save zip")
    ckpt.save(_state(4), run / "ckpt-4.many")
    assert many.load(run / "ckpt-4.many").prev_receipt == again
    # another directory is another chain
    other = tmp_path / "other"
    other.mkdir()
    ckpt.save(_state(0), other / "a.many")
    assert many.load(other / "a.many").prev_receipt is None


def test_torch_compat_save_with_prev_none_or_a_file_object_starts_no_chain(
    tmp_path: Path,
) -> None:
    first = ckpt.save(_state(0), tmp_path / "ckpt-0.many")
    ckpt.save(_state(1), tmp_path / "ckpt-1.many", prev=None)
    assert many.load(tmp_path / "ckpt-1.many").prev_receipt is None
    ckpt.save(_state(2), tmp_path / "ckpt-2.many", prev=first)
    assert many.load(tmp_path / "ckpt-2.many").prev_receipt == first
    buf = io.BytesIO()
    ckpt.save(_state(3), buf)
    (tmp_path / "from-buffer.bin").write_bytes(buf.getvalue())
    assert many.load(tmp_path / "from-buffer.bin").prev_receipt is None


@pytest.fixture()
def many_file(tmp_path: Path) -> Path:
    path = tmp_path / "wide.many"
    many.save(path, {f"slot{i:05d}": np.zeros(2) for i in range(3000)})  # > a pipe's 64 KiB
    return path


def _closed_pipe_run(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """serwatt ARGV with stdout a pipe whose reader has already gone: every write is EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [*SERWATT, *argv], cwd=REPO, stdout=write_end, stderr=subprocess.PIPE, timeout=120
        )
    finally:
        os.close(write_end)


def _reader_closes_after_one_line(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """serwatt ARGV | head -1: the reader takes a line, then closes the pipe."""
    p = subprocess.Popen(
        [*SERWATT, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    code = p.wait(timeout=120)
    return subprocess.CompletedProcess(argv, code, first, err)


def _assert_quiet(r: subprocess.CompletedProcess[bytes]) -> None:
    err = r.stderr.decode(errors="replace")
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    assert r.returncode == BROKEN_PIPE_EXIT, (r.returncode, err)


def test_every_subcommand_exits_quietly_when_its_reader_is_gone(
    many_file: Path, record: Path
) -> None:
    for argv in (
        ["many", "inspect", str(many_file)],
        ["many", "verify", str(many_file)],
        ["runs", "list", "--db", str(record)],
        ["runs", "show", "run-a", "--db", str(record)],
        ["check-config", str(REPO / "configs" / "serwatt.example.yaml")],
    ):
        _assert_quiet(_closed_pipe_run(argv))
    r = _reader_closes_after_one_line(["many", "inspect", str(many_file)])
    assert r.stdout.startswith(b"file"), r.stdout
    _assert_quiet(r)
