"""SIGHUP applies each reloadable key at once; the startup-bound keys wait for a restart.

docs/daemon.md, "SIGHUP": "A good one applies targets, `sample_rate_hz`, `window_s`,
`rescan_s`, `max_concurrent_samplers`, `cpu_budget_cores`, rules files, `retention_days`
and `log_level` at once; `listen`, `record.dir`, `paths.sysfs`, `rapl`, `nvml`,
`cpu_model.tdp_w` and `sampler_priority` are bound at startup and take effect on restart
(logged). A removed target keeps its totals (counters never vanish) and shows
`serwatt_target_up 0`."

Real daemons over real light targets. Each reloadable key is changed by a SIGHUP and its
effect observed where it acts: py-spy's own command line (rate, window length), the number
of py-spy processes at once, how soon a new process is found, the rate under a budget, the
metrics of a removed target, where samples land under a new rules file, the log lines of a
new level, and runs deleted by a shorter retention. The startup-bound keys are changed
too: each is logged as taking effect on restart and the running value is kept.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil

from serwatt.profiler.records.store import Recorder
from tests.daemon_support import (
    PYTHON,
    DaemonProc,
    children_named,
    daemon_config,
    stop_process,
    total,
    wait_for,
)

LIGHT = (
    "import pickle, time\nd = list(range(20000))\n"
    "def work():\n    pickle.dumps(d)\n"
    "while True:\n    work()\n    time.sleep(0.02)\n"
)


# Test B's target spends most of its time in work(), where the rules file acts.
BUSY = (
    "import pickle, time\nd = {str(i): list(range(40)) for i in range(400)}\n"
    "def work():\n    for _ in range(30):\n        pickle.dumps(d)\n"
    "while True:\n    work()\n    time.sleep(0.01)\n"
)


# The keys test A reloads to, and test B's light sampling.
FAST = {"sample_rate_hz": 20, "window_s": 2, "max_concurrent_samplers": 3}
SLOW = {"sample_rate_hz": 10, "window_s": 1}


def start_light(tmp_path: Path, marker: str, code: str = LIGHT) -> subprocess.Popen:
    script = tmp_path / f"{marker}.py"
    script.write_text(code)
    return subprocess.Popen([PYTHON, str(script)], stdout=subprocess.DEVNULL)


class SpyWatch:
    """The daemon's `py-spy record` children, every 20 ms: (monotonic time, {pid: argv})."""

    def __init__(self, daemon_pid: int) -> None:
        self.daemon_pid = daemon_pid
        self.seen: list[tuple[float, dict[int, list[str]]]] = []
        self._argv: dict[int, list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            found = {}
            for pid in children_named(self.daemon_pid, "py-spy", "record"):
                if pid not in self._argv:
                    try:
                        self._argv[pid] = psutil.Process(pid).cmdline()
                    except psutil.NoSuchProcess:
                        continue
                found[pid] = self._argv[pid]
            self.seen.append((now, found))
            time.sleep(0.02)

    def started_after(self, t: float) -> list[list[str]]:
        """argv of each py-spy first seen after t."""
        first: dict[int, float] = {}
        for when, found in list(self.seen):
            for pid in found:
                first.setdefault(pid, when)
        return [self._argv[pid] for pid, when in first.items() if when > t]

    def since(self, t: float) -> list[dict[int, list[str]]]:
        return [found for when, found in list(self.seen) if when >= t]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _reload(d: DaemonProc, cfg: Path, text: str) -> float:
    """Write the config, SIGHUP, wait until the daemon says it reloaded; monotonic time."""
    n = d.log().count("reloaded: ")
    cfg.write_text(text)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.log().count("reloaded: ") > n, 30, "the reload applied")
    return time.monotonic()


