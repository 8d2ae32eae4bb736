"""A new signal is one class and one line in collectors/source.py SOURCES: the tracker
probes and reads it, the daemon's `/metrics` carries its collector health and the run
record's `sources` names it, with no change to the tracker, the energy side or the sinks;
and none of those modules branch on a collector's name. A source with a `mode_option` is
also a key of the daemon config's `collectors:` (auto/required/off, left to the restart by
a reload) and a `serwatt profile --OPTION` flag, with no change to either."""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from prometheus_client import generate_latest

from serwatt.collectors import source as source_mod
from serwatt.collectors.role import OTHER, SourceContext
from serwatt.collectors.status import CollectorStatus
from serwatt.profiler.attribution.tracker import EnergyTracker, EnergyUnavailableError
from serwatt.profiler.cli.main import build_parser
from serwatt.profiler.cli.profile import profile_options
from serwatt.profiler.records.store import Recorder
from serwatt.profiler.service.clock import SystemClock
from serwatt.profiler.service.config import ConfigError, load_config
from serwatt.profiler.service.daemon_parts import _bound_at_start
from serwatt.profiler.service.energy_side import EnergySide, RequiredCollectorMissing
from serwatt.profiler.service.exporter import make_registry
from serwatt.profiler.service.ledger import Ledger
from tests.daemon_support import daemon_config, parse_metrics, total
from tests.serwatt_cli import serwatt

REPO = Path(__file__).resolve().parents[2]


class ThermalZone:
    """A new node signal: one thermal zone's temperature from sysfs (a fake tree here,
    as RAPL's is in the other tests: the hardware boundary)."""

    name: ClassVar[str] = "thermal"
    absent_reasons: ClassVar[frozenset[str]] = frozenset({"no_thermal"})
    role: ClassVar[str] = OTHER
    mode_option: ClassVar[str | None] = "thermal"
    label: ClassVar[str] = "thermal zone"
    without: ClassVar[str] = "run without temperatures"
    read_every_s: float | None = 1.0

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, ctx: SourceContext) -> ThermalZone:
        return cls(ctx.sysfs_root / "class" / "thermal" / "thermal_zone0" / "temp")

    def probe(self) -> CollectorStatus:
        if not self.path.exists():
            return CollectorStatus(False, "no_thermal", f"no {self.path}: no thermal zone")
        return CollectorStatus(True, None, f"{self.path}")

    def status(self) -> CollectorStatus:
        return self.probe()

    def tick_s(self, cap_s: float) -> float | None:
        return None

    def read(self) -> float:
        return int(self.path.read_text()) / 1000.0


