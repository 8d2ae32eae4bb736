"""The daemon config's `pyroscope:` section (the push of each target's profile,
profiler/service/pyroscope_push.py): its values (`PyroscopeConfig`) and their checks, each
problem named by its key with the fix."""

from __future__ import annotations

import re
import string
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from serwatt.profiler.deadline_http import WEB_SCHEMES
from serwatt.profiler.safeio import InputFileError, read_bounded
from serwatt.profiler.yamlcheck import INVALID, YamlChecker

if TYPE_CHECKING:
    from serwatt.profiler.service.config import TargetSpec

# `pyroscope.app_name`: placeholders and what the rendered name may hold (Pyroscope's
# application names; a dot would read as its profile-type suffix)
PYROSCOPE_APP_PLACEHOLDERS: tuple[str, ...] = ("target", "host")
DEFAULT_PYROSCOPE_APP = "serwatt-{target}"
_PYROSCOPE_APP_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
# a value inside Pyroscope's `name=APP{k=v,...}`: nothing that ends a value or the set
PYROSCOPE_LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:/@+-]{1,128}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9!._*'()-]{1,150}$")  # Pyroscope's tenant ID syntax
# a credentials file holds one line; anything larger is not one
MAX_CREDENTIAL_BYTES = 4096


@dataclass(frozen=True)
class PyroscopeConfig:
    """Where and how often the daemon pushes each target's profile
    (profiler/service/pyroscope_push.py). Credentials are read from their file at each
    push, never kept in the config: the config is copied into every run record."""

    url: str  # http(s)://HOST[:PORT][/PREFIX]; the push goes to PREFIX/ingest
    period_s: float = 60.0
    app_name: str = DEFAULT_PYROSCOPE_APP
    timeout_s: float = 10.0
    tenant_id: str | None = None  # X-Scope-OrgID, for a multi-tenant Pyroscope
    basic_auth_file: Path | None = None  # one line, USER:PASSWORD
    bearer_token_file: Path | None = None  # one line, the token

    def ingest_url(self) -> str:
        return self.url.rstrip("/") + "/ingest"


def _check_pyroscope_url(c: YamlChecker, node: yaml.Node) -> Any:
    url = c.string("pyroscope.url", node)
    if url is INVALID:
        return url
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError as exc:
        c.problem("pyroscope.url", node, f"not a URL: {exc}")
        return INVALID
    if parts.scheme.lower() not in WEB_SCHEMES or not parts.hostname:
        c.problem(
            "pyroscope.url",
            node,
            "must be http://HOST[:PORT] or https://HOST[:PORT], e.g. "
            "'http://pyroscope.monitoring:4040' (the push goes to its /ingest)",
        )
        return INVALID
    if parts.username is not None or parts.password is not None:
        c.problem(
            "pyroscope.url",
            node,
            "holds credentials: the config is copied into every run record; put them in "
            "a file named by pyroscope.auth.basic_auth_file instead",
        )
        return INVALID
    if parts.query or parts.fragment:
        c.problem(
            "pyroscope.url",
            node,
            "must not have a query or fragment: serwatt adds /ingest and its own query",
        )
        return INVALID
    return url


def _check_app_name(c: YamlChecker, node: yaml.Node) -> Any:
    template = c.string("pyroscope.app_name", node)
    if template is INVALID:
        return template
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        rendered = template.format(**{p: "x" for p in PYROSCOPE_APP_PLACEHOLDERS})
    except (ValueError, KeyError, IndexError):
        known = ", ".join("{" + p + "}" for p in PYROSCOPE_APP_PLACEHOLDERS)
        c.problem(
            "pyroscope.app_name", node, f"bad template {template!r}: placeholders are {known}"
        )
        return INVALID
    if not _PYROSCOPE_APP_RE.match(rendered) or any(f not in PYROSCOPE_APP_PLACEHOLDERS
                                                    for f in fields):  # fmt: skip
        c.problem(
            "pyroscope.app_name",
            node,
            f"{template!r}: use letters, digits, '_' and '-' around {{target}} and {{host}} "
            "(a '.' would read as Pyroscope's profile-type suffix), e.g. 'serwatt-{target}'",
        )
        return INVALID
    return template


