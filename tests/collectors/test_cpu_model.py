"""The labelled CPU energy model: TDP resolution and the idle + dynamic formula."""

from __future__ import annotations

from pathlib import Path

import pytest

from serwatt.collectors.cpu_model import (
    DEFAULT_W_PER_CPU,
    CpuPowerModel,
    parse_cpuinfo,
    read_cpuinfo,
    resolve_tdp,
)


def _cpuinfo(model: str, sockets: int, per_socket: int, vm: bool) -> str:
    flags = "fpu vme de pse tsc msr" + (" hypervisor" if vm else "")
    out = []
    n = 0
    for s in range(sockets):
        for _ in range(per_socket):
            out.append(
                f"processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\n"
                f"physical id\t: {s}\nsiblings\t: {per_socket}\nflags\t\t: {flags}\n"
            )
            n += 1
    return "\n".join(out)


def test_bare_metal_two_socket_xeon_uses_table() -> None:
    info = parse_cpuinfo(_cpuinfo("Intel(R) Xeon(R) Platinum 8480+", 2, 4, vm=False))
    assert (info.packages, info.logical_cpus, info.hypervisor) == (2, 8, False)
    tdp = resolve_tdp(info)
    assert tdp.tdp_w == 700.0
    assert tdp.tdp_source == "table:Xeon(R) Platinum 8480+ x 2"


def test_vm_uses_per_cpu_default_and_config_wins() -> None:
    info = parse_cpuinfo(_cpuinfo("AMD EPYC 7763 64-Core Processor", 1, 2, vm=True))
    tdp = resolve_tdp(info)
    assert tdp.tdp_w == DEFAULT_W_PER_CPU * 2
    assert "vm" in tdp.tdp_source
    assert resolve_tdp(info, tdp_w=55.0).tdp_source == "config"
    with pytest.raises(ValueError, match="tdp_w must be > 0"):
        resolve_tdp(info, tdp_w=0)


def test_unknown_model_number_prefix_does_not_match() -> None:
    info = parse_cpuinfo(_cpuinfo("Intel(R) Xeon(R) Platinum 84801", 1, 2, vm=False))
    assert resolve_tdp(info).tdp_source.startswith("default:")


def test_energy_is_idle_plus_dynamic() -> None:
    m = CpuPowerModel(resolve_tdp(parse_cpuinfo(""), tdp_w=200.0), idle_fraction=0.3)
    e = m.energy(wall_s=10.0, utilisation=0.5)
    assert e.idle_j == pytest.approx(600.0)  # 60 W x 10 s
    assert e.dynamic_j == pytest.approx(700.0)  # 140 W x 0.5 x 10 s
    assert e.total_j == pytest.approx(1300.0)
    assert e.source == "model"
    assert m.energy(10.0, 1.7).utilisation == 1.0  # clamped
    assert "TDP 200 W from config" in m.describe()


def test_this_machine(tmp_path: Path) -> None:
    info = read_cpuinfo()
    assert info.logical_cpus >= 1
    m = CpuPowerModel.for_node()
    assert m.tdp.tdp_w > 0
    (tmp_path / "cpuinfo").write_text(_cpuinfo("AMD EPYC 9654 96-Core Processor", 2, 2, False))
    assert CpuPowerModel.for_node(tmp_path).tdp.tdp_w == 720.0
