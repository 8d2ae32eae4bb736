"""Host fingerprint: real machine, built procfs/sysfs trees, GPUs through the NVML collector."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from serwatt.collectors.nvml import NvmlCollector
from serwatt.profiler.records.host import HOST_SCHEMA, describe, fingerprint
from tests.nvml_replay import ReplayNvmlBackend, load_timeline

CPUINFO_2S = "".join(
    f"processor\t: {i}\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    f"physical id\t: {i // 2}\nflags\t\t: fpu sse avx\n\n"
    for i in range(4)
)


def tree(tmp_path: Path, cpuinfo: str = CPUINFO_2S) -> tuple[Path, Path, Path]:
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    (procfs / "sys" / "kernel").mkdir(parents=True)
    (procfs / "cpuinfo").write_text(cpuinfo)
    (procfs / "meminfo").write_text("MemTotal:       2097152 kB\nMemFree: 1 kB\n")
    (procfs / "sys" / "kernel" / "osrelease").write_text("6.8.0-45-generic\n")
    (procfs / "loadavg").write_text("1.25 0.80 0.40 2/311 4242\n")
    governor = sysfs / "devices" / "system" / "cpu" / "cpu0" / "cpufreq" / "scaling_governor"
    governor.parent.mkdir(parents=True)
    governor.write_text("performance\n")
    osr = tmp_path / "os-release"
    osr.write_text('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\n')
    return procfs, sysfs, osr


def test_fingerprint_of_this_machine_is_complete_and_json() -> None:
    host = fingerprint()
    assert host["schema"] == HOST_SCHEMA
    assert host["cpu_model"] and host["logical_cpus"] >= 1 and host["sockets"] >= 1
    assert host["kernel"] == platform.release()
    assert host["python"] == platform.python_version()
    assert host["memory_bytes"] > 1 << 30
    assert host["gpus"] == [] and host["gpu_source"] == "unavailable: nvml not probed"
    assert json.loads(json.dumps(host)) == host


def test_built_tree_two_sockets_memory_kernel_os(tmp_path: Path) -> None:
    procfs, sysfs, osr = tree(tmp_path)
    host = fingerprint(procfs=procfs, sysfs=sysfs, os_release=osr)
    assert host["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert (host["sockets"], host["logical_cpus"], host["hypervisor"]) == (2, 4, False)
    assert host["memory_bytes"] == 2 * 1024**3
    assert host["kernel"] == "6.8.0-45-generic"
    assert host["os"] == "Ubuntu 24.04.1 LTS"
    assert host["cpu_governor"] == "performance"
    assert host["load_average"] == [1.25, 0.80, 0.40]
    assert set(host["packages"]) == {"torch", "numpy"}
    assert host["unreadable"] == {}


def test_a_missing_governor_and_loadavg_are_reported_not_guessed(tmp_path: Path) -> None:
    """A VM without cpufreq (this one) has no governor to read: None, and why."""
    procfs, sysfs, osr = tree(tmp_path)
    (procfs / "loadavg").unlink()
    gov = sysfs / "devices" / "system" / "cpu" / "cpu0" / "cpufreq" / "scaling_governor"
    gov.unlink()
    host = fingerprint(procfs=procfs, sysfs=sysfs, os_release=osr)
    assert host["cpu_governor"] is None and host["load_average"] is None
    assert "scaling_governor" in host["unreadable"]["cpu_governor"]
    assert "loadavg" in host["unreadable"]["load_average"]


def test_sockets_from_sysfs_topology_when_cpuinfo_has_no_physical_id(tmp_path: Path) -> None:
    # arm64 cpuinfo has neither `model name` nor `physical id`.
    procfs, sysfs, osr = tree(tmp_path, "processor\t: 0\n\nprocessor\t: 1\n\n")
    for cpu, pkg in ((0, 0), (1, 1)):
        topo = sysfs / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
    host = fingerprint(procfs=procfs, sysfs=sysfs, os_release=osr)
    assert host["sockets"] == 2 and host["cpu_model"] is None


def test_unreadable_cpuinfo_is_reported_not_guessed(tmp_path: Path) -> None:
    procfs, sysfs, osr = tree(tmp_path)
    (procfs / "cpuinfo").unlink()
    host = fingerprint(procfs=procfs, sysfs=sysfs, os_release=tmp_path / "none")
    assert host["cpu_model"] is None and host["sockets"] is None
    assert "cpuinfo" in host["unreadable"]["cpu"]
    assert host["os"] is None


def test_gpus_from_the_nvml_collector(tmp_path: Path) -> None:
    procfs, sysfs, osr = tree(tmp_path)
    collector = NvmlCollector(ReplayNvmlBackend(load_timeline("two_gpus_one_lost")))
    host = fingerprint(procfs=procfs, sysfs=sysfs, os_release=osr, nvml_status=collector.probe())
    assert host["gpu_source"] == "nvml"
    assert len(host["gpus"]) == 2
    assert all(g["name"] and g["uuid"] for g in host["gpus"])
    assert "x2" in describe(host)


def test_no_nvml_says_why(tmp_path: Path) -> None:
    procfs, sysfs, osr = tree(tmp_path)
    # Probing the real NVML: on a machine without an NVIDIA driver (CI) it gives a reason,
    # not a crash; on a GPU node it lists the GPUs.
    host = fingerprint(procfs=procfs, sysfs=sysfs, os_release=osr, probe_gpus=True)
    if host["gpus"]:
        assert host["gpu_source"] == "nvml" and all(g["uuid"] for g in host["gpus"])
    else:
        assert host["gpu_source"].startswith("unavailable: ")
        assert host["gpu_source"] != "unavailable: nvml not probed"
        assert "GPUs: unavailable" in describe(host)
