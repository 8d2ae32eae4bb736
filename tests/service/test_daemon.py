"""`serwatt daemon`: a real daemon process sampling real Python workloads with py-spy.

Lifecycle (config, READY/WATCHDOG/STOPPING, SIGTERM, records) and the fault tests:
target killed mid-window, target restarted, py-spy killed, a target that is not
Python, bad config on SIGHUP, SIGKILL during writes.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import time

import pytest

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records.store import Recorder
from tests.daemon_support import (
    PYTHON,
    REPO,
    NotifyListener,
    children_named,
    daemon_config,
    start_daemon,
    start_powercap,
    start_workload,
    stop_process,
    total,
    wait_for,
)


def _run_to_exit(cfg) -> subprocess.CompletedProcess:
    """Run a daemon that is expected to exit on its own (bad config, startup failure)."""
    return subprocess.run(
        [PYTHON, "-m", "serwatt", "daemon", "--config", str(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _error_kinds(m: dict, target: str) -> dict[str, float]:
    """serwatt_sampler_errors_total{target} by kind, the kinds counted at least once."""
    return {
        dict(lab)["kind"]: v
        for (n, lab), v in m.items()
        if n == "serwatt_sampler_errors_total" and v > 0 and dict(lab)["target"] == target
    }


def _next_step(d, name: str, timeout_s: float = 30, **labels: str) -> tuple[dict, float]:
    """Scrape until `name` changes; returns that scrape and the time it was sent.

    A counter the daemon advances once per slot changes in the first scrape after the
    slot is published: sent at most one poll (plus one scrape) after it."""
    before = total(d.metrics(), name, **labels)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sent = time.monotonic()
        m = d.metrics()
        if total(m, name, **labels) != before:
            return m, sent
        time.sleep(STEP_POLL_S)
    raise AssertionError(f"{name}{labels} did not change in {timeout_s}s\n{d.log()}")


# How often _next_step scrapes, and the most a slot's end may precede the scrape that
# first shows it (applying the slot: the energy read, the record commit, publishing;
# a few ms on an idle VM, tens of ms on a loaded one), both ends together.
STEP_POLL_S = 0.02
SLOT_EDGE_S = 0.5
# The RAPL test's span between its two scrapes (plus up to a slot): 0.52 s of slack over
# at least 4 s still fails a node counter 13% or more off the advancer's power.
SPAN_S = 4.0


def _record_totals(record_dir) -> dict[str, int]:
    with Recorder.for_dir(record_dir, readonly=True) as rec:
        out: dict[str, int] = {}
        for run in rec.runs():
            out[run.target] = out.get(run.target, 0) + run.samples
        return out


def test_bad_config_exits_78_naming_the_key_and_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("listen: 127.0.0.1:9977\nsample_rate_hz: fast\ntargets: []\n")
    proc = _run_to_exit(cfg)
    assert proc.returncode == 78, proc.stderr
    assert "sample_rate_hz" in proc.stderr and ":2:" in proc.stderr


def test_port_in_use_exits_1_with_the_fix(tmp_path):
    with __import__("socket").socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "serwatt.yaml"
        cfg.write_text(
            daemon_config(tmp_path / "runs", {"t": "nothing"}, listen=f"127.0.0.1:{port}")
        )
        proc = _run_to_exit(cfg)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "listen" in proc.stderr


def test_lifecycle_ready_watchdog_metrics_sigterm_and_record(tmp_path):
    work = start_workload(tmp_path, "lifecycle_trainer")
    notify = NotifyListener(tmp_path / "notify.sock")
    d = start_daemon(
        tmp_path,
        {"trainer": "lifecycle_trainer"},
        notify=notify,
        watchdog_usec=2_000_000,
    )
    try:
        wait_for(lambda: "READY=1" in notify.lines(), 60, "READY=1")
        m = d.wait_metric("serwatt_samples_total", 20, target="trainer")
        # Every codepath of the closed set is exported for the target, zeros included, each
        # serializer in both directions and unknown, `other` unknown alone.
        for cp in CODEPATHS:
            for way in ("encode", "decode", "unknown") if cp != "other" else ("unknown",):
                labels = (("codepath", cp), ("direction", way), ("target", "trainer"))
                assert ("serwatt_samples_total", labels) in m
                assert ("serwatt_cpu_seconds_total", labels) in m
        assert ("serwatt_samples_total", (("codepath", "other"), ("direction", "encode"),
                                          ("target", "trainer"))) not in m  # fmt: skip

        # the workload's pickle.dumps and pickle.loads (each on its own line: a line that
        # calls both says neither) land on their own directions; waited for, as the first
        # window with samples may be too short to hold a pickle sample
        def pickle_both_ways() -> bool:
            now = d.metrics()
            labels = {"target": "trainer", "codepath": "pickle"}
            return total(now, "serwatt_samples_total", **labels) > 0 and all(
                total(now, "serwatt_cpu_seconds_total", direction=way, **labels) > 0
                for way in ("encode", "decode")
            )

        wait_for(pickle_both_ways, 60, "pickle samples, and pickle CPU both ways")

        assert total(m, "serwatt_cpu_seconds_total", target="trainer") > 0
        assert total(m, "serwatt_target_up", target="trainer") == 1
        assert total(m, "serwatt_target_info", target="trainer", pid=str(work.pid)) == 1
        # no stack-change run (timing_rate_hz 0): the estimates weighed, and it says so
        now = d.metrics()
        assert total(now, "serwatt_target_info", pid=str(work.pid), cpu_source="estimate") == 1
        assert total(m, "serwatt_build_info") == 1
        page = d.get("/")
        assert '<a href="/metrics">' in page and f"pid {work.pid}" in page
        wait_for(lambda: "WATCHDOG=1" in notify.lines(), 30, "WATCHDOG=1")
        before_stop = d.metrics()
        code, took_s = d.stop()
        assert code == 0, d.log()
        assert took_s < 10, f"SIGTERM took {took_s:.1f}s"
        assert "STOPPING=1" in notify.lines()
    finally:
        d.kill()
        notify.close()
        stop_process(work)
    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        runs = [r for r in rec.runs() if r.target == "trainer"]
        assert len(runs) == 1 and runs[0].pids == (work.pid,)
        assert runs[0].ended_at is not None  # SIGTERM closed the run
        # Everything the last scrape showed was recorded (SIGTERM may add one window).
        assert runs[0].samples >= total(before_stop, "serwatt_samples_total", target="trainer")
        detail = rec.run(runs[0].run_id)
        assert detail.config["targets"][0]["name"] == "trainer"
        assert detail.host  # host fingerprint recorded


def test_target_killed_mid_window_then_restarted(tmp_path):
    work = start_workload(tmp_path, "restart_trainer")
    d = start_daemon(tmp_path, {"trainer": "restart_trainer"}, window_s=3)
    try:
        d.wait_metric("serwatt_samples_total", 10, target="trainer")
        # Kill the target while a py-spy window is attached to it.
        wait_for(lambda: children_named(d.pid, "py-spy"), 30, "a py-spy window")
        work.kill()
        work.wait()

        def down():
            m = d.metrics()
            return total(m, "serwatt_target_up", target="trainer") == 0 and m

        m = wait_for(down, 30, "target_up 0 after the kill")
        assert total(m, "serwatt_target_info", target="trainer") == 0
        # A window the target died in keeps its samples (an `exited` window, no error);
        # one that started after the death is `target_gone`; nothing is serwatt's fault.
        assert set(_error_kinds(m, "trainer")) <= {"target_gone"}, _error_kinds(m, "trainer")
        # Same target, new process: picked up by the re-scan.
        work2 = start_workload(tmp_path, "restart_trainer")
        try:

            def new_pid_sampled():
                m = d.metrics()
                info = total(m, "serwatt_target_info", target="trainer", pid=str(work2.pid))
                return info == 1 and m

            wait_for(new_pid_sampled, 60, "the restarted target's pid")
            before = total(d.metrics(), "serwatt_samples_total", target="trainer")
            d.wait_metric("serwatt_samples_total", before + 10, target="trainer")
            assert d.proc.poll() is None
            code, _ = d.stop()
            assert code == 0
        finally:
            stop_process(work2)
    finally:
        d.kill()
        stop_process(work)
    with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
        runs = {r.pids: r for r in rec.runs()}
        assert set(runs) == {(work.pid,), (work2.pid,)}
        assert all(r.ended_at is not None for r in runs.values())
        assert runs[(work.pid,)].samples > 0 and runs[(work2.pid,)].samples > 0


def test_pyspy_killed_is_counted_and_sampling_continues(tmp_path):
    work = start_workload(tmp_path, "pyspy_kill_trainer")
    d = start_daemon(tmp_path, {"trainer": "pyspy_kill_trainer"}, window_s=3)
    try:
        d.wait_metric("serwatt_samples_total", 10, target="trainer")
        spies = wait_for(lambda: children_named(d.pid, "py-spy", "record"), 30, "a py-spy window")
        os.kill(spies[0], signal.SIGKILL)
        m = d.wait_metric("serwatt_sampler_errors_total", 1, target="trainer")
        # A py-spy killed under the daemon is serwatt's own sampling failing (docs/daemon.md).
        assert _error_kinds(m, "trainer") == {"sampler_failed": 1}, m
        assert total(m, "serwatt_collector_up", collector="pyspy") == 0
        before = total(m, "serwatt_samples_total", target="trainer")
        d.wait_metric("serwatt_samples_total", before + 10, target="trainer")
        assert d.proc.poll() is None
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)


def test_not_python_target_is_counted_not_fatal(tmp_path):
    # A non-Python binary whose name looks like Python: discovery takes it, py-spy refuses.
    (tmp_path / "notpy_marker").mkdir()
    fake = tmp_path / "notpy_marker" / "python3"
    shutil.copy("/bin/sleep", fake)
    impostor = subprocess.Popen([str(fake), "600"])
    work = start_workload(tmp_path, "notpy_real_trainer")
    d = start_daemon(tmp_path, {"impostor": "notpy_marker", "trainer": "notpy_real_trainer"})
    try:
        m = d.wait_metric("serwatt_sampler_errors_total", 1, target="impostor")
        kinds = _error_kinds(m, "impostor")
        assert set(kinds) == {"not_python"}, kinds
        m = d.wait_metric("serwatt_samples_total", 10, target="trainer")
        assert total(m, "serwatt_target_up", target="impostor") == 0
        assert total(m, "serwatt_target_up", target="trainer") == 1
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)
        stop_process(impostor)


def test_sighup_bad_config_is_logged_and_the_old_one_kept(tmp_path):
    work = start_workload(tmp_path, "hup_trainer")
    other = start_workload(tmp_path, "hup_loader")
    targets = {"trainer": "hup_trainer"}
    d = start_daemon(tmp_path, targets)
    cfg = tmp_path / "serwatt.yaml"
    try:
        d.wait_metric("serwatt_samples_total", 5, target="trainer")
        cfg.write_text(daemon_config(tmp_path / "runs", targets, sample_rate_hz=-3))
        d.signal(signal.SIGHUP)
        wait_for(lambda: "reload rejected" in d.log(), 30, "the rejected reload in the log")
        assert "sample_rate_hz" in d.log()
        before = total(d.metrics(), "serwatt_samples_total", target="trainer")
        d.wait_metric("serwatt_samples_total", before + 5, target="trainer")
        # A good config adds a target without a restart.
        cfg.write_text(daemon_config(tmp_path / "runs", targets | {"loader": "hup_loader"}))
        d.signal(signal.SIGHUP)
        d.wait_metric("serwatt_samples_total", 5, target="loader")
        assert d.proc.poll() is None
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)
        stop_process(other)


@pytest.mark.long  # SIGKILLs a writing daemon at many moments
def test_sigkill_during_writes_keeps_every_committed_window(tmp_path):
    work = start_workload(tmp_path, "kill9_trainer")
    work2 = start_workload(tmp_path, "kill9_loader")
    rng = random.Random(4)
    record_dir = tmp_path / "runs"
    try:
        for round_ in range(3):
            before = _record_totals(record_dir) if (record_dir / "runs.sqlite").exists() else {}
            d = start_daemon(
                tmp_path,
                {"trainer": "kill9_trainer", "loader": "kill9_loader"},
                window_s=1,
                rescan_s=0.3,
            )
            try:
                d.wait_metric("serwatt_samples_total", 1, target="loader")
                time.sleep(rng.uniform(0.0, 2.0))
                seen = d.metrics()  # every window counted here was committed first
                time.sleep(rng.uniform(0.0, 0.3))
                d.proc.send_signal(signal.SIGKILL)
                d.proc.wait(timeout=10)
            finally:
                d.kill()
            db = sqlite3.connect(record_dir / "runs.sqlite")
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            db.close()
            after = _record_totals(record_dir)
            for target in ("trainer", "loader"):
                scraped = total(seen, "serwatt_samples_total", target=target)
                recorded = after.get(target, 0) - before.get(target, 0)
                assert recorded >= scraped, (round_, target, recorded, scraped)
        # A restarted daemon reopened the same runs (same processes), not new ones.
        with Recorder.for_dir(record_dir, readonly=True) as rec:
            assert sorted(r.target for r in rec.runs()) == ["loader", "trainer"]
    finally:
        stop_process(work)
        stop_process(work2)


@pytest.mark.serial  # times the node energy against the wall clock
def test_rapl_energy_then_unreadable_sysfs_keeps_the_scrape_up(tmp_path):
    sysfs = tmp_path / "sys"
    watts = 40.0
    advancer = start_powercap(sysfs, watts)
    work = start_workload(tmp_path, "rapl_trainer")
    d = start_daemon(tmp_path, {"trainer": "rapl_trainer"}, sysfs=sysfs, window_s=2)
    try:
        node = "serwatt_node_cpu_energy_joules_total"
        d.wait_metric(node, 1, source="rapl")
        # The node counter steps once per slot, by the energy of that slot; slots are back
        # to back. Taking both scrapes just after a step measures the energy between two
        # slot ends, so the span is off only by how late each scrape saw its step.
        a, ta = _next_step(d, node, source="rapl")
        assert total(a, "serwatt_collector_up", collector="rapl") == 1
        time.sleep(SPAN_S)
        b, tb = _next_step(d, node, source="rapl")
        dj = total(b, node, source="rapl") - total(a, node, source="rapl")
        slack_j = watts * (SLOT_EDGE_S + STEP_POLL_S)
        assert abs(dj - watts * (tb - ta)) <= slack_j, (dj, watts * (tb - ta), slack_j)
        # Identity: node = every target codepath's joules + unattributed.
        node = total(b, "serwatt_node_cpu_energy_joules_total", source="rapl")
        parts = total(b, "serwatt_energy_joules_total", source="rapl") + total(
            b, "serwatt_unattributed_energy_joules_total", source="rapl"
        )
        assert abs(node - parts) <= 1e-6 * max(1.0, node)
        assert total(b, "serwatt_energy_joules_total", target="trainer", source="rapl") > 0

        # The sysfs counter becomes unreadable mid-run.
        advancer.kill()
        advancer.wait()
        energy_file = sysfs / "class" / "powercap" / "intel-rapl:0" / "energy_uj"
        energy_file.unlink()
        energy_file.mkdir()  # reading it now fails with EISDIR

        def rapl_down():
            m = d.metrics()
            return total(m, "serwatt_collector_up", collector="rapl") == 0 and m

        m = wait_for(rapl_down, 60, "collector_up{rapl} 0")
        before = total(m, "serwatt_samples_total", target="trainer")
        node_before = total(m, "serwatt_node_cpu_energy_joules_total", source="rapl")
        m = d.wait_metric("serwatt_samples_total", before + 10, target="trainer")
        assert total(m, "serwatt_node_cpu_energy_joules_total", source="rapl") >= node_before
        assert "rapl" in d.get("/")
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)
        stop_process(advancer)


def test_required_rapl_missing_exits_78_with_the_fix(tmp_path):
    empty_sysfs = tmp_path / "sys"
    (empty_sysfs / "class").mkdir(parents=True)  # a sysfs without powercap, as on a VM
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(daemon_config(tmp_path / "runs", {"t": "x"}, sysfs=empty_sysfs, rapl=True))
    proc = _run_to_exit(cfg)
    assert proc.returncode == 78, proc.stderr
    assert "RAPL is required but unavailable" in proc.stderr and "auto" in proc.stderr


def test_concurrent_pyspy_windows_are_bounded_and_every_target_gets_turns(tmp_path):
    names = [f"bound{i}_trainer" for i in range(4)]
    works = [start_workload(tmp_path, n) for n in names]
    d = start_daemon(
        tmp_path,
        {f"t{i}": n for i, n in enumerate(names)},
        window_s=1,
        max_concurrent_samplers=2,
    )
    try:
        most = 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            most = max(most, len(children_named(d.pid, "py-spy", "record")))
            try:
                m = d.metrics()
            except OSError:
                m = {}  # not listening yet
            if all(total(m, "serwatt_samples_total", target=f"t{i}") > 0 for i in range(4)):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"not every target was sampled:\n{d.log()}")
        # A window is two py-spy processes (on-CPU and --idle runs): 2 windows, 4 py-spys.
        assert 2 <= most <= 4, most
        assert d.stop()[0] == 0
    finally:
        d.kill()
        for w in works:
            stop_process(w)


def test_retention_deletes_old_runs_at_startup(tmp_path):
    record_dir = tmp_path / "runs"
    with Recorder.for_dir(record_dir) as rec:
        old = time.time() - 40 * 86400
        rec.start_run("old-run", "trainer", host={}, config={}, sources={}, started_at=old)
        rec.finish_run("old-run", old + 60)
        rec.start_run("recent-run", "trainer", host={}, config={}, sources={})
    d = start_daemon(tmp_path, {"trainer": "retention_nothing_matches"})  # retention_days: 30
    try:
        d.wait_metric("serwatt_build_info", 1)
        with Recorder.for_dir(record_dir, readonly=True) as rec:
            assert [r.run_id for r in rec.runs()] == ["recent-run"]
        assert d.stop()[0] == 0
    finally:
        d.kill()


def test_hung_pyspy_is_stopped_counted_and_sampling_resumes(tmp_path):
    work = start_workload(tmp_path, "hung_trainer")
    d = start_daemon(
        tmp_path, {"trainer": "hung_trainer"}, window_s=1, daemon_options={"kill_grace_s": 2.0}
    )
    try:
        d.wait_metric("serwatt_samples_total", 5, target="trainer")
        spies = wait_for(lambda: children_named(d.pid, "py-spy", "record"), 30, "a py-spy window")
        os.kill(spies[0], signal.SIGSTOP)  # a py-spy that never ends its window
        m = d.wait_metric("serwatt_sampler_errors_total", 1, timeout_s=120, target="trainer")
        # The window's py-spy ignores its SIGINT; the sampler kills it kill_grace_s (2 s
        # here, 10 s by default) later, well before the daemon would abandon the window
        # (window_s + 15 s + 15 s, `window_timeout`): serwatt's own sampling failing,
        # `sampler_failed`.
        assert _error_kinds(m, "trainer") == {"sampler_failed": 1}, m
        assert total(m, "serwatt_collector_up", collector="pyspy") == 0
        before = total(m, "serwatt_samples_total", target="trainer")
        m = d.wait_metric("serwatt_samples_total", before + 10, target="trainer")
        assert d.proc.poll() is None
        assert spies[0] not in children_named(d.pid, "py-spy")  # the hung one is gone
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)
