"""What differs between runs without making them incomparable is a warning, one per
field, never a refusal; a different stack-change rate (it sets every stall's resolution)
is a refusal unless mismatches are allowed (issue 25, section 3)."""

from __future__ import annotations

import dataclasses

import pytest

from serwatt.profiler.report import ReportRefused, build_report, render_text
from serwatt.profiler.report.inputs import InputError, RestoreInput, RunInput
from tests.report_synth import HOST, make_run


def _run(run_id: str, seed: int, **host: object) -> RunInput:
    return dataclasses.replace(
        make_run(run_id, seed=seed, host=dict(HOST, **host)),
        config={"command": "python train.py", "window_s": 5.0, "timing_rate_hz": 400.0},
    )


def _fields(report: dict) -> list[str]:
    return [w["field"] for w in report["warnings"] if w["scope"] == "comparability"]


def test_like_runs_have_no_comparability_warning() -> None:
    base = [_run("a-1", 1, load_average=[0.5, 0.4, 0.3]), _run("a-2", 2)]
    cand = [_run("b-1", 3, load_average=[1.2, 0.4, 0.3]), _run("b-2", 4)]
    assert _fields(build_report(base, cand)) == []


def test_each_differing_field_is_one_warning_naming_the_runs() -> None:
    base = [_run("a-1", 1, cpu_governor="performance", load_average=[0.2, 0, 0])]
    cand = [
        dataclasses.replace(
            _run("b-1", 3, cpu_governor="powersave", load_average=[3.5, 0, 0],
                 packages={"torch": "2.13.0", "numpy": "2.3.0"}),
            config={"command": "python train.py --big", "window_s": 5.0,
                    "timing_rate_hz": 400.0, "target_pythons": "3.12.1"},
        )
    ]  # fmt: skip
    report = build_report(base, cand)
    assert report["comparable"] is True and report["caveats"] == []
    assert _fields(report) == [
        "host.cpu_governor",
        "host.packages.torch",
        "host.packages.numpy",
        "target pythons",
        "host.load_average (1 min, at start)",
    ]
    by_field = {w["field"]: w["message"] for w in report["warnings"] if "field" in w}
    assert by_field["host.cpu_governor"].startswith(
        "host.cpu_governor differs: performance (a-1); powersave (b-1)"
    )
    assert "0.20 (a-1); 3.50 (b-1)" in by_field["host.load_average (1 min, at start)"]
    text = render_text(report, full=True)
    assert "host.cpu_governor differs: performance (a-1); powersave (b-1)" in text


def test_a_different_stack_change_rate_is_refused_unless_allowed() -> None:
    base = [_run("a-1", 1)]
    cand = [dataclasses.replace(_run("b-1", 3), config={"timing_rate_hz": 0.0})]
    with pytest.raises(ReportRefused) as info:
        build_report(base, cand)
    assert [m.field for m in info.value.mismatches] == ["config.timing_rate_hz (stack-change run)"]
    report = build_report(base, cand, allow_mismatch=True)
    assert report["caveats"] == [
        "not comparable: config.timing_rate_hz (stack-change run) differs: 400.0 (a-1); 0.0 (b-1)"
    ]


def test_a_records_config_is_checked_and_only_known_keys_are_kept() -> None:
    run = make_run("a-1", seed=1)
    kept = dataclasses.replace(run, config={"window_s": 5, "secret": [1, 2], "command": "x"})
    assert dict(kept.config) == {"window_s": 5.0, "command": "x"}
    with pytest.raises(InputError, match="config.window_s must be finite"):
        dataclasses.replace(run, config={"window_s": float("nan")})
    with pytest.raises(InputError, match="config.timing_rate_hz must be a number"):
        dataclasses.replace(run, config={"timing_rate_hz": [400]})


def test_a_refusal_prints_one_line_per_mismatch_and_escapes_each_value() -> None:
    """The message's own line breaks stay line breaks; a run id's (it comes from the record)
    and its control characters are written out, so no value forges a line or a terminal
    sequence."""
    base = [_run("a-1", 1)]
    cand = [_run("b\n\x1b[2J-1", 3)]
    cand = [dataclasses.replace(cand[0], config={"timing_rate_hz": 0.0})]
    with pytest.raises(ReportRefused) as info:
        build_report(base, cand)
    lines = info.value.shown().split("\n")
    assert lines == [
        "the runs are not comparable (1 mismatch(es)):",
        "  config.timing_rate_hz (stack-change run) differs: 400.0 (a-1); 0.0 (b\\n\\x1b[2J-1)",
        "compare runs from like hosts and settings, or allow the mismatches",
    ]


def _loaded(run: RunInput, load: float | None) -> RunInput:
    windows = tuple(dataclasses.replace(w, load_1min=load) for w in run.windows)
    return dataclasses.replace(run, windows=windows)


