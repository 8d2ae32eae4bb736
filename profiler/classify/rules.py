"""Codepath rule files: schema, loading and validation.

A rule file is YAML (schema `serwatt.codepaths/1`, see configs/codepaths.yaml) with:

- `rules`: a list of rules. Each rule has an `id` (unique across every loaded file),
  a `codepath` from the closed set in profiler.classify.codepaths (never `other`: that is what
  unmatched samples get), an optional `confidence` (`high` default, or `low`), and
  an optional `inner_wins` (boolean, default false; python and native layers only), and
  exactly one `layer`:
  - `python`: a Python frame matches by `file` (path-suffix patterns) and `function`
    (patterns; default any). A function pattern without a dot matches the last
    component of the frame name, so `iterencode` matches both the bare pre-3.11 name
    `iterencode` and the 3.11+ qualname `JSONEncoder.iterencode`. A dotted pattern
    (`Packer.pack`) matches the qualname, and on pre-3.11 bare names its last component.
  - `native`: a native frame matches by `module` (patterns on the shared-object
    basename; default any) and `symbol` (patterns; default any). At least one is given.
  - `callsite`: a Python frame's source line matches when it calls one of `calls`
    (patterns on the import-resolved dotted name, e.g. `pickle.dumps`,
    `pickle.Pickler().dump`) or a method in `methods` (patterns on the method name,
    for receivers the source does not resolve, e.g. `SerializeToString`).
- `direction` (optional: `encode`, `decode` or `unknown`) states which way the rule's
  frames or calls go. Without it the frame's or called name says (profiler/classify/
  direction.py); `unknown` says the names are not to be read.
- `inner_wins: true` marks a storage layer that other frameworks plug in: a frame such a
  rule matches decides the sample even inside another rule's scope (a `.many` storage
  writer under DCP's `save`, whose own rule would otherwise win as the outermost scope).
  Among several such frames the outermost decides.
- `callbacks`: function names (patterns, last component) that a C serializer calls
  back into (`persistent_id`, `__reduce_ex__`, ...): such a frame counts toward the
  serializer called on its caller's line.
- `trivial_calls`: call patterns that do not make a call-site line ambiguous (`len`).

A pattern is a shell glob (`fnmatch`'s meaning, case-sensitive) or, prefixed with `re:`, a
regular expression in RE2's syntax (Python's, less backreferences and lookaround) that
must match the whole text. Every pattern is matched by RE2, in time linear in the text:
a rule file is not trusted more than the frames it is matched against (`(a+)+$` took
Python's engine 10 s on a 27-character name). A function or callback pattern prefixed
`!` excludes: `!<module>` is any function but a module body. A rule file is read like
the config: a regular file of at most 1 MiB (profiler.yamlcheck). Every error names the
file, the line and the reason (RuleError).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import DIRECTIONS
from serwatt.profiler.yamlcheck import (
    ConfigError,
    RegexError,
    compile_regex,
    full_match_set,
    read_yaml_file,
)

SCHEMA = "serwatt.codepaths/1"
LAYERS = ("python", "native", "callsite")
CONFIDENCES = ("high", "low")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")

_TOP_KEYS = {"schema", "description", "rules", "callbacks", "trivial_calls"}
_COMMON_KEYS = {"id", "codepath", "layer", "confidence", "description", "inner_wins", "direction"}
_LAYER_KEYS = {
    "python": {"file", "function"},
    "native": {"module", "symbol"},
    "callsite": {"calls", "methods"},
}
# Layers looked up on every frame of a stack: a call-site rule only ever sees the leaf or
# a callback's caller, so it cannot be a scope inside another rule's.
_INNER_WINS_LAYERS = ("python", "native")


class RuleError(ValueError):
    """A rule file that cannot be used: `file:line: reason`."""

    def __init__(self, path: Path | str, line: int | None, reason: str) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {reason}")


_GLOB_CHARS = frozenset("*?[")


def glob_regex(glob: str) -> str:
    """A glob as an RE2 regex with fnmatch's meaning (`*` and `?` match newlines too;
    `[!...]` negates; an unclosed `[` is literal). fnmatch.translate is not used: its
    atomic groups are Python-only."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            if not out or out[-1] != ".*":
                out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i + (1 if i < n and glob[i] == "!" else 0)
            j += 1 if j < n and glob[j] == "]" else 0
            end = glob.find("]", j)
            if end < 0:
                out.append(re.escape(c))
                continue
            body = glob[i:end]
            i = end + 1
            negate = body.startswith("!")
            body = body[1:] if negate else body
            # in RE2's class a backslash, `[` and a leading `^` would mean something else
            body = body.replace("\\", "\\\\").replace("[", "\\[").replace("^", "\\^")
            out.append(f"[{'^' if negate else ''}{body}]")
        else:
            out.append(re.escape(c))
    return "(?s:" + "".join(out) + ")"


