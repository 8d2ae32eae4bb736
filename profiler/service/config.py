"""The daemon's configuration: load, validate, and the `serwatt check-config FILE` subcommand.

A config is validated completely before anything starts: every problem (unknown key,
wrong type, bad regex, bad listen address, out-of-range number, unknown `run`
placeholder) is collected with its key path and the line it sits on, and all of them
are reported at once. The line numbers come from YAML's node marks, so the file is
composed into a node tree first and values are read from the nodes.

The documented shape, with every default, is `configs/serwatt.example.yaml`.
"""

from __future__ import annotations

import ipaddress
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from serwatt.collectors.source import with_mode
from serwatt.profiler.service.config_pyroscope import (
    PyroscopeConfig,
    check_pyroscope,
    check_pyroscope_labels,
)
from serwatt.profiler.yamlcheck import (
    INVALID,
    ConfigError,
    ConfigProblem,
    Regex,
    YamlChecker,
    check_yaml,
    node_kind,
    read_yaml_file,
)

# Placeholders a target's `run` template may use (rendered by profiler.service.discovery).
RUN_PLACEHOLDERS: tuple[str, ...] = ("unit", "start_time", "target", "pid", "host")
DEFAULT_RUN_TEMPLATE = "{target}-{start_time}-{pid}"
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")
# Target names become the `target` Prometheus label and part of run ids.
TARGET_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9-]{1,63})*$")
_UNIT_SUFFIXES = (".service", ".scope", ".slice", ".socket", ".mount", ".target", ".timer")

# `targets[].labels`: static labels on every per-target series. Bounded so that the config
# bounds the cardinality: each target has one fixed label set, so labels add no series,
# but their names and values are a fixed, small, checked vocabulary.
LABEL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # Prometheus' label-name syntax
MAX_TARGET_LABELS = 8
MAX_LABEL_NAME_LEN = 64
MAX_LABEL_VALUE_LEN = 128
# Names a config label may not take: serwatt's own labels (a clash would overwrite them),
# the ones Prometheus attaches at scrape time (`job`, `instance`: it would rename ours to
# exported_*), and the ones PromQL gives a meaning (`le`, `quantile`).
RESERVED_LABELS: frozenset[str] = frozenset(
    {"target", "codepath", "direction", "source", "gpu", "pid", "python", "kind", "collector",
     "part", "version", "cpu_source", "job", "instance", "le", "quantile"}
)  # fmt: skip


@dataclass(frozen=True)
class TargetMatch:
    """What a process must look like to be this target; every given criterion must hold."""

    # Regexes are RE2's (YamlChecker.regex): linear-time, whatever the pattern and text.
    cmdline: Regex | None = None  # searched in the space-joined command line
    exe: Regex | None = None  # searched in the resolved /proc/<pid>/exe path
    systemd_unit: str | None = None  # exact unit name, ".service" added when no suffix
    cgroup: Regex | None = None  # searched in each /proc/<pid>/cgroup path
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    pid_file: Path | None = None  # the pid written in this file

    def criteria(self) -> tuple[str, ...]:
        names = ("cmdline", "exe", "systemd_unit", "cgroup", "pid_file")
        given = [n for n in names if getattr(self, n) is not None]
        if self.environ:
            given.append("environ")
        return tuple(given)


@dataclass(frozen=True)
class TargetSpec:
    name: str
    match: TargetMatch
    run: str = DEFAULT_RUN_TEMPLATE
    # static labels on every per-target series (checked by _check_labels)
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # a directory the target writes its checkpoints to: watched (inotify) from when the
    # daemon opens the target's run until the run ends, so the record's checkpoints are
    # files written (profiler/attribution/checkpoint_watch.py); None: the heuristic
    checkpoints: Path | None = None
    checkpoint_glob: str | None = None  # names that count (fnmatch); None: the default rule