def test_sampling_keys_and_targets_apply_at_once(tmp_path: Path) -> None:
    works = [start_light(tmp_path, f"hupkeys_t{i}") for i in range(3)]
    record_dir = tmp_path / "runs"
    cfg = tmp_path / "serwatt.yaml"
    targets = {f"t{i}": f"hupkeys_t{i}" for i in range(3)}
    base = dict(record_dir=record_dir, targets=targets)
    cfg.write_text(
        daemon_config(**base, sample_rate_hz=10, window_s=1, max_concurrent_samplers=1, rescan_s=30)
    )
    d = DaemonProc(cfg, None, tmp_path / "daemon.log")  # port 0: read from its landing line
    watch = SpyWatch(d.pid)
    extra: list[subprocess.Popen] = []
    try:
        for name in targets:
            d.wait_metric("serwatt_samples_total", 1, target=name)
        before = [f for f in watch.since(0) if f]
        assert before and max(len(f) for f in before) <= 2  # one window (two runs) at once
        argvs = [a for f in before for a in f.values()]
        assert {_arg(a, "--duration") for a in argvs} == {"2"}  # ceil(window_s) + 1
        assert {_arg(a, "--rate") for a in argvs if "--idle" not in a} == {"10"}

        # sample_rate_hz, window_s, max_concurrent_samplers
        t = _reload(d, cfg, daemon_config(**base, **FAST, rescan_s=30))
        m = wait_for(
            lambda: (m := d.metrics())[("serwatt_sample_rate_hz", ())] == 20 and m,
            10,
            "serwatt_sample_rate_hz 20",
        )
        wait_for(lambda: any(len(f) >= 4 for f in watch.since(t)), 20, "2+ windows at once")
        after = [a for f in watch.since(t) for a in f.values()]
        new = [a for a in after if _arg(a, "--duration") != "2"]
        assert new and {_arg(a, "--duration") for a in new} == {"3"}
        assert {_arg(a, "--rate") for a in new if "--idle" not in a} == {"20"}
        assert max(len(f) for f in watch.since(t)) <= 6  # 3 windows x 2 runs

        # timing_rate_hz: a third run per window, the stack-change run (chrometrace)
        t = _reload(
            d,
            cfg,
            daemon_config(**base, **FAST, rescan_s=30, timing_rate_hz=40),
        )
        wait_for(
            lambda: any("chrometrace" in a for a in watch.started_after(t)), 20, "a timing run"
        )
        timing = [a for a in watch.started_after(t) if "chrometrace" in a]
        assert {_arg(a, "--rate") for a in timing} == {"40"} and all("--idle" in a for a in timing)

        # rescan_s: a new rank started after the reload is found well before the old 30 s
        t = _reload(d, cfg, daemon_config(**base, **FAST))
        extra.append(start_light(tmp_path, "hupkeys_t0_rank1"))
        wait_for(
            lambda: any(
                n == "serwatt_target_info" and dict(lab).get("pid") == str(extra[0].pid)
                for n, lab in d.metrics()
            ),
            5,
            "the new rank discovered",
        )

        # cpu_budget_cores: far below what the daemon needs; the rate falls
        _reload(d, cfg, daemon_config(**base, **FAST, cpu_budget_cores=0.001))
        m = wait_for(
            lambda: (m := d.metrics())[("serwatt_sample_rate_hz", ())] < 20 and m,
            30,
            "the rate lowered by the budget",
        )
        assert m[("serwatt_cpu_budget_cores", ())] == 0.001

        # targets: t2 removed keeps its totals and shows target_up 0
        kept = {"t0": targets["t0"], "t1": targets["t1"]}
        t2_samples = total(m, "serwatt_samples_total", target="t2")
        assert t2_samples > 0
        t = _reload(
            d,
            cfg,
            daemon_config(record_dir, kept, **FAST, cpu_budget_cores=0.001),
        )
        m = d.metrics()
        assert total(m, "serwatt_target_up", target="t2") == 0
        assert total(m, "serwatt_target_up", target="t0") == 1
        # (a window of t2 in flight at the reload may still be counted)
        assert total(m, "serwatt_samples_total", target="t2") >= t2_samples
        # windows started after the reload: both kept targets again, never t2
        kept_pids = {str(works[0].pid), str(works[1].pid)}
        wait_for(
            lambda: kept_pids <= {_arg(a, "--pid") for a in watch.started_after(t)},
            20,
            "windows of t0 and t1 after the reload",
        )
        assert str(works[2].pid) not in {_arg(a, "--pid") for a in watch.started_after(t)}
        assert d.stop()[0] == 0
    finally:
        watch.close()
        d.kill()
        for w in works + extra:
            stop_process(w)


