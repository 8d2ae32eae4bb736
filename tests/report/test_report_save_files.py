"""A checkpoint written as a directory of files in one save (a Trainer's `checkpoint-N/`:
safetensors for the weights, torch for the optimizer, json for the state) is one checkpoint
in the report, and its files are shown under it: each file's name relative to the
directory (escaped: the job names them), its codepath, bytes and the time of the episode
that wrote it, in the JSON and in --full; a file no episode wrote says so, untimed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from serwatt.profiler.attribution.checkpoints import PART_OF
from serwatt.profiler.report import build_report, render_html, render_text
from serwatt.profiler.report.inputs import CheckpointInput, EpisodeInput, RunInput
from tests.report_synth import make_run

WEIGHTS, OPTIMIZER, STATE = 4 << 20, 8 << 20, 829
# the job names its files: a terminal escape in one must reach the terminal escaped
HOSTILE = "state\x1b[31m.json"
GOLDEN = Path(__file__).parent / "golden" / "report_save_files.txt"


def _part(
    path: str, size: int, t: float, writer: EpisodeInput | None, save: str
) -> CheckpointInput:
    return CheckpointInput(
        path=path, bytes=size, event_t=t, pid=4242,
        thread_id=writer.thread if writer else None,
        episode_start=writer.start if writer else None,
        stall_thread=None, stall_start=None, stall_s=None, resolution_s=None,
        timed_by=f"{PART_OF} {save} (5 files)", cpu_s_all_threads=None, async_tail_s=None,
    )  # fmt: skip


def directory_run(run_id: str, *, seed: int, weights_s: float, optimizer_s: float) -> RunInput:
    """Every save of make_run's as `checkpoint-K/`: the weights' safetensors episode, then
    the optimizer's torch episode, then a small state file no episode spans."""
    run = make_run(run_id, seed=seed, noise=0.0, stall_s=weights_s + optimizer_s)
    episodes: list[EpisodeInput] = []
    checkpoints: list[CheckpointInput] = []
    for k, e in enumerate(run.episodes or ()):
        w = dataclasses.replace(
            e, codepath="safetensors", end=e.start + weights_s, wall_s=weights_s
        )
        o = dataclasses.replace(
            e, codepath="torch", start=w.end, end=w.end + optimizer_s, wall_s=optimizer_s
        )
        # one torch episode writes two small files (saves closer than a sample period)
        x = dataclasses.replace(o, start=o.end, end=o.end + 0.01, wall_s=0.01)
        episodes += [w, o, x]
        save = f"checkpoint-{k}"
        d = f"/ckpt/{save}"
        done = x.end + 0.001
        checkpoints += [
            _part(f"{d}/model.safetensors", WEIGHTS, w.end, w, save),
            _part(f"{d}/optimizer.pt", OPTIMIZER, o.end, o, save),
            _part(f"{d}/rng_state.pth", 14_000, x.end, x, save),
            _part(f"{d}/scheduler.pt", 1_000, x.end, x, save),
            _part(f"{d}/{HOSTILE}", STATE, done, None, save),
            CheckpointInput(
                path=d, bytes=WEIGHTS + OPTIMIZER + STATE + 15_000, event_t=done, pid=4242,
                thread_id=w.thread, episode_start=w.start, stall_thread=w.thread,
                stall_start=w.start, stall_s=done - w.start, resolution_s=w.resolution_s,
                timed_by="sample edges, one save of 5 files", cpu_s_all_threads=None,
                async_tail_s=0.0,
            ),
        ]  # fmt: skip
    return dataclasses.replace(run, episodes=tuple(episodes), checkpoints=tuple(checkpoints))


def _report() -> dict:
    base = [directory_run(f"b{i}", seed=i, weights_s=0.2, optimizer_s=0.4) for i in range(3)]
    cand = [directory_run(f"c{i}", seed=9 + i, weights_s=0.1, optimizer_s=0.05) for i in range(3)]
    return build_report(base, cand)


