"""Every bench/ script run at smoke size, in seconds: its output has the bench's shape, and
each verdict it prints is the one its own printed interval gives (worked out here with
plain comparisons, not with profiler/intervals.py). Figures are not checked: the benches
measure them (docs/benchmarks.md), so most of these run beside other tests. The ones whose
target or workload keeps a CPU busy for more than a few seconds are `serial`.
bench/checkpoint.py's smoke test is tests/test_bench_checkpoint.py."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.collectors.nvml import NvmlCollector
from serwatt.profiler.intervals import Interval, mean_interval
from serwatt.profiler.service.config import load_config
from tests.benches import BENCH_DIR, load_bench
from tests.nvml_replay import ReplayNvmlBackend

REPO = BENCH_DIR.parent
NUM = r"(-?[0-9.]+|nan)"
VERDICTS = {"confirmed", "not met", "undecided"}


def bench(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH_DIR / name), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def at_least(lo: float, hi: float, goal: float) -> str:
    """The verdict of `quantity >= goal` from its interval."""
    return "confirmed" if lo >= goal else "not met" if hi < goal else "undecided"


def at_most(lo: float, hi: float, goal: float) -> str:
    return "confirmed" if hi <= goal else "not met" if lo > goal else "undecided"


def band(lo: float, hi: float, low: float, high: float) -> str:
    if hi < low or lo > high:
        return "not met"
    return "confirmed" if lo >= low and hi <= high else "undecided"


# ---------------------------------------------------------------------------- record_append


def test_record_append_prints_the_mean_per_append_with_its_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ra = load_bench("record_append")
    out = tmp_path / "fig.json"
    assert (
        ra.main(["--windows", "40", "--blocks", "4", "--dir", str(tmp_path), "--json", str(out)])
        == 0
    )
    text = capsys.readouterr().out
    fig = json.loads(out.read_text())
    assert fig["windows_stored"] == 40 and fig["blocks"] == 4
    assert len(fig["wall_s_per_append_by_block"]) == len(fig["cpu_s_per_append_by_block"]) == 4
    for part in ("wall", "cpu"):
        lo, hi = fig[f"{part}_s_per_append_ci95"]
        assert lo <= fig[f"{part}_s_per_append"] <= hi
        m = re.search(rf"{part} per append:\s+{NUM} ms \(95% CI {NUM}-{NUM}, Student t, 3 df\)",
                      text, re.I)  # fmt: skip
        assert m, text
        assert float(m.group(1)) == pytest.approx(fig[f"{part}_s_per_append"] * 1e3, abs=5e-4)
    assert fig["bytes_per_window"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["fig.json"]  # the record is removed


def test_record_append_with_one_block_says_why_it_has_no_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ra = load_bench("record_append")
    assert ra.main(["--windows", "5", "--blocks", "1", "--dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.count("(no interval: 1 value: an interval needs 2)") == 2, text
    with pytest.raises(SystemExit) as exc:
        ra.main(["--windows", "3", "--blocks", "5", "--dir", str(tmp_path)])
    assert exc.value.code == 2


# ---------------------------------------------------------------------------- record_validation


def test_record_validation_compares_each_library_on_the_same_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rv = load_bench("record_validation")
    out = tmp_path / "fig.json"
    args = ["--windows", "8", "--blocks", "2", "--dir", str(tmp_path), "--json", str(out)]
    assert rv.main(args) == 0
    text = capsys.readouterr().out
    fig = json.loads(out.read_text())
    assert fig["rows"] == 8 * 10 and fig["blocks"] == 2
    # every checker refuses every damaged row, the record's own included
    assert fig["let_through"] == {"record": [], "pydantic": [], "msgspec": []}, fig["let_through"]
    assert text.count("refuses every damaged row") == 3, text
    for lib in ("pydantic", "msgspec"):
        f = fig["libraries"][lib]
        lo, hi = f["read_ratio_ci95"]
        assert lo <= f["read_ratio"] <= hi
        assert f["read_verdict"] == at_most(lo, hi, 1.0)
        lo, hi = f["write_extra_share_ci95"]
        assert f["write_verdict"] == at_most(lo, hi, 0.01)
        assert f["startup_s"] > 0
        m = re.search(rf"{lib}\s+read: {NUM} us per row, {NUM} \(95% CI", text)
        assert m and float(m.group(2)) == pytest.approx(f["read_ratio"], abs=5e-3), text
    assert [p.name for p in tmp_path.iterdir()] == ["fig.json"]  # the record is removed


# ---------------------------------------------------------------------------- overhead


def check_overhead_lines(stdout: str, *, unit: str, goal: float) -> None:
    """The bench's lines parse, and each verdict is the one its printed interval gives."""
    assert re.search(r"^per-pair ratio B/mean\(A neighbours\): [0-9.]+, [0-9.]+$", stdout, re.M)
    word = rf"goal >= {re.escape(f'{goal:g}')} (CONFIRMED|NOT MET|undecided)"
    lines = {
        "throughput": rf"^throughput ratio profiled/unprofiled: {NUM} \(95% CI {NUM}\.\.{NUM}, "
        rf"Student t, 1 df; min [0-9.]+, max [0-9.]+\): {word}",
        "factor 2": rf"^factor 2, {unit} per target CPU-second, profiled/unprofiled: .*; mean "
        rf"{NUM} \(95% CI {NUM}\.\.{NUM}, Student t, 1 df\): {word}",
    }
    for name, pattern in lines.items():
        m = re.search(pattern, stdout, re.M)
        assert m, (name, stdout)
        mean, lo, hi = (float(m.group(i)) for i in (1, 2, 3))
        assert lo <= mean <= hi
        assert m.group(4).lower() == at_least(lo, hi, goal), m.group(0)
    assert re.search(r"^factor 1, target CPU share of wall, .*run-queue wait", stdout, re.M)
    assert re.search(r"^serwatt CPU while profiling .*: [0-9.]+% of one core \(min ", stdout, re.M)


