"""`serwatt_collector_up{collector="recorder"}` goes to 0 when appends fail (a full disk).

docs/daemon.md, "Collectors": "`recorder` (up 0 when an append failed; counters are still
exported)". A real daemon records into a small tmpfs of its own (mounted in a private mount
namespace with util-linux `unshare`, so nothing outside the daemon sees it; the test
reaches it through /proc/<daemon pid>/root). The test fills that file system: appends fail
with SQLITE_FULL, the recorder collector goes down while the counters keep advancing;
freeing the space brings it back up, windows are recorded again and the record is sound.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.daemon_support import (
    PYTHON,
    DaemonProc,
    daemon_argv,
    daemon_config,
    stop_process,
    total,
    wait_for,
)

LIGHT = (
    "import pickle, time\nd = list(range(20000))\n"
    "while True:\n    pickle.dumps(d)\n    time.sleep(0.02)\n"
)


def daemon_on_tmpfs(config_path: Path, log_path: Path, record_dir: Path) -> DaemonProc:
    """`serwatt daemon` whose record dir is a private tmpfs of 4 MiB (port from its
    landing line)."""
    script = f'mount -t tmpfs -o size=4m tmpfs {record_dir} || exit 99\nexec "$@"\n'
    # unshare execs sh, which execs the daemon: one pid throughout
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    return DaemonProc(config_path, None, log_path, argv=argv + daemon_argv(config_path))


def _can_mount_private_tmpfs(where: Path) -> str | None:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "needs util-linux unshare and nsenter"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
        + [f"mount -t tmpfs -o size=64k tmpfs {where}"],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else f"cannot mount a private tmpfs: {probe.stderr}"


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    # the last partial block too
    with open(directory / "filler2", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def test_recorder_down_on_a_full_disk_and_back_up(tmp_path: Path) -> None:
    record_dir = tmp_path / "runs"
    record_dir.mkdir()
    why = _can_mount_private_tmpfs(record_dir)
    if why:
        pytest.skip(why)
    script = tmp_path / "recfull_trainer.py"
    script.write_text(LIGHT)
    work = subprocess.Popen([PYTHON, str(script)], stdout=subprocess.DEVNULL)
    cfg = tmp_path / "serwatt.yaml"
    cfg.write_text(
        daemon_config(record_dir, {"trainer": "recfull_trainer"}, window_s=1, sample_rate_hz=20)
    )
    d = daemon_on_tmpfs(cfg, tmp_path / "daemon.log", record_dir)
    try:
        m = d.wait_metric("serwatt_samples_total", 1, target="trainer")
        assert total(m, "serwatt_collector_up", collector="recorder") == 1
        # The daemon's own view of its record dir: the tmpfs, not tmp_path/runs here.
        inside = Path(f"/proc/{d.pid}/root") / str(record_dir).lstrip("/")
        assert (inside / "runs.sqlite").exists() and not (record_dir / "runs.sqlite").exists()
        _fill(inside)
        m = wait_for(
            lambda: (
                m := d.metrics(),
                total(m, "serwatt_collector_up", collector="recorder") == 0 and m,
            )[1],
            30,
            "collector_up{recorder} 0",
        )
        down_samples = total(m, "serwatt_samples_total", target="trainer")
        # Counters are still exported and still advance while nothing can be recorded.
        m = d.wait_metric("serwatt_samples_total", down_samples + 20, target="trainer")
        assert total(m, "serwatt_collector_up", collector="recorder") == 0
        assert "recording window of" in d.log() and "full" in d.log()
        # Space again: the next appends work and the collector is back up.
        for f in ("filler", "filler2"):
            (inside / f).unlink()
        wait_for(
            lambda: total(d.metrics(), "serwatt_collector_up", collector="recorder") == 1,
            30,
            "collector_up{recorder} back to 1",
        )
        before, _ = _record_state(d.pid, record_dir)
        wait_for(lambda: _record_state(d.pid, record_dir)[0] > before, 30, "windows recorded again")
        assert _record_state(d.pid, record_dir)[1] == "ok"
        assert d.stop()[0] == 0
    finally:
        d.kill()
        stop_process(work)


WINDOWS_AND_INTEGRITY = """
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print(db.execute("SELECT count(*) FROM windows").fetchone()[0],
      db.execute("PRAGMA integrity_check").fetchone()[0])
"""


def _record_state(daemon_pid: int, record_dir: Path) -> tuple[int, str]:
    """(windows recorded, integrity_check) of the record, read in the daemon's mount
    namespace (SQLite resolves /proc/<pid>/root to the host's root)."""
    out = subprocess.run(
        ["nsenter", "--mount", "--target", str(daemon_pid), PYTHON, "-c", WINDOWS_AND_INTEGRITY]
        + [str(record_dir / "runs.sqlite")],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    return int(out[0]), out[1]