def _node(tmp_path: Path, temp_mc: int | None) -> tuple[Path, Path]:
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    procfs.mkdir(parents=True)
    (procfs / "stat").write_text("cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 10 0 10 80 0 0 0 0 0 0\n")
    (procfs / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Test CPU\n")
    zone = sysfs / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    if temp_mc is not None:
        (zone / "temp").write_text(f"{temp_mc}\n")
    return sysfs, procfs


@pytest.fixture
def one_more_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one line: ThermalZone appended to SOURCES."""
    monkeypatch.setattr(source_mod, "SOURCES", (*source_mod.SOURCES, ThermalZone))


def _config(tmp_path: Path, sysfs: Path, procfs: Path, thermal: str | None = None) -> Path:
    """A daemon config; thermal: its `collectors.thermal.enabled` (None: not set)."""
    text = daemon_config(
        tmp_path / "runs", {"t": "nothing"}, nvml="off", sysfs=sysfs, procfs=procfs
    )
    if thermal is not None:
        doc = yaml.safe_load(text)
        doc["collectors"]["thermal"] = {"enabled": thermal}
        text = yaml.safe_dump(doc, sort_keys=False)
    path = tmp_path / "serwatt.yaml"
    path.write_text(text)
    return path


def _side(tmp_path: Path, sysfs: Path, procfs: Path) -> EnergySide:
    return EnergySide(load_config(_config(tmp_path, sysfs, procfs)), SystemClock())


def test_a_new_source_is_probed_read_exported_and_recorded(
    tmp_path: Path, one_more_source: None
) -> None:
    sysfs, procfs = _node(tmp_path, 41_500)
    side = _side(tmp_path, sysfs, procfs)
    try:
        assert side.status["thermal"] == CollectorStatus(True, None, str(sysfs / "class" /
                                                         "thermal/thermal_zone0/temp"))  # fmt: skip
        # the tracker read it on its period (at start), as the source's role OTHER says
        assert side.tracker.readings["thermal"] == 41.5
        ledger = Ledger()
        side.declare(ledger)
        ledger.publish()
        m = parse_metrics(generate_latest(make_registry(ledger.snapshot)).decode())
        assert total(m, "serwatt_collector_up", collector="thermal") == 1
        # the run record's sources, written and read back
        with Recorder.for_dir(tmp_path / "runs") as rec:
            rec.start_run("r", "t", host={}, config={}, sources=side.sources())
        with Recorder.for_dir(tmp_path / "runs", readonly=True) as rec:
            (run,) = rec.runs()
            sources = rec.run(run.run_id).sources
        assert sources["collectors"]["thermal"] == {
            "up": True,
            "reason": None,
            "detail": str(sysfs / "class" / "thermal" / "thermal_zone0" / "temp"),
        }
    finally:
        side.close()


def test_a_new_sources_failed_reads_are_its_collector_health(
    tmp_path: Path, one_more_source: None
) -> None:
    """A read that fails sets its `serwatt_collector_up` to 0 with the error at the next
    slot, and the other sources are still read; a good read sets it back to 1."""
    sysfs, procfs = _node(tmp_path, 41_500)
    side = _side(tmp_path, sysfs, procfs)
    try:
        (thermal,) = (s for s in side.tracker.sources if s.name == "thermal")
        thermal.read_every_s = None  # every tick: the test need not wait for its period
        ledger = Ledger()
        side.declare(ledger)
        temp = sysfs / "class" / "thermal" / "thermal_zone0" / "temp"
        edges = [time.time()]  # after the tracker's first reading: slots are bracketed

        def slot_health() -> tuple[float, str]:
            time.sleep(0.05)
            n = 100 * len(edges)  # the node's CPU time moves, so the model has a reading
            (procfs / "stat").write_text(f"cpu  {n} 0 0 {n} 0 0 0 0 0 0\ncpu0 {n} 0 0 {n}\n")
            edges.append(time.time())
            assert side.slot(edges[-2], edges[-1], [], ledger) is not None
            ledger.publish()
            m = parse_metrics(generate_latest(make_registry(ledger.snapshot)).decode())
            state = ledger.snapshot().collectors["thermal"]
            assert total(m, "serwatt_collector_up", collector="thermal") == float(state.up)
            return total(m, "serwatt_collector_up", collector="cpu_model"), state.detail

        temp.write_text("not a number\n")
        model_up, detail = slot_health()
        assert ledger.snapshot().collectors["thermal"].up is False
        assert detail.startswith("read failed: invalid literal for int()") and model_up == 1
        temp.write_text("42000\n")
        slot_health()
        assert ledger.snapshot().collectors["thermal"].up is True
        assert side.tracker.readings["thermal"] == 42.0
    finally:
        side.close()


def test_a_new_sources_absent_reason_keeps_it_off_metrics(
    tmp_path: Path, one_more_source: None
) -> None:
    """Its own absent reason (not present here) is not exported, as RAPL's no_powercap
    is not; the record still says why it was not read."""
    sysfs, procfs = _node(tmp_path, None)
    side = _side(tmp_path, sysfs, procfs)
    try:
        assert side.status["thermal"].reason == "no_thermal"
        ledger = Ledger()
        side.declare(ledger)
        ledger.publish()
        m = parse_metrics(generate_latest(make_registry(ledger.snapshot)).decode())
        exported = {dict(lab)["collector"] for (n, lab), _ in m.items()
                    if n == "serwatt_collector_up"}  # fmt: skip
        assert "thermal" not in exported and "cpustat" in exported
        assert side.sources()["collectors"]["thermal"]["reason"] == "no_thermal"
        assert "thermal" not in side.tracker.readings
    finally:
        side.close()


def test_a_new_sources_config_mode(tmp_path: Path, one_more_source: None) -> None:
    """Its `mode_option` is honoured like rapl's and nvml's: off is not probed, required
    and down fails with the fix."""
    sysfs, procfs = _node(tmp_path, None)
    off = EnergyTracker(sysfs, procfs, nvml_mode="off", modes={"thermal": "off"}).probe()
    assert off["thermal"] == CollectorStatus(False, "off", "thermal zone disabled by configuration")
    with pytest.raises(
        EnergyUnavailableError,
        match=r"thermal zone is required but unavailable \(no_thermal\).*set thermal to auto "
        "to run without temperatures",
    ):
        EnergyTracker(sysfs, procfs, nvml_mode="off", modes={"thermal": "required"}).probe()


def test_a_new_sources_mode_is_a_daemon_config_key(tmp_path: Path, one_more_source: None) -> None:
    """Its `mode_option` is a `collectors:` key of the daemon config with rapl's and nvml's
    words, the config's off and required are the tracker's, check-config names it and a
    reload leaves it to the restart."""
    sysfs, procfs = _node(tmp_path, None)  # no thermal zone here
    config = load_config(_config(tmp_path, sysfs, procfs, thermal="off"))
    assert config.collector_modes == {"rapl": "auto", "nvml": "off", "thermal": "off"}
    side = EnergySide(config, SystemClock())
    try:
        assert side.status["thermal"] == CollectorStatus(
            False, "off", "thermal zone disabled by configuration"
        )
    finally:
        side.close()
    assert _bound_at_start(config)["thermal"] == "off"
    required = load_config(_config(tmp_path, sysfs, procfs, thermal=True))  # YAML's true
    assert required.collector_modes["thermal"] == "required"
    with pytest.raises(
        RequiredCollectorMissing,
        match=r"^collectors: thermal zone is required but unavailable \(no_thermal\).*set "
        "thermal to auto to run without temperatures$",
    ):
        EnergySide(required, SystemClock())
    assert load_config(_config(tmp_path, sysfs, procfs)).collector_modes["thermal"] == "auto"


def test_a_new_sources_mode_is_checked_like_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the SOURCES line its key is unknown (the check above can fail); with it, a
    wrong word is the config error rapl's is and check-config's summary names its mode."""
    sysfs, procfs = _node(tmp_path, None)
    path = _config(tmp_path, sysfs, procfs, thermal="auto")
    with pytest.raises(ConfigError, match=r"collectors\.thermal.*unknown key 'thermal'.*"
                       "allowed here: rapl, nvml, cpu_model"):  # fmt: skip
        load_config(path)
    monkeypatch.setattr(source_mod, "SOURCES", (*source_mod.SOURCES, ThermalZone))
    ran = serwatt(capsys, "check-config", str(path))
    assert ran.returncode == 0 and "rapl auto, nvml off, thermal auto, records in" in ran.stdout
    path.write_text(path.read_text().replace("enabled: auto", "enabled: sometimes"))
    with pytest.raises(ConfigError, match=r"collectors\.thermal\.enabled"):
        load_config(path)


def test_a_new_sources_mode_is_a_profile_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_more_source: None
) -> None:
    """`serwatt profile --thermal`: the config's words, its label and fallback in the help,
    and required on a node without it fails before any process starts."""
    sysfs, procfs = _node(tmp_path, None)
    help_text = " ".join(serwatt(capsys, "profile", "--help").stdout.split())
    assert "--thermal {auto,required,off} thermal zone: auto (when it is unavailable, run " \
        "without temperatures), required, off" in help_text  # fmt: skip
    args = build_parser(configure_all=True).parse_args(["profile", "--thermal", "false", "--", "x"])
    assert profile_options(args).modes == {"rapl": "auto", "nvml": "auto", "thermal": "off"}
    ran = serwatt(capsys, "profile", "--nvml", "off", "--thermal", "required",
                  "--path.sysfs", str(sysfs), "--", "true")  # fmt: skip
    assert ran.returncode == 2
    assert "thermal zone is required but unavailable (no_thermal)" in ran.stderr, ran.stderr
    assert "set thermal to auto to run without temperatures" in ran.stderr