@pytest.mark.serial  # its target serializes flat out for ~12 s
def test_overhead_bench_smoke() -> None:
    r = bench("overhead.py", "--rate", "20", "--phase", "1", "--pairs", "2", "--timing-rate", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^overhead, loop: 20 Hz, stack-change run 0 Hz, .* ops/s", r.stdout, re.M)
    check_overhead_lines(r.stdout, unit="ops", goal=0.99)


@pytest.mark.serial  # a DataLoader job with 2 workers trains flat out for ~30 s
def test_overhead_bench_dataloader_smoke() -> None:
    # serwatt profile's default rates; 2 s phases: the job's main thread reports after a
    # step, and a 1 s phase under a busy machine may hold fewer than two reports; a 4 s
    # settle, not the bench's 60 (the smoke checks the path, not the settled rate)
    r = bench("overhead.py", "--workload", "dataloader", "--phase", "2", "--pairs", "2",
              "--settle", "4", timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^cpu budget: [0-9]+ Hz after 4 s$", r.stdout, re.M), r.stdout
    assert re.search(
        r"^overhead, dataloader: 50 Hz, stack-change run 200 Hz, 2 pairs of 2 s phases; "
        r"unprofiled [0-9.]+ steps/s .*, profiled [0-9.]+ steps/s$",
        r.stdout,
        re.M,
    ), r.stdout
    check_overhead_lines(r.stdout, unit="steps", goal=0.97)


def test_overhead_verdict_without_an_interval_says_why() -> None:
    ov = load_bench("overhead")
    one = mean_interval([1.2])
    assert ov.verdict(one) == "goal >= 0.99 undecided (1 value: an interval needs 2)"
    assert ov.ci_text(one) == "no 95% CI: 1 value: an interval needs 2"
    assert ov.verdict(Interval(1.0, 0.995, 1.01, 6, 5, "t")) == "goal >= 0.99 CONFIRMED"
    assert ov.verdict(Interval(0.9, 0.85, 0.95, 6, 5, "t")) == "goal >= 0.99 NOT MET"


# ---------------------------------------------------------------------------- daemon


@pytest.mark.long  # a daemon over workloads
def test_daemon_bench_smoke(tmp_path: Path) -> None:
    fig_path = tmp_path / "daemon.json"
    r = bench(
        "daemon.py", "--targets", "1", "--rate", "20", "--watch-s", "6", "--window-s", "1",
        "--phase-s", "1", "--pairs", "2", "--json", str(fig_path), timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    fig = json.loads(fig_path.read_text())
    goals = fig["goals"]
    assert list(goals) == [
        "cpu < 10% of one core",
        "every window at 20 Hz",
        "RSS < 150 MB",
        "serialization share within 2 pp of the truth",
        "RSS flat (|slope| <= 1 MB/min)",
        "throughput ratio >= 0.99 (wall)",
        "throughput ratio >= 0.99 (CPU)",
    ]
    assert goals["every window at 20 Hz"] in ("met", "not met"), goals
    # the CPU and accuracy goals: verdicts from the intervals over the watch's segments
    # (6 s of 1 s windows: segments of ~2 s, cut where the 2 s RSS poll passes one),
    # each segment's figures in the JSON
    segments = fig["segments"]
    assert len(segments) >= 2, segments
    for name, values in (
        ("segment_cpu_pct_of_one_core", [g["cpu_pct_of_one_core"] for g in segments]),
        (
            "segment_serialization_error_pp",
            [g["serialization_cpu_share_error_pp"] for g in segments],
        ),
    ):
        iv = mean_interval(values)
        assert fig[name]["mean"] == pytest.approx(iv.estimate, abs=1e-3), name
        assert fig[name]["ci95"] == pytest.approx([iv.lo, iv.hi], abs=1e-3), name
    for g in segments:
        assert g["serialization_cpu_share_error_pp"] == pytest.approx(
            g["error_pp"]["pickle"] + g["error_pp"]["json"], abs=0.011
        ), g
        assert g["error_pp"]["other"] == pytest.approx(
            -g["serialization_cpu_share_error_pp"], abs=0.011
        ), g
    lo, hi = fig["segment_cpu_pct_of_one_core"]["ci95"]
    assert goals["cpu < 10% of one core"] == at_most(lo, hi, 10.0)
    lo, hi = fig["segment_serialization_error_pp"]["ci95"]
    assert goals["serialization share within 2 pp of the truth"] == band(lo, hi, -2.0, 2.0)
    # the cost floor: py-spy's CPU over the samples asked for (1 target, 2 runs, 20 Hz)
    floor = fig["cost_floor"]
    assert floor["pyspy_samples_per_s"] == 40
    assert floor["pyspy_ms_per_sample"] == pytest.approx(
        1000 * fig["cpu_pct_pyspy_children"] / 100 / 40, rel=0.01
    )
    # per codepath: the daemon's shares and the in-process truth's each cover the targets'
    # CPU, the serialization share is pickle + json, and its goal reads off its error
    shares = fig["codepath_shares"]
    assert list(shares) == ["pickle", "json", "other"], shares
    for who in ("daemon", "truth"):
        assert sum(f[who] for f in shares.values()) == pytest.approx(1, abs=2e-4), shares
    for f in shares.values():
        assert f["error_pp"] == pytest.approx(100 * (f["daemon"] - f["truth"]), abs=0.02), f
    # the target serializes ~2 ms in every ~20 ms, pickle and json alike: both timed
    assert all(0.01 < shares[cp]["truth"] < 0.9 for cp in ("pickle", "json")), shares
    assert fig["serialization_cpu_share_daemon"] == pytest.approx(
        shares["pickle"]["daemon"] + shares["json"]["daemon"], abs=2e-4
    )
    for cp, f in shares.items():
        assert re.search(rf"^    {cp} +{f['daemon']:.3f} / {f['truth']:.3f} ", r.stdout, re.M), cp
    assert fig["competitors"] == 0
    assert goals["RSS < 150 MB"] == ("met" if fig["rss_mb_max"] < 150 else "not met")
    # three RSS samples 2 s apart: a slope and its interval
    lo, hi = fig["rss_slope_ci95"]
    assert lo <= fig["rss_slope_mb_per_min"] <= hi
    assert goals["RSS flat (|slope| <= 1 MB/min)"] == band(lo, hi, -1.0, 1.0)
    for part, name in (("wall", "(wall)"), ("cpu", "(CPU)")):
        lo, hi = fig[f"throughput_ratio_{part}_ci95"]
        assert len(fig[f"throughput_ratio_{part}_pairs"]) == 2
        assert lo <= fig[f"throughput_ratio_{part}_mean"] <= hi
        assert fig[f"throughput_ratio_{part}_verdict"] == at_least(lo, hi, 0.99)
        assert goals[f"throughput ratio >= 0.99 {name}"] == at_least(lo, hi, 0.99)
    for name, v in goals.items():
        assert re.search(rf"^  {re.escape(v.upper())} +{re.escape(name)}$", r.stdout, re.M), name
    # --recompute reads the per-pair ratios back and gives the same verdicts
    again = bench("daemon.py", "--recompute", str(fig_path))
    assert again.returncode == 0, again.stderr
    said = re.findall(r">= 0\.99 (confirmed|not met|undecided)$", again.stdout, re.M)
    want = [fig["throughput_ratio_wall_verdict"], fig["throughput_ratio_cpu_verdict"]]
    assert said == want, again.stdout


def test_daemon_bench_recompute_refuses_other_json(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"goals": {}}')
    r = bench("daemon.py", "--recompute", str(other))
    assert r.returncode == 2
    assert "no throughput_ratio_wall_pairs (not a bench/daemon.py --json output)" in r.stderr


def test_daemon_bench_throughput_without_two_pairs_is_undecided() -> None:
    fig = load_bench("daemon").throughput_figures([1.01], [0.98])
    assert fig["throughput_ratio_wall_ci95"] is None
    assert (
        fig["throughput_ratio_wall_verdict"] == fig["throughput_ratio_cpu_verdict"] == "undecided"
    )


# ---------------------------------------------------------------------------- accuracy


@pytest.mark.serial  # two busy serializer threads' worth of profiling, ~15 s
def test_accuracy_bench_smoke() -> None:
    # the contended two-thread condition (issue 21): two threads beside a busy process
    r = bench(
        "accuracy.py", "--rate", "50", "--duration", "2", "--window", "1", "--repeats", "2",
        "--timing-rate", "0", "--threads", "2", "--busy", "1", "--truth-waits",
    )  # fmt: skip
    assert (
        "== mix, 2 busy thread(s), 1 busy process(es), cpu_source estimate: 2 repeat(s)" in r.stdout
    ), r.stdout
    assert r.returncode in (0, 1), r.stderr[-3000:]
    rows = re.findall(
        rf"^(pickle|json|protobuf|msgpack|other) +{NUM}% +{NUM}% +([+-][0-9.]+|nan) "
        rf"\[([+-][0-9.]+|nan), ([+-][0-9.]+|nan)\]$",
        r.stdout,
        re.M,
    )
    assert [row[0] for row in rows] == ["pickle", "json", "protobuf", "msgpack", "other"], r.stdout
    truth = [float(row[1]) for row in rows]
    assert sum(truth) == pytest.approx(100.0, abs=0.05)
    m = re.search(
        rf"^worst codepath \|error\| per repeat: ([0-9.]+), ([0-9.]+) pp; mean {NUM} pp "
        rf"\(95% CI {NUM}-{NUM}, Student t, 1 df\); goal <= 2 pp: (confirmed|not met|undecided)$",
        r.stdout,
        re.M,
    )
    assert m, r.stdout
    mean, lo, hi = (float(m.group(i)) for i in (3, 4, 5))
    assert mean == pytest.approx((float(m.group(1)) + float(m.group(2))) / 2, abs=0.006)
    assert m.group(6) == at_most(lo, hi, 2.0)
    assert r.returncode == (1 if m.group(6) == "not met" else 0)
    # --truth-waits: where the threads' run-queue wait fell, per codepath, beside serwatt's
    # shares (the same figures as the table above) and the (CPU + wait) shares
    waits = re.findall(
        rf"^(pickle|json|protobuf|msgpack|other) +{NUM}s +{NUM}s +{NUM} +{NUM}% +{NUM}%$",
        r.stdout.split("run-queue wait by codepath", 1)[-1],
        re.M,
    )
    assert [w[0] for w in waits] == ["pickle", "json", "protobuf", "msgpack", "other"], r.stdout
    cpu_s = [float(w[1]) for w in waits]
    wait_s = [float(w[2]) for w in waits]
    assert sum(cpu_s) > 0.5 and all(w >= 0 for w in wait_s), waits
    runnable = sum(cpu_s) + sum(wait_s)
    # seconds printed to 1 ms: a share's numerator is off by 1 ms at most, its denominator
    # by 5 ms, and the share is printed to 0.005
    tol = 100 * (0.001 + 0.005) / runnable + 0.005
    for w, c, d in zip(waits, cpu_s, wait_s, strict=True):
        assert float(w[4]) == pytest.approx(100 * (c + d) / runnable, abs=tol)
    assert [float(w[5]) for w in waits] == pytest.approx([float(row[2]) for row in rows], abs=0.011)


def test_accuracy_bench_refuses_one_repeat() -> None:
    r = bench("accuracy.py", "--repeats", "1")
    assert r.returncode == 2 and "--repeats must be >= 2: the verdict needs an interval" in r.stderr


# ---------------------------------------------------------------------------- ab


@pytest.mark.serial  # two `serwatt profile` runs of a torch training loop
def test_ab_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "ab"
    r = bench(
        # six saves a side: with three, a loaded machine's windows missed every one of a
        # side's. 16 MB at 200 Hz: each ~20 ms save is its own episode, two steps (~30 ms,
        # over the episode rules' 2-tick merge) apart; 1 MB saves at 50 Hz all fall in one
        "ab.py", "--repeats", "1", "--steps", "12", "--every", "2", "--size", "16",
        "--rate", "200", "--out", str(out), timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(
        r"^1 repeats per side, interleaved, 12 steps, a 16 MB checkpoint", r.stdout, re.M
    )
    for side, ckpt in (("baseline", "torch"), ("candidate", "many")):
        # the checkpoints are the six files each side wrote (the runs watch their directory),
        # through the side's codepath, or none named when a loaded machine timed none of
        # the six (a CI run: every save untimed); never another codepath's episodes
        line = re.search(
            rf"^  {side} +(\S+): 6 checkpoints \(([0-9]+) file event only\), stall p50 ",
            r.stdout,
            re.M,
        )
        assert line, (side, r.stdout)
        assert line.group(1) == ckpt or line.groups() == ("None", "6"), (side, r.stdout)
    ck = json.loads((out / "report.json").read_text())["checkpoint"]
    for metric in ("stall_s", "cpu_s"):
        m = ck.get(metric)
        if m is None:  # a side with no timed stall: the bench prints the report's note
            assert f"  {metric}: not compared ({ck['note']})" in r.stdout, r.stdout
            continue
        line = re.search(
            rf"^  {metric} per checkpoint: ratio .* n (\d+)\+(\d+): (.+)$", r.stdout, re.M
        )
        assert line, r.stdout
        assert [int(line.group(1)), int(line.group(2))] == m["n"]
        assert line.group(3) == m["verdict"]
        if m["ci95"] is None:  # too few checkpoints: the report's reason is printed
            assert m["ci_note"] and f"({m['ci_note']})" in line.group(0)
    assert (out / "report.html").is_file()


# ---------------------------------------------------------------------------- classify_cost


def test_classify_cost_bench_smoke() -> None:
    r = bench("classify_cost.py", "--repeat", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^samples: [1-9][0-9]* \(mean depth [0-9.]+ frames\), median of 1 runs$",
                     r.stdout, re.M)  # fmt: skip
    assert "call-site prefilter: on" in r.stdout
    labels = [
        "cold (fresh classifier, parses sources)",
        "cold, leaves read from host paths",
        "new stack, warm rule/source caches",
        "warm (stack cache hit)",
    ]
    cases = re.findall(r"^([^:\n]+): +([0-9.]+) us/sample", r.stdout, re.M)
    assert [c for c, _ in cases] == labels, r.stdout
    assert all(float(us) > 0 for _, us in cases)
    parsed = re.search(r"source files parsed (\d+), read but not parsed (\d+)", r.stdout)
    assert parsed and int(parsed.group(1)) + int(parsed.group(2)) > 0, r.stdout


# ---------------------------------------------------------------------------- many_proofs


@pytest.mark.long  # the proofs bench
def test_many_proofs_bench_smoke(tmp_path: Path) -> None:
    work, out = tmp_path / "proofs", tmp_path / "proofs.json"
    r = bench(
        "many_proofs.py", "--dir", str(work), "--sizes-mb", "16", "--save-mb", "4",
        "--hash-mb", "8", "--proof-n", "50", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert not work.exists()  # its files are deleted at the end
    fig = json.loads(out.read_text())
    assert [(row["state_mib"], row["k"]) for row in fig["update"]] == [
        (16, k) for k in (1, 2, 16, 64)
    ]
    assert fig["save"]["state_bytes"] == 4 << 20
    assert [row["slots"] for row in fig["load"]] == [200]
    assert set(fig["hash"]) == {"blake3 1 thread", "blake3 AUTO threads", "sha256 (hashlib)"}
    proofs = fig["proofs"]
    assert {"CPython allocator", "PYTHONMALLOC=malloc", "tracemalloc", "seccomp"} <= set(proofs)
    # the verdict: the update survives the kill-on-mmap filter, and the filter is live
    assert proofs["seccomp"] == {"survived": True, "signal": None, "control": "SIGSYS"}
    assert (
        "seccomp kill filter: 50 calls survived; control (one mmap after the filter): SIGSYS"
        in r.stdout
    )


# ---------------------------------------------------------------------------- remote_write


@pytest.mark.long  # Prometheus remote-writing
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus")
def test_remote_write_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "rw.json"
    r = bench(
        "remote_write.py", "--nodes", "2", "--scrape-s", "0.5", "--warmup-s", "6", "--blocks", "3",
        "--block-s", "1", "--send-deadline-s", "0.5", "--json", str(out), timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    fig = json.loads(out.read_text())
    assert fig["nodes"] == 2 and fig["series_per_node"] > 0
    assert 2 <= fig["blocks"] == len(fig["per_block"]) <= 3
    lo, hi = fig["ci95"]
    assert lo <= fig["bytes_per_sample"] <= hi and fig["bytes_per_sample"] > 0
    m = re.search(rf"^remote_write: {NUM} bytes/sample \(95% CI {NUM}-{NUM}, (\d) blocks of 1 s\)",
                  r.stdout, re.M)  # fmt: skip
    assert m and int(m.group(4)) == fig["blocks"], r.stdout


# ---------------------------------------------------------------------------- sampler_choice


def test_sampler_choice_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "sc.json"
    r = bench("sampler_choice.py", "--rounds", "1", "--window-s", "1", "--alias-s", "1",
              "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    fig = json.loads(out.read_text())
    assert fig["austin"] is None and Path(fig["pyspy"]).name == "py-spy"
    assert len(fig["cost_pct_of_one_core"]["py-spy"]) == 1
    assert len(fig["periodic_busy_share"]["py-spy"]) == 2  # rounds + 1
    assert all(0 <= s <= 1 for s in fig["periodic_busy_share"]["py-spy"])
    assert re.search(r"^py-spy  1 s at 50 Hz: [0-9.]+% of one core$", r.stdout, re.M), r.stdout
    assert "share of samples in busy() (truth 0.20)" in r.stdout


# ---------------------------------------------------------------------------- soak


def _rss_samples(slope_mb_per_min: float, n: int = 60) -> list[tuple[float, float, int, int]]:
    # every 2 s, a small alternating wiggle so the slope has a nonzero standard error
    return [(2.0 * i, 40.0 + slope_mb_per_min * 2.0 * i / 60 + 0.01 * (-1) ** i, 20, 9)
            for i in range(n)]  # fmt: skip


def test_soak_rss_verdicts_come_from_the_slope_interval() -> None:
    soak = load_bench("soak")
    grows = soak.rss_check(_rss_samples(1.0), 0.0025, 120.0, warmup_s=0.0)
    assert grows.verdict == "not met" and grows.figures["ci95"][0] > 0.0025, grows
    flat = soak.rss_check(_rss_samples(0.0), 0.5, 120.0, warmup_s=0.0)
    assert flat.verdict == "confirmed" and flat.figures["ci95"][1] <= 0.5, flat
    lo, hi = flat.figures["ci95"]
    straddle = soak.rss_check(_rss_samples(0.0), (lo + hi) / 2, 120.0, warmup_s=0.0)
    assert straddle.verdict == "undecided"
    short = soak.rss_check(_rss_samples(0.0, n=12), 0.5, 24.0)  # warm-up 8 s leaves 8 samples
    assert (
        short.verdict == "undecided" and short.detail == "fewer than 10 samples after the warm-up"
    )


@pytest.mark.serial  # 8 churning Python targets keep more than a CPU busy
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus")
def test_soak_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    r = bench(
        "soak.py", "--minutes", "0.1", "--window-s", "1", "--sighup-s", "2", "--json", str(out),
        timeout=240,
    )  # fmt: skip
    checks = json.loads(out.read_text())
    names = [c["name"] for c in checks]
    assert names == ["rss", "rss_bound", "fds", "threads", "windows", "reloads", "prometheus",
                     "record", "kills"], (names, r.stderr[-3000:])  # fmt: skip
    for c in checks:
        allowed = VERDICTS if c["name"] == "rss" else {"holds", "fails"}
        assert c["verdict"] in allowed, c
        assert re.search(rf"^{c['name']} +{c['verdict'].upper()} ", r.stdout, re.M), c["name"]
    # 6 s leaves too few RSS samples after the warm-up: said, not decided
    assert checks[0]["verdict"] == "undecided" and "fewer than 10 samples" in checks[0]["detail"]
    assert r.returncode == 1  # an undecided check is not a pass
    reloads = checks[5]["figures"]
    assert reloads["sighups"] >= 2 and checks[5]["verdict"] == (
        "holds" if reloads["reloaded_lines"] == reloads["sighups"] else "fails"
    )


# ---------------------------------------------------------------------------- nvml_smoke

# one GPU busy for the replay's first 2 s, idle after (tests/nvml_replay.py's format)
REPLAY = {
    "driver": {"clock": "boottime", "buffer_depth": 120},
    "gpus": [
        {
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-00000000-0000-0000-0000-smoke0000000",
            "mig": 0,
            "period_s": 1 / 6,
            "energy_counter": True,
            "idle_w": 70.0,
            "busy_w": 690.0,
            "pids": ["target"],
            "segments": [{"until_s": 2.0, "busy": 100}, {"until_s": 1e9, "busy": 0}],
        }
    ],
}


def _replayed(monkeypatch: pytest.MonkeyPatch):
    smoke = load_bench("nvml_smoke")
    monkeypatch.setattr(
        smoke,
        "NvmlCollector",
        lambda: NvmlCollector(ReplayNvmlBackend(REPLAY, target_pids=[os.getpid()])),
    )
    return smoke


def test_nvml_smoke_prints_what_the_driver_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    smoke = _replayed(monkeypatch)
    assert smoke.main(["--seconds", "0.6", "--poll-s", "0.2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^gpu 0: NVIDIA H100 80GB HBM3 GPU-\S+ up$", out, re.M), out
    assert re.search(r"^clock: domain=boottime offset_s=-?[0-9.]+ newest_sample_lag_s=[0-9.]+$",
                     out, re.M), out  # fmt: skip
    m = re.search(r"^gpu 0: sample_period_s=0\.1667 window_s=([0-9.]+) covered_s=[0-9.]+ "
                  r"busy_s=([0-9.]+) idle_s=[0-9.]+ .* energy_j=\S+ \(\w+\) pids=\[(\d+)\]$",
                  out, re.M)  # fmt: skip
    assert m and int(m.group(3)) == os.getpid(), out


def test_nvml_smoke_burn_without_cuda_is_undecided_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    smoke = _replayed(monkeypatch)
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the burn would run (bench/nvml_smoke.py --burn)")
    assert smoke.main(["--seconds", "0.4", "--poll-s", "0.2", "--burn"]) == smoke.EXIT_UNDECIDED
    out = capsys.readouterr().out
    assert "burn verdict (gpu None): undecided" in out
    assert re.search(r"^  the burn did not run: \w+", out, re.M), out


# ---------------------------------------------------------------------------- live_systemd.sh

LIVE = BENCH_DIR / "live_systemd.sh"


def test_live_systemd_script_parses() -> None:
    r = subprocess.run(["bash", "-n", str(LIVE)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_live_systemd_dry_run_writes_the_installation_and_boots_nothing(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    env = {**os.environ, "TREE": str(tree)}
    r = subprocess.run(["bash", str(LIVE), "--dry-run"], capture_output=True, text=True,
                       timeout=60, env=env)  # fmt: skip
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.search(rf"^dry run: would boot: systemd-nspawn --boot .* -D {re.escape(str(tree))} ",
                     r.stdout, re.M), r.stdout  # fmt: skip
    system = tree / "etc/systemd/system"
    assert (system / "serwatt.service").read_bytes() == (
        REPO / "configs/systemd/serwatt.service"
    ).read_bytes()
    drop_in = (system / "serwatt.service.d/live-check.conf").read_text()
    assert re.search(r"^WatchdogSec=6$", drop_in, re.M), drop_in
    for unit in ("serwatt.service", "serwatt-live-target.service"):
        link = system / "multi-user.target.wants" / unit
        assert os.readlink(link) == f"/etc/systemd/system/{unit}"
    wrapper = tree / "opt/serwatt/bin/serwatt"
    assert os.access(wrapper, os.X_OK) and "-m serwatt" in wrapper.read_text()
    cfg = load_config(tree / "etc/serwatt/serwatt.yaml")  # serwatt's own loader accepts it
    assert [t.name for t in cfg.targets] == ["trainer"] and cfg.window_s == 2
    assert (tree / "root/serwatt-live-target.py").is_file()
    assert (tree / "root").stat().st_mode & 0o777 == 0o700


def test_live_systemd_refuses_unknown_arguments() -> None:
    r = subprocess.run(
        ["bash", str(LIVE), "--boot-now"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2 and "usage:" in r.stderr


# ------------------------------------------------------------------------ checkpoint_overlap

OVERLAP_METHODS = (
    "many.Checkpointer",
    "many.Checkpointer+overlap",
    "dcp.async_save",
    "dcp.async_save+staging",
)


@pytest.mark.serial  # a GPT training loop in two regimes, ~10 s of one busy CPU
def test_checkpoint_overlap_prints_stall_slowdown_and_verdicts_per_regime(tmp_path: Path) -> None:
    out = tmp_path / "overlap.json"
    r = bench(
        "checkpoint_overlap.py", "--size-mb", "2", "--repeat", "2", "--dir", str(tmp_path),
        "--json", str(out), timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert re.search(rf"^state {NUM} MiB .*; one copy {NUM} ms; 2 rounds", r.stdout, re.M)
    assert "load average" in r.stdout
    for regime in ("long", "short"):
        res = doc[regime]
        assert all(len(res["samples"][m]) == 2 for m in OVERLAP_METHODS)
        for m in OVERLAP_METHODS:
            summary = res["summary"]["methods"][m]
            stall = mean_interval([x["stall_s"] for x in res["samples"][m]])
            assert summary["stall_s"] == pytest.approx(stall.estimate)
            line = rf"^  {re.escape(m)} +stall +{NUM} ms \(95% CI {NUM}-{NUM}\)   step slowdown"
            assert re.search(line, r.stdout, re.M), r.stdout
        goals = res["summary"]["goals"]
        # the 0.1x goal is asked only where forward + backward took at least the copy
        assert [g["at_most"] for g in goals] == ([0.1] if res["ratio"] >= 1 else []) + [1.0, 1.0]
        for g in goals:
            lo, hi = g["ci95"]
            assert g["verdict"] == at_most(lo, hi, g["at_most"]), g
            assert f"stall <= {g['at_most']:g}x {g['vs']}'s: ratio" in r.stdout
            assert f"{g['verdict'].upper()}" in r.stdout
    assert not [p for p in tmp_path.iterdir() if p.name != "overlap.json"]  # cleaned up


# ------------------------------------------------------------------- checkpoint_identity


def _identity_run(stalls: list[tuple[float | None, float]], *, codepath: str = "many") -> tuple:
    """A save run's (document, summary): one file per (serwatt's stall, the job's save_s)."""
    checkpoints = [
        {
            "path": f"/ck/{k}.many",
            "stall_s": stall,
            "resolution_s": 0.01,
            "episode": {"codepath": codepath},
        }
        for k, (stall, _job) in enumerate(stalls)
    ]
    summary = [{"path": f"/ck/{k}.many", "save_s": job} for k, (_s, job) in enumerate(stalls)]
    return {"checkpoints": checkpoints}, {"checkpoints": summary}


def _identity_resume(wall_s: float | None, job_s: float) -> tuple:
    restore = {
        "path": "/ck/3.many",
        "wall_s": wall_s,
        "resolution_s": 0.01,
        "timed_by": "stack changes",
        "lazy": True,
    }
    return {"restores": [restore]}, {"restored_from": "/ck/3.many", "restore_s": job_s}


def test_checkpoint_identity_verdicts_hold_and_fail_on_each_rule() -> None:
    ci = load_bench("checkpoint_identity")
    good = [(0.050, 0.052)] * 20
    cell = ci.check_cell("many", _identity_run(good), _identity_resume(0.02, 0.03))
    assert cell["verdict"] == "holds" and cell["failed"] == [], cell
    assert (cell["files"], cell["checkpoints"], cell["timed"]) == (20, 20, 20)
    # the misses a 95% half-width allows in 20 but once in 1,000 runs: P(X >= 6) = 3e-4
    # for X ~ Binomial(20, 0.05), P(X >= 5) = 2.6e-3
    assert cell["allowed"] == 5
    six = [(0.2, 0.05)] * 6 + good[6:]
    assert ci.check_cell("many", _identity_run(six), _identity_resume(0.02, 0.03))["failed"] == [
        "6 stalls outside resolution, 5 allowed"
    ]
    # a checkpoint written by a log line's json episode is not the format's
    stranger = ci.check_cell(
        "many-async", _identity_run(good, codepath="json"), _identity_resume(0.02, 0.03)
    )
    assert stranger["failed"] == ["20 checkpoint(s) written by ['json']"]
    # a restore longer than the job's whole restore, past its error's 99.9% quantile
    # (timed by stack changes: Laplace, ln(1/0.002) periods where 95% is ln(20))
    error = 0.01 * math.log(500) / math.log(20)
    assert (
        ci.check_cell("many", _identity_run(good), _identity_resume(0.03 + error * 0.99, 0.03))[
            "verdict"
        ]
        == "holds"
    )
    late = ci.check_cell("many", _identity_run(good), _identity_resume(0.03 + error * 1.01, 0.03))
    assert late["verdict"] == "fails" and late["failed"][0].startswith("restore ")
    # nothing timed proves nothing
    blind = ci.check_cell("many", _identity_run([(None, 0.05)] * 4), _identity_resume(None, 0.03))
    assert blind["failed"] == ["no stall timed"]


@pytest.mark.long  # profiled torch jobs
def test_checkpoint_identity_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "cells.json"
    r = bench(
        "checkpoint_identity.py", "--formats", "many,json", "--sizes", "1", "--saves", "2",
        "--json-max-mb", "0.5", "--backend", "numpy", "--json", str(out), timeout=180,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr[-3000:]
    doc = json.loads(out.read_text())
    (cell,) = doc["cells"]
    assert (cell["format"], cell["size_mb"], cell["files"]) == ("many", 1.0, 2)
    assert doc["skipped"] == ["json 1 MB (over --json-max-mb 0.5)"]
    assert re.search(
        rf"^many +1 +2 +{cell['checkpoints']} .* {cell['verdict'].upper()}", r.stdout, re.M
    )
    assert r.returncode == (0 if cell["verdict"] == "holds" else 1)
    assert r.stdout.splitlines()[-1] == f"cells: {int(cell['verdict'] == 'holds')} of 1 hold"
