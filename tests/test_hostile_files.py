"""File arguments that are not the file they claim to be (issue 21, finding 7).

A FIFO must not hang serwatt, a device must not be read to the end of memory, and a file
that parses badly (JSON nested 100 000 deep) is one error line: every file argument goes
through one regular-file, size-bounded open (profiler/safeio.py), and the error exits with
the documented code, 2 for bad input. Each run is a real `serwatt` process with a
deadline; the ones that read /dev/zero run under an address-space limit, so the old code
fails with MemoryError instead of taking the machine's memory.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.profiler import safeio
from serwatt.profiler.exitcodes import EXIT_CONFIG, EXIT_USAGE
from tests.records.test_hostile_records import _build

REPO = Path(__file__).resolve().parents[1]
# a hang is a failure, not a stuck test run; on a loaded 2-CPU VM a start that imports
# scipy took over 30 s, so the deadline is far above any start and far below "forever"
DEADLINE_S = 120
ADDRESS_SPACE = 2 << 30  # the child's memory: plenty for serwatt, far short of /dev/zero


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def serwatt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serwatt", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        stdin=subprocess.DEVNULL,
        preexec_fn=_limit_memory,
    )


def one_error_line(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    p = tmp_path / "pipe"
    os.mkfifo(p)
    return p


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return _build(tmp_path / "runs.sqlite")


def test_report_verify_on_deeply_nested_json(tmp_path: Path, db: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    r = serwatt("report", "--verify", str(deep), "--db", str(db))
    one_error_line(r, EXIT_USAGE, f"--verify {deep}", "nested too deeply")


def test_report_verify_on_dev_zero(db: Path) -> None:
    r = serwatt("report", "--verify", "/dev/zero", "--db", str(db))
    one_error_line(r, EXIT_USAGE, "--verify /dev/zero", "not a regular file")


def test_report_verify_on_a_fifo(fifo: Path, db: Path) -> None:
    r = serwatt("report", "--verify", str(fifo), "--db", str(db))
    one_error_line(r, EXIT_USAGE, f"--verify {fifo}", "not a regular file")


def test_report_verify_on_a_directory_and_on_a_file_too_big(tmp_path: Path, db: Path) -> None:
    r = serwatt("report", "--verify", str(tmp_path), "--db", str(db))
    one_error_line(r, EXIT_USAGE, "not a regular file")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"pad": "x" * (safeio.MAX_JSON_BYTES + 1)}))
    r = serwatt("report", "--verify", str(big), "--db", str(db))
    one_error_line(r, EXIT_USAGE, f"--verify {big}", f"at most {safeio.MAX_JSON_BYTES} bytes")


def test_many_verify_key_on_a_fifo(tmp_path: Path, fifo: Path) -> None:
    ckpt = tmp_path / "a.many"
    ckpt.write_bytes(b"")  # never read: the key is refused first
    r = serwatt("many", "verify", "--key", str(fifo), str(ckpt))
    one_error_line(r, EXIT_USAGE, str(fifo), "not a regular file")


def test_many_verify_key_on_dev_zero(tmp_path: Path) -> None:
    ckpt = tmp_path / "a.many"
    ckpt.write_bytes(b"")
    r = serwatt("many", "verify", "--key", "/dev/zero", str(ckpt))
    one_error_line(r, EXIT_USAGE, "/dev/zero", "not a regular file")


@pytest.mark.parametrize(
    "argv",
    [
        ["check-config", "{fifo}"],
        ["runs", "list", "--config", "{fifo}"],
        ["report", "--baseline", "a", "--candidate", "b", "--cluster", "{fifo}", "--db", "{db}"],
    ],
)
def test_yaml_file_arguments_on_a_fifo(argv: list[str], fifo: Path, db: Path) -> None:
    r = serwatt(*(a.format(fifo=fifo, db=db) for a in argv))
    # a config error lists its problems under one header line (profiler/yamlcheck.py)
    assert r.returncode == (EXIT_CONFIG if argv[0] == "check-config" else EXIT_USAGE), r.stderr
    assert "Traceback" not in r.stderr
    assert str(fifo) in r.stderr and "not a regular file" in r.stderr


def test_read_bounded_refuses_what_a_file_argument_must_not_be(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 11)
    assert safeio.read_bounded(f, max_bytes=11) == b"x" * 11
    with pytest.raises(safeio.InputFileError, match="11 bytes; serwatt reads at most 10"):
        safeio.read_bounded(f, max_bytes=10)
    link = tmp_path / "link"
    link.symlink_to(f)
    assert safeio.read_bounded(link, max_bytes=11) == b"x" * 11  # a link to a file is one
    with pytest.raises(safeio.InputFileError, match="is a symbolic link"):
        safeio.read_bounded(link, max_bytes=11, follow_links=False)
    with pytest.raises(safeio.InputFileError, match="no such file"):
        safeio.read_bounded(tmp_path / "missing", max_bytes=11)
    with pytest.raises(safeio.InputFileError, match="not a regular file"):
        safeio.read_bounded(Path("/dev/zero"), max_bytes=11)
    with pytest.raises(safeio.InputFileError, match="nested too deeply"):
        safeio.parse_json(b"[" * 100_000 + b"]" * 100_000, tmp_path / "deep.json")
    with pytest.raises(safeio.InputFileError, match="not JSON"):
        safeio.parse_json(b"{", tmp_path / "bad.json")


def test_classifier_explain_tool_on_a_fifo_and_deep_json(tmp_path: Path, fifo: Path) -> None:
    def explain(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "serwatt", "classify", str(path)],
            cwd=REPO, capture_output=True, text=True, timeout=DEADLINE_S,
            stdin=subprocess.DEVNULL, preexec_fn=_limit_memory,
        )  # fmt: skip

    one_error_line(explain(fifo), EXIT_USAGE, str(fifo), "not a regular file")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    one_error_line(explain(deep), EXIT_USAGE, "nested too deeply")