def _check_credential_file(c: YamlChecker, path: str, node: yaml.Node, *, basic: bool) -> Any:
    """The file must hold one line: USER:PASSWORD (basic) or a token without spaces. Its
    content is never echoed, only what is wrong with it."""
    file = c.path_value(path, node)
    if file is INVALID:
        return file
    try:
        text = read_bounded(file, max_bytes=MAX_CREDENTIAL_BYTES).decode()
    except InputFileError as exc:
        c.problem(path, node, f"{exc} (it holds the Pyroscope credentials)")
        return INVALID
    except UnicodeDecodeError:
        c.problem(path, node, f"{file} is not UTF-8 text")
        return INVALID
    line = text.strip()
    if not line or "\n" in line or (basic and ":" not in line) or (not basic and " " in line):
        want = "USER:PASSWORD" if basic else "the bearer token (no spaces)"
        c.problem(path, node, f"{file} must hold one line, {want}")
        return INVALID
    return file


def check_pyroscope(c: YamlChecker, node: yaml.Node) -> dict[str, Any]:
    keys = c.mapping(
        "pyroscope", node, ("url", "period_s", "app_name", "timeout_s", "tenant_id", "auth")
    )
    if not keys:  # absent, null or {}: no push
        return {}
    if "url" not in keys:
        c.problem(
            "pyroscope.url",
            node,
            "missing: where to push, e.g. url: http://pyroscope:4040 (or remove `pyroscope:`)",
        )
        return {"pyroscope": INVALID}
    values: dict[str, Any] = {"url": _check_pyroscope_url(c, keys["url"])}
    if "period_s" in keys:
        values["period_s"] = c.number("pyroscope.period_s", keys["period_s"], minimum=1,
                                      maximum=3600)  # fmt: skip
    if "timeout_s" in keys:
        values["timeout_s"] = c.number(
            "pyroscope.timeout_s", keys["timeout_s"], minimum=0, exclusive_minimum=True,
            maximum=300,
        )  # fmt: skip
    if "app_name" in keys:
        values["app_name"] = _check_app_name(c, keys["app_name"])
    if "tenant_id" in keys:
        tenant = c.string("pyroscope.tenant_id", keys["tenant_id"], nullable=True)
        if isinstance(tenant, str) and not _TENANT_RE.match(tenant):
            c.problem(
                "pyroscope.tenant_id",
                keys["tenant_id"],
                "must be 1-150 of letters, digits and !-_.*'() (Pyroscope's tenant IDs)",
            )
            tenant = INVALID
        values["tenant_id"] = tenant
    if "auth" in keys:
        akeys = c.mapping("pyroscope.auth", keys["auth"], ("basic_auth_file", "bearer_token_file"))
        if akeys and len(akeys) > 1:
            c.problem(
                "pyroscope.auth",
                keys["auth"],
                "give one of basic_auth_file and bearer_token_file, not both",
            )
            values["basic_auth_file"] = INVALID
        for name in ("basic_auth_file", "bearer_token_file"):
            if akeys and name in akeys:
                values[name] = _check_credential_file(
                    c, f"pyroscope.auth.{name}", akeys[name], basic=name == "basic_auth_file"
                )
    defaults = PyroscopeConfig(url="")
    period = values.get("period_s", defaults.period_s)
    timeout = values.get("timeout_s", defaults.timeout_s)
    if isinstance(period, float) and isinstance(timeout, float) and timeout >= period:
        c.problem(
            "pyroscope.timeout_s",
            keys.get("timeout_s", node),
            f"{timeout:g} s is not shorter than period_s ({period:g} s): a slow server would "
            "hold every push past the next; lower timeout_s or raise period_s",
        )
        return {"pyroscope": INVALID}
    if any(v is INVALID for v in values.values()):
        return {"pyroscope": INVALID}
    return {"pyroscope": PyroscopeConfig(**values)}


def check_pyroscope_labels(c: YamlChecker, targets: tuple[TargetSpec, ...]) -> None:
    """With a push, each target's static labels go into Pyroscope's `name=APP{k=v,...}`,
    whose values cannot hold the characters that end a value or the set."""
    for i, t in enumerate(targets):
        for name, value in t.labels.items():
            if not PYROSCOPE_LABEL_VALUE_RE.match(value):
                c.problem(
                    f"targets[{i}].labels.{name}",
                    None,
                    f"{value[:80]!r} cannot go into a Pyroscope series name (pyroscope: is "
                    "set): use letters, digits and _ . : / @ + -, or push without it",
                )