@dataclass(frozen=True)
class Config:
    listen: str = "127.0.0.1:9977"
    sample_rate_hz: float = 50.0
    window_s: float = 10.0
    rescan_s: float = 5.0
    max_concurrent_samplers: int = 8
    cpu_budget_cores: float | None = (
        None  # profiler/sampling/budget.py; None: always sample_rate_hz
    )
    # the stack-change run's rate at sample_rate_hz (scaled with the governed rate); 0: none
    timing_rate_hz: float = 0.0
    sampler_priority: str = "auto"  # 'auto' | 'required' | 'off' (collectors/sched.py)
    targets: tuple[TargetSpec, ...] = ()
    # each source's `mode_option` (collectors/source.py SOURCES) -> 'auto' | 'required' | 'off'
    collector_modes: Mapping[str, str] = field(default_factory=lambda: default_modes())
    cpu_tdp_w: float | None = None
    record_dir: Path = Path("/var/lib/serwatt/runs")
    retention_days: float = 30.0
    rules_files: tuple[Path, ...] = ()
    path_sysfs: Path = Path("/sys")
    path_procfs: Path = Path("/proc")
    log_level: str = "info"
    pyroscope: PyroscopeConfig | None = None  # None: no push
    source_path: Path = Path("<defaults>")
    raw: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def listen_host(self) -> str:
        return parse_listen(self.listen, any_port=True)[0]

    @property
    def listen_port(self) -> int:
        return parse_listen(self.listen, any_port=True)[1]


def mode_options() -> tuple[str, ...]:
    """The `collectors:` keys that set a source auto/required/off: every source's
    `mode_option` (collectors/source.py `with_mode`)."""
    return tuple(str(s.mode_option) for s in with_mode())


def default_modes() -> Mapping[str, str]:
    return MappingProxyType(dict.fromkeys(mode_options(), "auto"))


def parse_listen(listen: str, *, any_port: bool = False) -> tuple[str, int]:
    """'127.0.0.1:9977' -> ('127.0.0.1', 9977); '[::1]:9977' -> ('::1', 9977).

    The host is an IPv4 address, a bracketed IPv6 address or a host name; the port is
    1..65535. any_port: also accept port 0 (the kernel picks a free one; the daemon logs
    the port it bound), so tests start daemons side by side without racing for a port.
    ValueError says what is wrong with the address and how to write it.
    """
    if not isinstance(listen, str):
        raise ValueError("listen must be a string HOST:PORT")
    if listen.startswith("["):
        host, sep, port_s = listen[1:].partition("]:")
        if not sep:
            raise ValueError("an IPv6 listen address is written [ADDR]:PORT, e.g. '[::1]:9977'")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"listen host {host!r} is not an IPv6 address") from None
    else:
        host, sep, port_s = listen.rpartition(":")
        if not sep:
            raise ValueError("listen must be HOST:PORT, e.g. '127.0.0.1:9977' or '0.0.0.0:9977'")
        if ":" in host:
            raise ValueError("an IPv6 listen address is written [ADDR]:PORT, e.g. '[::1]:9977'")
        if not host:
            raise ValueError("the listen host is empty: use '0.0.0.0:PORT' for all interfaces")
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            if not _HOSTNAME_RE.match(host) or host.replace(".", "").isdigit():
                raise ValueError(
                    f"listen host {host!r} is neither an IPv4 address nor a host name"
                ) from None
    if not port_s.isdigit():
        raise ValueError(f"listen port {port_s!r} is not a number")
    port = int(port_s)
    low = 0 if any_port else 1
    if not low <= port <= 65535:
        raise ValueError(f"listen port {port} is outside {low}..65535")
    return host, port


