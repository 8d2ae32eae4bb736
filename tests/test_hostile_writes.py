"""Root never writes through a link another user planted (issue 21, finding 1).

serwatt runs as root and writes its output (the profile document, the report's JSON and
HTML, the run record) into job and project directories that other users can write. Each
test plants what such a user would (a link at the temp name a writer would use, or at the
final name, or a dangling link for the record) and checks that the link's target is
untouched and nothing was created there. The links are given to user nobody (lchown), as
if that user had made them; `fs.protected_symlinks` is not relied on. Every writer goes
through profiler/safeio.py, and a last test checks that no other code under profiler/ or
collectors/ opens a file for writing.
"""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from serwatt.profiler import safeio
from serwatt.profiler.cli.main import main
from serwatt.profiler.records.store import Recorder, RecordError
from tests.records.test_hostile_records import _build

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
PRECIOUS = "precious: another user's file, or root's\n"


def serwatt(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serwatt", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def plant(link: Path, target: Path) -> None:
    """A symbolic link as user nobody would leave it."""
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)


def shared_sticky_dir(tmp_path: Path) -> Path:
    """A directory like /tmp: root's, everyone may create entries (mode 1777)."""
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.write_text(PRECIOUS)
    return v


def test_profile_json_never_writes_through_a_planted_temp_link(tmp_path: Path) -> None:
    shared = shared_sticky_dir(tmp_path)
    v = victim(tmp_path)
    dangling = tmp_path / "created-by-root"
    plant(shared / "prof.json.tmp", v)  # the fixed temp name the writer used
    plant(shared / ".prof.json.tmp", dangling)
    out = shared / "prof.json"
    r = serwatt(
        "profile", "--window", "0.5", "--nvml", "off", "--json", str(out), "--",
        sys.executable, "-c", "import time; time.sleep(1.5)",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert v.read_text() == PRECIOUS
    assert not dangling.exists()
    assert (shared / "prof.json.tmp").is_symlink()  # the planted link itself is left alone
    assert not out.is_symlink() and '"serwatt.profile/1"' in out.read_text()
    assert out.stat().st_uid == os.geteuid()
    # the writer's own temp file is gone; the planted ones are as they were
    assert sorted(p.name for p in shared.iterdir()) == [
        ".prof.json.tmp",
        "prof.json",
        "prof.json.tmp",
    ]


def test_report_outputs_never_write_through_links_for_coming_pids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _build(tmp_path / "runs.sqlite")
    shared = shared_sticky_dir(tmp_path)
    v = victim(tmp_path)
    # in-process, so the pid the old writer named its temp file after is known exactly;
    # links for the next pids stand for the ones a run in a new process would get
    for pid in range(os.getpid(), os.getpid() + 50):
        for name in ("report.json", "report.html"):
            plant(shared / f".{name}.tmp-{pid}", v)
    links = sorted(p.name for p in shared.iterdir())
    rc = main(
        ["report", "--db", str(db), "--baseline", "base-a", "--candidate", "cand-b",
         "--allow-mismatch", "--json", str(shared / "report.json"),
         "--html", str(shared / "report.html")]
    )  # fmt: skip
    capsys.readouterr()
    assert rc == 0
    assert v.read_text() == PRECIOUS
    assert (shared / "report.json").read_text().lstrip().startswith("{")
    assert "<html" in (shared / "report.html").read_text()
    assert sorted(p.name for p in shared.iterdir()) == sorted(
        [*links, "report.html", "report.json"]
    )


def test_a_final_path_that_is_a_link_or_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    shared = shared_sticky_dir(tmp_path)
    v = victim(tmp_path)
    plant(shared / "out.json", v)
    with pytest.raises(safeio.UnsafePathError, match=r"out\.json: is a symbolic link"):
        safeio.write_text(shared / "out.json", "{}\n")
    os.mkfifo(shared / "fifo.json")
    with pytest.raises(safeio.UnsafePathError, match=r"fifo\.json: .*not a regular file"):
        safeio.write_text(shared / "fifo.json", "{}\n")
    assert v.read_text() == PRECIOUS
    assert sorted(p.name for p in shared.iterdir()) == ["fifo.json", "out.json"]  # no temp left


@pytest.mark.parametrize(
    ("mode", "owner", "why"),
    [
        (0o777, 0, "other users can write it"),  # a shared project dir without the sticky bit
        (0o775, 0, "other users can write it"),  # group-writable: the project's group
        (0o755, NOBODY, "owned by uid 65534"),  # another user's directory
        (0o1777, NOBODY, "owned by uid 65534"),  # sticky, but its owner may still replace entries
    ],
)
def test_a_directory_another_user_can_write_is_refused(
    tmp_path: Path, mode: int, owner: int, why: str
) -> None:
    d = tmp_path / "job"
    d.mkdir()
    os.chown(d, owner, owner)
    d.chmod(mode)
    with pytest.raises(safeio.UnsafePathError, match=why) as info:
        safeio.write_text(d / "out.json", "{}\n")
    assert str(d) in str(info.value) and "sticky" in str(info.value)  # the path and the fix
    assert list(d.iterdir()) == []


def test_a_link_to_a_directory_is_followed_only_when_no_other_user_could_have_planted_it(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    shared = shared_sticky_dir(tmp_path)
    plant(shared / "out", real)  # nobody's link in /tmp-like dir: what protected_symlinks stops
    with pytest.raises(safeio.UnsafePathError, match="a symbolic link owned by uid 65534"):
        safeio.write_text(shared / "out" / "x.json", "{}\n")
    assert list(real.iterdir()) == []
    (tmp_path / "mine").symlink_to(real)  # root's own link in root's own dir: followed
    safeio.write_text(tmp_path / "mine" / "x.json", "{}\n")
    assert (real / "x.json").read_text() == "{}\n"


def test_profile_refuses_an_unsafe_json_directory_before_the_command_starts(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job"
    job.mkdir()
    job.chmod(0o777)
    marker = tmp_path / "ran"
    r = serwatt(
        "profile", "--nvml", "off", "--json", str(job / "p.json"), "--",
        sys.executable, "-c", f"open({str(marker)!r}, 'w')",
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert f"--json {job / 'p.json'}" in r.stderr and "other users can write it" in r.stderr
    assert "Traceback" not in r.stderr
    assert not marker.exists()


def test_record_never_follows_a_dangling_link(tmp_path: Path) -> None:
    d = tmp_path / "records"
    d.mkdir()
    target = tmp_path / "root-owned-sqlite-here"
    plant(d / "runs.sqlite", target)
    marker = tmp_path / "ran"
    r = serwatt(
        "profile", "--nvml", "off", "--record", str(d / "runs.sqlite"), "--",
        sys.executable, "-c", f"open({str(marker)!r}, 'w')",
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "runs.sqlite: is a symbolic link" in r.stderr and "Traceback" not in r.stderr
    assert not target.exists() and not marker.exists()
    assert sorted(p.name for p in d.iterdir()) == ["runs.sqlite"]  # no -journal, -wal


def test_record_on_a_device_is_refused_and_leaves_no_journal(tmp_path: Path) -> None:
    journal = Path("/dev/null-journal")
    before = journal.exists()
    try:
        r = serwatt(
            "profile", "--nvml", "off", "--record", "/dev/null", "--",
            sys.executable, "-c", "pass",
        )  # fmt: skip
        assert r.returncode == 2, r.stderr
        assert "/dev/null: not a regular file" in r.stderr and "Traceback" not in r.stderr
        assert journal.exists() == before
    finally:
        if journal.exists() and not before:
            journal.unlink()  # what the old code left, so the machine is as it was


def test_recorder_checks_its_directory_too(tmp_path: Path) -> None:
    d = tmp_path / "records"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(RecordError, match="other users can write it"):
        Recorder(d / "runs.sqlite")
    assert list(d.iterdir()) == []
    d.chmod(0o755)
    Recorder(d / "runs.sqlite").close()
    info = os.lstat(d / "runs.sqlite")
    assert stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


# Calls that open a file for writing, or move one into place, by name. Only the safe writer
# (and the record store, which hands SQLite a path it has checked) may make them.
_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"}
_ALLOWED = {
    "profiler/safeio.py": {"os.open for writing", "os.replace", "fsync", "write_bytes"},
    "profiler/records/store.py": {"sqlite3.connect"},
    # the record's own schema, built in memory (":memory:") to check a file against
    "profiler/records/schema.py": {"sqlite3.connect"},
    # --cold-restore fsyncs the job's checkpoint files, opened read-only, so their pages
    # are clean and posix_fadvise(DONTNEED) can drop them: it writes no file
    "profiler/profile/page_cache.py": {"fsync"},
    # stdout's reader is gone (EPIPE): /dev/null takes over fd 1, writing no file
    "profiler/cli/main.py": {"os.open for writing"},
    # runs inside the job's processes (their user, their interpreter; serwatt's modules
    # are not loaded yet): appends the swap's log in the A/B's own mode-0700 directory,
    # O_APPEND | O_NOFOLLOW
    "profiler/profile/swap/sitecustomize.py": {"os.open for writing"},
}
# profiler/many/ stands alone (it has its own durable writer); workloads are the demo's jobs.
_OUTSIDE = ("profiler/many/", "profiler/workloads/")


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _write_call(node: ast.Call) -> str | None:
    """What a call writes, or None when it opens or moves nothing for writing."""
    name = _dotted(node.func)
    if name.startswith("safeio."):
        return None  # the safe writer itself
    last = name.rsplit(".", 1)[-1]
    if last in ("write_text", "write_bytes", "mkstemp", "mkfifo", "fsync"):
        return last
    if name in ("os.replace", "os.rename", "sqlite3.connect", "shutil.copy", "shutil.move"):
        return name
    if (
        isinstance(node.func, ast.Attribute)
        and not name.startswith("dataclasses.")
        and last in ("replace", "rename")
        and len(node.args) == 1
    ):
        return f"Path.{last}"  # Path.replace(target); str.replace takes two
    if name == "os.open":
        flags = {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
        return "os.open for writing" if flags & _WRITE_FLAGS else None
    modes = [k.value for k in node.keywords if k.arg == "mode"]
    if name == "open":  # open(path, mode): a mode that is not a literal may write
        modes += node.args[1:2]
    elif last == "open":  # Path.open(mode); other objects' open() take no mode literal
        modes += [a for a in node.args[:1] if isinstance(a, ast.Constant)]
    for mode in modes:
        if not (isinstance(mode, ast.Constant) and set(str(mode.value)) <= set("rbt")):
            return "open for writing"
    return None


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    return [
        (node.lineno, what)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and (what := _write_call(node)) is not None
    ]


def test_every_output_file_is_written_by_the_safe_writer() -> None:
    problems = []
    for top in ("profiler", "collectors"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith(_OUTSIDE):
                continue
            allowed = _ALLOWED.get(rel, set())
            for line, name in _writes(ast.parse(path.read_text())):
                if name not in allowed:
                    problems.append(f"{rel}:{line}: {name}")
    assert problems == []
