"""Build realistic powercap sysfs trees for tests, and advance their counters.

The layout matches a real two-socket Intel server:

    devices/virtual/powercap/intel-rapl/            (control type, has `enabled`)
    devices/virtual/powercap/intel-rapl/intel-rapl:0/{name,energy_uj,max_energy_range_uj,...}
    devices/virtual/powercap/intel-rapl/intel-rapl:0/intel-rapl:0:0/   (dram subzone)
    devices/virtual/powercap/intel-rapl-mmio/intel-rapl-mmio:0/        (duplicate of pkg 0)
    class/powercap/intel-rapl:0 -> ../../devices/virtual/powercap/intel-rapl/intel-rapl:0
    class/powercap/intel-rapl:0:0 -> .../intel-rapl:0/intel-rapl:0:0

Counter values are written atomically (write + rename) so a concurrent reader sees
either the old or the new value, as with the kernel's sysfs.

Run as a helper process that advances package counters at a known power:

    python -m tests.powercap advance --root ROOT --watts 40 --zone intel-rapl:0 ...

It prints `started <epoch>` once the first value is written, then writes
energy_uj = (start + watts x elapsed) mod max_energy_range_uj every --step-s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# 2^32 energy units of 61.035 uJ: the range a Xeon reports (~262 kJ).
XEON_MAX_RANGE_UJ = 262_143_328_850


@dataclass
class ZoneSpec:
    zone_id: str  # "intel-rapl:0" or "intel-rapl:0:0"
    name: str  # "package-1", "dram", "psys"
    max_uj: int | None = XEON_MAX_RANGE_UJ  # None: no max_energy_range_uj file
    energy_uj: int = 0


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class PowercapTree:
    def __init__(self, root: Path) -> None:
        self.root = root  # the sysfs root passed as --path.sysfs
        self.class_dir = root / "class" / "powercap"
        self.devices_dir = root / "devices" / "virtual" / "powercap"

    def zone_dir(self, zone_id: str) -> Path:
        return self.class_dir / zone_id

    def max_uj(self, zone_id: str) -> int:
        return int((self.zone_dir(zone_id) / "max_energy_range_uj").read_text())

    def energy_uj(self, zone_id: str) -> int:
        return int((self.zone_dir(zone_id) / "energy_uj").read_text())

    def set_energy(self, zone_id: str, uj: int) -> None:
        write_atomic(self.zone_dir(zone_id) / "energy_uj", f"{uj}\n")

    def advance(self, zone_id: str, joules: float) -> int:
        """Add energy the way the hardware would: modulo the zone's range."""
        new = (self.energy_uj(zone_id) + round(joules * 1e6)) % self.max_uj(zone_id)
        self.set_energy(zone_id, new)
        return new


def add_zone(tree: PowercapTree, spec: ZoneSpec, control: str = "intel-rapl") -> Path:
    parts = spec.zone_id.split(":")
    if len(parts) == 3:
        parent = tree.devices_dir / control / f"{control}:{parts[1]}"
        d = parent / spec.zone_id
    else:
        d = tree.devices_dir / control / spec.zone_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "name").write_text(spec.name + "\n")
    (d / "enabled").write_text("1\n")
    (d / "energy_uj").write_text(f"{spec.energy_uj}\n")
    if spec.max_uj is not None:
        (d / "max_energy_range_uj").write_text(f"{spec.max_uj}\n")
    (d / "constraint_0_name").write_text("long_term\n")
    (d / "constraint_0_power_limit_uw").write_text("205000000\n")
    link = tree.class_dir / spec.zone_id
    link.symlink_to(os.path.relpath(d, tree.class_dir))
    return d


def build_powercap(
    root: Path,
    *,
    package_ids: tuple[int, ...] = (1, 0),
    dram: bool = True,
    psys: bool = True,
    mmio: bool = True,
    max_uj: int = XEON_MAX_RANGE_UJ,
    start_uj: int = 0,
) -> PowercapTree:
    """A two-socket tree by default, with zone index != package id (zone 0 is package-1)."""
    tree = PowercapTree(root)
    tree.class_dir.mkdir(parents=True, exist_ok=True)
    control = tree.devices_dir / "intel-rapl"
    control.mkdir(parents=True, exist_ok=True)
    (control / "enabled").write_text("1\n")
    (tree.class_dir / "intel-rapl").symlink_to(os.path.relpath(control, tree.class_dir))
    for idx, pkg in enumerate(package_ids):
        add_zone(tree, ZoneSpec(f"intel-rapl:{idx}", f"package-{pkg}", max_uj, start_uj))
        if dram:
            add_zone(tree, ZoneSpec(f"intel-rapl:{idx}:0", "dram", max_uj // 4, 0))
    if psys:
        add_zone(tree, ZoneSpec(f"intel-rapl:{len(package_ids)}", "psys", max_uj, 0))
    if mmio:
        (tree.devices_dir / "intel-rapl-mmio").mkdir(parents=True, exist_ok=True)
        add_zone(tree, ZoneSpec("intel-rapl-mmio:0", "package-0", max_uj, 0), "intel-rapl-mmio")
    return tree


def _advance_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.powercap advance")
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--watts", type=float, required=True, help="power per zone")
    ap.add_argument("--zone", action="append", required=True)
    ap.add_argument("--step-s", type=float, default=0.005)
    ap.add_argument("--duration-s", type=float, default=600.0)
    args = ap.parse_args(argv)
    tree = PowercapTree(args.root)
    start = {z: tree.energy_uj(z) for z in args.zone}
    maxes = {z: tree.max_uj(z) for z in args.zone}
    t0 = time.time()
    announced = False
    while True:
        now = time.time()
        elapsed = now - t0
        for z in args.zone:
            tree.set_energy(z, (start[z] + round(args.watts * elapsed * 1e6)) % maxes[z])
        if not announced:
            print(f"started {t0:.6f}", flush=True)
            announced = True
        if elapsed >= args.duration_s:
            return 0
        time.sleep(args.step_s)


if __name__ == "__main__":
    if sys.argv[1:2] != ["advance"]:
        sys.exit("usage: python -m tests.powercap advance --root ROOT --watts W --zone Z ...")
    sys.exit(_advance_main(sys.argv[2:]))