class PatternSet:
    """Globs and `re:` regexes; `match(text)` is True when any matches all of text.
    Globs without wildcards are a set lookup; the rest one RE2 set (linear time)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        self._literals = frozenset(
            p for p in self.patterns if not p.startswith("re:") and not _GLOB_CHARS & set(p)
        )
        regexes = [
            p[3:] if p.startswith("re:") else glob_regex(p)
            for p in self.patterns
            if p not in self._literals
        ]
        self._match = full_match_set(regexes) if regexes else None

    def match(self, text: str) -> bool:
        return text in self._literals or (self._match is not None and self._match(text))

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __repr__(self) -> str:
        return f"PatternSet({list(self.patterns)!r})"


class FunctionPatterns:
    """Function-name patterns tolerant of pre-3.11 bare names and 3.11+ qualnames.
    `!PATTERN` excludes what PATTERN matches; with exclusions only, any other name
    matches."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        excluded = [p[1:] for p in patterns if p.startswith("!")]
        included = [p for p in patterns if not p.startswith("!")]
        if excluded and not included:
            included = ["*"]
        last = [p for p in included if p.startswith("re:") or "." not in p]
        dotted = [p for p in included if not p.startswith("re:") and "." in p]
        self._last = PatternSet(last)
        self._qual = PatternSet(dotted)
        self._dotted_tail = PatternSet([p.rsplit(".", 1)[1] for p in dotted])
        self._excluded = FunctionPatterns(excluded) if excluded else None

    def match(self, name: str) -> bool:
        if self._excluded is not None and self._excluded.match(name):
            return False
        return self._included(name)

    def _included(self, name: str) -> bool:
        last = name.rsplit(".", 1)[-1]
        if self._last.match(last) or self._last.match(name):
            return True
        if self._qual.match(name):
            return True
        # A pre-3.11 frame carries only co_name: let `Class.method` match bare `method`.
        return "." not in name and self._dotted_tail.match(name)


def _suffix_patterns(patterns: Sequence[str]) -> PatternSet:
    # File patterns are path suffixes: "json/encoder.py" matches ".../json/encoder.py".
    out = []
    for p in patterns:
        if p.startswith("re:"):
            out.append(p)
        else:
            out.append(p)
            if not p.startswith(("/", "*")):
                out.append("*/" + p)
    return PatternSet(out)


@dataclass(frozen=True)
class Rule:
    id: str
    codepath: str
    layer: str
    confidence: str
    origin: str  # "file:line", for messages and docs
    # A storage layer: its frame decides even inside another rule's scope (see the module doc).
    inner_wins: bool = False
    # encode / decode / unknown as the rule states it; None: read from the names
    direction: str | None = None
    files: PatternSet | None = None
    functions: FunctionPatterns | None = None
    modules: PatternSet | None = None
    symbols: PatternSet | None = None
    calls: PatternSet | None = None
    methods: PatternSet | None = None


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    callbacks: FunctionPatterns
    trivial_calls: PatternSet
    sources: tuple[str, ...] = field(default_factory=tuple)

    def layer(self, name: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.layer == name)


