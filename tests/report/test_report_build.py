"""build_report on synthetic runs: A/A, a large constructed difference, comparability,
durability, schema-1 records, minimum-n warnings, the contract and receipts."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from serwatt.profiler.report import (
    REPORT_SCHEMA,
    InputError,
    ReportRefused,
    build_report,
    default_cluster,
    receipt,
    render_text,
    stats,
    verify_receipt,
)
from serwatt.profiler.report.cluster import parse_cluster
from serwatt.profiler.report.inputs import CodepathFigures, RunInput
from serwatt.profiler.report.render_text import p_cell
from tests.report_synth import HOST, make_run


def _aa(runs: int = 2) -> tuple[list[RunInput], list[RunInput]]:
    # the run is the test's unit: 4 runs a side is the fewest that can reach p < 0.05
    base = [make_run(f"base-{k}", seed=k) for k in range(1, runs + 1)]
    cand = [make_run(f"base-{k}", seed=k) for k in range(runs + 1, 2 * runs + 1)]
    return base, cand


def _ab(runs: int = 2) -> tuple[list[RunInput], list[RunInput]]:
    # 6 runs a side: the codepath family of about 8 tests can reach Holm p < 0.05
    base = [make_run(f"torch-{k}", seed=k) for k in range(1, runs + 1)]
    cand = [
        make_run(f"many-{k}", seed=runs + k, codepath="many", ckpt_cpu_s=0.25, stall_s=0.2)
        for k in range(1, runs + 1)
    ]
    return base, cand


def _all_metrics(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = [m for cp in report["codepaths"].values() for m in cp.values()]
    out += list(report["total"].values())
    out += [report["checkpoint"][k] for k in ("stall_s", "cpu_s") if report["checkpoint"].get(k)]
    out += list(report["per_run"].values())
    return out


def test_aa_reports_no_significant_change_anywhere() -> None:
    report = build_report(*_aa(4))
    stall = report["checkpoint"]["stall_s"]
    assert stall["significant"] is False
    assert stall["display"] == "~" and stall["verdict"] == "no significant change"
    assert stall["ci95"][0] < 1.0 < stall["ci95"][1]
    tested = [m for m in _all_metrics(report) if m["p"] is not None]
    assert len(tested) >= 5
    for m in tested:
        assert not m["significant"] and m["display"] == "~"
        assert "faster" not in json.dumps(m)
    assert report["comparable"] is True and report["caveats"] == []


def test_a_large_constructed_difference_is_significant_with_an_interval_excluding_1() -> None:
    report = build_report(*_ab(6))
    ck = report["checkpoint"]
    assert ck["baseline"]["codepath"] == "torch" and ck["candidate"]["codepath"] == "many"
    assert ck["baseline"]["chosen_by"] == "most episode wall time on the main thread"
    stall = ck["stall_s"]
    assert stall["significant"] is True and stall["verdict"] == "lower"
    assert stall["ratio"] == pytest.approx(0.25, rel=0.1)
    assert stall["ci95"][1] < 1.0
    assert stall["display"].startswith("-7")
    # the run is the unit: n counts runs, and the checkpoints inside them beside it
    assert stall["n"] == [6, 6] and stall["n_unit"] == "runs"
    assert stall["n_within"] == [ck["baseline"]["episodes"], ck["candidate"]["episodes"]]
    cpu = ck["cpu_s"]
    assert cpu["significant"] and cpu["ci95"][1] < 1.0
    # the torch codepath vanishes on the candidate, the many codepath appears
    assert report["codepaths"]["torch"]["cpu_s"]["verdict"] == "lower"
    assert report["codepaths"]["many"]["cpu_s"]["display"] == "new"
    total = report["total"]["cpu_s"]
    assert total["significant"] and total["ratio"] < 1.0 and total["ci95"][1] < 1.0


def test_holm_is_applied_within_the_stall_the_secondary_and_the_codepath_families() -> None:
    report = build_report(*_ab())
    tested = [m for m in _all_metrics(report) if m["p"] is not None]
    ck = report["checkpoint"]
    secondary = [m for k in ("cpu_s", "gpu_wait_s", "restore_s") if (m := ck.get(k))]
    families = report["statistics"]["families"]
    # the stall is the one primary test: Holm leaves its p as it is
    assert families["checkpoint"] == 1 and ck["stall_s"]["family"] == "checkpoint"
    assert ck["stall_s"]["p_adjusted"] == ck["stall_s"]["p"]
    assert families["checkpoint_secondary"] == len(secondary) >= 1
    per_run = [m for m in report["per_run"].values() if m["p"] is not None]
    assert families["per_run"] == len(per_run) == 1 and per_run[0]["family"] == "per_run"
    assert families["codepaths"] == len(tested) - 1 - len(secondary) - len(per_run)
    assert report["statistics"]["family_size"] == len(tested)
    # within its family: the smallest secondary p times the family size (Holm's first step)
    smallest = min(secondary, key=lambda m: m["p"])
    assert smallest["p_holm"] == pytest.approx(min(1.0, smallest["p"] * len(secondary)))
    for m in tested:
        assert m["p_holm"] == m["p_adjusted"] >= m["p"]
        assert m["significant"] == (m["p_holm"] < 0.05)
        assert m["test"] == stats.TEST
    # the model's energy follows CPU: shown as such, not tested a second time
    energy = report["codepaths"]["torch"]["energy_j"]
    assert energy["p"] is None and energy["display"] == "follows CPU (model)"
    assert all(m["family"] != "codepaths" or "energy" not in m["unit"] for m in tested)


def test_the_contract_names_are_there_and_the_document_is_strict_json(tmp_path: Path) -> None:
    # storage fast enough that the measured stalls, not its bandwidth, set each δ
    fast = parse_cluster("storage_write_gb_s: 1000000\n", tmp_path / "cluster.yaml")
    report = build_report(*_ab(), cluster=fast)
    assert report["schema"] == REPORT_SCHEMA == "serwatt.report/1"
    assert report["receipt"].startswith("rcpt_") and len(report["receipt"]) == 5 + 64
    assert report["baseline"]["runs"] == ["torch-1", "torch-2"]
    for key in ("baseline", "candidate", "ratio", "ci95", "p", "n", "significant"):
        assert key in report["codepaths"]["torch"]["cpu_s"]
    for side in ("baseline", "candidate"):
        c = report["checkpoint"][side]
        for key in ("codepath", "episodes", "stall_s", "cpu_s_per_checkpoint"):
            assert key in c
        assert set(c["stall_s"]) >= {"p50", "p95", "max"}
        p = report["projection"][side]
        for key in ("delta_s", "interval_s", "lost_fraction", "gpu_hours_per_year"):
            assert isinstance(p[key], float)
        assert p["bound"] == "measured stall" and p["delta_s"] == p["delta_node_s"]
    assert set(report["checkpoint"]["stall_s"]) >= {"ratio", "ci95", "p", "significant"}
    mtbf = report["projection"]["inputs"]["mtbf_h"]
    assert mtbf["value"] == 3.093 and mtbf["source"].startswith("assumed")
    saved = report["projection"]["saved"]
    assert saved["gpu_hours_per_year"] > 0
    assert len(saved["mwh_per_year"]) == 2 and len(saved["water_l_per_year"]) == 2
    json.dumps(report, allow_nan=False)


def test_every_figure_names_its_source() -> None:
    base, cand = _ab()
    cand = [dataclasses.replace(make_run("many-x", energy_source="unavailable"))]
    cand = [dataclasses.replace(cand[0], energy_reason="permission: energy_uj is root-only")]
    report = build_report(base, cand, allow_mismatch=True)
    torch = report["codepaths"]["torch"]
    assert torch["cpu_s"]["source"]["baseline"].startswith("measured")
    assert torch["energy_j"]["source"]["baseline"] == "model (windows' energy source)"
    assert torch["energy_j"]["source"]["candidate"] == (
        "unavailable: permission: energy_uj is root-only"
    )
    assert torch["energy_j"]["verdict"] == "not tested: unavailable on candidate"
    assert torch["gpu_wait_s"]["source"]["baseline"] == "unavailable: no NVML library"


def test_mismatches_are_refused_naming_each() -> None:
    base, cand = _aa()
    other_host = dict(HOST, kernel="6.8.0-40-generic")
    cand = [
        make_run("base-3", seed=3, host=other_host, rate_hz=100.0),
        make_run("base-4", seed=4),
    ]
    with pytest.raises(ReportRefused) as info:
        build_report(base, cand)
    fields = [m.field for m in info.value.mismatches]
    assert fields == ["host.kernel", "rate_hz"]
    text = str(info.value)
    assert "host.kernel differs: 6.1.0-18-amd64 (base-1, base-2, base-4); 6.8.0-40-generic" in text
    assert "rate_hz differs" in text
    report = build_report(base, cand, allow_mismatch=True)
    assert report["comparable"] is False
    assert len(report["caveats"]) == 2 and report["caveats"][0].startswith("not comparable")


def test_gpu_names_are_compared_as_a_multiset() -> None:
    h100 = dict(HOST, gpus=[{"index": 0, "name": "H100"}, {"index": 1, "name": "A100"}])
    swapped = dict(HOST, gpus=[{"index": 0, "name": "A100"}, {"index": 1, "name": "H100"}])
    one = dict(HOST, gpus=[{"index": 0, "name": "H100"}])
    build_report([make_run("a", host=h100)], [make_run("b", host=swapped)])
    with pytest.raises(ReportRefused, match="host.gpus differs"):
        build_report([make_run("a", host=h100)], [make_run("b", host=one)])


def test_durability_difference_is_a_caveat_and_qualifies_the_verdict() -> None:
    base, cand = _ab(6)
    base = [make_run(r.run_id, seed=i, durable=False) for i, r in enumerate(base)]
    report = build_report(base, cand)
    d = report["checkpoint"]["durability"]
    n_b, n_c = (report["checkpoint"][s]["episodes"] for s in ("baseline", "candidate"))
    # what was seen, never "not durable" for "not seen"; the .many writer is known durable
    assert d["baseline"] == f"fsync seen in 0 of {n_b}" and d["baseline_durable"] is None
    assert d["baseline_basis"].startswith(f"unknown: fsync seen in 0 of {n_b}")
    assert d["candidate"] == f"fsync seen in {n_c} of {n_c}" and d["candidate_durable"] is True
    assert d["candidate_basis"].startswith("known: the .many writer fsyncs every file")
    assert d["same"] is False
    assert any("may differ in durability" in c for c in report["caveats"])
    assert report["checkpoint"]["stall_s"]["verdict"] == (
        f"lower, but durability may differ (baseline fsync seen in 0 of {n_b}, candidate "
        f"fsync seen in {n_c} of {n_c})"
    )


def test_a_many_side_is_durable_by_its_code_whatever_the_samples_saw() -> None:
    """Every `.many` save fsyncs; samples that missed some (0 of N here) do not make it
    'not durable', and against a torch side whose fsyncs were seen the sides match."""
    base, cand = _ab(6)
    cand = [make_run(r.run_id, seed=i + 3, codepath="many", stall_s=0.2, durable=False)
            for i, r in enumerate(cand, start=6)]  # fmt: skip
    report = build_report(base, cand)
    d = report["checkpoint"]["durability"]
    assert d["candidate"].startswith("fsync seen in 0 of ") and d["candidate_durable"] is True
    assert d["baseline_durable"] is True and d["baseline_basis"] == d["baseline"]
    assert d["same"] is True and not any("durability" in c for c in report["caveats"])
    assert report["checkpoint"]["stall_s"]["verdict"] == "lower"


def test_a_schema_1_side_says_it_has_no_episodes() -> None:
    base, cand = _ab(6)
    base = [make_run(f"old-{k}", seed=k, episodes=False) for k in range(1, 7)]
    report = build_report(base, cand, cluster=default_cluster())
    assert report["baseline"]["episodes"] is None
    assert report["baseline"]["episodes_note"] == "no episodes recorded (schema 1)"
    assert report["checkpoint"]["baseline"]["note"] == "no episodes recorded (schema 1)"
    assert report["checkpoint"]["stall_s"] is None
    assert "no checkpoint episodes on baseline" in report["checkpoint"]["note"]
    assert report["projection"]["baseline"] == {"unavailable": "no episodes recorded (schema 1)"}
    # the window comparison still stands
    assert report["total"]["cpu_s"]["significant"]


def test_too_few_runs_warn_with_the_needed_n() -> None:
    base = [make_run(f"b{k}", windows=6, every_s=10.0, seed=k) for k in range(3)]
    cand = [make_run(f"c{k}", windows=6, every_s=10.0, seed=9 + k, stall_s=0.1) for k in range(3)]
    report = build_report(base, cand)
    by_scope = {w["scope"]: w for w in report["warnings"]}
    # 3 runs a side: 2/C(6,3) = 0.1 can never be < 0.05, and in the codepath family of k
    # tests Holm multiplies the smallest p by k
    k = report["statistics"]["families"]["codepaths"]
    windows = by_scope["windows"]
    assert windows["n"] == [3, 3] and windows["family"] == "codepaths"
    assert windows["min_attainable_p"] == pytest.approx(min(1.0, k * 0.1))
    need = next(n for n in range(2, 50) if k * 2 / math.comb(2 * n, n) < 0.05)
    assert windows["needed_per_side"] == need
    assert f"Holm family of {k} tests" in windows["message"]
    assert report["statistics"]["min_attainable_p"]["codepaths"] == pytest.approx(min(1.0, k * 0.1))
    assert by_scope["checkpoint"]["n"] == [3, 3]
    assert "more checkpoints per run do not help" in by_scope["checkpoint"]["message"]


def _trending(run: RunInput) -> RunInput:
    """`run` with its checkpoint stalls rising step by step (a warm-up that never ends)."""
    eps = tuple(
        dataclasses.replace(e, wall_s=0.1 * (i + 1), end=e.start + 0.1 * (i + 1))
        for i, e in enumerate(run.episodes or ())
    )
    return dataclasses.replace(run, episodes=eps)


def test_more_checkpoints_per_run_never_lower_the_stall_tests_floor() -> None:
    # one run a side of 16 checkpoints: the run is the unit, so nothing is tested, and
    # the warning says runs are what is missing (the per-episode test called this 16+16)
    base = [_trending(make_run("b", windows=19, every_s=6.0, seed=1))]
    cand = [_trending(make_run("c", windows=19, every_s=6.0, seed=2))]
    assert [len(r.episodes or ()) for r in (*base, *cand)] == [16, 16]
    report = build_report(base, cand)
    stall = report["checkpoint"]["stall_s"]
    assert stall["n"] == [1, 1] and stall["n_within"] == [16, 16] and stall["p"] is None
    warned = [w for w in report["warnings"] if w.get("family") == "checkpoint"]
    assert len(warned) == 1 and warned[0]["n"] == [1, 1], warned
    assert warned[0]["needed_per_side"] == 4


def test_explicit_checkpoint_codepaths_override_the_choice() -> None:
    base, cand = _ab()
    report = build_report(
        base, cand, checkpoint_codepaths={"baseline": "torch", "candidate": "json"}
    )
    assert report["checkpoint"]["candidate"]["codepath"] == "json"
    assert report["checkpoint"]["candidate"]["chosen_by"] == "given"
    assert report["checkpoint"]["candidate"]["episodes"] == 0
    with pytest.raises(InputError, match="checkpoint_codepaths"):
        build_report(base, cand, checkpoint_codepaths={"baseline": "other"})


def test_a_run_on_both_sides_is_refused() -> None:
    run = make_run("same")
    with pytest.raises(InputError, match="given twice"):
        build_report([run], [run])


def test_checkpoint_files_are_carried_as_given() -> None:
    chain = {"files": 3, "verified": 3, "head": "abc", "length": 3, "first_break": None}
    report = build_report(*_ab(), checkpoints=chain)
    assert report["checkpoint_files"] == chain


# --------------------------------------------------------------------------- receipts


def test_the_receipt_verifies_when_nothing_changed() -> None:
    base, cand = _ab()
    report = build_report(base, cand)
    again_base, again_cand = _ab()  # rebuilt from scratch: equal inputs
    assert verify_receipt(report, again_base, again_cand) == []
    assert report["receipt"] == build_report(again_base, again_cand)["receipt"]


def _replace_window(run: RunInput, i: int, **changes: Any) -> RunInput:
    windows = list(run.windows)
    windows[i] = dataclasses.replace(windows[i], **changes)
    return dataclasses.replace(run, windows=tuple(windows))


def _replace_episode(run: RunInput, i: int, **changes: Any) -> RunInput:
    assert run.episodes is not None
    episodes = list(run.episodes)
    episodes[i] = dataclasses.replace(episodes[i], **changes)
    return dataclasses.replace(run, episodes=tuple(episodes))


def test_the_receipt_changes_when_any_input_changes() -> None:
    base, cand = _ab()
    original = receipt(base, cand)
    run = base[0]
    w0 = run.windows[0]
    torch = w0.codepaths["torch"]
    changed = [
        dataclasses.replace(run, serwatt_version="0.1.1"),
        dataclasses.replace(run, host=dict(run.host, hostname="node-b")),
        dataclasses.replace(run, rate_hz=49.0),
        dataclasses.replace(run, ended_at=run.ended_at + 1),
        dataclasses.replace(run, restore_s=(1.5,)),
        dataclasses.replace(run, episodes=None),
        _replace_window(run, 0, cpu_s=w0.cpu_s + 1e-9),
        _replace_window(run, 3, energy_source="rapl"),
        _replace_window(
            run,
            0,
            codepaths=dict(
                w0.codepaths, torch=dataclasses.replace(torch, samples=torch.samples + 1)
            ),
        ),
        _replace_episode(run, 0, wall_s=run.episodes[0].wall_s + 0.001),  # type: ignore[index]
        _replace_episode(run, 1, durable=False),
        _replace_episode(run, 2, main_thread=False),
    ]
    seen = {original}
    for new in changed:
        r = receipt([new, base[1]], cand)
        assert r not in seen
        seen.add(r)
    # which side a run is on, and the order of runs, are inputs too
    assert receipt(cand, base) != original
    assert receipt([base[1], base[0]], cand) != original
    report = build_report(base, cand)
    problems = verify_receipt(report, [changed[6], base[1]], cand)
    assert len(problems) == 1 and problems[0].startswith("receipt mismatch")
    problems = verify_receipt(report, base[:1], cand)
    assert any("baseline runs differ" in p for p in problems)
    assert verify_receipt({"receipt": None}, base, cand)[0].startswith("the report has no receipt")


def test_the_receipt_does_not_depend_on_int_or_float_spelling() -> None:
    a = CodepathFigures(samples=3, cpu_s=1, wall_s=2, energy_j=None, gpu_wait_s=0)
    b = CodepathFigures(samples=3, cpu_s=1.0, wall_s=2.0, energy_j=None, gpu_wait_s=0.0)
    assert a == b
    base, cand = _ab()
    run = _replace_window(base[0], 0, codepaths={"json": a})
    same = _replace_window(base[0], 0, codepaths={"json": b})
    assert receipt([run], cand) == receipt([same], cand)


def test_hostile_inputs_are_refused_on_construction() -> None:
    run = make_run("x")
    with pytest.raises(InputError, match="cpu_s must be finite"):
        _replace_window(run, 0, cpu_s=float("nan"))
    with pytest.raises(InputError, match="unknown codepath 'evil'"):
        _replace_window(run, 0, codepaths={"evil": run.windows[0].codepaths["torch"]})
    with pytest.raises(InputError, match="energy_source must be one of"):
        dataclasses.replace(run, energy_source="guess")
    with pytest.raises(InputError, match="end .* is before start"):
        _replace_episode(run, 0, end=0.0)


# --------------------------------------------------------------------------- terminal table


def test_the_terminal_table_fits_100_columns_and_never_says_faster() -> None:
    aa = render_text(build_report(*_aa(4), cluster=default_cluster()), full=True)
    assert max(len(line) for line in aa.splitlines()) <= 100
    stall_line = next(line for line in aa.splitlines() if line.strip().startswith("stall mean"))
    # a change that is not significant still shows its interval, p and n
    assert re.search(r"~ \[-\d+(\.\d+)?, \+\d+(\.\d+)?\] no significant change", stall_line)
    assert "faster" not in aa and "slower" not in aa
    assert "the stall change is not significant" in aa
    ab = render_text(build_report(*_ab(6), cluster=default_cluster()), full=True)
    stall_line = next(line for line in ab.splitlines() if line.strip().startswith("stall mean"))
    assert re.search(r"-7\d(\.\d)?% \[-\d+(\.\d+)?, -\d+(\.\d+)?\]", stall_line)
    # at most 3 significant digits in every figure of the stall and projection rows
    rows = [stall_line] + [ln for ln in ab.splitlines() if "/ year" in ln]
    for token in (t for ln in rows for t in re.findall(r"\d[\d.]*(?:e[-+]\d+)?", ln)):
        mantissa = token.split("e")[0]
        digits = mantissa.replace(".", "").lstrip("0")
        digits = digits if "." in mantissa else digits.rstrip("0")
        assert len(digits) <= 3, (token, rows)
    assert "scaling: each side's measured stall" in ab
    assert max(len(line) for line in ab.splitlines()) <= 100


def test_skip_warmup_leaves_out_each_runs_first_episodes_and_says_so() -> None:
    base, cand = _ab()
    full = build_report(base, cand)
    skipped = build_report(base, cand, skip_warmup=3)
    for side in ("baseline", "candidate"):
        warmup = skipped["checkpoint"][side]["warmup"]
        assert warmup["skipped"] == 6 and set(warmup["skipped_per_run"].values()) == {3}
        assert skipped["checkpoint"][side]["episodes"] == full["checkpoint"][side]["episodes"] - 6
        assert {"trend_p", "lag1_autocorrelation"} <= set(warmup)
    assert "3 skipped" not in render_text(full, full=True) and "6 skipped" in render_text(
        skipped, full=True
    )
    with pytest.raises(InputError, match="skip_warmup"):
        build_report(base, cand, skip_warmup=-1)


def test_a_warm_up_is_detected_and_described_while_runs_stay_the_unit() -> None:
    base, cand = _ab()
    slow_start = []
    for run in base:
        eps = list(run.episodes or ())
        for i, factor in enumerate((3.0, 2.5, 2.0)):
            e = eps[i]
            eps[i] = dataclasses.replace(
                e, wall_s=e.wall_s * factor, end=e.start + e.wall_s * factor
            )
        slow_start.append(dataclasses.replace(run, episodes=tuple(eps)))
    report = build_report(slow_start, cand)
    warmup = report["checkpoint"]["baseline"]["warmup"]
    assert warmup["detected"]
    assert report["checkpoint"]["stall_s"]["n_unit"] == "runs"
    assert any(w.get("side") == "baseline" for w in report["warnings"])
    assert not report["checkpoint"]["candidate"]["warmup"]["detected"]


def test_the_report_says_whether_the_runs_were_interleaved() -> None:
    base, cand = _ab()  # every run starts at the same t0: the tie keeps the side order
    shift = [dataclasses.replace(r, started_at=r.started_at + i) for i, r in enumerate(base)]
    late = [dataclasses.replace(r, started_at=r.started_at + 10 + i) for i, r in enumerate(cand)]
    assert build_report(shift, late)["interleaving"]["order"] == "AABB"
    assert "blocked" in build_report(shift, late)["interleaving"]["kind"]
    mixed = [dataclasses.replace(r, started_at=r.started_at + 0.5 + i) for i, r in enumerate(cand)]
    got = build_report(shift, mixed)["interleaving"]
    assert got["order"] == "ABAB" and got["kind"] == "interleaved (ABAB)"


def _warm(run: Any, scale: float = 4.0) -> Any:
    """The run with its first checkpoints slower (page cache and allocator warm-up)."""
    eps = [
        dataclasses.replace(e, wall_s=e.wall_s * (1 + scale * math.exp(-k / 2)))
        for k, e in enumerate(run.episodes)
    ]
    return dataclasses.replace(run, episodes=tuple(eps))


def test_a_flagged_warm_up_reaches_the_headline_with_the_ratio_without_it() -> None:
    base = [_warm(make_run(f"t{i}", seed=i)) for i in range(4)]
    cand = [
        _warm(make_run(f"m{i}", seed=10 + i, codepath="many", stall_s=0.4, ckpt_cpu_s=0.5))
        for i in range(4)
    ]
    report = build_report(base, cand)
    warm = report["checkpoint"]["stall_s"]["warmup"]
    assert warm["flagged"] == ["baseline", "candidate"], warm
    # the ratio without each run's first checkpoint is the same test on the rest
    rest = (
        [[e.wall_s for e in r.episodes[1:]] for r in base],
        [[e.wall_s for e in r.episodes[1:]] for r in cand],
    )
    (xb, wb), (xc, wc) = (
        ([sum(s) for s in runs] for runs in rest),
        ([float(len(s)) for s in runs] for runs in rest),
    )
    c = stats.compare(xb, xc, list(wb), list(wc))
    assert warm["ratio"] == pytest.approx(c.ratio, rel=1e-12) and warm["p"] == c.p
    head = render_text(report).splitlines()
    line = " ".join(ln.strip() for ln in head if ln.startswith(("warm-up", "          ")))
    assert "without each run's first checkpoint" in line and "-50%" in line, head
    # none flagged: no line, no field
    plain = build_report(*_ab(4))
    assert "warmup" not in plain["checkpoint"]["stall_s"]
    assert not any(ln.startswith("warm-up") for ln in render_text(plain).splitlines())


def test_every_tested_row_knows_its_smallest_attainable_p() -> None:
    report = build_report(*_ab(4))
    stall, per_run = report["checkpoint"]["stall_s"], report["per_run"]["cpu_s"]
    assert stall["min_attainable_p"] == pytest.approx(2 / 70)  # 2/C(8,4), a family of 1
    assert stall["can_reach_significance"] is True
    size = report["statistics"]["families"]["codepaths"]
    total = report["total"]["cpu_s"]
    assert total["min_attainable_p"] == pytest.approx(min(1.0, size * 2 / 70))
    assert total["can_reach_significance"] is False  # 4+4 runs, many codepath tests
    assert "‡" in render_text(report)
    assert per_run["family"] == "per_run" and per_run["n_unit"] == "runs"
    # 3+3: the secondary rows cannot reach it either, and a warning names them
    small = build_report(*_ab(3))
    rows = [w for w in small["warnings"] if w.get("scope") == "row"]
    assert any("CPU s/checkpoint" in w["rows"] for w in rows), small["warnings"]


def test_p_below_the_resampling_floor_prints_as_under_a_thousandth() -> None:
    assert p_cell({"p_holm": 0.0002}) == "< 0.001" and p_cell({"p_holm": 0.0022}) == "0.0022"
    assert p_cell({"p_holm": None}) == "-"
