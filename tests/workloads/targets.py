"""Target interpreters for real-process classification tests.

serwatt itself runs on the project venv (3.11); the processes it profiles may run any
CPython. The tests profile real workloads on one interpreter before 3.11 (bare frame
names) and one 3.12+ (qualnames), each in a small venv with the third-party
serializers the workloads use. `make target-venvs` (run by `make test`) builds them;
a test that finds one missing builds it on first use, or fails saying how.

    python -m tests.workloads.targets        # build/check all target venvs
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGETS_DIR = Path(os.environ.get("SERWATT_TARGET_VENVS", REPO / ".venv-targets"))
PYENV_ROOT = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
# name -> (interpreter candidates, packages). Interpreters are pyenv builds.
TARGETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "py310": (("3.10.13", "3.10"), ("protobuf>=5", "msgpack>=1.0", "pyyaml>=6", "orjson>=3.9")),
    "py312": (
        ("3.12.1", "3.13.0", "3.12"),
        ("protobuf>=5", "msgpack>=1.0", "pyyaml>=6", "orjson>=3.9"),
    ),
}
_MARKER = ".serwatt-target-ok"


class TargetUnavailable(RuntimeError):
    pass


def find_interpreter(candidates: tuple[str, ...]) -> Path:
    versions = PYENV_ROOT / "versions"
    for name in candidates:
        exe = versions / name / "bin" / "python"
        if exe.exists():
            return exe
    if versions.is_dir():
        for d in sorted(versions.iterdir()):
            for name in candidates:
                if d.name.startswith(name + ".") and (d / "bin" / "python").exists():
                    return d / "bin" / "python"
    raise TargetUnavailable(
        f"no CPython {' or '.join(candidates)} under {versions}: install one "
        f"(`pyenv install {candidates[0]}`) or set PYENV_ROOT"
    )


def ensure_target(name: str) -> Path:
    """The python of target venv `name`, building it if needed (needs PyPI access)."""
    candidates, packages = TARGETS[name]
    venv = TARGETS_DIR / name
    python = venv / "bin" / "python"
    marker = venv / _MARKER
    want = " ".join(packages)
    if python.exists() and marker.exists() and marker.read_text().strip() == want:
        return python
    base = find_interpreter(candidates)
    steps = [
        [str(base), "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise TargetUnavailable(
                f"building target venv {venv} failed at `{' '.join(cmd)}` "
                f"(exit {proc.returncode}): {proc.stderr.strip()[-800:]}\n"
                "Fix: make sure PyPI is reachable (or a pip index is configured), then "
                "run `make target-venvs`."
            )
    marker.write_text(want + "\n")
    return python


def main() -> int:
    for name in TARGETS:
        try:
            python = ensure_target(name)
        except TargetUnavailable as exc:
            print(f"target {name}: {exc}", file=sys.stderr)
            return 1
        version = subprocess.run(
            [str(python), "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        print(f"target {name}: {python} (CPython {version})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