# --- YAML with line numbers -------------------------------------------------------


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _scalar(path: Path, node: yaml.Node, what: str) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise RuleError(path, _line(node), f"{what} must be a string")
    value = str(node.value)
    if node.tag != "tag:yaml.org,2002:str" and node.style is None:
        # Unquoted `yes`, `1.0`, `null`: keep the text, but an empty value is an error.
        if value in ("", "~", "null"):
            raise RuleError(path, _line(node), f"{what} is empty")
    if value == "":
        raise RuleError(path, _line(node), f"{what} is empty")
    return value


_Fields = dict[str, tuple[yaml.Node, yaml.Node]]  # key -> (its key node, its value node)


def _mapping(path: Path, node: yaml.Node, what: str) -> _Fields:
    if not isinstance(node, yaml.MappingNode):
        raise RuleError(path, _line(node), f"{what} must be a mapping")
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key_node, value_node in node.value:
        key = _scalar(path, key_node, "a key")
        if key in out:
            raise RuleError(path, _line(key_node), f"duplicate key {key!r} in {what}")
        out[key] = (key_node, value_node)
    return out


# Lists whose patterns name functions (FunctionPatterns): only these take `!` exclusions.
_FUNCTION_LISTS = ("function", "callbacks")


def _patterns(path: Path, node: yaml.Node, what: str, rule_id: str | None = None) -> list[str]:
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    in_rule = f" in rule {rule_id!r}" if rule_id is not None else ""
    if isinstance(node, yaml.SequenceNode) and not items:
        raise RuleError(path, _line(node), f"{what} is an empty list{in_rule}")
    out = []
    for item in items:
        text = _scalar(path, item, what)
        pattern = text
        if text.startswith("!"):
            if what not in _FUNCTION_LISTS:
                raise RuleError(
                    path,
                    _line(item),
                    f"{what}{in_rule}: {text!r}: exclusions (!PATTERN) are for function "
                    "patterns only (`function`, `callbacks`); write [!]... for a literal !",
                )
            pattern = text[1:]
        try:
            compile_regex(pattern[3:] if pattern.startswith("re:") else glob_regex(pattern))
        except RegexError as exc:
            hint = (
                "; `!PATTERN` excludes, e.g. '!<module>' for any function but a module body"
                if "(?!" in pattern and what in _FUNCTION_LISTS
                else ""
            )
            of_rule = f" of rule {rule_id!r}" if rule_id is not None else ""
            kind = "regex" if pattern.startswith("re:") else f"glob {pattern!r}"
            raise RuleError(
                path, _line(item), f"bad {kind} in {what}{of_rule}: {exc}{hint}"
            ) from None
        out.append(text)
    return out


def _rule_id(path: Path, fields: _Fields, line: int, seen: dict[str, str]) -> str:
    if "id" not in fields:
        raise RuleError(path, line, "rule has no `id` (every rule needs a unique id)")
    rule_id = _scalar(path, fields["id"][1], "id")
    if not _ID_RE.match(rule_id):
        raise RuleError(
            path,
            _line(fields["id"][1]),
            f"bad id {rule_id!r}: use letters, digits and . _ : - (start with a letter or digit)",
        )
    if rule_id in seen:
        raise RuleError(
            path, _line(fields["id"][1]), f"duplicate id {rule_id!r} (first at {seen[rule_id]})"
        )
    return rule_id


def _codepath_and_layer(path: Path, fields: _Fields, line: int, rule_id: str) -> tuple[str, str]:
    """The rule's codepath and layer, and no key its layer does not take."""
    if "codepath" not in fields:
        raise RuleError(path, line, f"rule {rule_id!r} has no `codepath`")
    codepath = _scalar(path, fields["codepath"][1], "codepath")
    if codepath not in CODEPATHS or codepath == "other":
        allowed_cp = ", ".join(c for c in CODEPATHS if c != "other")
        why = "`other` is what unmatched samples get" if codepath == "other" else "unknown"
        raise RuleError(
            path,
            _line(fields["codepath"][1]),
            f"{why} codepath {codepath!r} in rule {rule_id!r} (one of {allowed_cp})",
        )
    if "layer" not in fields:
        raise RuleError(path, line, f"rule {rule_id!r} has no `layer` (one of {', '.join(LAYERS)})")
    layer = _scalar(path, fields["layer"][1], "layer")
    if layer not in LAYERS:
        raise RuleError(
            path,
            _line(fields["layer"][1]),
            f"unknown layer {layer!r} in rule {rule_id!r} (one of {', '.join(LAYERS)})",
        )
    allowed = _COMMON_KEYS | _LAYER_KEYS[layer]
    for key, (key_node, _) in fields.items():
        if key not in allowed:
            raise RuleError(
                path,
                _line(key_node),
                f"unknown key {key!r} in {layer} rule {rule_id!r} "
                f"(allowed: {', '.join(sorted(allowed))})",
            )
    return codepath, layer


