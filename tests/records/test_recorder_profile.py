"""RecordSink: a real `serwatt profile` session (real py-spy, real workload) recorded
in the daemon's run-record format, with energy from the model and GPU-wait from a replayed
NVML timeline."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.tracker import EnergyTracker
from serwatt.profiler.attribution.window import episode_gpu_reading
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.profile.energy_sink import EnergySink
from serwatt.profiler.profile.record_sink import RecordSink
from serwatt.profiler.profile.session import ProfileSession
from serwatt.profiler.records.store import Recorder, RecordError
from tests.nvml_replay import ReplayNvmlBackend, load_timeline

REPO = Path(__file__).resolve().parents[2]
JSON_LOOP = textwrap.dedent(
    """
    import json, time
    doc = {"k%d" % i: [i, str(i), {"x": i * 0.5}] for i in range(2000)}
    end = time.time() + 60
    while time.time() < end:
        json.dumps(doc)
    """
)


@pytest.fixture
def workload():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([sys.executable, "-c", JSON_LOOP])
    yield proc
    proc.kill()
    proc.wait(timeout=30)


def profile(pid: int, sinks: list, duration_s: float = 4.0, tracker=None):  # type: ignore[no-untyped-def]
    session = ProfileSession(
        pid,
        classifier=Classifier.default(),
        plan=SamplingPlan(rate_hz=50, on_cpu_run=True),
        window_s=1.0,
        duration_s=duration_s,
        tracker=tracker,
        sinks=sinks,
        follow_children=False,
        progress=None,
    )
    return session.run()


def test_profile_session_is_recorded_with_model_energy_and_replayed_gpu_wait(
    tmp_path: Path, workload
) -> None:  # type: ignore[no-untyped-def]
    # The stall (an empty sample buffer) moved 20 s later: the session's one JSON episode
    # spans its whole run, and a slow start put its end into the stall at 4 s, where no
    # sample covers its edge and its GPU-wait is rightly unknown.
    timeline = load_timeline("h200_checkpoint_stall")
    for seg in timeline["gpus"][0]["segments"][:-1]:
        seg["until_s"] += 20.0
    backend = ReplayNvmlBackend(timeline, target_pids=[workload.pid])
    tracker = EnergyTracker(
        sysfs_root=tmp_path / "no-sysfs",  # no powercap here: the labelled model is used
        tdp_w=120.0,
        rapl_mode="auto",
        nvml_mode="auto",
        nvml_backend=backend,
        clock=backend.clock,
    )
    energy = EnergySink()
    recorder = RecordSink(tmp_path / "profile.sqlite", tracker=tracker)
    result = profile(workload.pid, [energy, recorder], tracker=tracker)
    assert recorder.errors == []
    windows = sum(t.windows for t in result.targets)
    assert windows >= 2 and recorder.windows == windows

    rec = Recorder(tmp_path / "profile.sqlite", readonly=True)
    (summary,) = rec.runs()
    assert summary.run_id == recorder.run_id and summary.run_id.endswith(f"-{workload.pid}")
    assert summary.target == "profile" and summary.ended_at is not None
    assert summary.pids == (workload.pid,) and summary.windows == windows
    assert summary.energy_sources == ("model",)
    detail = rec.run(summary.run_id)
    assert detail.config["mode"] == "serwatt profile" and detail.config["rate_hz"] == 50
    assert detail.host["gpu_source"] == "nvml" and detail.host["gpus"][0]["name"]
    assert detail.sources["energy"] == "model"
    # the one `sources` shape the daemon records too (profiler/records/sources.py)
    collectors = detail.sources["collectors"]
    assert set(detail.sources) == {"energy", "collectors"}
    assert set(collectors) == {"rapl", "cpustat", "cpu_model", "nvml"}, collectors
    assert collectors["nvml"]["up"] is True and collectors["cpu_model"]["up"] is True
    # The samples recorded are the session's own, codepath by codepath.
    for cp in CODEPATHS:
        assert detail.codepaths[cp].samples == result.acc.samples[cp], cp
        assert detail.codepaths[cp].cpu_s == pytest.approx(result.acc.cpu_s[cp], abs=1e-9)
    assert detail.codepaths["json"].samples > 0  # the workload is json.dumps
    # Every window carries model joules per codepath, and GPU-wait from the replayed H200.
    # (A short last window the NVML poll did not cover has no GPU data: None, never 0 s.)
    for w in detail.windows:
        assert w.energy is not None and w.energy["source"] == "model"
        assert all(w.codepaths[cp]["energy_source"] == "model" for cp in CODEPATHS)
        if w.gpu is not None:
            assert w.gpu["gpus"][0]["index"] == 0
            assert all(w.codepaths[cp]["gpu_wait_s"] is not None for cp in CODEPATHS)
        else:
            assert all(w.codepaths[cp]["gpu_wait_s"] is None for cp in CODEPATHS)
    assert sum(w.gpu is not None for w in detail.windows) >= len(detail.windows) - 1
    # GPU-wait is computed once per window: the profile document's is the record's, summed
    doc = energy.summary.codepaths if energy.summary else {}
    for cp in CODEPATHS:
        recorded = sum(w.codepaths[cp]["gpu_wait_s"] or 0.0 for w in detail.windows)
        assert doc[cp].gpu_wait_s == pytest.approx(recorded, abs=1e-5), cp
    assert sum(doc[cp].gpu_wait_s or 0.0 for cp in CODEPATHS) > 0
    total_j = sum(w.energy["package_j"] for w in detail.windows)
    assert 0 < sum(t.energy_j or 0.0 for t in detail.codepaths.values()) <= total_j + 1e-6
    # Each episode's GPU-wait is the replayed GPU's idle time over its span, within two
    # NVML utilisation periods (its edges), and its idle joules lie between the GPU's
    # idle and busy power times that wait (None only where the energy polls stop).
    nvml_period_s = backend.timeline["gpus"][0]["period_s"]
    episodes = rec.episodes(summary.run_id) or ()
    timed = [e for e in episodes if e["gpu_wait_s"] is not None]

    def coverage() -> list[tuple]:
        """Per episode: its span, and the replayed GPU's utilisation intervals over it."""
        out: list[tuple] = []
        for e in episodes:
            try:
                gpus = tracker.gpu_window(e["start"], e["end"])
            except Exception as exc:  # a failure message, not a second failure
                out.append((e["start"], e["end"], repr(exc)))
                continue
            for g in gpus:
                ivs = [(iv.t0, iv.t1) for iv in g.intervals]
                out.append((e["start"], e["end"], g.up, g.pids, ivs[:2], ivs[-2:]))
        return out

    assert timed, (episodes, coverage(), backend.start)
    for e in timed:
        truth = backend.true_idle_s(0, e["start"], e["end"])
        assert e["gpu_wait_s"] == pytest.approx(truth, abs=2 * nvml_period_s), e
        if e["gpu_idle_j"] is not None:
            assert 75.0 * e["gpu_wait_s"] * 0.95 <= e["gpu_idle_j"] <= 640.0 * e["gpu_wait_s"]
    # A 2 s episode inside the replay's first 24 s (96% busy throughout, 617.4 W) and
    # inside the session's energy polls, which begin when the session does (on a loaded
    # machine over 1 s after the replay): its last 2.5-0.5 s. Exact figures, to the
    # rounding of the driver's mJ counter and us timestamps.
    end = backend.clock() - 0.5
    assert end <= backend.start + 24.0, "the session outran the replay's busy segment"
    inside = episode_gpu_reading(
        tracker,
        Episode(
            pid=workload.pid, thread=workload.pid, codepath="json", start=end - 2.0,
            end=end, wall_s=2.0, period_s=0.02, resolution_s=0.02, cpu_s=0.0,
            main_thread=True, durable=False,
        ),
    )  # fmt: skip
    assert inside.gpu_wait_s == pytest.approx(2.0 * 0.04, rel=1e-6)
    assert inside.gpu_idle_j == pytest.approx(2.0 * 0.04 * (75.0 + 565.0 * 0.96), rel=1e-4)


