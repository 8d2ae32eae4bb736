"""The host fingerprint recorded with every run: what machine produced these numbers.

Two runs are comparable (an A/B report) only on like hardware, so each record says
the CPU model, sockets, logical CPUs, whether it is a VM, memory, GPUs (from NVML,
or why there are none), kernel, OS, the CPU frequency governor, the load average at
the start, the Python, torch, numpy and serwatt versions that recorded it. Target
processes' Python versions, and the 1-minute load (load_1min), are recorded per window.

Every root is a parameter (procfs, sysfs, os-release) so tests read built trees.
A fact that cannot be read is None with the reason in `unreadable`, never guessed.
"""

from __future__ import annotations

import math
import platform
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serwatt.collectors.cpu_model import parse_cpuinfo
from serwatt.collectors.nvml import NvmlCollector, NvmlStatus
from serwatt.profiler import __version__

HOST_SCHEMA = "serwatt.host/1"


def _sockets_from_sysfs(sysfs: Path) -> int | None:
    """Distinct physical package ids: works on CPUs whose cpuinfo has no `physical id`."""
    ids = set()
    for f in (sysfs / "devices" / "system" / "cpu").glob("cpu[0-9]*/topology/physical_package_id"):
        try:
            ids.add(f.read_text().strip())
        except OSError:
            continue
    return len(ids) or None


def _os_release(path: Path) -> str | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "PRETTY_NAME":
                return value.strip().strip('"')
    except OSError:
        return None
    return None


def _memory_bytes(procfs: Path) -> int | None:
    try:
        for line in (procfs / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_governor(sysfs: Path, unreadable: dict[str, str]) -> str | None:
    """cpu0's cpufreq scaling governor (`performance`, `powersave`, ...): it sets how
    fast a loaded CPU runs, so runs under different governors time differently."""
    path = sysfs / "devices" / "system" / "cpu" / "cpu0" / "cpufreq" / "scaling_governor"
    try:
        return path.read_text().strip()[:64] or None
    except OSError as exc:
        unreadable["cpu_governor"] = f"{path}: {exc.strerror or exc}"
        return None


def load_1min(procfs: Path = Path("/proc")) -> float | None:
    """The 1-minute load average now; None when /proc/loadavg cannot be read. The run
    sink records it with every window, so a report compares the load over the runs, not
    only at their start."""
    loads = _load_average(procfs, {})
    if not loads or not math.isfinite(loads[0]) or loads[0] < 0:
        return None
    return loads[0]


def _load_average(procfs: Path, unreadable: dict[str, str]) -> list[float] | None:
    """The 1, 5 and 15 minute load averages when the run started."""
    try:
        fields = (procfs / "loadavg").read_text().split()
        return [float(x) for x in fields[:3]]
    except (OSError, ValueError) as exc:
        unreadable["load_average"] = f"{procfs}/loadavg: {exc}"
        return None


def _package_versions() -> dict[str, str | None]:
    """torch and numpy as installed beside serwatt (metadata only: nothing is imported);
    a command run in another environment may use others."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("torch", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpus_from_nvml(status: NvmlStatus | None) -> tuple[list[dict[str, Any]], str]:
    """GPU list and its source from a collectors.nvml.NvmlStatus (or None: not probed)."""
    if status is None:
        return [], "unavailable: nvml not probed"
    gpus = [
        {"index": g.index, "uuid": g.uuid, "name": g.name, "up": g.up, "reason": g.reason}
        for g in status.gpus
    ]
    if status.up or gpus:
        return gpus, "nvml"
    return [], f"unavailable: {status.reason}" + (f" ({status.detail})" if status.detail else "")


def probe_nvml() -> NvmlStatus:
    """Probe NVML once for the GPU list; an unusable NVML is a status, never an exception."""
    collector = NvmlCollector()
    try:
        return collector.probe()
    finally:
        collector.shutdown()


def fingerprint(
    *,
    procfs: Path = Path("/proc"),
    sysfs: Path = Path("/sys"),
    os_release: Path = Path("/etc/os-release"),
    nvml_status: NvmlStatus | None = None,
    probe_gpus: bool = False,
) -> dict[str, Any]:
    """The host facts for a run record, as a JSON-ready dict.

    nvml_status: a collectors.nvml.NvmlStatus the caller already has (the daemon
    probes NVML anyway). probe_gpus: probe NVML here when no status is given.
    """
    unreadable: dict[str, str] = {}
    try:
        cpu = parse_cpuinfo((procfs / "cpuinfo").read_text())
        model, logical, hypervisor = cpu.model_name, cpu.logical_cpus, cpu.hypervisor
        sockets: int | None = cpu.packages
    except OSError as exc:
        model = logical = hypervisor = sockets = None  # type: ignore[assignment]
        unreadable["cpu"] = f"{procfs}/cpuinfo: {exc.strerror or exc}"
    from_sysfs = _sockets_from_sysfs(sysfs)
    if from_sysfs is not None:
        sockets = from_sysfs
    try:
        kernel = (procfs / "sys" / "kernel" / "osrelease").read_text().strip()
    except OSError:
        kernel = platform.release()
    if nvml_status is None and probe_gpus:
        nvml_status = probe_nvml()
    gpus, gpu_source = gpus_from_nvml(nvml_status)
    return {
        "schema": HOST_SCHEMA,
        "hostname": socket.gethostname(),
        "cpu_model": model,
        "sockets": sockets,
        "logical_cpus": logical,
        "hypervisor": hypervisor,
        "memory_bytes": _memory_bytes(procfs),
        "gpus": gpus,
        "gpu_source": gpu_source,
        "kernel": kernel,
        "os": _os_release(os_release),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "serwatt_version": __version__,
        "cpu_governor": _cpu_governor(sysfs, unreadable),
        "load_average": _load_average(procfs, unreadable),
        "packages": _package_versions(),
        "unreadable": unreadable,
    }


def describe(host: Mapping[str, Any]) -> str:
    """One line for `serwatt runs show`."""
    gpus = host.get("gpus") or []
    gpu_text = (
        ", ".join(sorted({str(g.get("name")) for g in gpus})) + f" x{len(gpus)}"
        if gpus
        else str(host.get("gpu_source", "no GPU"))
    )
    return (
        f"{host.get('hostname')}: {host.get('cpu_model')} ({host.get('sockets')} socket(s), "
        f"{host.get('logical_cpus')} CPUs{', VM' if host.get('hypervisor') else ''}), "
        f"GPUs: {gpu_text}; kernel {host.get('kernel')}; Python {host.get('python')}"
    )