def _check_run_template(c: YamlChecker, path: str, node: yaml.Node) -> Any:
    template = c.string(path, node)
    if template is INVALID:
        return template
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        c.problem(path, node, f"bad template {template!r}: {exc} (write a literal brace as {{{{)")
        return INVALID
    fields = [f for _, f, _, _ in parts if f is not None]
    bad = [f for f in fields if f not in RUN_PLACEHOLDERS]
    if bad:
        c.problem(
            path,
            node,
            f"unknown placeholder(s) {', '.join('{' + b + '}' for b in bad)} in {template!r}; "
            f"known: {', '.join('{' + p + '}' for p in RUN_PLACEHOLDERS)}",
        )
        return INVALID
    if any(spec or conv for _, f, spec, conv in parts if f is not None):
        c.problem(path, node, "placeholders take no format spec or conversion, e.g. {pid}")
        return INVALID
    if not fields:
        c.problem(
            path,
            node,
            f"{template!r} has no placeholder, so every run of this target would share "
            "one id; add e.g. {start_time}",
        )
        return INVALID
    return template


def _check_labels(c: YamlChecker, path: str, node: yaml.Node) -> Any:
    """`targets[i].labels`: {name: value}, each checked against Prometheus' syntax and
    serwatt's bounds; every problem is reported with its key and line."""
    keys = c.mapping(path, node, None)
    if keys is None:
        return INVALID
    key_nodes = {
        c.value(k): k for k, _v in getattr(node, "value", ()) if isinstance(k, yaml.ScalarNode)
    }
    out: dict[str, str] = {}
    bad = False
    if len(keys) > MAX_TARGET_LABELS:
        c.problem(
            path,
            node,
            f"{len(keys)} labels, more than {MAX_TARGET_LABELS}: keep the few that select "
            "series (variant, job_name, ...); put the rest in the run template or a "
            "Prometheus relabel rule",
        )
        bad = True
    for name, vnode in keys.items():
        kpath = f"{path}.{name}"
        knode = key_nodes.get(name, vnode)
        if len(name) > MAX_LABEL_NAME_LEN or not LABEL_NAME_RE.match(name):
            c.problem(
                kpath,
                knode,
                f"{name[:80]!r} is not a Prometheus label name: use letters, digits and '_', "
                f"not starting with a digit, at most {MAX_LABEL_NAME_LEN} characters",
            )
            bad = True
            continue
        if name.startswith("__"):
            c.problem(kpath, knode, f"{name!r}: names starting with '__' are Prometheus' own")
            bad = True
            continue
        if name in RESERVED_LABELS:
            c.problem(
                kpath,
                knode,
                f"{name!r} is a label serwatt or Prometheus sets itself; reserved: "
                f"{', '.join(sorted(RESERVED_LABELS))}. Pick another name, e.g. 'variant'",
            )
            bad = True
            continue
        value = c.value(vnode) if isinstance(vnode, yaml.ScalarNode) else None
        if not isinstance(value, str):
            c.problem(
                kpath, vnode, f"must be a string, got {node_kind(vnode, c)} (quote it, e.g. '2')"
            )
            bad = True
            continue
        if not value or len(value) > MAX_LABEL_VALUE_LEN or not value.isprintable():
            c.problem(
                kpath,
                vnode,
                f"the value must be 1-{MAX_LABEL_VALUE_LEN} printable characters "
                f"(an empty value is the same as no label to Prometheus), got {value[:80]!r}",
            )
            bad = True
            continue
        out[name] = value
    return INVALID if bad else MappingProxyType(dict(sorted(out.items())))


_Keys = dict[str, yaml.Node]  # a mapping's keys -> their value nodes (YamlChecker.mapping)


def _check_target_name(c: YamlChecker, path: str, node: yaml.Node, keys: _Keys) -> Any:
    if "name" not in keys:
        c.problem(f"{path}.name", node, "missing: every target needs a name (the `target` label)")
        return INVALID
    name = c.string(f"{path}.name", keys["name"])
    if name is not INVALID and not TARGET_NAME_RE.match(name):
        c.problem(
            f"{path}.name",
            keys["name"],
            f"{name!r} is not a valid target name: use 1-64 letters, digits, '_', '.', '-'",
        )
        return INVALID
    return name


