"""The session's classified stacks as a pprof profile (gzip'd profile.proto), for
`go tool pprof`, Pyroscope, Parca and the other backends that read it.

profile.proto (github.com/google/pprof/proto/profile.proto) is built here as a
descriptor and turned into message classes by the protobuf runtime, already a
dependency: no protoc step, no generated module to keep in step with the runtime's
version. Only the fields serwatt fills are declared; their numbers and types are the
upstream file's, so any pprof reader parses the result.

Sample types (values are int64, so units are scaled): samples/count, cpu/nanoseconds,
energy/microjoules, gpu_wait/nanoseconds; the default is cpu. Each sample carries the
labels `codepath` and `direction`. Frames are Python functions with their file and
line: one Function per (name, file), one Location per (function, line)."""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from serwatt.profiler.profile.stack_profile import StackFigures, StackProfile
from serwatt.profiler.sampling.stacks import FrameKey, StackKey

_F = descriptor_pb2.FieldDescriptorProto
_INT64, _UINT64, _STRING, _BOOL, _MSG = (
    _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_MESSAGE,
)  # fmt: skip
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_PACKAGE = "perftools.profiles"

# message -> (field name, number, type, label, message type) as in upstream profile.proto
_SCHEMA: dict[str, list[tuple[str, int, int, int, str | None]]] = {
    "Profile": [
        ("sample_type", 1, _MSG, _MANY, "ValueType"),
        ("sample", 2, _MSG, _MANY, "Sample"),
        ("location", 4, _MSG, _MANY, "Location"),
        ("function", 5, _MSG, _MANY, "Function"),
        ("string_table", 6, _STRING, _MANY, None),
        ("time_nanos", 9, _INT64, _ONE, None),
        ("duration_nanos", 10, _INT64, _ONE, None),
        ("period_type", 11, _MSG, _ONE, "ValueType"),
        ("period", 12, _INT64, _ONE, None),
        ("comment", 13, _INT64, _MANY, None),
        ("default_sample_type", 14, _INT64, _ONE, None),
    ],
    "ValueType": [("type", 1, _INT64, _ONE, None), ("unit", 2, _INT64, _ONE, None)],
    "Sample": [
        ("location_id", 1, _UINT64, _MANY, None),
        ("value", 2, _INT64, _MANY, None),
        ("label", 3, _MSG, _MANY, "Label"),
    ],
    "Label": [
        ("key", 1, _INT64, _ONE, None),
        ("str", 2, _INT64, _ONE, None),
        ("num", 3, _INT64, _ONE, None),
    ],
    "Location": [
        ("id", 1, _UINT64, _ONE, None),
        ("mapping_id", 2, _UINT64, _ONE, None),
        ("line", 4, _MSG, _MANY, "Line"),
    ],
    "Line": [("function_id", 1, _UINT64, _ONE, None), ("line", 2, _INT64, _ONE, None)],
    "Function": [
        ("id", 1, _UINT64, _ONE, None),
        ("name", 2, _INT64, _ONE, None),
        ("system_name", 3, _INT64, _ONE, None),
        ("filename", 4, _INT64, _ONE, None),
    ],
}


def _profile_class() -> Any:
    fd = descriptor_pb2.FileDescriptorProto(
        name="serwatt/pprof_profile.proto", package=_PACKAGE, syntax="proto3"
    )
    for msg_name, fields in _SCHEMA.items():
        msg = fd.message_type.add(name=msg_name)
        for name, number, ftype, label, type_name in fields:
            f = msg.field.add(name=name, number=number, type=ftype, label=label)
            if type_name is not None:
                f.type_name = f".{_PACKAGE}.{type_name}"
    # a pool of its own: the process's default pool may hold another perftools.profiles
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.Profile"))


Profile = _profile_class()

# (type, unit, the figure's scale to int64)
SAMPLE_TYPES: tuple[tuple[str, str, str, float], ...] = (
    ("samples", "count", "samples", 1.0),
    ("cpu", "nanoseconds", "cpu_s", 1e9),
    ("energy", "microjoules", "energy_j", 1e6),
    ("gpu_wait", "nanoseconds", "gpu_wait_s", 1e9),
)
DEFAULT_SAMPLE_TYPE = "cpu"


class _Strings:
    def __init__(self) -> None:
        self.table: list[str] = [""]  # index 0 is "" (profile.proto)
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def build_profile(
    stacks: Iterable[tuple[StackKey, StackFigures]],
    *,
    started_at: float,
    duration_s: float,
    rate_hz: float,
    comments: Iterable[str] = (),
) -> Any:
    """The Profile message of `stacks` (a StackProfile's items)."""
    prof = Profile()
    s = _Strings()
    for type_, unit, _, _ in SAMPLE_TYPES:
        prof.sample_type.add(type=s(type_), unit=s(unit))
    prof.default_sample_type = s(DEFAULT_SAMPLE_TYPE)
    prof.period_type.type, prof.period_type.unit = s("cpu"), s("nanoseconds")
    prof.period = int(1e9 / rate_hz) if rate_hz > 0 else 0
    prof.time_nanos = int(started_at * 1e9)
    prof.duration_nanos = int(duration_s * 1e9)
    functions: dict[tuple[str, str], int] = {}
    locations: dict[FrameKey, int] = {}

    def location(frame: FrameKey) -> int:
        loc = locations.get(frame)
        if loc is None:
            name, filename, line = frame
            fn = functions.get((name, filename))
            if fn is None:
                fn = functions[name, filename] = len(functions) + 1
                prof.function.add(id=fn, name=s(name), system_name=s(name), filename=s(filename))
            loc = locations[frame] = len(locations) + 1
            prof.location.add(id=loc).line.add(function_id=fn, line=line)
        return loc

    codepath_key, direction_key = s("codepath"), s("direction")
    for (frames, codepath, direction), fig in stacks:
        sample = prof.sample.add()
        sample.location_id.extend(location(f) for f in frames)  # leaf first, as pprof's
        sample.value.extend(round(getattr(fig, attr) * scale) for _, _, attr, scale in SAMPLE_TYPES)
        sample.label.add(key=codepath_key, str=s(codepath))
        sample.label.add(key=direction_key, str=s(direction))
    for text in comments:
        prof.comment.append(s(text))
    prof.string_table.extend(s.table)
    return prof


def pprof_bytes(
    profile: StackProfile, *, started_at: float, duration_s: float, rate_hz: float
) -> bytes:
    """The gzip'd profile.proto of a session's stacks, as `go tool pprof` reads it."""
    comments = ["serwatt: CPU, energy and GPU-wait by serialization codepath"]
    if profile.merged:
        comments.append(f"{profile.merged} distinct stacks past the cap of {profile.cap} merged")
    if not profile.has_energy:
        comments.append("energy: not measured in this run (values 0)")
    if not profile.has_gpu_wait:
        comments.append("gpu_wait: no GPU data in this run (values 0)")
    msg = build_profile(
        profile, started_at=started_at, duration_s=duration_s, rate_hz=rate_hz, comments=comments
    )
    # mtime 0: the same profile gives the same bytes
    return gzip.compress(msg.SerializeToString(), mtime=0)
