"""Validating a YAML file with every problem placed: its key path and its line.

One implementation for every YAML file serwatt reads from a user: the daemon config
(profiler.service.config) and the report's cluster file (profiler.report.cluster).
Imports nothing from profiler, so any layer may use it.

serwatt runs as root, so a file it reads may be hostile: `read_yaml_file` refuses
anything but a regular file of at most MAX_YAML_BYTES, and `compile_regex` (used by
`YamlChecker.regex` and by the codepath rule files) compiles user regexes with RE2, whose
matching time is linear in the text.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import re2
import yaml

from serwatt.profiler import safeio

# The largest YAML file serwatt reads (daemon config, cluster file). Real ones are a few
# KiB; PyYAML holds ~75 bytes of memory per byte of input, so 8 MB took 625 MB and 15 s.
MAX_YAML_BYTES = 1024 * 1024


class Regex(Protocol):
    """A compiled user regex: `YamlChecker.regex` gives RE2's; tests may pass `re`'s."""

    @property
    def pattern(self) -> str: ...

    def search(self, text: str) -> object | None: ...


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the problem is reported with its key and line instead
    return options


_RE2_OPTIONS = _re2_options()

# Python syntax RE2 has no linear-time algorithm for, and the rewrite to suggest.
_RE2_UNSUPPORTED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\\[1-9]|\(\?P="), "backreferences (\\1, (?P=name)) are not supported"),
    (re.compile(r"\(\?<[=!]"), "lookbehind ((?<=...), (?<!...)) is not supported"),
    (re.compile(r"\(\?[=!]"), "lookahead ((?=...), (?!...)) is not supported"),
    (re.compile(r"\\Z"), "write \\z for the end of the text (RE2 has no \\Z)"),
)


class RegexError(ValueError):
    """A user regex serwatt will not match with; the message names it and the fix."""


def compile_regex(pattern: str) -> Any:
    """`pattern` compiled with RE2 (a Regex: `search`, `match`, `fullmatch`), so that a
    match runs in time linear in the text and no pattern can stall serwatt on hostile
    text (a command line, a frame name). Raises RegexError: a bad regex, or Python syntax
    RE2 has no linear-time algorithm for, with the rewrite to make."""
    try:
        return re2.compile(pattern, options=_RE2_OPTIONS)
    except re2.error as re2_exc:
        why = re2_exc.args[0] if re2_exc.args else re2_exc
        if isinstance(why, bytes):
            why = why.decode("utf-8", "replace")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise RegexError(f"bad regular expression {pattern!r}: {exc}") from None
    hints = [hint for found, hint in _RE2_UNSUPPORTED if found.search(pattern)]
    raise RegexError(
        f"regular expression {pattern!r} is not supported by RE2 ({why}), the "
        "linear-time engine serwatt matches with so that no pattern can stall it: "
        + "; ".join(hints + ["rewrite the pattern without it" if hints else "simplify it"])
        + " (RE2 syntax: https://github.com/google/re2/wiki/Syntax)"
    )


def full_match_set(patterns: Sequence[str]) -> Callable[[str], bool]:
    """A test of whether any of `patterns` (each accepted by compile_regex) matches the
    whole of a text: one RE2 set, one linear pass. A lone surrogate in the text is
    matched as `?` (RE2 reads UTF-8)."""
    for pattern in patterns:
        compile_regex(pattern)  # raises RegexError, with the reason
    regex_set = re2.Set.FullMatchSet(_RE2_OPTIONS)
    for pattern in patterns:
        regex_set.Add(pattern)
    regex_set.Compile()

    def match(text: str) -> bool:
        return regex_set.Match(text.encode("utf-8", "replace")) is not None

    return match


@dataclass(frozen=True)
class ConfigProblem:
    key_path: str  # e.g. "targets[0].match.cmdline"
    line: int | None  # 1-based line in the file, None when the problem has no place
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.key_path or '<document>'}: {self.message}"


class ConfigError(Exception):
    """A config that must not be used. `problems` lists every problem found, in file order."""

    def __init__(self, path: Path | str, problems: list[ConfigProblem]) -> None:
        self.path = Path(path)
        self.problems = problems
        lines = [f"{self.path}: {len(problems)} problem(s):"]
        lines += [
            f"  {self.path}:{p.line if p.line is not None else '-'}: "
            f"{p.key_path or '<document>'}: {p.message}"
            for p in problems
        ]
        super().__init__("\n".join(lines))


class YamlChecker:
    """Walks the composed YAML node tree, converting values and collecting problems."""

    def __init__(self, loader: yaml.SafeLoader, base_dir: Path) -> None:
        self.loader = loader
        self.base_dir = base_dir
        self.problems: list[ConfigProblem] = []

    def problem(self, path: str, node: yaml.Node | None, message: str) -> None:
        line = node.start_mark.line + 1 if node is not None else None
        self.problems.append(ConfigProblem(path, line, message))

    def value(self, node: yaml.Node) -> Any:
        return self.loader.construct_object(node, deep=True)

    def mapping(
        self, path: str, node: yaml.Node, allowed: tuple[str, ...] | None
    ) -> dict[str, yaml.Node] | None:
        """Keys of a mapping node -> value nodes; reports unknown (unless `allowed` is None:
        any key, e.g. environment variable names) and duplicate keys."""
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return {}
        if not isinstance(node, yaml.MappingNode):
            self.problem(path, node, f"must be a mapping, got {node_kind(node, self)}")
            return None
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            key_path = join_key(path, key)
            if not isinstance(key, str):
                self.problem(key_path, key_node, "keys must be strings")
                continue
            if key in out:
                self.problem(key_path, key_node, "duplicate key (YAML would keep only the last)")
                continue
            if allowed is not None and key not in allowed:
                hint = _closest(key, allowed)
                self.problem(
                    key_path,
                    key_node,
                    f"unknown key {key!r}"
                    + (f" (did you mean {hint!r}?)" if hint else "")
                    + f"; allowed here: {', '.join(allowed)}",
                )
                continue
            out[key] = value_node
        return out

    def number(
        self,
        path: str,
        node: yaml.Node,
        *,
        integer: bool = False,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_minimum: bool = False,
        nullable: bool = False,
    ) -> Any:
        value: Any = self.value(node) if isinstance(node, yaml.ScalarNode) else node
        if value is None and nullable:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (integer and not isinstance(value, int))
        ):
            want = "an integer" if integer else "a number"
            if nullable:
                want += " or null"
            self.problem(path, node, f"must be {want}, got {node_kind(node, self)}")
            return INVALID
        if value != value or value in (float("inf"), float("-inf")):
            self.problem(path, node, "must be a finite number")
            return INVALID
        if minimum is not None:
            if exclusive_minimum and value <= minimum:
                self.problem(path, node, f"must be greater than {minimum:g}, got {value}")
                return INVALID
            if not exclusive_minimum and value < minimum:
                self.problem(path, node, f"must be at least {minimum:g}, got {value}")
                return INVALID
        if maximum is not None and value > maximum:
            self.problem(path, node, f"must be at most {maximum:g}, got {value}")
            return INVALID
        return value if integer else float(value)

    def string(self, path: str, node: yaml.Node, *, nullable: bool = False) -> Any:
        value = self.value(node) if isinstance(node, yaml.ScalarNode) else node
        if value is None and nullable:
            return None
        if not isinstance(value, str) or not isinstance(node, yaml.ScalarNode):
            self.problem(
                path,
                node,
                f"must be a string{' or null' if nullable else ''}, got "
                f"{node_kind(node, self)} (quote it)",
            )
            return INVALID
        if not value:
            self.problem(path, node, "must not be empty")
            return INVALID
        return value

    def regex(self, path: str, node: yaml.Node) -> Any:
        """A user regex compiled with RE2 (a Regex): a match runs in time linear in the
        text, so no pattern can stall the daemon on a hostile command line."""
        pattern = self.string(path, node, nullable=True)
        if pattern is None or pattern is INVALID:
            return pattern
        try:
            return compile_regex(pattern)
        except RegexError as exc:
            quote = " (single-quote regexes in YAML so backslashes stay literal)"
            self.problem(path, node, f"{exc}{quote if str(exc).startswith('bad') else ''}")
            return INVALID

    def path_value(self, path: str, node: yaml.Node, *, nullable: bool = False) -> Any:
        value = self.string(path, node, nullable=nullable)
        if value is None or value is INVALID:
            return value
        p = Path(value).expanduser()
        return p if p.is_absolute() else (self.base_dir / p)

    def choice(self, path: str, node: yaml.Node, choices: Mapping[Any, str]) -> Any:
        value = self.value(node) if isinstance(node, yaml.ScalarNode) else INVALID
        for key, result in choices.items():
            if type(key) is type(value) and key == value:
                return result
        shown = ", ".join(
            ("true" if k is True else "false" if k is False else str(k)) for k in choices
        )
        self.problem(path, node, f"must be one of {shown}, got {node_kind(node, self)}")
        return INVALID


INVALID: Any = object()  # a value that failed validation (already reported)


def node_kind(node: yaml.Node, checker: YamlChecker) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    value = checker.value(node)
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}"


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_@:/+-][A-Za-z0-9_.@:/+-]*$")


def join_key(path: str, key: object) -> str:
    """`a.b` for plain keys; `a['odd key']` (repr) for keys with spaces, dots or newlines,
    so a problem always prints on one line and names the key unambiguously."""
    if isinstance(key, str) and _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _closest(key: str, allowed: tuple[str, ...]) -> str | None:
    found = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return found[0] if found else None


def read_yaml_file(path: Path, *, missing_hint: str, max_bytes: int = MAX_YAML_BYTES) -> str:
    """The text of a user's YAML file; raises ConfigError when it cannot be used.

    Read through serwatt's one bounded open (profiler/safeio.py): anything but a regular
    file (a FIFO would block the reader, a device would never end) and a file over
    `max_bytes` are refused.
    """

    def refuse(message: str) -> ConfigError:
        return ConfigError(path, [ConfigProblem("", None, message)])

    try:
        data = safeio.read_bounded(path, max_bytes=max_bytes)
    except safeio.InputFileError as exc:
        if exc.problem == safeio.NO_SUCH_FILE:
            raise refuse(f"file not found; {missing_hint}") from None
        raise refuse(exc.problem) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse(f"cannot read the file: not UTF-8 text ({exc})") from None


def read_yaml_stream(stream: BinaryIO, name: Path, *, max_bytes: int = MAX_YAML_BYTES) -> str:
    """The text of YAML piped to serwatt (`check-config -`), under the same bound as a file;
    raises ConfigError naming `name` when it cannot be used."""

    def refuse(message: str) -> ConfigError:
        return ConfigError(name, [ConfigProblem("", None, message)])

    chunks: list[bytes] = []
    left = max_bytes + 1
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise refuse(f"more than {max_bytes} bytes; serwatt reads at most that much here")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse(f"cannot read the input: not UTF-8 text ({exc})") from None


def check_yaml(
    text: str, source_path: Path, check: Callable[[YamlChecker, yaml.Node | None], Any]
) -> tuple[Any, Any, yaml.Node | None]:
    """Compose YAML text into nodes and run `check(checker, root)` over them.

    Returns (what check returned, the plain document, the root node); raises ConfigError
    listing every problem, each with its key path and line. Shared by every YAML file
    serwatt validates (the daemon config, the report's cluster file).
    """
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:  # e.g. a control character: the reader refuses at once
        raise ConfigError(
            source_path, [ConfigProblem("", None, f"not valid YAML: {exc}")]
        ) from None
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            msg = " ".join(s for s in (exc.context, exc.problem) if s)
            raise ConfigError(
                source_path, [ConfigProblem("", line, f"not valid YAML: {msg}")]
            ) from None
        except yaml.YAMLError as exc:
            raise ConfigError(
                source_path, [ConfigProblem("", None, f"not valid YAML: {exc}")]
            ) from None
        checker = YamlChecker(loader, source_path.parent)
        try:
            values = check(checker, root)
            raw = loader.construct_document(root) if root is not None else None
        except yaml.constructor.ConstructorError as exc:
            mark = exc.problem_mark
            raise ConfigError(
                source_path,
                [
                    ConfigProblem(
                        "", mark.line + 1 if mark else None, f"bad YAML value: {exc.problem}"
                    )
                ],
            ) from None
    finally:
        loader.dispose()
    problems = sorted(checker.problems, key=lambda p: p.line or 0)
    if problems:
        raise ConfigError(source_path, problems)
    return values, raw, root