def _options(path: Path, fields: _Fields, rule_id: str, layer: str) -> tuple[str, bool, str | None]:
    """(confidence, inner_wins, direction), each defaulted when the rule leaves it out."""
    confidence = "high"
    if "confidence" in fields:
        confidence = _scalar(path, fields["confidence"][1], "confidence")
        if confidence not in CONFIDENCES:
            raise RuleError(
                path,
                _line(fields["confidence"][1]),
                f"confidence must be high or low, not {confidence!r}",
            )
    inner_wins = False
    if "inner_wins" in fields:
        node_iw = fields["inner_wins"][1]
        if not (isinstance(node_iw, yaml.ScalarNode) and node_iw.tag == "tag:yaml.org,2002:bool"):
            raise RuleError(
                path, _line(node_iw), f"inner_wins must be true or false in rule {rule_id!r}"
            )
        inner_wins = yaml.safe_load(node_iw.value) is True
        if inner_wins and layer not in _INNER_WINS_LAYERS:
            raise RuleError(
                path,
                _line(node_iw),
                f"inner_wins applies to python and native rules, not to {layer} rule "
                f"{rule_id!r} (a call site is only looked at on the leaf frame)",
            )
    direction = None
    if "direction" in fields:
        direction = _scalar(path, fields["direction"][1], "direction")
        if direction not in DIRECTIONS:
            raise RuleError(
                path,
                _line(fields["direction"][1]),
                f"direction must be {', '.join(DIRECTIONS[:-1])} or {DIRECTIONS[-1]}, "
                f"not {direction!r}, in rule {rule_id!r} (leave it out to read it from "
                "the names)",
            )
    return confidence, inner_wins, direction


def _matchers(path: Path, fields: _Fields, line: int, rule_id: str, layer: str) -> dict[str, Any]:
    """The Rule's pattern fields for its layer; a rule with none of its layer's keys is an
    error."""

    def pats(key: str) -> list[str] | None:
        return _patterns(path, fields[key][1], key, rule_id) if key in fields else None

    if layer == "python":
        files = pats("file")
        if files is None:
            raise RuleError(path, line, f"python rule {rule_id!r} needs `file`")
        return {
            "files": _suffix_patterns(files),
            "functions": FunctionPatterns(pats("function") or ["*"]),
        }
    if layer == "native":
        modules, symbols = pats("module"), pats("symbol")
        if modules is None and symbols is None:
            raise RuleError(path, line, f"native rule {rule_id!r} needs `module` or `symbol`")
        return {"modules": PatternSet(modules or ["*"]), "symbols": PatternSet(symbols or ["*"])}
    calls, methods = pats("calls"), pats("methods")
    if calls is None and methods is None:
        raise RuleError(path, line, f"callsite rule {rule_id!r} needs `calls` or `methods`")
    return {"calls": PatternSet(calls or []), "methods": PatternSet(methods or [])}


def _rule(path: Path, node: yaml.Node, seen: dict[str, str]) -> Rule:
    fields = _mapping(path, node, "a rule")
    line = _line(node)
    rule_id = _rule_id(path, fields, line, seen)
    codepath, layer = _codepath_and_layer(path, fields, line, rule_id)
    confidence, inner_wins, direction = _options(path, fields, rule_id, layer)
    return Rule(
        rule_id,
        codepath,
        layer,
        confidence,
        f"{path}:{line}",
        inner_wins,
        direction,
        **_matchers(path, fields, line, rule_id, layer),
    )


