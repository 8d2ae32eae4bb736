"""End to end: `serwatt profile --path.sysfs TREE` while a helper process advances the
powercap counters at a known power (with wraps), real py-spy on a real workload."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from serwatt.profiler.classify.codepaths import CODEPATHS
from tests.powercap import build_powercap

REPO = Path(__file__).resolve().parents[2]
SERWATT = [sys.executable, "-m", "serwatt"]
WATTS_PER_PACKAGE = 25.0
# Each package counter wraps every 3 s at 25 W, so any profile of 5 s sees a wrap
# of both. Not much smaller: the serwatt process can hold the GIL for ~0.5-1 s
# (ast.parse of a large source file in the call-site classifier, measured during
# `serwatt demo`), and the poller must read at least once per wrap. Real RAPL ranges
# take minutes to wrap.
RANGE_UJ = 75_000_000
DEMO_RANGE_UJ = 150_000_000  # the demo classifies torch stacks: longest GIL stalls


def _serwatt(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERWATT, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


class Advancer:
    """The helper process: counters of both packages advance at WATTS_PER_PACKAGE."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.powercap", "advance", "--root", str(root),
             "--watts", str(WATTS_PER_PACKAGE), "--zone", "intel-rapl:0",
             "--zone", "intel-rapl:1", "--duration-s", "300"],
            cwd=REPO, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("started "), line

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _check_identities(doc: dict) -> None:
    e = doc["energy"]
    cps = doc["codepaths"]
    assert set(cps) == set(CODEPATHS)
    attributed = math.fsum(c["energy_j"] for c in cps.values())
    assert all(c["energy_j"] >= 0 for c in cps.values())
    assert all(c["energy_source"] == e["source"] for c in cps.values())
    assert e["unattributed_j"] >= 0
    assert attributed <= e["package_j"] + 1e-5
    assert attributed + e["unattributed_j"] == pytest.approx(e["package_j"], abs=1e-4)
    assert sum(e["unattributed_parts_j"].values()) == pytest.approx(e["unattributed_j"], abs=1e-4)


@pytest.mark.serial  # measures CPU shares and time: alone, on a quiet machine
def test_profile_measures_known_power_through_wraps(tmp_path: Path) -> None:
    tree = build_powercap(tmp_path / "sys", max_uj=RANGE_UJ, start_uj=RANGE_UJ // 2)
    work = tmp_path / "work.py"
    work.write_text(
        textwrap.dedent(
            """
            import pickle, time
            data = {str(i): [i, "x" * 10] for i in range(5000)}
            end = time.time() + 6
            while time.time() < end:
                blob = pickle.dumps(data)
            """
        )
    )
    out = tmp_path / "p.json"
    adv = Advancer(tree.root)
    try:
        r = _serwatt(
            "profile", "--path.sysfs", str(tree.root), "--nvml", "off", "--json", str(out),
            "--", sys.executable, str(work),
        )  # fmt: skip
    finally:
        adv.stop()
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    e = doc["energy"]
    assert e["source"] == "rapl" and e["reason"] is None
    wall = e["window"]["end"] - e["window"]["start"]
    assert wall > 5.0
    expected = 2 * WATTS_PER_PACKAGE * wall
    assert e["package_j"] == pytest.approx(expected, rel=0.02)
    assert e["per_package_j"]["0"] == pytest.approx(expected / 2, rel=0.02)
    assert e["rapl"]["wraps_corrected"] >= 2  # both counters wrapped at least once
    assert e["rapl"]["max_read_gap_s"] < RANGE_UJ / 1e6 / WATTS_PER_PACKAGE
    assert e["dram_j"] == pytest.approx(0.0) and e["psys_j"] == pytest.approx(0.0)
    _check_identities(doc)
    assert doc["codepaths"]["pickle"]["energy_j"] > 0
    assert doc["codepaths"]["pickle"]["gpu_wait_s"] is None  # no GPU: unavailable, not 0
    assert "J (rapl)" in r.stdout and "energy: measured (RAPL): package" in r.stdout


@pytest.mark.serial  # measures CPU shares and time: alone, on a quiet machine
def test_demo_reads_rapl_from_path_sysfs(tmp_path: Path) -> None:
    tree = build_powercap(tmp_path / "sys", max_uj=DEMO_RANGE_UJ, dram=False, psys=False)
    out = tmp_path / "d.json"
    adv = Advancer(tree.root)
    try:
        r = _serwatt(
            "demo", "--workload", "mixed", "--duration", "3",
            "--path.sysfs", str(tree.root), "--nvml", "off",
            "--json", str(out),
        )  # fmt: skip
    finally:
        adv.stop()
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    e = doc["energy"]
    assert e["source"] == "rapl"
    wall = e["window"]["end"] - e["window"]["start"]
    assert e["package_j"] == pytest.approx(2 * WATTS_PER_PACKAGE * wall, rel=0.02)
    _check_identities(doc)


@pytest.mark.serial  # measures CPU shares and time: alone, on a quiet machine
def test_without_powercap_profile_uses_the_labelled_model(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    out = tmp_path / "p.json"
    code = "import json,time\nt=time.time()\nwhile time.time()-t<2: json.dumps(list(range(999)))"
    r = _serwatt(
        "profile", "--path.sysfs", str(tmp_path / "sys"), "--tdp", "120", "--nvml", "off",
        "--json", str(out), "--", sys.executable, "-c", code,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    e = doc["energy"]
    assert e["source"] == "model" and "no_powercap" in e["reason"]
    assert "TDP 120 W from config" in e["model"]
    assert e["package_j"] > 0
    _check_identities(doc)
    assert "J (model)" in r.stdout and "ESTIMATED (model, not measured)" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--path.sysfs", "/nonexistent/sys"], "--path.sysfs /nonexistent/sys: not a directory"),
        (["--rapl", "required"], "RAPL is required but unavailable (no_powercap)"),
        (["--nvml", "required"], "NVML is required but unavailable (no_driver)"),
        (["--tdp", "-5"], "--tdp must be > 0 watts"),
    ],
)
def test_bad_energy_options_exit_2_before_starting_the_command(
    tmp_path: Path, args: list[str], message: str
) -> None:
    marker = tmp_path / "ran"
    base = ["--path.sysfs", str(tmp_path)] if "--path.sysfs" not in args else []
    r = _serwatt(
        "profile", *base, *args, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')",
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not marker.exists()  # the command never started
