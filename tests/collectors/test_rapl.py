"""The real RAPL reader against realistic powercap trees built in tmp dirs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serwatt.collectors.rapl import (
    REASON_NO_POWERCAP,
    REASON_PERMISSION,
    REASON_UNSUPPORTED,
    RaplCollector,
    RaplError,
    derive_poll_period_s,
    wrap_delta_uj,
)
from tests.powercap import ZoneSpec, add_zone, build_powercap

REPO = Path(__file__).resolve().parents[2]


def test_two_sockets_map_zones_to_packages_by_name(tmp_path: Path) -> None:
    tree = build_powercap(tmp_path)  # intel-rapl:0 is package-1, intel-rapl:1 is package-0
    c = RaplCollector(tmp_path)
    st_ = c.probe()
    assert st_.up, st_.detail
    kinds = {z.zone_id: (z.kind, z.package) for z in st_.zones}
    assert kinds == {
        "intel-rapl:0": ("package", 1),
        "intel-rapl:0:0": ("dram", 1),
        "intel-rapl:1": ("package", 0),
        "intel-rapl:1:0": ("dram", 0),
        "intel-rapl:2": ("psys", None),
    }  # the mmio duplicate is not there
    assert st_.packages == (0, 1)
    c.read()
    tree.advance("intel-rapl:0", 30.0)  # package-1
    tree.advance("intel-rapl:1", 10.0)  # package-0
    tree.advance("intel-rapl:0:0", 2.0)
    tree.advance("intel-rapl:2", 50.0)
    r = c.read()
    assert r.per_package_j == {0: pytest.approx(10.0), 1: pytest.approx(30.0)}
    assert r.package_j == pytest.approx(40.0)
    assert r.dram_j == pytest.approx(2.0)
    assert r.psys_j == pytest.approx(50.0)  # reported apart, never added to packages
    assert r.errors == ()


def test_wrap_mid_run_is_corrected_per_zone_before_summing(tmp_path: Path) -> None:
    max_uj = 50_000_000  # 50 J range: wraps within the run
    tree = build_powercap(tmp_path, max_uj=max_uj, start_uj=45_000_000, psys=False)
    c = RaplCollector(tmp_path)
    c.read()
    total = 0.0
    for step_j in (3.0, 4.0, 20.0, 30.0, 49.0):  # 3 + 4 crosses the 50 J wrap
        tree.advance("intel-rapl:0", step_j)
        tree.advance("intel-rapl:1", step_j / 2)
        total += step_j * 1.5
        r = c.read()
    assert r.package_j == pytest.approx(total)
    assert r.package_j > 0
    assert r.wraps >= 3


def test_poll_period_allows_at_most_one_wrap(tmp_path: Path) -> None:
    build_powercap(tmp_path, max_uj=60_000_000, dram=False, psys=False)
    st_ = RaplCollector(tmp_path, max_power_w=1000.0).probe()
    assert st_.poll_period_s == pytest.approx(0.03)  # 60 J / 1000 W / 2
    assert derive_poll_period_s([262_143_328_850], 1000.0) == 10.0  # capped
    assert derive_poll_period_s([1_000], 1000.0) == 0.01  # floored


def test_missing_max_skips_zone_with_reason(tmp_path: Path) -> None:
    tree = build_powercap(tmp_path, psys=False)
    (tree.zone_dir("intel-rapl:0:0") / "max_energy_range_uj").unlink()
    c = RaplCollector(tmp_path)
    st_ = c.probe()
    assert st_.up
    assert [s.zone_id for s in st_.skipped] == ["intel-rapl:0:0"]
    assert "max_energy_range_uj unreadable" in st_.skipped[0].reason
    c.read()
    tree.set_energy("intel-rapl:0:0", 5_000_000)
    tree.advance("intel-rapl:1:0", 1.0)
    assert c.read().dram_j == pytest.approx(1.0)  # only the zone whose wraps we can fix


def test_all_packages_without_max_is_unsupported_not_zero(tmp_path: Path) -> None:
    tree = build_powercap(tmp_path, psys=False, dram=False)
    for z in ("intel-rapl:0", "intel-rapl:1"):
        (tree.zone_dir(z) / "max_energy_range_uj").write_text("garbage\n")
    c = RaplCollector(tmp_path)
    st_ = c.probe()
    assert (st_.up, st_.reason) == (False, REASON_UNSUPPORTED)
    assert "max_energy_range_uj unreadable" in (st_.detail or "")
    with pytest.raises(RaplError, match="unsupported"):
        c.read()


def test_no_powercap_and_unsupported_are_distinct(tmp_path: Path) -> None:
    st_ = RaplCollector(tmp_path / "sys").probe()
    assert (st_.up, st_.reason) == (False, REASON_NO_POWERCAP)
    assert "no powercap sysfs" in (st_.detail or "")
    (tmp_path / "sys" / "class" / "powercap").mkdir(parents=True)
    st_ = RaplCollector(tmp_path / "sys").probe()
    assert st_.reason == REASON_UNSUPPORTED
    # powercap with only a non-RAPL style zone name
    root = tmp_path / "other"
    tree = build_powercap(root, package_ids=(), dram=False, psys=False, mmio=True)
    add_zone(tree, ZoneSpec("intel-rapl:0", "core", 10**9))
    st_ = RaplCollector(root).probe()
    assert st_.reason == REASON_UNSUPPORTED
    assert "unrecognised zone name 'core'" in (st_.detail or "")


def test_this_machine_has_no_powercap() -> None:
    # A VM: the real /sys has no powercap. The reader must say so, not report 0 W.
    st_ = RaplCollector(Path("/sys")).probe()
    if Path("/sys/class/powercap").is_dir():
        assert st_.reason != REASON_NO_POWERCAP
    else:
        assert st_.reason == REASON_NO_POWERCAP


def test_transient_read_error_carries_energy_never_zero(tmp_path: Path) -> None:
    tree = build_powercap(tmp_path, psys=False, dram=False)
    c = RaplCollector(tmp_path)
    c.read()
    tree.advance("intel-rapl:0", 7.0)
    assert c.read().package_j == pytest.approx(7.0)
    f = tree.zone_dir("intel-rapl:0") / "energy_uj"
    saved = f.read_text()
    f.unlink()
    r = c.read()
    assert r.package_j == pytest.approx(7.0)
    assert r.errors and r.errors[0].startswith("intel-rapl:0: ENOENT")
    f.write_text(saved)
    tree.advance("intel-rapl:0", 2.0)
    assert c.read().package_j == pytest.approx(9.0)


_PERMISSION_PROBE = """
import json, os, sys
sys.path.insert(0, sys.argv[2])
from serwatt.collectors.rapl import RaplCollector
c = RaplCollector(sys.argv[1])
os.setgid(65534)
os.setuid(65534)  # drop root for real: the kernel, not us, refuses the read
s = c.probe()
print(json.dumps({"available": s.up, "reason": s.reason, "detail": s.detail}))
"""


def test_eacces_on_energy_uj_is_permission_not_zero_watts() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test drops privileges from root; run the suite as root")
    # tmp_path lives under a 0700 dir that nobody cannot traverse, so build elsewhere.
    base = Path(tempfile.mkdtemp(prefix="serwatt-eacces-"))
    try:
        os.chmod(base, 0o755)
        tree = build_powercap(base, psys=False)
        for dirpath, dirnames, filenames in os.walk(base):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
            for fn in filenames:
                os.chmod(os.path.join(dirpath, fn), 0o444)
        for z in ("intel-rapl:0", "intel-rapl:1", "intel-rapl:0:0", "intel-rapl:1:0"):
            os.chmod(tree.zone_dir(z) / "energy_uj", 0o400)  # as patched kernels do
        out = subprocess.run(
            [sys.executable, "-c", _PERMISSION_PROBE, str(base), str(REPO)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["available"] is False
        assert got["reason"] == REASON_PERMISSION
        assert "CVE-2020-8694" in got["detail"] and "intel-rapl:0" in got["detail"]
        # as root the same tree reads fine
        assert RaplCollector(base).probe().up
    finally:
        shutil.rmtree(base)


def test_wrap_delta_rejects_values_outside_range() -> None:
    assert wrap_delta_uj(90, 10, 100) == 20
    assert wrap_delta_uj(10, 90, 100) == 80
    with pytest.raises(ValueError, match="outside"):
        wrap_delta_uj(10, 101, 100)


@given(
    max_uj=st.integers(min_value=1_000, max_value=2**40),
    start_frac=st.floats(min_value=0, max_value=0.999),
    steps=st.lists(st.floats(min_value=0, max_value=0.999), min_size=1, max_size=60),
)
def test_wrap_sequences_integrate_to_true_energy(
    max_uj: int, start_frac: float, steps: list[float]
) -> None:
    # True increments below one full range (the poll period guarantees it); the raw
    # counter is their running sum modulo the range.
    raw = int(start_frac * max_uj)
    true_uj = 0
    integrated = 0
    for frac in steps:
        inc = int(frac * max_uj)
        true_uj += inc
        new = (raw + inc) % max_uj
        d = wrap_delta_uj(raw, new, max_uj)
        assert d >= 0
        integrated += d
        raw = new
    assert integrated == true_uj


@settings(max_examples=25, deadline=None)
@given(steps_j=st.lists(st.floats(min_value=0, max_value=49.0), min_size=1, max_size=12))
def test_reader_on_files_integrates_wraps(steps_j: list[float]) -> None:
    with tempfile.TemporaryDirectory() as d:
        tree = build_powercap(
            Path(d), max_uj=50_000_000, start_uj=40_000_000, dram=False, psys=False, mmio=False
        )
        c = RaplCollector(d)
        c.read()
        true_uj = 0
        for s in steps_j:
            tree.advance("intel-rapl:0", s)
            true_uj += round(s * 1e6)
            r = c.read()
        assert r.package_j == pytest.approx(true_uj / 1e6, abs=1e-6)
        assert r.package_j >= 0


def test_multi_die_packages_sum_per_package(tmp_path: Path) -> None:
    # Some parts expose one zone per die: package-0-die-0, package-0-die-1, ...
    tree = build_powercap(tmp_path, package_ids=(), dram=False, psys=False, mmio=False)
    for idx, name in enumerate(("package-0-die-0", "package-0-die-1", "package-1-die-0")):
        add_zone(tree, ZoneSpec(f"intel-rapl:{idx}", name))
    c = RaplCollector(tmp_path)
    st_ = c.probe()
    assert [(z.package, z.die) for z in st_.zones] == [(0, 0), (0, 1), (1, 0)]
    c.read()
    for z, j in (("intel-rapl:0", 5.0), ("intel-rapl:1", 7.0), ("intel-rapl:2", 3.0)):
        tree.advance(z, j)
    r = c.read()
    assert r.per_package_j == {0: pytest.approx(12.0), 1: pytest.approx(3.0)}
    assert r.package_j == pytest.approx(15.0)
