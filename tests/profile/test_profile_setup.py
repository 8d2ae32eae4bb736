"""profiler/profile/setup.py: the one constructor both profile drivers of the command line
call. Every bad option is a SetupError naming it, raised before anything is opened that
would outlive it, and a record file that is not one is left as it was."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from serwatt.profiler.profile.setup import ProfileOptions, ProfileSetup, SetupError


def test_the_plan_is_the_options_runs() -> None:
    default = ProfileOptions(rate_hz=50).plan()
    assert (default.rate_hz, default.on_cpu_run, default.timing_rate_hz) == (50, True, 200)
    assert ProfileOptions(rate_hz=200).plan().timing_rate_hz == 400  # the ceiling
    assert ProfileOptions(timing_rate_hz=0).plan().timing_rate_hz is None
    assert ProfileOptions(timing_rate_hz=30, on_cpu_run=False).plan().timing_rate_hz == 30
    assert ProfileOptions(on_cpu_run=False).plan().on_cpu_run is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(checkpoint_glob="*.pt"), "--checkpoint-glob names files under --checkpoints DIR"),
        (dict(run_id="a"), "--run-id names the run --record writes: give --record FILE too"),
        (dict(tdp_w=0.0), "--tdp must be > 0 watts, got 0"),
        (dict(modes={"rapl": "sometimes"}), "--rapl sometimes: give one of auto, required, off"),
        (dict(sysfs=Path("/nonexistent")), "--path.sysfs /nonexistent: not a directory"),
        (dict(modes={"rapl": "required"}), "RAPL"),  # this VM has no powercap zones
    ],
)  # fmt: skip
def test_a_bad_option_is_a_setup_error_that_names_it(options: dict, message: str) -> None:
    with pytest.raises(SetupError) as info:
        ProfileSetup.open(ProfileOptions(**options))
    assert message in str(info.value), str(info.value)


def test_a_record_that_is_not_one_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"not a run record\n")
    with pytest.raises(SetupError, match=rf"--record {notes}: "):
        ProfileSetup.open(ProfileOptions(record=notes))
    assert notes.read_bytes() == b"not a run record\n"
    missing = tmp_path / "nope"
    with pytest.raises(SetupError, match=rf"--checkpoints {missing}: not a directory"):
        ProfileSetup.open(ProfileOptions(checkpoints=missing))


def test_a_run_id_already_taken_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    first = ProfileSetup.open(ProfileOptions(record=db, run_id="a-1"))
    assert [type(s).__name__ for s in first.sinks()] == ["EnergySink", "RecordSink"]
    assert first.record_sink is not None
    first.record_sink.recorder.start_run("a-1", "job", host={}, config={}, sources={})
    first.record_sink.recorder.close()
    with pytest.raises(SetupError, match="--run-id a-1: .* already holds a run of that id"):
        ProfileSetup.open(ProfileOptions(record=db, run_id="a-1"))


def _profile_parser() -> argparse.ArgumentParser:
    from serwatt.profiler.cli import profile

    parser = argparse.ArgumentParser(prog="serwatt profile")
    profile.configure(parser)
    return parser


@pytest.mark.parametrize(
    ("argv", "rate", "budget"),
    [
        ([], 50, "default"),  # the default rate under the default budget
        (["--rate", "100"], 100, None),  # a rate given is that rate
        (["--rate", "100", "--cpu-budget", "0.5"], 100, 0.5),  # unless a budget is too
        (["--cpu-budget", "off"], 50, None),
        (["--cpu-budget", "0.25"], 50, 0.25),
    ],
)
def test_the_cpu_budget_of_a_command_line(argv, rate, budget) -> None:
    from serwatt.profiler.cli.profile import profile_options
    from serwatt.profiler.sampling.budget import default_budget_cores

    args = _profile_parser().parse_args([*argv, "--", "true"])
    options = profile_options(args)
    assert options.rate_hz == rate
    assert options.cpu_budget_cores == (default_budget_cores() if budget == "default" else budget)


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "lots"])
def test_a_bad_cpu_budget_is_refused_with_its_name(bad, capsys) -> None:
    with pytest.raises(SystemExit):
        _profile_parser().parse_args(["--cpu-budget", bad, "--", "true"])
    assert "--cpu-budget" in capsys.readouterr().err
