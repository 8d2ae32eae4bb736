"""Long runs and faults: a real `serwatt daemon` over churning, crashing and hostile
targets, with py-spy children killed at random, SIGHUP every 2 minutes and a real
Prometheus scraping it. At the end it checks that nothing leaked or was lost.

    .venv/bin/python bench/soak.py [--minutes 30] [--seed 1] [--window-s 5]
                                   [--rss-goal-mb-per-min 0.0025] [--json FILE]

The daemon (`serwatt daemon --config FILE`, a child process) watches 8 targets, each a
cmdline pattern that a supervisor here keeps re-filling with a new process that lives
20-40 s (then a 0-4 s gap):
  t0, t1   Python, exit 0
  t2, t3   Python, crash (SIGABRT, SIGSEGV; no core dump)
  t4, t5   Python, exit 0 / uncaught exception / SIGKILL from outside, at random
  t6       not Python (/bin/sh copied as python3, running sleep): a `not_python` window
  t7       hostile: its frames name a FIFO and a 16 GiB sparse file as their sources
Every 10-30 s a random `py-spy record` child of the daemon is SIGKILLed; every
--sighup-s the config is rewritten (sample_rate_hz 20 <-> 25) and the daemon SIGHUPed.
Debian's Prometheus scrapes it every 5 s (timeout 5 s; the shipped config uses 10 s / 5 s).

Checks, each printed with its figures and a verdict:
  rss       least-squares slope of the daemon's RSS after a warm-up (--rss-warmup-min;
            default the first third of the run, at most 5 min), sampled every 2 s, with
            its 95% Student t interval widened for the samples' autocorrelation (RSS swings
            over minutes; profiler/intervals.py). Goal --rss-goal-mb-per-min; the default 0.0025
            MB/min keeps a ~40 MB daemon under the documented 150 MB after 30 days.
            confirmed: the interval's top is under the goal; not met: its bottom is over
            it; undecided otherwise. An interval that holds 0 means no growth was seen,
            and its width is the resolution of the run: confirming 0.0025 MB/min takes
            hours of flat RSS, so a 30-60 minute run reports the resolution it reached.
  rss_bound the daemon's RSS never reaches 150 MB (docs/daemon.md's bound), at any sample.
  fds, threads  the daemon's open file descriptors and threads when idle (no target, no
            py-spy running) before the targets start and after they are stopped, each the
            smallest of 10 reads 0.5 s apart: within 30 s of the last py-spy's exit, the
            end equals the start for files, pipes and threads (the last window's thread may
            still be classifying: settle_s says how long it took); sockets (Prometheus
            reconnects: a connection lives <= 10 s) at the end are no more than the most
            seen at the start. Min/max during the run are printed.
  windows   every window started is applied or counted as failed, and every applied one
            is in the record: the daemon's exit line gives windows started and applied and
            its sampler-error counters; started = applied + the per-window error kinds
            (all kinds but classify_timeout and source_too_costly, which count files), and
            applied = the windows rows in the record. No "windows are lost" log line.
  reloads   every SIGHUP was applied ("reloaded:" lines = SIGHUPs sent).
  prometheus  over the whole time Prometheus scraped: no counter reset in any serwatt
            series (`resets()` summed = 0), `up` always 1, and no scrape missed (the count
            of `up` samples is at least 90% of the span / interval).
  record    `PRAGMA integrity_check` is "ok" and the daemon exited 0 after SIGTERM.
  kills     at least one py-spy was killed and the daemon counted `sampler_failed` windows.
Exit status 0 when every check holds (rss: confirmed), 1 otherwise.

Run it as the unit runs the daemon: `serwatt daemon` limits glibc to 2 malloc arenas
(profiler/cli/daemon.py) unless MALLOC_ARENA_MAX is set.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from serwatt.profiler.intervals import slope_interval, verdict  # noqa: E402 (needs REPO on the path)
from tests.daemon_support import (  # noqa: E402
    DaemonProc,
    children_named,
    daemon_config,
    wait_for,
)
from tests.ports import prometheus_port  # noqa: E402

PYTHON = sys.executable
# the shipped config's scrape_timeout (5 s), scraped twice as often as it does
SCRAPE_S = 5
# sampler-error kinds that count source files, not windows (docs/daemon.md)
PER_FILE_KINDS = frozenset({"classify_timeout", "source_too_costly"})
RATES_HZ = (20, 25)
HUGE_BYTES = 16 << 30
RSS_BOUND_MB = 150.0  # docs/daemon.md

# A Python target: serializes for `lifetime` seconds (3 ms of work, 20 ms asleep), then
# ends as told. Extra arguments are file names its frames report (the hostile target's
# FIFO and huge file): the same loop is compiled under each name and run in turn.
TARGET = textwrap.dedent(
    """
    import json, os, pickle, resource, signal, sys, time
    marker, lifetime, ending = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    data = {"k%d" % i: list(range(30)) for i in range(80)}
    def work():
        for _ in range(4):
            pickle.loads(pickle.dumps(data))
        json.loads(json.dumps(data))
    loops = [work]
    for name in sys.argv[4:]:
        ns = {"pickle": pickle, "data": data}
        src = "def work():\\n    for _ in range(4):\\n        pickle.loads(pickle.dumps(data))\\n"
        exec(compile(src, name, "exec"), ns)
        loops.append(ns["work"])
    deadline, i = time.monotonic() + lifetime, 0
    while time.monotonic() < deadline:
        loops[i % len(loops)]()
        i += 1
        time.sleep(0.02)
    if ending == "raise":
        raise RuntimeError("soak target crashing on purpose")
    if ending == "abort":
        os.abort()
    if ending == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    sys.exit(0)
    """
)

# name -> (kind, endings chosen from at random)
TARGETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "t0": ("python", ("exit",)),
    "t1": ("python", ("exit",)),
    "t2": ("python", ("abort",)),
    "t3": ("python", ("segv",)),
    "t4": ("python", ("exit", "raise", "sigkill")),
    "t5": ("python", ("exit", "raise", "sigkill")),
    "t6": ("shell", ("exit",)),
    "t7": ("hostile", ("exit",)),
}


# in every target's command line: this run's own, so soaks running side by side (a CI
# run beside a long one) never watch each other's targets
RUN_TOKEN = f"{os.getpid()}-{os.urandom(3).hex()}"


def marker(name: str) -> str:
    return f"soakmark-{RUN_TOKEN}-{name}-"


@dataclass
class Check:
    name: str
    verdict: str  # holds / fails, or confirmed / not met / undecided
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict in ("holds", "confirmed")


# --------------------------------------------------------------------------- targets


class Churn:
    """Keeps every target's pattern filled with short-lived processes that end as told."""

    def __init__(self, workdir: Path, rng: random.Random) -> None:
        self.workdir = workdir
        self.rng = rng
        self.script = workdir / "target.py"
        self.script.write_text(TARGET)
        hostile = workdir / "hostile"
        hostile.mkdir()
        self.fifo = hostile / "fifo_source.py"
        os.mkfifo(self.fifo)
        self.huge = hostile / "huge_source.py"
        with open(self.huge, "wb") as f:
            f.write(b"import pickle\n")
            f.truncate(HUGE_BYTES)  # sparse: costs no disk
        self.fake_python = workdir / "not-python" / "python3"
        self.fake_python.parent.mkdir()
        shutil.copy2("/bin/sh", self.fake_python)
        self.log = open(workdir / "targets.log", "ab")  # noqa: SIM115 (closed in stop())
        self.procs: dict[str, subprocess.Popen] = {}
        self.kill_at: dict[str, float] = {}
        self.next_start: dict[str, float] = {name: 0.0 for name in TARGETS}
        self.started = 0
        self.endings: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def _spawn(self, name: str) -> None:
        kind, endings = TARGETS[name]
        lifetime = self.rng.uniform(20, 40)
        ending = self.rng.choice(endings)
        if kind == "shell":
            # /bin/sh named python3, so discovery takes it and py-spy must refuse it;
            # two commands, so sh stays the process (a lone one is exec'd in place)
            argv = [str(self.fake_python), "-c", f"sleep {lifetime:.1f}; exit 0", marker(name)]
        else:
            argv = [PYTHON, str(self.script), marker(name), f"{lifetime:.1f}", ending]
            if kind == "hostile":
                argv += [str(self.fifo), str(self.huge)]
        if ending == "sigkill":
            self.kill_at[name] = time.monotonic() + self.rng.uniform(5, lifetime)
        self.procs[name] = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=self.log, cwd=self.workdir
        )
        self.started += 1

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._lock:
                for name in TARGETS:
                    p = self.procs.get(name)
                    if p is not None and name in self.kill_at and now >= self.kill_at[name]:
                        del self.kill_at[name]
                        p.kill()
                    if p is not None and p.poll() is not None:
                        code = p.returncode
                        key = (
                            "exit 0"
                            if code == 0
                            else f"exit {code}"
                            if code > 0
                            else (signal.Signals(-code).name)
                        )
                        self.endings[key] = self.endings.get(key, 0) + 1
                        del self.procs[name]
                        self.kill_at.pop(name, None)
                        self.next_start[name] = now + self.rng.uniform(0, 4)
                    elif p is None and now >= self.next_start[name] and not self._stop.is_set():
                        self._spawn(name)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            for p in self.procs.values():
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)
            self.procs.clear()
        self.log.close()


