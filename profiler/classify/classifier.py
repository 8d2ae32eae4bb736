"""Codepath classification: which serializer, if any, a stack sample is inside.

Rules (profiler/classify/rules.py, built-ins in configs/codepaths.yaml) come in three layers:

- python: a Python frame by file path suffix + function name, on any frame;
- native: a native frame by shared-object basename + symbol (py-spy --native);
- callsite: a Python frame's source line calls a serializer (profiler/classify/callsite.py).
  It applies to the innermost Python frame (a C serializer has no frame of its own:
  its caller at the call line is the leaf), and to a caller whose callee is a
  serializer *callback* (`persistent_id`, `__reduce_ex__`, ...): the C serializer
  on the caller's line runs that callback, so the callback's time is serialization;
  and to any frame whose line *encloses* its deeper frames (one serializer call and
  nothing else that can run Python, CallsiteMatch.encloses): every deeper Python
  frame (reduce functions such as rebuild_storage_fd) is inside that call, rule id
  `<rule>+below`, unless a deeper rule of the same codepath names it.

The sample goes to its OUTERMOST serializer scope, walking from the stack root:
`torch.save` -> torch even though pickling runs under it. Its direction (encode /
decode / unknown) is the first one said from that frame inward by a frame of the same
codepath: its rule's `direction`, else its name (profiler/classify/direction.py); a
call-site decision by the called names. A leaf call-site line that
also runs other non-trivial calls is `low` confidence (`ambiguous=True`). Nothing
matched, or two different serializers called on one ambiguous line: `other`.
Unknown stays `other`; nothing is guessed.

Classification runs on every sample, so results are cached per frame tuple, per
(file, function) for the python/native layers and per (file, line) for call sites.
A source change (mtime/size, checked at most every `stat_ttl_s`) drops the
source-derived caches.

A source the classifier cannot use now or ever is never guessed at: a file still
loading when the caller's deadline passes (not memoized: asked again next time),
a file given up as too costly to index, a line whose call names are too deep to
resolve: the sample is `other`, low confidence (docs/classification.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from serwatt.collectors import procstat
from serwatt.collectors.samples import Frame, Sample
from serwatt.profiler.classify.callsite import MAX_NAME_PARTS, LineCalls, LineIndex
from serwatt.profiler.classify.codepaths import OTHER, Classification
from serwatt.profiler.classify.direction import UNKNOWN, combined, name_direction
from serwatt.profiler.classify.prefilter import CallsitePrefilter
from serwatt.profiler.classify.rules import PatternSet, Rule, RuleSet, load_rules
from serwatt.profiler.classify.source_cache import NOT_READY, SourceCache
from serwatt.profiler.classify.source_index import TOO_COSTLY
from serwatt.profiler.classify.source_store import SourceStore
from serwatt.profiler.classify.target_files import source_path

_MEMO_MAX = 1 << 17
MODULE_BODY = "<module>"  # a module body's frame name (CPython)


def _is_import(outer: Frame | None) -> bool:
    """Whether a module body run below `outer` is an import: the import system runs it
    (importlib's frames, frozen or not). A script's own body (`python job.py`, or runpy's
    for `-m`) is no import: its functions are the job's, whatever a rule says of them."""
    return outer is not None and "importlib" in outer.filename


def _is_inner_scope(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return last in ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>")


BELOW_SUFFIX = "+below"


def below_id(rule_id: str) -> str:
    """The rule id a sample gets when a frame deeper than the rule's call-site line ran
    (`+` is not allowed in a rule's own id, so it names no other rule)."""
    return rule_id + BELOW_SUFFIX


def _within(enclosing: Explanation | None, got: Explanation) -> Explanation:
    """A deeper decision inside an enclosing call-site line: kept when it names the
    same codepath with high confidence (its rule is the more specific), else the
    enclosing line decides (the outermost scope; the line leaves no doubt)."""
    if enclosing is None:
        return got
    same = got.classification.codepath == enclosing.classification.codepath
    return got if same and not got.classification.low_confidence else enclosing


@dataclass(frozen=True)
class CallsiteMatch:
    codepath: str | None  # None: two serializers of different codepaths on the line
    rule: Rule | None
    others: int  # non-trivial non-serializer calls (and comprehensions) on the line
    # why the line's calls are not known (source not ready, too costly, a name too deep
    # to resolve): the sample is `other`, low confidence
    unknown: str | None = None
    # the line runs one serializer call, named through an import, and nothing else that
    # can run Python: no other call (trivial ones included: `str(x)` runs `__str__`), no
    # comprehension, arguments only constants, names and attributes of imported names.
    # Any Python frame deeper than such a line is inside that serializer's call.
    encloses: bool = False
    # encode / decode from the serializer calls' rules or names; unknown when they do
    # not say or disagree (profiler/classify/direction.py)
    direction: str = UNKNOWN


@dataclass(frozen=True)
class Explanation:
    """A classification and where it came from (Classifier.explain)."""

    classification: Classification
    frame_index: int | None  # into the leaf-first frames; None when nothing matched
    how: str  # the layer, and why confidence is low or why nothing matched


@dataclass
class ClassifierStats:
    samples: int = 0
    stack_cache_hits: int = 0
    # source files this classifier needed parsed: parsed here, or reused from another
    # path or cache in the process (profiler/classify/source_cache.py _SHARED)
    source_parses: int = 0
    callsite_lookups: int = 0
    sources_unavailable: int = 0
    # source files read but not parsed: their text cannot hold a call-site match
    sources_prefiltered: int = 0
    # lookups whose source was still loading at the deadline (not waited for)
    sources_not_ready: int = 0
    # source files given up past the CPU budget (source_index.SOURCE_CPU_BUDGET_S)
    sources_too_costly: int = 0
    # source files the on-disk store answered (source_store.py): neither prefiltered nor
    # parsed again
    sources_from_store: int = 0


class Classifier:
    """Classifies samples with a RuleSet. Not thread-safe: one per sampling thread."""

    def __init__(
        self,
        rules: RuleSet,
        *,
        stack_cache_size: int = 65536,
        stat_ttl_s: float = 2.0,
        callsite_prefilter: bool = True,
        proc_fs: Path = Path("/proc"),
        source_store: SourceStore | None = None,
    ) -> None:
        self.rules = rules
        self._python_rules = rules.layer("python")
        self._native_rules = rules.layer("native")
        self._callsite_rules = rules.layer("callsite")
        self._inner_wins_ids = frozenset(r.id for r in rules.rules if r.inner_wins)
        self._stack_cache_size = stack_cache_size
        self._sources = SourceCache(stat_ttl_s=stat_ttl_s, store=source_store)
        # Reads a leaf's file before parsing it; None parses every file (the reference
        # the prefilter is tested against: tests/classify/test_callsite_prefilter.py).
        self._prefilter: CallsitePrefilter | None = None
        if callsite_prefilter:
            calls = [p for r in self._callsite_rules if r.calls for p in r.calls.patterns]
            method_patterns = [
                p for r in self._callsite_rules if r.methods for p in r.methods.patterns
            ]
            self._prefilter = CallsitePrefilter(
                calls,
                PatternSet(method_patterns).match,
                fingerprint=json.dumps([sorted(calls), sorted(method_patterns)]),
            )
        self._generation = self._sources.generation
        self._stacks: dict[tuple[str | None, tuple[Frame, ...]], Classification] = {}
        self._python_memo: dict[tuple[str, str], Rule | None] = {}
        self._import_memo: dict[str, frozenset[str]] = {}
        self._native_memo: dict[tuple[str, str], Rule | None] = {}
        self._callback_memo: dict[str, bool] = {}
        self._callsite_memo: dict[tuple[str, int, bool], CallsiteMatch | None] = {}
        self._start_times: dict[str, float | None] = {}
        self._proc_fs = proc_fs
        self.stats = ClassifierStats()
        # the current classify call's deadline (time.monotonic()), and whether a
        # source it needed was not ready (then nothing derived from it is memoized)
        self._deadline: float | None = None
        self._not_ready = False

    # -- construction --------------------------------------------------------------

    @classmethod
    def default(cls, **options: Any) -> Classifier:
        """The built-in rules packaged with serwatt (options: see __init__)."""
        return cls(load_rules([], builtin=True), **options)

    @classmethod
    def from_files(cls, paths: Iterable[Path], **options: Any) -> Classifier:
        """Built-in rules plus user rule files; user rules are tried first on a frame.

        Raises profiler.classify.rules.RuleError naming file, line and reason for a bad file.
        """
        return cls(load_rules(list(paths), builtin=True), **options)

    # -- public --------------------------------------------------------------------

    def classify(
        self, sample: Sample, *, proc_root: Path | None = None, deadline: float | None = None
    ) -> Classification:
        return self.classify_frames(sample.frames, proc_root=proc_root, deadline=deadline)

    def classify_frames(
        self,
        frames: Sequence[Frame],
        *,
        proc_root: Path | None = None,
        deadline: float | None = None,
    ) -> Classification:
        """Classify one stack given leaf first (the order of collectors.samples.Sample).

        deadline (time.monotonic()): a source file not loaded by then is not waited
        for (None: each load is waited on up to source_cache.SOURCE_WAIT_S)."""
        self.stats.samples += 1
        sweeps = self._sources.sweeps
        self._sources.revalidate()
        if self._sources.sweeps != sweeps:
            self._sweep()
        if self._sources.generation != self._generation:
            self._generation = self._sources.generation
            self._stacks.clear()
            self._callsite_memo.clear()
        frames = tuple(frames)
        key = (str(proc_root) if proc_root is not None else None, frames)
        hit = self._stacks.get(key)
        if hit is not None:
            self.stats.stack_cache_hits += 1
            return hit
        self._deadline, self._not_ready = deadline, False
        result = self._walk(frames, proc_root)
        if self._not_ready:
            return result  # a later call, with the source loaded, may say more
        if len(self._stacks) >= self._stack_cache_size:
            self._stacks.clear()  # a full reset is cheaper than LRU bookkeeping per sample
        self._stacks[key] = result
        return result

    def _sweep(self) -> None:
        """Periodic upkeep (every `stat_ttl_s`): bound the memos, notice pid reuse."""
        for memo in (self._python_memo, self._native_memo, self._callsite_memo, self._import_memo):
            if len(memo) > _MEMO_MAX:
                memo.clear()
        if len(self._callback_memo) > _MEMO_MAX:
            self._callback_memo.clear()
        # A pid reused by a new process is a new /proc/<pid>/root: forget what the old
        # process's root said.
        known = dict(self._start_times)
        self._start_times.clear()
        for key, start in known.items():
            if self._process_start_epoch(Path(key)) != start:
                self._sources.forget(key.rstrip("/") + "/")
                self._stacks.clear()
                self._callsite_memo.clear()

    # -- layers --------------------------------------------------------------------

    def _python_rule(self, frame: Frame) -> Rule | None:
        key = (frame.filename, frame.name)
        if key in self._python_memo:
            return self._python_memo[key]
        found = None
        for rule in self._python_rules:
            assert rule.files is not None and rule.functions is not None
            if rule.files.match(frame.filename) and rule.functions.match(frame.name):
                found = rule
                break
        self._python_memo[key] = found
        return found

    def _imported_by(self, frame: Frame) -> frozenset[str]:
        """The python rules whose files `frame` is the module body of, where the rule
        leaves module bodies out (`!<module>`): below this frame that package is being
        imported, and a function it runs then (yaml's resolver registering its implicit
        resolvers) is set-up, not serialization."""
        got = self._import_memo.get(frame.filename)
        if got is None:
            got = frozenset(
                rule.id
                for rule in self._python_rules
                if rule.files is not None
                and rule.functions is not None
                and rule.files.match(frame.filename)
                and not rule.functions.match(MODULE_BODY)
            )
            self._import_memo[frame.filename] = got
        return got

    def _native_rule(self, frame: Frame) -> Rule | None:
        module = os.path.basename(frame.module or "")
        key = (module, frame.name)
        if key in self._native_memo:
            return self._native_memo[key]
        found = None
        for rule in self._native_rules:
            assert rule.modules is not None and rule.symbols is not None
            if rule.modules.match(module) and rule.symbols.match(frame.name):
                found = rule
                break
        self._native_memo[key] = found
        return found

    def _is_callback(self, name: str) -> bool:
        hit = self._callback_memo.get(name)
        if hit is None:
            hit = self._callback_memo[name] = self.rules.callbacks.match(name)
        return hit

    def _callsite(self, frame: Frame, proc_root: Path | None) -> CallsiteMatch | None:
        path = source_path(frame.filename, proc_root)
        if path is None or frame.line <= 0:
            return None
        # A comprehension/lambda frame (its own code object before 3.12) runs only the
        # calls inside it, not the call that consumes its result on the same line.
        inner = _is_inner_scope(frame.name)
        key = (path, frame.line, inner)
        if key in self._callsite_memo:
            return self._callsite_memo[key]
        self.stats.callsite_lookups += 1
        index, error = self._source(path, proc_root)
        result: CallsiteMatch | None = None
        if error == NOT_READY:
            self._not_ready = True
            return CallsiteMatch(None, None, 0, unknown=NOT_READY)  # not memoized
        if index is None:
            if error is not None and error.startswith(TOO_COSTLY):
                result = CallsiteMatch(None, None, 0, unknown=error)
            elif error is not None:
                self.stats.sources_unavailable += 1
        else:
            result = self._match_line(index.calls_at(frame.line), inner_only=inner)
        self._callsite_memo[key] = result
        return result

    def _source(self, path: str, proc_root: Path | None) -> tuple[LineIndex | None, str | None]:
        """(index, error) of one source, read inside the target's root, counted."""
        src = self._sources
        before = (
            src.parses, src.shared_hits, src.filtered, src.not_ready, src.too_costly, src.stored
        )  # fmt: skip
        index, error, _mtime = src.get(
            path,
            self._prefilter,
            root=str(proc_root) if proc_root is not None else None,
            deadline=self._deadline,
        )
        parses, shared, filtered, not_ready, too_costly, stored = before
        self.stats.source_parses += src.parses - parses + src.shared_hits - shared
        self.stats.sources_from_store += src.stored - stored
        # (a no-match marker from the store counts here too: the file cannot match)
        self.stats.sources_prefiltered += src.filtered - filtered
        self.stats.sources_not_ready += src.not_ready - not_ready
        self.stats.sources_too_costly += src.too_costly - too_costly
        if error == NOT_READY:
            self._not_ready = True
        return index, error

    def _match_line(self, line_calls: LineCalls, *, inner_only: bool) -> CallsiteMatch | None:
        if line_calls.unresolved:
            return CallsiteMatch(
                None,
                None,
                0,
                unknown=f"cannot resolve a call on the line (a name over {MAX_NAME_PARTS} parts)",
            )
        matched: list[Rule] = []
        said: list[str | None] = []  # each matched call's direction
        others = 1 if line_calls.comprehension and not inner_only else 0
        # what `encloses` needs: every call on the line named through an import, plain
        # arguments everywhere, and no call but the serializer and its receivers
        encloses = not line_calls.comprehension and not inner_only
        for call in line_calls.calls:
            if inner_only and not call.nested:
                continue
            encloses = encloses and call.plain_args
            rule = None
            for r in self._callsite_rules:
                assert r.calls is not None and r.methods is not None
                if call.imported and r.calls.match(call.name):
                    rule = r
                    break
                if call.method is not None and r.methods.match(call.method):
                    rule = r
                    encloses = False  # a method on an unresolved receiver
                    break
            if rule is not None:
                matched.append(rule)
                d = rule.direction or name_direction(call.method or call.name)
                said.append(None if d == UNKNOWN else d)
            elif not call.receiver:
                encloses = False
                if not self.rules.trivial_calls.match(call.name):
                    others += 1
            else:
                # A receiver (`Pickler(f)` in `Pickler(f).dump(x)`) is part of the call.
                encloses = encloses and call.imported
        if not matched:
            return None
        codepaths = {r.codepath for r in matched}
        if len(codepaths) > 1:
            return CallsiteMatch(None, None, others)
        encloses = encloses and len(matched) == 1 and matched[0].confidence == "high"
        return CallsiteMatch(
            matched[0].codepath,
            matched[0],
            others,
            encloses=encloses,
            direction=combined(said) or UNKNOWN,
        )

    def _process_start_epoch(self, proc_root: Path) -> float | None:
        """When the target started (epoch s), from <proc_root>/../stat; None if unknown."""
        key = str(proc_root)
        if key in self._start_times:
            return self._start_times[key]
        # The stat beside proc_root (<procfs>/<pid>/root), the boot time from our procfs.
        pid_dir = proc_root.parent
        start: float | None
        try:
            start = procstat.start_time_s(
                int(pid_dir.name), pid_dir.parent, boot_s=procstat.boot_time_s(self._proc_fs)
            )
        except (OSError, ValueError, procstat.ProcessGone, procstat.NotProcfs):
            start = None
        self._start_times[key] = start
        return start

    def _stale(self, frame: Frame, proc_root: Path | None) -> bool:
        """The source changed after the target started: its lines may not be what runs."""
        if proc_root is None:
            return False
        path = source_path(frame.filename, proc_root)
        if path is None:
            return False
        _index, _err, mtime_ns = self._sources.get(
            path, root=str(proc_root), deadline=self._deadline
        )
        start = self._process_start_epoch(proc_root)
        return mtime_ns is not None and start is not None and mtime_ns / 1e9 > start + 1.0

    def _walk(self, frames: tuple[Frame, ...], proc_root: Path | None) -> Classification:
        return self._select(frames, proc_root, why=False).classification

    def explain(
        self,
        frames: Sequence[Frame],
        *,
        proc_root: Path | None = None,
        deadline: float | None = None,
    ) -> Explanation:
        """Which frame decided, through which layer: for people checking a rule."""
        self._deadline, self._not_ready = deadline, False
        return self._select(tuple(frames), proc_root)

    def _select(
        self, frames: tuple[Frame, ...], proc_root: Path | None, *, why: bool = True
    ) -> Explanation:
        """The outermost scope decides (`_decide`), unless a frame deeper than the one it
        chose is matched by an `inner_wins` rule (a storage layer plugged into a framework,
        such as a `.many` storage writer under DCP's `save`): then the outermost such frame
        decides. Frames above the chosen one matched no rule, so only deeper ones are
        looked at."""
        got = self._decide(frames, proc_root, why=why)
        k, rule_id = got.frame_index, got.classification.rule_id
        # Nothing decided (`other`, or two serializers on the leaf line): every python and
        # native frame was looked at and none matched.
        if k is None or rule_id is None:
            return got
        if rule_id not in self._inner_wins_ids:
            for j in range(k - 1, -1, -1):
                frame = frames[j]
                rule = self._native_rule(frame) if frame.is_native else self._python_rule(frame)
                if rule is not None and rule.inner_wins:
                    got = Explanation(
                        Classification(rule.codepath, rule.id, rule.confidence),
                        j,
                        f"{'native' if frame.is_native else 'python'}, "
                        f"inner_wins inside rule {rule_id}'s scope",
                    )
                    break
        return self._with_direction(frames, got)

    def _with_direction(self, frames: tuple[Frame, ...], got: Explanation) -> Explanation:
        """`got` with the direction its deciding frame, or the first deeper frame of its
        codepath, states or names (a call-site decision already has its line's)."""
        c, k = got.classification, got.frame_index
        if c.direction != UNKNOWN or k is None:
            return got
        for j in range(k, -1, -1):
            frame = frames[j]
            rule = self._native_rule(frame) if frame.is_native else self._python_rule(frame)
            if rule is not None and rule.codepath == c.codepath:
                said = rule.direction or name_direction(frame.name)
            elif rule is None and not frame.is_native and self._is_callback(frame.name):
                said = name_direction(frame.name)  # persistent_id, __setstate__
            else:
                continue
            if said is not None and said != UNKNOWN:
                return replace(got, classification=replace(c, direction=said))
        return got

    def _decide(
        self, frames: tuple[Frame, ...], proc_root: Path | None, *, why: bool = True
    ) -> Explanation:
        """why=False: only the classification is wanted (its `how` may be less exact: a
        file the prefilter did not parse is not parsed just to say why nothing matched)."""
        python_idx = [i for i, f in enumerate(frames) if not f.is_native]
        innermost_python = python_idx[0] if python_idx else None
        deeper_python: dict[int, int] = {}
        for k in range(1, len(python_idx)):
            deeper_python[python_idx[k]] = python_idx[k - 1]
        enclosing: Explanation | None = None  # the outermost line enclosing deeper frames
        importing: frozenset[str] = frozenset()  # rules whose package's import is running
        outer: Frame | None = None  # the next Python frame outward
        for i in range(len(frames) - 1, -1, -1):
            frame = frames[i]
            if not frame.is_native and frame.name == MODULE_BODY and _is_import(outer):
                importing |= self._imported_by(frame)
            if not frame.is_native:
                outer = frame
            if frame.is_native:
                rule = self._native_rule(frame)
                if rule is not None:
                    return _within(
                        enclosing,
                        Explanation(
                            Classification(rule.codepath, rule.id, rule.confidence), i, "native"
                        ),
                    )
                continue
            rule = self._python_rule(frame)
            if rule is not None and rule.id in importing:
                rule = None  # import-time set-up of the package (`_imported_by`)
            if rule is not None:
                return _within(
                    enclosing,
                    Explanation(
                        Classification(rule.codepath, rule.id, rule.confidence), i, "python"
                    ),
                )
            if i == innermost_python:
                return _within(enclosing, self._leaf(frames, i, proc_root, why=why))
            callee = deeper_python.get(i)
            if callee is not None and self._is_callback(frames[callee].name):
                match = self._callsite(frame, proc_root)
                if match is not None and match.codepath is not None and match.rule is not None:
                    # The serializer on this line runs the callback. If the line also
                    # makes other calls, one of them may have called it instead.
                    low = (
                        match.others > 0
                        or match.rule.confidence == "low"
                        or self._stale(frame, proc_root)
                    )
                    got = Classification(
                        match.codepath,
                        match.rule.id,
                        "low" if low else "high",
                        ambiguous=match.others > 0,
                        direction=match.direction,
                    )
                    how = f"callsite, running callback {frames[callee].name}"
                    return _within(enclosing, Explanation(got, i, how))
            if enclosing is None and callee is not None:
                match = self._callsite(frame, proc_root)
                if (
                    match is not None
                    and match.encloses
                    and match.rule is not None
                    and not self._stale(frame, proc_root)
                ):
                    # A C serializer has no frame: the Python frames it calls (reduce
                    # functions such as torch's rebuild_storage_fd and what they run)
                    # stack directly on the line that called it. Deeper frames are
                    # still looked at: a rule of the same codepath names it better.
                    enclosing = Explanation(
                        Classification(
                            match.rule.codepath,
                            below_id(match.rule.id),
                            direction=match.direction,
                        ),
                        i,
                        f"callsite, {frames[callee].name} runs inside the call",
                    )
        return enclosing or Explanation(OTHER, None, "no rule matched any frame")

    def _leaf(
        self, frames: tuple[Frame, ...], i: int, proc_root: Path | None, *, why: bool = True
    ) -> Explanation:
        # Native frames below the innermost Python frame say where the CPU is; they
        # beat a call-site guess about the same instant.
        for j in range(i - 1, -1, -1):
            if frames[j].is_native:
                rule = self._native_rule(frames[j])
                if rule is not None:
                    got = Classification(rule.codepath, rule.id, rule.confidence)
                    return Explanation(got, j, "native, below the innermost Python frame")
        match = self._callsite(frames[i], proc_root)
        if match is None:
            path = source_path(frames[i].filename, proc_root)
            how = "no serializer call on the innermost Python frame's line"
            if path is None:
                how = "innermost Python frame has no readable source path"
            elif why:
                # parses a prefiltered file, so a syntax error is still named (not
                # counted in the stats: they say what classification needed)
                _index, error, _ = self._sources.get(
                    path,
                    root=str(proc_root) if proc_root is not None else None,
                    deadline=self._deadline,
                )
                if error is not None:
                    how = f"innermost Python frame: {error}"
            return Explanation(OTHER, None, how)
        if match.unknown is not None:
            got = Classification("other", None, "low")
            return Explanation(got, i, f"callsite: {match.unknown}")
        if match.codepath is None or match.rule is None:
            got = Classification("other", None, "low", ambiguous=True)
            return Explanation(got, i, "callsite: the line calls two different serializers")
        ambiguous = match.others > 0
        stale = self._stale(frames[i], proc_root)
        low = ambiguous or match.rule.confidence == "low" or stale
        got = Classification(
            match.codepath,
            match.rule.id,
            "low" if low else "high",
            ambiguous=ambiguous,
            direction=match.direction,
        )
        how = "callsite"
        if ambiguous:
            how += f", line also makes {match.others} other call(s)"
        if stale:
            how += ", source changed after the target started"
        return Explanation(got, i, how)


# --- `python -m profiler.classify.classifier`: explain what the rules make of a live stack ------