def test_rules_log_level_retention_apply_and_startup_keys_wait(tmp_path: Path) -> None:
    work = start_light(tmp_path, "hupother_trainer", BUSY)
    record_dir = tmp_path / "runs"
    with Recorder.for_dir(record_dir) as rec:
        old = time.time() - 40 * 86400
        rec.start_run("old-run", "trainer", host={}, config={}, sources={}, started_at=old)
        rec.finish_run("old-run", old + 60)
    rules = tmp_path / "team.yaml"
    rules.write_text(
        "schema: serwatt.codepaths/1\n"
        "rules:\n"
        "  - id: team.work\n"
        "    codepath: msgpack\n"
        "    layer: python\n"
        '    file: "*/hupother_trainer.py"\n'
        "    function: work\n"
    )
    cfg = tmp_path / "serwatt.yaml"
    base = dict(record_dir=record_dir, targets={"trainer": "hupother_trainer"})
    # info, not warning: the landing line that names the port is an INFO line
    cfg.write_text(daemon_config(**base, **SLOW, record={"retention_days": 365}))
    d = DaemonProc(cfg, None, tmp_path / "daemon.log")
    port = d.port
    try:
        m = d.wait_metric("serwatt_samples_total", 5, target="trainer", codepath="pickle")
        assert total(m, "serwatt_samples_total", target="trainer", codepath="msgpack") == 0
        with Recorder.for_dir(record_dir, readonly=True) as rec:
            assert "old-run" in {r.run_id for r in rec.runs()}  # 40 days < 365
        assert "DEBUG" not in d.log()

        # rules files, log_level, retention_days
        _reload(
            d,
            cfg,
            daemon_config(
                **base,
                **SLOW,
                log_level="debug",
                record={"retention_days": 30},
                classify={"rules_files": [rules]},
            ),
        )
        with Recorder.for_dir(record_dir, readonly=True) as rec:
            assert "old-run" not in {r.run_id for r in rec.runs()}
        d.wait_metric("serwatt_samples_total", 5, target="trainer", codepath="msgpack")
        wait_for(lambda: "DEBUG serwatt.daemon: slot used" in d.log(), 20, "debug lines")

        # startup-bound keys: logged, the running values kept
        # (nothing listens on port 1 here; the daemon must not move to it)
        other_port = 1
        other_dir = tmp_path / "other-runs"
        (tmp_path / "sys" / "class").mkdir(parents=True)  # what check-config wants of a sysfs
        changed = daemon_config(
            other_dir,
            base["targets"],
            **SLOW,
            listen=f"127.0.0.1:{other_port}",
            log_level="debug",
            record={"retention_days": 30},
            classify={"rules_files": [rules]},
            sampler_priority=False,
            tdp_w=50,
            sysfs=tmp_path / "sys",
            rapl=False,
            nvml=False,
        )
        windows_before = _windows(record_dir)
        _reload(d, cfg, changed)
        log = d.log()
        for key in ("listen", "record_dir", "path_sysfs", "rapl", "nvml", "cpu_tdp_w"):
            assert f"reload: {key} changed" in log and "takes effect on restart" in log, key
        assert "reload: sampler_priority changed ('auto' -> 'off')" in log
        before = total(d.metrics(), "serwatt_samples_total", target="trainer")
        d.wait_metric("serwatt_samples_total", before + 5, target="trainer")  # old port
        assert d.port == port and f"Listening on 127.0.0.1:{port}." in d.get("/")
        wait_for(lambda: _windows(record_dir) > windows_before, 20, "windows in the old dir")
        assert not other_dir.exists()
        try:
            DaemonProc.get.__get__(_Port(other_port))("/metrics")
            raise AssertionError(f"something listens on the new port {other_port}")
        except OSError:
            pass
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)


class _Port:
    def __init__(self, port: int) -> None:
        self.port = port


def _windows(record_dir: Path) -> int:
    with Recorder.for_dir(record_dir, readonly=True) as rec:
        return sum(r.windows for r in rec.runs())
