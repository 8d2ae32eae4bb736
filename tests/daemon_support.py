"""Helpers for the daemon tests: real workloads, a real daemon process, real scrapes, and
the one daemon config builder every daemon test writes its config with.

No tests here; the tests under tests/service/, tests/sampling/ and tests/report/ that
run a daemon import it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

WORKLOAD = textwrap.dedent(
    """
    import json, pickle, sys, time
    data = {"k%d" % i: list(range(40)) for i in range(150)}
    while True:
        for _ in range(20):
            blob = pickle.dumps(data)
            pickle.loads(blob)
        for _ in range(10):
            text = json.dumps(data)
            json.loads(text)
        sum(i * i for i in range(20000))
        time.sleep(0.002)
    """
)


def start_workload(tmp_path: Path, marker: str, python: str = PYTHON) -> subprocess.Popen:
    """A Python process serializing in a loop; `marker` is in its command line."""
    script = tmp_path / f"{marker}.py"
    script.write_text(WORKLOAD)
    return subprocess.Popen([python, str(script)], stdout=subprocess.DEVNULL)


def start_powercap(sysfs: Path, watts: float) -> subprocess.Popen:
    """A one-package powercap tree under `sysfs` whose energy_uj a helper process
    advances at `watts` (tests/powercap.py), as the hardware would."""
    from tests.powercap import build_powercap

    build_powercap(sysfs, package_ids=(0,), dram=False, psys=False, mmio=False)
    advancer = subprocess.Popen(
        [PYTHON, "-m", "tests.powercap", "advance", "--root", str(sysfs), "--watts", str(watts)]
        + ["--zone", "intel-rapl:0", "--step-s", "0.02"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert advancer.stdout is not None and advancer.stdout.readline().startswith("started")
    return advancer


# The top-level keys every test config starts from; a test's own keywords replace them.
DAEMON_DEFAULTS: dict[str, Any] = {
    "listen": "127.0.0.1:0",  # the kernel picks; the landing line says which
    "sample_rate_hz": 50,
    "window_s": 2,
    "rescan_s": 0.5,
    "log_level": "info",
}


def daemon_config(
    record_dir: Path,
    targets: Mapping[str, str | Mapping[str, Any]],
    *,
    rapl: bool | str = "auto",
    nvml: bool | str = "auto",
    tdp_w: float | None = 100.0,
    sysfs: Path | None = None,
    procfs: Path | None = None,
    record: Mapping[str, Any] | None = None,
    classify: Mapping[str, Any] | None = None,
    **top: Any,
) -> str:
    """A daemon config (YAML). targets: {name: cmdline pattern}, or {name: the target's
    keys}, whose `cmdline` goes under `match` (labels, checkpoints, run beside it); `top`:
    top-level keys (sample_rate_hz=10, max_concurrent_samplers=2) over DAEMON_DEFAULTS;
    `record`: keys beside its dir; sysfs and procfs go under `paths`."""
    config: dict[str, Any] = DAEMON_DEFAULTS | top
    config["targets"] = []
    for name, given in targets.items():
        keys = {"cmdline": given} if isinstance(given, str) else dict(given)
        entry = {"name": name, "match": {"cmdline": keys.pop("cmdline")}}
        config["targets"].append(entry | {k: _yaml_value(v) for k, v in keys.items()})
    config["collectors"] = {
        "rapl": {"enabled": rapl},
        "nvml": {"enabled": nvml},
        "cpu_model": {"tdp_w": tdp_w},
    }
    config["record"] = {"dir": str(record_dir)} | dict(record or {})
    if classify is not None:
        config["classify"] = {k: _yaml_value(v) for k, v in classify.items()}
    paths = {k: str(v) for k, v in (("sysfs", sysfs), ("procfs", procfs)) if v is not None}
    if paths:
        config["paths"] = paths
    return yaml.safe_dump(config, sort_keys=False)


def _yaml_value(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_yaml_value(v) for v in value]
    return value


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(metrics: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in metrics.items() if n == name and want <= set(lab))


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the daemon may not be listening yet
            last_exc = exc
        time.sleep(poll_s)
    raise AssertionError(
        f"timed out after {timeout_s}s waiting for {what} (last error: {last_exc})"
    )


class NotifyListener:
    """A systemd-style NOTIFY_SOCKET that records every datagram."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[str] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.2)
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                self.messages.append(self._sock.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def lines(self) -> list[str]:
        return [line for m in list(self.messages) for line in m.split("\n")]

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        self._sock.close()


# The daemon's landing log line names the address it bound (port 0: the kernel's pick).
LANDING_RE = re.compile(r"listening on http://(?:\[[^\]]*\]|[^:/\s]+):(\d+)/metrics")


def daemon_argv(config_path: Path, **daemon_options: Any) -> list[str]:
    """`serwatt daemon --config FILE`, or, with daemon_options (Daemon's keywords such as
    kill_grace_s), the same CLI entry point with those passed to the Daemon."""
    if not daemon_options:
        return [PYTHON, "-m", "serwatt", "daemon", "--config", str(config_path)]
    code = (
        "from pathlib import Path\nfrom serwatt.profiler.cli.daemon import serve\n"
        f"raise SystemExit(serve(Path({str(config_path)!r}), **{daemon_options!r}))\n"
    )
    return [PYTHON, "-c", code]


class DaemonProc:
    """`serwatt daemon --config FILE` as a real child process."""

    def __init__(
        self,
        config_path: Path,
        port: int | None,
        log_path: Path,
        *,
        notify: NotifyListener | None = None,
        watchdog_usec: int | None = None,
        argv: list[str] | None = None,
    ) -> None:
        """port: where it listens; None: read from its landing line (a config with
        `listen: 127.0.0.1:0`). argv: the daemon's command line instead of `serwatt
        daemon --config FILE` (e.g. tests/replayed_daemon.py, NVML replayed)."""
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        env.pop("WATCHDOG_USEC", None)
        if notify is not None:
            env["NOTIFY_SOCKET"] = str(notify.path)
        if watchdog_usec is not None:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        self._port = port
        self.log_path = log_path
        # a log may hold earlier daemons' lines (restarts into one file): read after them
        self._log_start = log_path.stat().st_size if log_path.exists() else 0
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in kill())
        self.proc = subprocess.Popen(
            argv or daemon_argv(config_path),
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        if self._port is None:
            self._port = self.landing_port()
        return self._port

    def landing_port(self, timeout_s: float = 60) -> int:
        """The port of the daemon's landing line ("serwatt ... listening on
        http://HOST:PORT/metrics"), once it has written it."""
        deadline = time.monotonic() + timeout_s
        while True:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                found = LANDING_RE.search(f.read().decode(errors="replace"))
            if found:
                return int(found.group(1))
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no landing line in {timeout_s}s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.read().decode()

    def metrics(self) -> dict:
        return parse_metrics(self.get("/metrics"))

    def wait_metric(self, name: str, at_least: float, timeout_s: float = 60, **labels: str):
        def check():
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
            m = self.metrics()
            return m if total(m, name, **labels) >= at_least else None

        try:
            return wait_for(check, timeout_s, f"{name}{labels} >= {at_least}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- daemon log ---\n{self.log()}") from None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 20) -> tuple[int, float]:
        """SIGTERM; returns (exit code, seconds it took)."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        finally:
            self.kill()
        return code, time.monotonic() - t0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


def children_named(pid: int, name: str, subcommand: str | None = None) -> list[int]:
    """Descendants of `pid` named `name` (and with argv[1] == subcommand, if given:
    a window is one `py-spy record`; the sampler may also run a short `py-spy dump`)."""
    import psutil

    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if k.name() == name and (subcommand is None or k.cmdline()[1:2] == [subcommand]):
                out.append(k.pid)
        except psutil.NoSuchProcess:
            continue
    return out


def stop_process(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=10)


def start_daemon(
    tmp_path: Path,
    targets: Mapping[str, str | Mapping[str, Any]],
    *,
    notify=None,
    watchdog_usec=None,
    daemon_options: dict[str, Any] | None = None,
    **kw,
):
    """A daemon over `targets` ({name: cmdline pattern}) listening on a port the kernel
    picks (listen port 0), read back from its landing line; daemon_config's keywords pass
    through, daemon_options go to the Daemon (daemon_argv). Its config is
    tmp_path/serwatt.yaml."""
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(daemon_config(tmp_path / "runs", targets, **kw))
    return DaemonProc(
        cfg,
        None,
        tmp_path / "daemon.log",
        notify=notify,
        watchdog_usec=watchdog_usec,
        argv=daemon_argv(cfg, **(daemon_options or {})),
    )