def test_each_file_of_a_directory_save_is_in_the_json_with_its_codepath_bytes_and_time() -> None:
    report = _report()
    side = report["checkpoint"]["baseline"]
    saves = len(directory_run("x", seed=0, weights_s=0.2, optimizer_s=0.4).episodes or ()) // 3 * 3
    files = side["save_files"]
    assert files["saves"] == saves
    assert files["source"].startswith("measured: ")
    got = {(f["name"], f["codepath"]): f for f in files["per_file"]}
    escaped = "state\\x1b[31m.json"
    assert list(got) == [
        ("optimizer.pt", "torch"),
        ("model.safetensors", "safetensors"),
        ("rng_state.pth", "torch"),
        ("scheduler.pt", "torch"),
        (escaped, None),
    ]  # largest first
    assert got[("optimizer.pt", "torch")]["writer_s_mean"] == pytest.approx(0.4, rel=1e-12)
    assert got[("model.safetensors", "safetensors")]["writer_s_mean"] == pytest.approx(
        0.2, rel=1e-12
    )
    assert got[("model.safetensors", "safetensors")]["bytes_mean"] == WEIGHTS
    state = got[(escaped, None)]
    assert (state["writer_s_mean"], state["timed"], state["file_event_only"]) == (None, 0, saves)
    for name in ("rng_state.pth", "scheduler.pt"):  # written in one episode: no own time
        f = got[(name, "torch")]
        assert (f["writer_s_mean"], f["timed"], f["shared"]) == (None, 0, saves)
    first = files["per_save"][0]
    assert first["checkpoint"] == "checkpoint-0"
    assert [f["name"] for f in first["files"]] == [
        "model.safetensors",
        "optimizer.pt",
        "rng_state.pth",
        "scheduler.pt",
        escaped,
    ]
    # one checkpoint per save, its stall across its files
    assert (side["checkpoints"], side["files_written"]) == (saves, saves * 5)
    assert side["stall_s"]["p50"] == pytest.approx(0.611, abs=1e-6)  # epoch-second floats
    cand = report["checkpoint"]["candidate"]["save_files"]["per_file"]
    assert [f["writer_s_mean"] for f in cand[:2]] == pytest.approx([0.05, 0.1], rel=1e-12)


def test_full_text_shows_each_file_under_the_checkpoint_table_escaped() -> None:
    full = render_text(_report(), full=True)
    assert "\x1b" not in full
    lines = full.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  files per save: baseline"))
    assert lines.index("CHECKPOINT COST (per checkpoint, training thread)") < at
    block = "\n".join(lines[at : at + 12])
    assert "optimizer.pt: torch, 8.39e+06 B," in block
    assert "written in 0.4 s ± 0.02 (60 of 60 saves timed)" in block
    assert "model.safetensors: safetensors, 4.19e+06 B," in block
    assert "state\\x1b[31m.json: codepath unknown, 829 B," in block
    assert "829 B, untimed in 60 of 60: no episode (file event only)" in block
    assert (
        "scheduler.pt: torch, 1000 B, untimed in 60 of 60: its episode wrote other files too"
        in ("\n".join(lines[at : at + 12]))
    )
    assert any(line.startswith("  files per save: candidate") for line in lines)
    # the first screen stays compact: no per-file lines
    assert "files per save" not in render_text(_report(), full=False)


def test_the_html_has_a_table_of_each_sides_files() -> None:
    page = render_html(_report())
    assert "\x1b" not in page
    assert page.count("checkpoint(s) of several files, per file over its saves") == 2
    assert '<td>optimizer.pt</td><td>torch</td><td class="num">8.39e+06</td>' in page
    assert "<td>state\\x1b[31m.json</td><td>unknown</td>" in page


def test_the_checkpoint_section_matches_its_golden_file(request: pytest.FixtureRequest) -> None:
    """The --full checkpoint section of a directory-save report, for a reviewer to read;
    `pytest --update-golden` rewrites it after a reviewed change."""
    lines = render_text(_report(), full=True).splitlines()
    at = lines.index("CHECKPOINT COST (per checkpoint, training thread)")
    end = lines.index("", at)
    text = "\n".join(lines[at:end]) + "\n"
    if request.config.getoption("--update-golden"):
        GOLDEN.write_text(text)
        return
    assert text == GOLDEN.read_text(), f"{GOLDEN.name} differs from its golden file"