def test_profile_session_without_energy_records_unavailable(tmp_path: Path, workload) -> None:  # type: ignore[no-untyped-def]
    recorder = RecordSink(tmp_path / "r.sqlite", target="bench", run_id="bench-1")
    profile(workload.pid, [recorder], duration_s=2.5)
    detail = Recorder(tmp_path / "r.sqlite").run("bench-1")
    assert detail.summary.windows >= 1
    assert detail.sources["energy"].startswith("unavailable")
    assert all(w.energy is None for w in detail.windows)
    assert detail.codepaths["json"].energy_j is None  # never 0 J


def test_a_bad_record_file_fails_before_profiling(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("my notes, not a database\n" * 50)
    with pytest.raises(RecordError, match="not a readable serwatt run record"):
        RecordSink(bad)
    assert bad.read_text().startswith("my notes")


# --------------------------------------------------------------- `serwatt profile --record`


def test_serwatt_profile_record_writes_a_run_that_serwatt_runs_shows(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    out = subprocess.run(
        # --cpu-budget off: 1 s windows under the default budget on 2 CPUs run at 1 Hz
        [sys.executable, "-m", "serwatt", "profile", "--record", str(db), "--window", "1",
         "--cpu-budget", "off",
         "--path.sysfs", str(tmp_path), "--tdp", "100", "--nvml", "off", "--",
         sys.executable, "-c", JSON_LOOP.replace("60", "4")],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rec = Recorder(db, readonly=True)
    (summary,) = rec.runs()
    assert summary.target == "profile" and summary.run_id.startswith("profile-")
    assert summary.windows >= 2 and summary.ended_at is not None
    assert summary.energy_sources == ("model",)  # no powercap under --path.sysfs tmp
    detail = rec.run(summary.run_id)
    assert detail.config["mode"] == "serwatt profile" and "json.dumps" in detail.config["command"]
    assert detail.codepaths["json"].samples > 0
    assert detail.host["gpu_source"].startswith("unavailable: off")  # --nvml off, said so
    shown = subprocess.run(
        [sys.executable, "-m", "serwatt", "runs", "show", summary.run_id, "--db", str(db)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert shown.returncode == 0 and f"run {summary.run_id}  target profile" in shown.stdout


def test_serwatt_profile_refuses_a_bad_record_file_before_starting_the_command(
    tmp_path: Path,
) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("not a database\n" * 100)
    marker = tmp_path / "started"
    out = subprocess.run(
        [sys.executable, "-m", "serwatt", "profile", "--record", str(junk), "--",
         sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--record" in out.stderr and "not a readable serwatt run record" in out.stderr
    assert not marker.exists()  # the command never ran
    assert junk.read_text() == "not a database\n" * 100
