"""Headless Chromium for the tests that check a page as a browser draws it (the A/B page,
the profile's flame graph). CI installs Debian's `chromium` (Makefile system-deps), so
there a missing browser fails the test; elsewhere it skips it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed: CI needs the Debian package `chromium`")
    pytest.skip("chromium is not installed (apt-get install chromium)")


def run(tmp: Path, *args: str) -> str:
    """Chromium's stdout for `args` (e.g. `--dump-dom URL`), with a profile of its own
    under `tmp`; a failing browser raises."""
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",  # tests run as root in containers
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={tmp / 'profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