def _check_checkpoint_glob(c: YamlChecker, path: str, node: yaml.Node, checkpoints: Any) -> Any:
    glob = c.string(f"{path}.checkpoint_glob", node, nullable=True)
    if isinstance(glob, str) and (not glob or "/" in glob or "\0" in glob):
        c.problem(
            f"{path}.checkpoint_glob",
            node,
            f"{glob!r} is not a file-name pattern: give one without '/', e.g. '*.pt'",
        )
        return INVALID
    if glob is not None and checkpoints is None:
        c.problem(
            f"{path}.checkpoint_glob",
            node,
            "without checkpoints: name the directory the pattern applies in",
        )
        return INVALID
    return glob


def _check_environ(c: YamlChecker, mpath: str, node: yaml.Node) -> MappingProxyType:
    ekeys = c.mapping(f"{mpath}.environ", node, None)
    env: dict[str, str] = {}
    for k, vnode in (ekeys or {}).items():
        v = c.value(vnode) if isinstance(vnode, yaml.ScalarNode) else INVALID
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            c.problem(
                f"{mpath}.environ.{k}",
                vnode,
                f"must be a string (the exact value), got {node_kind(vnode, c)}",
            )
            continue
        env[k] = str(v)
    return MappingProxyType(env)


def _check_match(c: YamlChecker, mpath: str, node: yaml.Node) -> dict[str, Any] | None:
    """TargetMatch's fields; None when the match is not a mapping or names no criterion."""
    mkeys = c.mapping(
        mpath, node, ("cmdline", "exe", "systemd_unit", "cgroup", "environ", "pid_file")
    )
    if mkeys is None:
        return None
    values: dict[str, Any] = {}
    for key in ("cmdline", "exe", "cgroup"):
        if key in mkeys:
            values[key] = c.regex(f"{mpath}.{key}", mkeys[key])
    if "systemd_unit" in mkeys:
        unit = c.string(f"{mpath}.systemd_unit", mkeys["systemd_unit"], nullable=True)
        if isinstance(unit, str) and not unit.endswith(_UNIT_SUFFIXES):
            unit += ".service"
        values["systemd_unit"] = unit
    if "pid_file" in mkeys:
        values["pid_file"] = c.path_value(f"{mpath}.pid_file", mkeys["pid_file"], nullable=True)
    if "environ" in mkeys:
        values["environ"] = _check_environ(c, mpath, mkeys["environ"])
    if not any(v is not None and v != {} for v in values.values()):
        c.problem(
            mpath,
            node,
            "needs at least one criterion (cmdline, exe, systemd_unit, cgroup, environ, "
            "pid_file); an empty match would profile every Python process on the node",
        )
        return None
    return values


def _check_target(c: YamlChecker, path: str, node: yaml.Node) -> TargetSpec | None:
    keys = c.mapping(
        path, node, ("name", "match", "run", "labels", "checkpoints", "checkpoint_glob")
    )
    if keys is None:
        return None
    name = _check_target_name(c, path, node, keys)
    run = DEFAULT_RUN_TEMPLATE
    if "run" in keys:
        run = _check_run_template(c, f"{path}.run", keys["run"])
    labels: Any = MappingProxyType({})
    if "labels" in keys:
        labels = _check_labels(c, f"{path}.labels", keys["labels"])
    checkpoints: Any = None
    if "checkpoints" in keys:
        checkpoints = c.path_value(f"{path}.checkpoints", keys["checkpoints"], nullable=True)
    glob: Any = None
    if "checkpoint_glob" in keys:
        glob = _check_checkpoint_glob(c, path, keys["checkpoint_glob"], checkpoints)
    if "match" not in keys:
        c.problem(
            f"{path}.match",
            node,
            "missing: say which processes this target is, e.g. match: {cmdline: 'train\\.py'}",
        )
        return None
    values = _check_match(c, f"{path}.match", keys["match"])
    if values is None:
        return None
    if any(v is INVALID for v in (*values.values(), name, run, labels, checkpoints, glob)):
        return None
    return TargetSpec(
        name=name,
        match=TargetMatch(**values),
        run=run,
        labels=labels,
        checkpoints=checkpoints,
        checkpoint_glob=glob,
    )