# The modules that drive sources: they may use a collector's name only through the
# source (`src.name`), never as a literal they compare or look up. "rapl"/"model" as the
# energy *source label* of a reading (WindowEnergy.source, a record's energy_source) is
# data, compared only against a `...source` name.
DRIVERS = (
    "profiler/attribution/tracker.py",
    "profiler/service/energy_side.py",
    "profiler/service/collector_health.py",
    "profiler/profile/energy_sink.py",
    "profiler/records/sources.py",
)


def _name_branches(text: str, names: set[str]) -> list[str]:
    found = []

    def named(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and node.value in names:
            return [node.value]
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return [v for e in node.elts for v in named(e)]
        return []

    def is_source_label(node: ast.AST) -> bool:
        text = ast.unparse(node)
        return text.endswith(("source", "['source']"))

    for node in ast.walk(text if isinstance(text, ast.AST) else ast.parse(text)):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            found += [f"line {node.lineno}: [{n!r}]" for n in named(node.slice)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop") and node.args:
                found += [f"line {node.lineno}: .get({n!r})" for n in named(node.args[0])]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_source_label(s) for s in sides):
                continue
            found += [f"line {node.lineno}: compares {n!r}" for s in sides for n in named(s)]
    return sorted(found)


def test_no_driver_branches_on_a_collector_name() -> None:
    names = {s.name for s in source_mod.SOURCES} | {"cpu_model"}
    for rel in DRIVERS:
        assert _name_branches((REPO / rel).read_text(), names) == [], rel


def test_the_name_check_finds_name_branches() -> None:
    """The check above can fail: the old tracker's and energy side's lookups are found."""
    names = {"rapl", "nvml", "cpu_model"}
    old = (
        'if status["rapl"].up: pass\n'
        'm = self.status.get("cpu_model")\n'
        'if name == "nvml": pass\n'
        'if name in ("rapl", "x"): pass\n'
        'if we.source == "rapl": pass\n'
        'if e["source"] in ("rapl", "model"): pass\n'
        'part["rapl"] = 1\n'
    )
    assert _name_branches(old, names) == [
        "line 1: ['rapl']",
        "line 2: .get('cpu_model')",
        "line 3: compares 'nvml'",
        "line 4: compares 'rapl'",
    ]