@dataclass(frozen=True)
class _Parsed:
    rules: list[Rule]
    callbacks: list[str]
    trivial_calls: list[str]


def _parse(path: Path, text: str, seen: dict[str, str]) -> _Parsed:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise RuleError(path, line, f"YAML syntax error: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise RuleError(path, None, f"YAML error: {exc}") from None
    if root is None:
        raise RuleError(path, 1, f"empty rule file (start it with `schema: {SCHEMA}`)")
    top = _mapping(path, root, "the rule file")
    for key, (key_node, _) in top.items():
        if key not in _TOP_KEYS:
            raise RuleError(
                path,
                _line(key_node),
                f"unknown top-level key {key!r} (allowed: {', '.join(sorted(_TOP_KEYS))})",
            )
    if "schema" not in top:
        raise RuleError(path, _line(root), f"missing `schema: {SCHEMA}`")
    schema = _scalar(path, top["schema"][1], "schema")
    if schema != SCHEMA:
        raise RuleError(
            path,
            _line(top["schema"][1]),
            f"unsupported schema {schema!r}: this serwatt reads {SCHEMA!r}",
        )
    rules: list[Rule] = []
    if "rules" in top:
        rules_node = top["rules"][1]
        if not isinstance(rules_node, yaml.SequenceNode):
            raise RuleError(path, _line(rules_node), "`rules` must be a list of rules")
        for item in rules_node.value:
            rule = _rule(path, item, seen)
            seen[rule.id] = rule.origin
            rules.append(rule)
    callbacks = _patterns(path, top["callbacks"][1], "callbacks") if "callbacks" in top else []
    trivial = (
        _patterns(path, top["trivial_calls"][1], "trivial_calls") if "trivial_calls" in top else []
    )
    return _Parsed(rules, callbacks, trivial)


def load_rules(paths: Iterable[Path], *, builtin: bool = False) -> RuleSet:
    """Load rule files; earlier files' rules are tried first on the same frame.

    With `builtin=True` the packaged rules are read first (so a clashing user id is
    reported against the user's file) but tried last (so user rules can refine them).
    """
    paths = [Path(p) for p in paths]
    if builtin:
        paths = [builtin_rules_path(), *paths]
    seen: dict[str, str] = {}
    per_file: list[list[Rule]] = []
    callbacks: list[str] = []
    trivial: list[str] = []
    sources: list[str] = []
    for path in paths:
        path = Path(path)
        try:
            text = read_yaml_file(path, missing_hint="no such rule file: check the path")
        except ConfigError as exc:
            reason = "; ".join(p.message for p in exc.problems)
            raise RuleError(path, None, reason.replace("the file", "rule file", 1)) from None
        parsed = _parse(path, text, seen)
        per_file.append(parsed.rules)
        callbacks.extend(parsed.callbacks)
        trivial.extend(parsed.trivial_calls)
        sources.append(str(path))
    if builtin and per_file:
        per_file = [*per_file[1:], per_file[0]]
    return RuleSet(
        rules=tuple(r for file_rules in per_file for r in file_rules),
        callbacks=FunctionPatterns(callbacks),
        trivial_calls=PatternSet(trivial),
        sources=tuple(sources),
    )


def parse_rules_text(text: str, name: str = "<rules>") -> RuleSet:
    """Parse one rule document from a string (for tests and `check` tooling)."""
    parsed = _parse(Path(name), text, {})
    return RuleSet(
        rules=tuple(parsed.rules),
        callbacks=FunctionPatterns(parsed.callbacks),
        trivial_calls=PatternSet(parsed.trivial_calls),
        sources=(name,),
    )


def builtin_rules_path() -> Path:
    """The packaged rule file (profiler/codepaths.yaml, a link to configs/codepaths.yaml)."""
    return Path(__file__).parents[1] / "codepaths.yaml"