_TOP_KEYS = (
    "listen",
    "sample_rate_hz",
    "window_s",
    "rescan_s",
    "max_concurrent_samplers",
    "cpu_budget_cores",
    "timing_rate_hz",
    "sampler_priority",
    "log_level",
    "targets",
    "collectors",
    "record",
    "classify",
    "paths",
    "pyroscope",
)
# The same words as the CLI's source flags (--rapl, --nvml...) and --sampler-priority;
# YAML's true/false (and on/off, yes/no, which YAML reads as booleans) mean required/off.
_ENABLED = {"auto": "auto", "required": "required", "off": "off", True: "required", False: "off"}


def _check_listen(c: YamlChecker, node: yaml.Node) -> dict[str, Any]:
    listen = c.string("listen", node)
    if listen is not INVALID:
        try:
            parse_listen(listen, any_port=True)
        except ValueError as exc:
            c.problem("listen", node, f"bad listen address {listen!r}: {exc}")
            listen = INVALID
    return {"listen": listen}


def _check_targets(c: YamlChecker, node: yaml.Node) -> dict[str, Any]:
    targets: list[TargetSpec] = []
    if not isinstance(node, yaml.SequenceNode):
        c.problem("targets", node, f"must be a list of targets, got {node_kind(node, c)}")
        return {"targets": ()}
    seen: dict[str, int] = {}
    for i, item in enumerate(node.value):
        spec = _check_target(c, f"targets[{i}]", item)
        if spec is None:
            continue
        if spec.name in seen:
            c.problem(
                f"targets[{i}].name",
                item,
                f"target name {spec.name!r} is already used by targets[{seen[spec.name]}]",
            )
            continue
        seen[spec.name] = i
        targets.append(spec)
    return {"targets": tuple(targets)}


