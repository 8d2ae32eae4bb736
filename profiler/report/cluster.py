"""The cluster file (`--cluster FILE.yaml`): the projection's assumptions.

Every input is either measured (and names the runs it came from) or assumed (printed
with its source and a range). The cluster file (`--cluster FILE.yaml`) sets the
assumptions; every key is optional and falls back to the default below:

    gpus: 16384            # GPUs in the job
    gpus_per_node: 8       # GPUs per node (one node's host energy per checkpoint scales by nodes)
    mtbf_h: 3.093          # job-level mean time between failures, hours
    restart_s: 600         # failure -> job running again, reading the checkpoint included
    gpu_power_w: 700       # watts per GPU while the job runs
    pue: [1.1, 1.58]       # facility / IT energy: a value or [low, high]
    wue_l_per_kwh: [0.30, 1.8]  # site water per IT kWh: a value or [low, high]
    state_bytes_per_gpu: 346069336  # checkpoint bytes each GPU's rank writes
    storage_write_gb_s: 2000     # the storage's write bandwidth, cluster-wide, GB/s
    machine_stall_factor: 1      # cluster machine's stall per byte / the measured node's
    policy: daly           # or {interval_s: 1800} or {interval_steps: 500, step_s: 3.6}

Unknown keys and bad values are errors naming the key and its line (the daemon config's
checker, profiler.config.check_yaml).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from serwatt.profiler.yamlcheck import INVALID, check_yaml, read_yaml_file


@dataclass(frozen=True)
class ClusterInput:
    """One assumption: the value used (None for inputs used as a range: pue, wue), the
    range shown (and used, for pue and wue), its unit and where it came from."""

    value: float | None
    low: float
    high: float
    unit: str
    source: str

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "range": [self.low, self.high],
            "unit": self.unit,
            "source": self.source,
            "kind": "assumed",
        }

    @property
    def central(self) -> float:
        """The value, or a range's midpoint (the central figure of a ranged input)."""
        return self.value if self.value is not None else 0.5 * (self.low + self.high)


@dataclass(frozen=True)
class Policy:
    """How often the job checkpoints: Daly's optimum, or a fixed compute interval."""

    kind: str = "daly"  # "daly" | "fixed"
    interval_s: float | None = None
    text: str = "daly"


# name -> (default value or (low, high) when used as a range, shown range, unit, source)
DEFAULTS: Mapping[str, tuple[float | tuple[float, float], tuple[float, float], str, str]] = (
    MappingProxyType(
        {
            "gpus": (
                16384,
                (16384, 16384),
                "GPUs",
                "assumed default: the Llama 3 405B training job, 16,384 H100 (arXiv 2407.21783)",
            ),
            "gpus_per_node": (
                8,
                (8, 8),
                "GPUs/node",
                "assumed default: 8 GPUs per server in the Llama 3 cluster (arXiv 2407.21783)",
            ),
            "mtbf_h": (
                3.093,
                (1.547, 6.186),
                "h",
                "assumed default: Llama 3 405B, 419 unexpected interruptions in 54 days "
                "(arXiv 2407.21783 §3.3.4) = 3.093 h job-level",
            ),
            "restart_s": (
                600.0,
                (600.0, 1200.0),
                "s",
                "assumed default: Gemini (SOSP'23) reports 10-20 min to retrieve a remote "
                "checkpoint and resume (the read included)",
            ),
            "gpu_power_w": (
                700.0,
                (350.0, 700.0),
                "W",
                "assumed default: H100 SXM TDP 700 W (Llama 3 paper); H100 PCIe 350 W "
                "(NVIDIA PB-11133-001)",
            ),
            "pue": (
                (1.1, 1.58),
                (1.1, 1.58),
                "",
                "assumed default: hyperscalers 1.1-1.2 to the Uptime Institute 2023 "
                "industry average 1.58",
            ),
            "wue_l_per_kwh": (
                (0.30, 1.8),
                (0.30, 1.8),
                "L/kWh",
                "assumed default: Microsoft 0.30 L/kWh to LBNL 2016's 1.8 L/kWh on-site "
                "average (The Green Grid WUE: site water per IT kWh)",
            ),
            "state_bytes_per_gpu": (
                405e9 * 14 / 16384,
                (405e9 * 12 / 16384, 405e9 * 16 / 16384),
                "B",
                "assumed default: Llama 3 405B's 405e9 parameters (arXiv 2407.21783) x 14 B "
                "each (bf16 weights 2, fp32 master weights 4, Adam moments 8), / 16,384 "
                "GPUs; range 12-16 B per parameter (without bf16 weights; with fp32 "
                "gradients, ZeRO's 16, arXiv 1910.02054)",
            ),
            "storage_write_gb_s": (
                2000.0,
                (2000.0, 7000.0),
                "GB/s",
                "assumed default: Llama 3's Tectonic storage, 2 TB/s sustained to 7 TB/s "
                "peak (arXiv 2407.21783 §3.3.1), cluster-wide",
            ),
            "machine_stall_factor": (
                1.0,
                (0.5, 2.0),
                "x",
                "assumed default: the measured node's stall per byte holds on the cluster's "
                "machines (no measurement fixes a scaling from one machine class to "
                "another); range a factor of 2 either way",
            ),
        }
    )
)
RANGED = ("pue", "wue_l_per_kwh")
_KEYS = (*DEFAULTS, "policy")
# (minimum, exclusive, maximum, integer) per key: values outside are refused
_BOUNDS: Mapping[str, tuple[float, bool, float, bool]] = MappingProxyType(
    {
        "gpus": (1, False, 10_000_000, True),
        "gpus_per_node": (1, False, 1024, True),
        "mtbf_h": (0, True, 1_000_000, False),
        "restart_s": (0, False, 31_536_000, False),
        "gpu_power_w": (0, True, 10_000, False),
        "pue": (1, False, 10, False),
        "wue_l_per_kwh": (0, False, 100, False),
        "state_bytes_per_gpu": (0, True, 1e15, False),
        "storage_write_gb_s": (0, True, 1e9, False),
        "machine_stall_factor": (0, True, 1000, False),
    }
)