def test_a_load_that_rose_during_a_run_is_a_warning_its_start_misses() -> None:
    # the same load at every start; the candidate's rose after it began (a busy neighbour)
    base = [_loaded(_run("a-1", 1, load_average=[0.3, 0, 0]), 0.4)]
    cand = [_loaded(_run("b-1", 3, load_average=[0.3, 0, 0]), 1.6)]
    report = build_report(base, cand)
    field = "load over the run (mean 1-min load at its windows' ends)"
    assert _fields(report) == [field]
    (message,) = [w["message"] for w in report["warnings"] if w.get("field") == field]
    assert "0.40 (a-1); 1.60 (b-1)" in message
    # within LOAD_SPREAD (1.0) of each other: no warning; unrecorded (None): none either
    assert _fields(build_report(base, [_loaded(cand[0], 1.3)])) == []
    assert _fields(build_report([_loaded(base[0], None)], cand)) == []


def _command(run: RunInput, command: str, directory: str | None = None) -> RunInput:
    config = dict(run.config, command=command, checkpoint_dir=directory)
    return dataclasses.replace(run, config=config)


def test_a_sides_runs_of_different_commands_are_a_warning() -> None:
    # `serwatt ab` gives each run its own checkpoint directory: not a difference
    base = [
        _command(_run("a-1", 1), "python train.py --dir /ck/a-1", "/ck/a-1"),
        _command(_run("a-2", 2), "python train.py --dir /ck/a-2", "/ck/a-2"),
    ]
    # the sides differ by design; a resume (restores, arguments appended) is the same job
    resumed = dataclasses.replace(
        _command(_run("b-1-resumed", 4), "python t2.py --resume", None),
        restores=(
            RestoreInput(
                path="/ck/b-1/ckpt.many", bytes=1 << 20, open_t=1_700_000_100.0, pid=1,
                thread_id=1, episode_start=None, wall_s=None, resolution_s=None,
                timed_by="file event", read_bytes=None, lazy=False,
            ),
        ),
    )  # fmt: skip
    cand = [_command(_run("b-1", 3), "python t2.py"), resumed]
    assert _fields(build_report(base, cand)) == []
    # a repeat run with other arguments is named, the directory written {dir}
    odd = _command(_run("a-3", 5), "python train.py --dir /ck/a-3 --batch 64", "/ck/a-3")
    report = build_report([*base, odd], cand)
    assert _fields(report) == ["workload command (baseline runs)"]
    (message,) = [w["message"] for w in report["warnings"] if w["scope"] == "comparability"]
    assert message.startswith(
        "workload command (baseline runs) differs: python train.py --dir {dir} (a-1, a-2); "
        "python train.py --dir {dir} --batch 64 (a-3)"
    )
    # without a restore an extended command is a different job, not a resume
    plain = dataclasses.replace(resumed, restores=())
    assert _fields(build_report(base, [cand[0], plain])) == ["workload command (candidate runs)"]


def test_the_html_page_leads_each_warning_with_its_kind() -> None:
    from serwatt.profiler.report import render_html

    base = [_run("a-1", 1, cpu_governor="performance")]
    cand = [_run("b-1", 3, cpu_governor="powersave")]
    page = render_html(build_report(base, cand))
    assert '<p class="warning">Runs differ: host.cpu_governor differs:' in page
    # a comparability warning is not a shortage of samples
    assert "Too few samples: host.cpu_governor" not in page


def test_an_older_record_without_its_directory_finds_it_above_its_checkpoint_files() -> None:
    from serwatt.profiler.report.comparability import workload_command
    from serwatt.profiler.report.inputs import CheckpointInput

    def saved(path: str) -> CheckpointInput:
        return CheckpointInput(
            path=path, bytes=1 << 20, event_t=1_700_000_010.0, pid=1, thread_id=1,
            episode_start=None, stall_thread=None, stall_start=None, stall_s=None,
            resolution_s=None, timed_by="file event", cpu_s_all_threads=None,
            async_tail_s=None,
        )  # fmt: skip

    run = _command(_run("a-1", 1), "python train.py --dir /ck/ab-1/a-1 --steps 8")
    files = (saved("/ck/ab-1/a-1/step-2/model.pt"), saved("/ck/ab-1/a-1/step-4/model.pt"))
    old = dataclasses.replace(run, checkpoints=files)
    assert workload_command(old) == "python train.py --dir {dir} --steps 8"
    # the recorded directory wins; no files and none recorded: the command as it is
    assert workload_command(_command(run, run.config["command"], "/ck/ab-1")) == (
        "python train.py --dir {dir}/a-1 --steps 8"
    )
    assert workload_command(run) == "python train.py --dir /ck/ab-1/a-1 --steps 8"


def test_a_run_under_another_cpu_budget_is_a_warning() -> None:
    """`serwatt profile --cpu-budget` lowers the rates a run's windows ran at: runs made
    under different budgets were sampled differently (serwatt ab runs with none)."""
    base = [_run("a-1", 1)]
    cand = [
        dataclasses.replace(
            _run("b-1", 3),
            config={"command": "python train.py", "window_s": 5.0, "timing_rate_hz": 400.0,
                    "cpu_budget_cores": 0.04},
        )
    ]  # fmt: skip
    report = build_report(base, cand)
    assert _fields(report) == ["config.cpu_budget_cores"]
    (warned,) = [w for w in report["warnings"] if w["scope"] == "comparability"]
    assert "null (a-1); 0.04 (b-1)" in warned["message"]