def _check_collectors(c: YamlChecker, node: yaml.Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    options = mode_options()
    ckeys = c.mapping("collectors", node, (*options, "cpu_model"))
    modes = dict(default_modes())
    for name in options:
        if ckeys and name in ckeys:
            sub = c.mapping(f"collectors.{name}", ckeys[name], ("enabled",))
            if sub and "enabled" in sub:
                modes[name] = c.choice(f"collectors.{name}.enabled", sub["enabled"], _ENABLED)
    out["collector_modes"] = MappingProxyType(modes)
    if ckeys and "cpu_model" in ckeys:
        sub = c.mapping("collectors.cpu_model", ckeys["cpu_model"], ("tdp_w",))
        if sub and "tdp_w" in sub:
            out["cpu_tdp_w"] = c.number(
                "collectors.cpu_model.tdp_w",
                sub["tdp_w"],
                minimum=0,
                exclusive_minimum=True,
                maximum=5000,
                nullable=True,
            )
    return out


def _check_record(c: YamlChecker, node: yaml.Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rkeys = c.mapping("record", node, ("dir", "retention_days"))
    if rkeys and "dir" in rkeys:
        out["record_dir"] = c.path_value("record.dir", rkeys["dir"])
    if rkeys and "retention_days" in rkeys:
        out["retention_days"] = c.number(
            "record.retention_days", rkeys["retention_days"], minimum=0, exclusive_minimum=True
        )
    return out


def _check_classify(c: YamlChecker, node: yaml.Node) -> dict[str, Any]:
    ckeys = c.mapping("classify", node, ("rules_files",))
    if not ckeys or "rules_files" not in ckeys:
        return {}
    node = ckeys["rules_files"]
    if not isinstance(node, yaml.SequenceNode):
        if not (isinstance(node, yaml.ScalarNode) and c.value(node) is None):
            c.problem(
                "classify.rules_files", node, f"must be a list of paths, got {node_kind(node, c)}"
            )
        return {}
    files: list[Path] = []
    for i, item in enumerate(node.value):
        p = c.path_value(f"classify.rules_files[{i}]", item)
        if p is INVALID:
            continue
        if not p.is_file():
            c.problem(
                f"classify.rules_files[{i}]",
                item,
                f"no such rules file: {p} (relative paths are relative to the config file)",
            )
            continue
        files.append(p)
    return {"rules_files": tuple(files)}


def _check_paths(c: YamlChecker, node: yaml.Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pkeys = c.mapping("paths", node, ("sysfs", "procfs"))
    for name in ("sysfs", "procfs"):
        if pkeys and name in pkeys:
            fs_root = c.path_value(f"paths.{name}", pkeys[name])
            # A procfs has /stat (btime, which run start times need); a sysfs has
            # /class (powercap lives there). A typo fails here, not at the first scan.
            probe = "stat" if name == "procfs" else "class"
            if fs_root is not INVALID and not (fs_root / probe).exists():
                c.problem(
                    f"paths.{name}",
                    pkeys[name],
                    f"{fs_root} does not look like a {name} ({fs_root / probe} is missing)",
                )
                fs_root = INVALID
            out[f"path_{name}"] = fs_root
    return out


# the top-level keys that are sections of their own, each checked by its function
_SECTIONS: dict[str, Callable[[YamlChecker, yaml.Node], dict[str, Any]]] = {
    "listen": _check_listen,
    "targets": _check_targets,
    "collectors": _check_collectors,
    "record": _check_record,
    "classify": _check_classify,
    "paths": _check_paths,
    "pyroscope": check_pyroscope,
}


def _check_document(c: YamlChecker, root: yaml.Node | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if root is None:
        c.problem("", None, "the file is empty; start from configs/serwatt.example.yaml")
        return out
    keys = c.mapping("", root, _TOP_KEYS)
    if keys is None:
        return out
    simple: dict[str, Callable[[str, yaml.Node], Any]] = {
        "sample_rate_hz": lambda p, n: c.number(
            p, n, minimum=0, exclusive_minimum=True, maximum=1000
        ),
        "window_s": lambda p, n: c.number(p, n, minimum=1, maximum=3600),
        "rescan_s": lambda p, n: c.number(p, n, minimum=0.1, maximum=3600),
        "max_concurrent_samplers": lambda p, n: c.number(
            p, n, integer=True, minimum=1, maximum=1024
        ),
        "cpu_budget_cores": lambda p, n: c.number(
            p, n, minimum=0, exclusive_minimum=True, maximum=1024, nullable=True
        ),
        # py-spy takes whole samples per second: 0 (no stack-change run) or 1..1000
        "timing_rate_hz": lambda p, n: c.number(p, n, integer=True, minimum=0, maximum=1000),
        "log_level": lambda p, n: c.choice(p, n, {lv: lv for lv in LOG_LEVELS}),
        "sampler_priority": lambda p, n: c.choice(p, n, _ENABLED),
    }
    for key, check in simple.items():
        if key in keys:
            out[key] = check(key, keys[key])
    for key, section in _SECTIONS.items():
        if key in keys:
            out |= section(c, keys[key])
    if isinstance(out.get("pyroscope"), PyroscopeConfig):
        check_pyroscope_labels(c, out.get("targets", ()))
    return out


def parse_config(text: str, source_path: Path) -> Config:
    """Validate YAML text; raises ConfigError listing every problem."""
    values, raw, root = check_yaml(text, source_path, _check_document)
    if not values.get("targets"):
        line = root.start_mark.line + 1 if root is not None else None
        raise ConfigError(
            source_path,
            [ConfigProblem("targets", line, "no targets: add at least one under `targets:`")],
        )
    return Config(
        **values,
        source_path=source_path,
        raw=MappingProxyType(dict(raw or {})),
    )


def load_config(path: Path) -> Config:
    """Read and validate a config file; raises ConfigError (with every problem) if unusable.

    The file must be a regular file of at most MAX_YAML_BYTES (check-config, daemon
    start and SIGHUP reload all read it here)."""
    path = Path(path)
    text = read_yaml_file(path, missing_hint="see configs/serwatt.example.yaml")
    return parse_config(text, path.absolute())
