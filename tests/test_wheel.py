"""The wheel as a job's environment gets it (issue 48): built from the checkout, installed
into a fresh venv, it adds one top-level name, `serwatt`, carries the operator files, and
`serwatt daemon --example-config | serwatt check-config -` passes there.

The wheel is installed with --no-deps into a venv of its own; its dependencies are this
test's own site-packages, put on the venv's path by a .pth file (that directory's .pth
files, among them an editable install's finder, are not run). Resolving them from an
index instead would take over a minute here and would test the index, not the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# what the build reads: pyproject's package-dir maps these folders under `serwatt`
BUILD_INPUTS = ("pyproject.toml", "README.md", "serwatt", "profiler", "collectors", "configs",
                "dashboards")  # fmt: skip
OPERATOR_DIRS = ("configs", "dashboards")

# make check: building and installing the wheel takes 12-20 s of CPU, and xdist builds it
# once per worker that draws one of these tests; packaging changes rarely between commits
pytestmark = pytest.mark.long


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / name, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                 "-w", str(tmp / "dist"), str(src)])  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp / "dist").glob("serwatt-*.whl")
    env = tmp / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", str(env)])
    assert made.returncode == 0, made.stderr
    python = env / "bin" / "python"
    # no PYTHONPATH: a checkout on it (its serwatt.egg-info) would read as installed already
    put = run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
              env=clean_env())  # fmt: skip
    assert put.returncode == 0, put.stdout + put.stderr
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site.stdout.strip()) / "_serwatt_test_deps.pth").write_text(
        "\n".join(sorted(ours)) + "\n"
    )
    return env


def clean_env() -> dict[str, str]:
    """No PYTHONPATH: only what the venv installed can be imported as serwatt."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_the_wheel_installs_serwatt_alone_at_top_level(venv: Path, tmp_path: Path) -> None:
    code = (
        "import importlib.metadata as m, importlib.util as u\n"
        "d = m.distribution('serwatt')\n"
        "print(d.read_text('top_level.txt').split())\n"
        "print(sorted({f.parts[0] for f in d.files if not f.parts[0].startswith('..')}))\n"
        "import serwatt.profiler.cli.main, serwatt.collectors.rapl\n"
        "print(serwatt.__file__)\n"
        "print(u.find_spec('profiler'), u.find_spec('collectors'))\n"
    )
    out = run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=clean_env())
    assert out.returncode == 0, out.stderr
    top_level, tops, where, others = out.stdout.splitlines()
    assert top_level == "['serwatt']"
    assert tops == "['serwatt', 'serwatt-0.1.0.dist-info']"
    assert where.startswith(str(venv)), where  # the wheel's copy, not the checkout
    assert others == "None None"


def test_the_operator_files_ship_unchanged(venv: Path, tmp_path: Path) -> None:
    where = "import serwatt; print(serwatt.__file__)"
    site = run([str(venv / "bin" / "python"), "-c", where], cwd=tmp_path, env=clean_env())
    package = Path(site.stdout.strip()).parent
    assert package.is_relative_to(venv), package  # not the checkout's serwatt/
    expected = [p.relative_to(REPO) for d in OPERATOR_DIRS for p in sorted((REPO / d).rglob("*"))
                if p.is_file()]  # fmt: skip
    assert expected and any(p.suffix == ".service" for p in expected)
    for rel in expected:
        shipped = package / rel
        assert shipped.is_file(), f"{rel} is not in the wheel"
        assert shipped.read_bytes() == (REPO / rel).read_bytes(), rel


def test_example_config_checks_in_the_installed_package(venv: Path, tmp_path: Path) -> None:
    bin_ = venv / "bin"
    serwatt = f"'{bin_}/serwatt'"
    pipe = f"set -o pipefail; {serwatt} daemon --example-config | {serwatt} check-config -"
    out = run(["bash", "-c", pipe], cwd=tmp_path, env=clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("<stdin>: ok:"), out.stdout
    module = run(
        [str(bin_ / "python"), "-m", "serwatt", "--version"], cwd=tmp_path, env=clean_env()
    )
    assert (module.returncode, module.stdout.strip()) == (0, "serwatt 0.1.0"), module.stderr