@dataclass(frozen=True)
class ClusterConfig:
    """The projection's assumptions (see the module docstring); `path` is the file read,
    None for the defaults."""

    inputs: Mapping[str, ClusterInput]
    policy: Policy = field(default_factory=Policy)
    path: str | None = None

    def value(self, name: str) -> float:
        v = self.inputs[name].value
        if v is None:
            raise ValueError(f"{name} is a range")
        return v


def _default_input(name: str) -> ClusterInput:
    value, (low, high), unit, source = DEFAULTS[name]
    if isinstance(value, tuple):
        return ClusterInput(None, value[0], value[1], unit, source)
    return ClusterInput(float(value), float(low), float(high), unit, source)


def default_cluster() -> ClusterConfig:
    """Every assumption at its documented default."""
    return ClusterConfig(MappingProxyType({n: _default_input(n) for n in DEFAULTS}))


def _check_cluster(c: Any, root: yaml.Node | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if root is None:
        return out  # an empty file: every default
    keys = c.mapping("", root, _KEYS)
    if keys is None:
        return out
    for name, node in keys.items():
        line = node.start_mark.line + 1
        where = f"{c.base_name}:{line}"
        if name == "policy":
            out[name] = _check_policy(c, node)
            continue
        unit, source = DEFAULTS[name][2], f"assumed (given in {where})"
        if name in RANGED and isinstance(node, yaml.SequenceNode):
            if len(node.value) != 2:
                c.problem(name, node, "a range is [low, high]: two numbers")
                continue
            low = _bounded(c, name, f"{name}[0]", node.value[0])
            high = _bounded(c, name, f"{name}[1]", node.value[1])
            if low is INVALID or high is INVALID:
                continue
            if low > high:
                c.problem(name, node, f"the range's low {low:g} is above its high {high:g}")
                continue
            out[name] = ClusterInput(None, low, high, unit, source)
            continue
        value = _bounded(c, name, name, node)
        if value is INVALID:
            continue
        out[name] = ClusterInput(float(value), float(value), float(value), unit, source)
    per_node, gpus = out.get("gpus_per_node"), out.get("gpus")
    if per_node is not None and gpus is not None and per_node.value > gpus.value:
        c.problem("gpus_per_node", keys["gpus_per_node"], "is more than gpus")
    return out


def _bounded(c: Any, name: str, path: str, node: yaml.Node) -> Any:
    minimum, exclusive, maximum, integer = _BOUNDS[name]
    return c.number(
        path, node, integer=integer, minimum=minimum, exclusive_minimum=exclusive, maximum=maximum
    )


def _check_policy(c: Any, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        if c.value(node) == "daly":
            return Policy("daly")
        c.problem(
            "policy",
            node,
            "must be daly, {interval_s: SECONDS} or {interval_steps: N, step_s: SECONDS}",
        )
        return INVALID
    keys = c.mapping("policy", node, ("interval_s", "interval_steps", "step_s"))
    if keys is None:
        return INVALID
    if set(keys) == {"interval_s"}:
        s = c.number("policy.interval_s", keys["interval_s"], minimum=0, exclusive_minimum=True)
        return INVALID if s is INVALID else Policy("fixed", s, f"fixed: every {s:g} s")
    if set(keys) == {"interval_steps", "step_s"}:
        steps = c.number("policy.interval_steps", keys["interval_steps"], integer=True, minimum=1)
        step_s = c.number("policy.step_s", keys["step_s"], minimum=0, exclusive_minimum=True)
        if steps is INVALID or step_s is INVALID:
            return INVALID
        return Policy("fixed", steps * step_s, f"fixed: every {steps} steps of {step_s:g} s")
    c.problem(
        "policy",
        node,
        "give either interval_s, or interval_steps together with step_s",
    )
    return INVALID


def parse_cluster(text: str, path: Path) -> ClusterConfig:
    """Validate cluster YAML text; raises profiler.config.ConfigError listing every problem."""

    def check(c: Any, root: yaml.Node | None) -> dict[str, Any]:
        c.base_name = path.name
        return _check_cluster(c, root)

    values, _raw, _root = check_yaml(text, path, check)
    inputs = {n: values.get(n) or _default_input(n) for n in DEFAULTS}
    return ClusterConfig(
        MappingProxyType(inputs), values.get("policy") or Policy("daly"), str(path)
    )


def load_cluster(path: Path | str) -> ClusterConfig:
    """Read and validate a cluster file (a regular file of at most MAX_YAML_BYTES);
    raises ConfigError naming each key and line."""
    path = Path(path)
    text = read_yaml_file(path, missing_hint="see docs/report.md for the keys")
    return parse_cluster(text, path.absolute())


def projection_cluster(path: Path | str | None, project: bool) -> ClusterConfig | None:
    """The cluster to project onto, or None: the projection is an estimate, made only when
    asked for (`--cluster FILE` or `--project` for the defaults)."""
    if path is not None:
        return load_cluster(path)
    return default_cluster() if project else None