class PyspyKiller:
    """SIGKILLs one random `py-spy record` child of the daemon every 10-30 s."""

    def __init__(self, daemon_pid: int, rng: random.Random) -> None:
        self.daemon_pid = daemon_pid
        self.rng = rng
        self.kills = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pyspy-killer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(10, 30)):
            spies = children_named(self.daemon_pid, "py-spy", "record")
            if spies:
                try:
                    os.kill(self.rng.choice(spies), signal.SIGKILL)
                    self.kills += 1
                except ProcessLookupError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Monitor:
    """The daemon's RSS, open fds and threads every 2 s."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, float, int, int]] = []  # (s, rss MB, fds, threads)
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            try:
                with self.proc.oneshot():
                    self.samples.append(
                        (
                            time.monotonic() - self._t0,
                            self.proc.memory_info().rss / 1e6,
                            self.proc.num_fds(),
                            self.proc.num_threads(),
                        )
                    )
            except psutil.NoSuchProcess:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def idle_state(pid: int, reads: int = 10) -> dict[str, int]:
    """Smallest counts over `reads` reads 0.5 s apart of the daemon's fds by kind, and
    threads, plus the most sockets seen."""
    mins: dict[str, int] = {}
    max_sockets = 0
    for i in range(reads):
        kinds = {"files": 0, "pipes": 0, "sockets": 0, "other": 0}
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            kind = (
                "sockets"
                if link.startswith("socket:")
                else "pipes"
                if link.startswith("pipe:")
                else "files"
                if link.startswith("/")
                else "other"
            )
            kinds[kind] += 1
        kinds["threads"] = len(os.listdir(f"/proc/{pid}/task"))
        max_sockets = max(max_sockets, kinds["sockets"])
        for k, v in kinds.items():
            mins[k] = min(mins.get(k, v), v)
        if i + 1 < reads:
            time.sleep(0.5)
    mins["max_sockets"] = max_sockets
    return mins


def wait_idle(pid: int, timeout_s: float) -> None:
    """Until the daemon has no py-spy child for 3 s in a row."""
    quiet_since = time.monotonic()

    def quiet() -> bool:
        nonlocal quiet_since
        if children_named(pid, "py-spy"):
            quiet_since = time.monotonic()
        return time.monotonic() - quiet_since >= 3

    wait_for(quiet, timeout_s, "the daemon to have no py-spy running", poll_s=0.2)


# --------------------------------------------------------------------------- prometheus


def start_prometheus(workdir: Path, daemon_port: int) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus missing: `make system-deps` installs Debian's prometheus")
    cfg = workdir / "prometheus.yml"
    cfg.write_text(
        f"global:\n  scrape_interval: {SCRAPE_S}s\n  scrape_timeout: {SCRAPE_S}s\n"
        "scrape_configs:\n  - job_name: soak\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{daemon_port}']\n"
    )
    log_path = workdir / "prometheus.log"
    log = open(log_path, "wb")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            # port 0: the kernel picks, Prometheus logs it (no port handed out to race for)
            "--web.listen-address=127.0.0.1:0",
            "--storage.tsdb.retention.time=1d",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, prometheus_port(proc, log_path)


def prom_query(port: int, expr: str, at: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/api/v1/query?{params}", timeout=30
    ) as resp:
        doc = json.load(resp)
    if doc.get("status") != "success":
        raise RuntimeError(f"Prometheus query {expr!r} failed: {doc}")
    return doc["data"]["result"]


def first_up_at(port: int) -> float:
    """When Prometheus stored its first `up` sample of the daemon."""

    def first() -> float | None:
        r = prom_query(port, 'up{job="soak"}', time.time())
        return float(r[0]["value"][0]) if r else None

    return float(wait_for(first, 60, "Prometheus's first scrape of the daemon", poll_s=0.5))


# --------------------------------------------------------------------------- checks


def rss_check(
    samples: list[tuple[float, float, int, int]],
    goal: float,
    run_s: float,
    warmup_s: float | None = None,
) -> Check:
    """The slope of RSS after the warm-up (default: the first third of the run, at most
    5 min), with a 95% interval that allows for the samples' autocorrelation: RSS moves
    in swings of minutes, so 2-s samples are far from independent (slope_interval in
    profiler/intervals.py widens it to the residuals' effective sample count)."""
    if warmup_s is None:
        warmup_s = min(300.0, run_s / 3)
    pts = [(t, rss) for t, rss, _, _ in samples if t >= warmup_s]
    figures: dict[str, Any] = {"warmup_s": warmup_s, "n": len(pts), "goal_mb_per_min": goal}
    if len(pts) < 10:
        return Check("rss", "undecided", figures, "fewer than 10 samples after the warm-up")
    slope = slope_interval([t / 60 for t, _ in pts], [r for _, r in pts])
    lo, hi = slope.bounds()
    figures |= {
        "slope_mb_per_min": slope.estimate,
        "ci95": [lo, hi],
        "lag1_autocorrelation": slope.lag1_autocorrelation,
        "effective_n": slope.effective_n,
        "rss_first_mb": samples[0][1],
        "rss_after_warmup_mb": pts[0][1],
        "rss_last_mb": pts[-1][1],
        "rss_max_mb": max(r for _, r, _, _ in samples),
        "rss_mean_mb_by_minute": _by_minute(samples),
    }
    return Check("rss", verdict(slope, at_most=goal), figures, slope.why_none or "")


def _by_minute(samples: list[tuple[float, float, int, int]]) -> list[float]:
    minutes: dict[int, list[float]] = {}
    for t, rss, _, _ in samples:
        minutes.setdefault(int(t // 60), []).append(rss)
    return [round(sum(v) / len(v), 1) for _, v in sorted(minutes.items())]


def settled_state(pid: int, before: dict[str, int], timeout_s: float = 30) -> dict[str, Any]:
    """idle_state once the daemon is back to `before` (the last window's thread may
    still be classifying after py-spy exited), or after `timeout_s`: a leak never is."""
    t0 = time.monotonic()
    while True:
        state: dict[str, Any] = idle_state(pid)
        back = all(state[k] == before[k] for k in ("files", "pipes", "other", "threads"))
        if back and state["sockets"] <= before["max_sockets"]:
            break
        if time.monotonic() - t0 > timeout_s:
            break
    state["settle_s"] = round(time.monotonic() - t0, 1)
    return state


def idle_check(name: str, before: dict[str, int], after: dict[str, int], keys, run) -> Check:
    figures = {"before": {k: before[k] for k in keys}, "after": {k: after[k] for k in keys}}
    figures["during_min_max"] = run
    figures["settle_s"] = after["settle_s"]
    bad = [k for k in keys if k != "sockets" and after[k] != before[k]]
    if "sockets" in keys and after["sockets"] > before["max_sockets"]:
        bad.append("sockets")
    return Check(name, "fails" if bad else "holds", figures, ", ".join(bad))


STOPPED_RE = re.compile(
    r"stopped: (\d+) window\(s\) started, (\d+) applied; sampler errors: (.*)$", re.M
)


def parse_stopped(log: str) -> tuple[int, int, dict[tuple[str, str], int]] | None:
    m = STOPPED_RE.search(log)
    if m is None:
        return None
    errors: dict[tuple[str, str], int] = {}
    if m.group(3).strip() != "none":
        for item in m.group(3).split(", "):
            key, n = item.rsplit("=", 1)
            target, kind = key.split("/", 1)
            errors[(target, kind)] = int(n)
    return int(m.group(1)), int(m.group(2)), errors


def windows_check(log: str, db_path: Path) -> tuple[Check, dict[tuple[str, str], int]]:
    parsed = parse_stopped(log)
    if parsed is None:
        return Check("windows", "fails", {}, "no 'stopped:' line in the daemon log"), {}
    started, applied, errors = parsed
    failed = sum(n for (_, kind), n in errors.items() if kind not in PER_FILE_KINDS)
    db = sqlite3.connect(db_path)
    try:
        recorded = db.execute("SELECT count(*) FROM windows").fetchone()[0]
        per_target = dict(
            db.execute(
                "SELECT r.target, count(*) FROM windows w JOIN runs r USING (run_id)"
                " GROUP BY r.target ORDER BY r.target"
            ).fetchall()
        )
    finally:
        db.close()
    lost_lines = log.count("its windows are lost")
    by_kind: dict[str, int] = {}
    for (_, kind), n in errors.items():
        by_kind[kind] = by_kind.get(kind, 0) + n
    figures = {
        "started": started,
        "applied": applied,
        "failed": failed,
        "recorded": recorded,
        "recorded_per_target": per_target,
        "errors_by_kind": by_kind,
        "lost_slot_log_lines": lost_lines,
    }
    bad = []
    if started != applied + failed:
        bad.append(f"started {started} != applied {applied} + failed {failed}")
    if applied != recorded:
        bad.append(f"applied {applied} != recorded {recorded}")
    if lost_lines:
        bad.append(f"{lost_lines} slot(s) lost")
    return Check("windows", "fails" if bad else "holds", figures, "; ".join(bad)), errors


def prometheus_check(port: int, since: float, until: float) -> Check:
    span = int(until - since)
    rng = f"{span}s"
    # resets() drops the metric name, so one query per counter name
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/api/v1/label/__name__/values", timeout=30
    ) as resp:
        names = [n for n in json.load(resp)["data"] if re.fullmatch(r"serwatt_.+_total", n)]
    reset_series, n_series = [], 0
    for name in names:
        for r in prom_query(port, f'resets({name}{{job="soak"}}[{rng}])', until):
            n_series += 1
            if float(r["value"][1]) > 0:
                reset_series.append({"__name__": name, **r["metric"]})
    up_min = prom_query(port, f'min_over_time(up{{job="soak"}}[{rng}])', until)
    up_n = prom_query(port, f'count_over_time(up{{job="soak"}}[{rng}])', until)
    samples = prom_query(port, 'sum(serwatt_samples_total{job="soak"})', until)
    figures = {
        "span_s": span,
        "counter_series": n_series,
        "series_with_resets": len(reset_series),
        "up_min": float(up_min[0]["value"][1]) if up_min else None,
        "up_samples": int(float(up_n[0]["value"][1])) if up_n else 0,
        "up_samples_expected": span // SCRAPE_S,
        "samples_total_last": float(samples[0]["value"][1]) if samples else None,
    }
    bad = []
    if n_series == 0:
        bad.append("no serwatt counter stored")
    if reset_series:
        bad.append(f"resets in {reset_series[:5]}")
    if figures["up_min"] != 1.0:
        bad.append(f"up fell to {figures['up_min']}")
    if figures["up_samples"] < 0.9 * figures["up_samples_expected"]:
        bad.append("scrapes missed")
    if not figures["samples_total_last"]:
        bad.append("no samples counted")
    return Check("prometheus", "fails" if bad else "holds", figures, "; ".join(bad))


def record_check(db_path: Path, exit_code: int) -> Check:
    db = sqlite3.connect(db_path)
    try:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        fk = db.execute("PRAGMA foreign_key_check").fetchall()
        open_runs = db.execute("SELECT count(*) FROM runs WHERE ended_at IS NULL").fetchone()[0]
        runs = db.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        db.close()
    figures = {
        "integrity_check": integrity,
        "foreign_key_violations": len(fk),
        "runs": runs,
        "runs_left_open": open_runs,
        "daemon_exit": exit_code,
    }
    bad = []
    if integrity != "ok":
        bad.append(f"integrity_check: {integrity}")
    if fk:
        bad.append(f"{len(fk)} foreign key violation(s)")
    if open_runs:
        bad.append(f"{open_runs} run(s) left open after SIGTERM")
    if exit_code != 0:
        bad.append(f"daemon exited {exit_code}")
    return Check("record", "fails" if bad else "holds", figures, "; ".join(bad))


# --------------------------------------------------------------------------- the run


def write_config(path: Path, port: int, record_dir: Path, rate_hz: int, window_s: float) -> None:
    path.write_text(
        daemon_config(
            record_dir,
            {name: marker(name) for name in TARGETS},
            listen=f"127.0.0.1:{port}",
            window_s=window_s,
            rescan_s=1,
            sample_rate_hz=rate_hz,
        )
    )


def run_soak(
    minutes: float,
    workdir: Path,
    *,
    seed: int = 1,
    window_s: float = 5,
    sighup_s: float = 120,
    rss_goal: float = 0.0025,
    rss_warmup_s: float | None = None,
    progress=print,
) -> list[Check]:
    rng = random.Random(seed)
    record_dir = workdir / "runs"
    cfg = workdir / "serwatt.yaml"
    write_config(cfg, 0, record_dir, RATES_HZ[0], window_s)
    daemon = DaemonProc(cfg, None, workdir / "daemon.log")  # port 0, read from its landing line
    prom = churn = killer = monitor = None
    try:
        wait_for(lambda: daemon.get("/metrics"), 60, "the daemon's /metrics")
        prom, prom_port = start_prometheus(workdir, daemon.port)
        prom_since = first_up_at(prom_port)
        before = idle_state(daemon.pid)
        progress(f"idle before: {before}")
        churn = Churn(workdir, rng)
        killer = PyspyKiller(daemon.pid, rng)
        monitor = Monitor(daemon.pid)
        churn.start()
        killer.start()
        monitor.start()
        t0 = time.monotonic()
        end = t0 + minutes * 60
        sighups, next_hup, last_report = 0, t0 + sighup_s, t0
        while time.monotonic() < end:
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {daemon.proc.returncode}:\n{daemon.log()}")
            now = time.monotonic()
            if now >= next_hup:
                sighups += 1
                write_config(cfg, 0, record_dir, RATES_HZ[sighups % 2], window_s)
                daemon.signal(signal.SIGHUP)
                next_hup += sighup_s
            if now - last_report >= 60:
                last_report = now
                s = monitor.samples[-1] if monitor.samples else None
                progress(
                    f"{(now - t0) / 60:.1f} min: {churn.started} processes started, "
                    f"{killer.kills} py-spy killed, {sighups} SIGHUP; rss/fds/threads {s}"
                )
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        run_s = time.monotonic() - t0
        killer.stop()
        churn.stop()
        monitor.stop()
        wait_idle(daemon.pid, 60)
        # A reload needs a slot to be noticed; give the last one time to log.
        wait_for(
            lambda: daemon.log().count("reloaded:") >= sighups,
            30,
            "the last SIGHUP to be applied",
        )
        after = settled_state(daemon.pid, before)
        progress(f"idle after: {after}")
        prom_until = time.time()
        prom_result = prometheus_check(prom_port, prom_since, prom_until)
        code, _ = daemon.stop(timeout_s=30)
        log = daemon.log()
        samples = monitor.samples

        def during(i: int) -> list[int]:
            vals = [s[i] for s in samples]
            return [min(vals), max(vals)] if vals else []

        checks = [rss_check(samples, rss_goal, run_s, rss_warmup_s)]
        rss_max = max((s[1] for s in samples), default=0.0)
        checks.append(
            Check(
                "rss_bound",
                "holds" if 0 < rss_max < RSS_BOUND_MB else "fails",
                {"rss_max_mb": rss_max, "bound_mb": RSS_BOUND_MB},
            )
        )
        checks.append(
            idle_check("fds", before, after, ("files", "pipes", "other", "sockets"), during(2))
        )
        checks.append(idle_check("threads", before, after, ("threads",), during(3)))
        wcheck, errors = windows_check(log, record_dir / "runs.sqlite")
        checks.append(wcheck)
        reloaded = log.count("reloaded:")
        checks.append(
            Check(
                "reloads",
                "holds" if reloaded == sighups else "fails",
                {"sighups": sighups, "reloaded_lines": reloaded},
            )
        )
        checks.append(prom_result)
        checks.append(record_check(record_dir / "runs.sqlite", code))
        failed_kills = sum(n for (_, k), n in errors.items() if k == "sampler_failed")
        checks.append(
            Check(
                "kills",
                "holds" if killer.kills > 0 and failed_kills > 0 else "fails",
                {
                    "pyspy_killed": killer.kills,
                    "sampler_failed_windows": failed_kills,
                    "processes_started": churn.started,
                    "endings": churn.endings,
                    "run_s": round(run_s, 1),
                },
            )
        )
        return checks
    finally:
        for part in (killer, churn, monitor):
            if part is not None:
                part.stop()
        daemon.kill()
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--window-s", type=float, default=5)
    ap.add_argument("--sighup-s", type=float, default=120)
    ap.add_argument("--rss-goal-mb-per-min", type=float, default=0.0025)
    ap.add_argument(
        "--rss-warmup-min",
        type=float,
        help="minutes left out of the RSS slope (default: a third of the run, at most 5); "
        "the energy history fills for its first 15 minutes (HISTORY_S)",
    )
    ap.add_argument(
        "--no-rss-slope",
        action="store_true",
        help="leave the RSS slope's verdict out (a run of minutes cannot decide it; the "
        "RSS bound and every other check stay)",
    )
    ap.add_argument("--workdir", type=Path, help="keep the logs, record and tsdb here")
    ap.add_argument("--json", type=Path, help="write the checks here")
    args = ap.parse_args()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=False)
        workdir, cleanup = args.workdir, False
    else:
        workdir, cleanup = Path(tempfile.mkdtemp(prefix="serwatt-soak-")), True
    try:
        checks = run_soak(
            args.minutes,
            workdir,
            seed=args.seed,
            window_s=args.window_s,
            sighup_s=args.sighup_s,
            rss_goal=args.rss_goal_mb_per_min,
            rss_warmup_s=None if args.rss_warmup_min is None else args.rss_warmup_min * 60,
            progress=lambda msg: print(msg, flush=True),
        )
    finally:
        if cleanup:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.no_rss_slope:
        checks = [c for c in checks if c.name != "rss"]
    for c in checks:
        print(f"{c.name:11s} {c.verdict.upper():10s} {json.dumps(c.figures)}")
        if c.detail:
            print(f"{'':11s} {c.detail}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(c) for c in checks], indent=2) + "\n")
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
