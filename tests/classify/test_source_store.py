"""The on-disk source store (profiler/classify/source_store.py): what indexing a file found,
kept across processes. It must never change a classification: the tests compare a
Classifier answered by the store (a second one, after a first filled it) with one that
indexes every file itself, line by line, on real library files; and it must be safe
as root: a directory others can write, links and entries that are not serwatt's are
refused or read as misses.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from serwatt.collectors.samples import Frame
from serwatt.profiler.classify import source_store
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.source_index import SourceIndex
from serwatt.profiler.classify.source_store import (
    SourceStore,
    StoredIndex,
    decode_table,
    encode_table,
)

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = [
    STDLIB / "multiprocessing" / "queues.py",  # relative import of ForkingPickler
    STDLIB / "multiprocessing" / "connection.py",
    STDLIB / "json" / "tool.py",
    STDLIB / "shelve.py",  # from pickle import Pickler, Unpickler
    STDLIB / "copyreg.py",  # mentions pickle, calls no serializer
    STDLIB / "textwrap.py",  # no serializer at all: a no-match marker
    STDLIB / "pickle.py",  # decided by its python rule: never read
]


def _frames(path: Path, line: int) -> list[tuple[Frame, ...]]:
    # a plain frame and a comprehension's own frame (it runs only the calls inside it)
    return [(Frame(name, str(path), line),) for name in ("f", "<listcomp>")]


def _answers(classifier: Classifier) -> list[object]:
    got: list[object] = []
    for f in FILES:
        for line in range(1, len(f.read_text().splitlines()) + 1):
            for frames in _frames(f, line):
                got.append(
                    (f, line, classifier.classify_frames(frames), classifier.explain(frames))
                )
    return got


def test_a_store_filled_by_one_classifier_answers_another_the_same_on_every_line(
    tmp_path: Path,
) -> None:
    # The reference parses every file itself. Indexes live in-process while a classifier
    # holds them (source_cache._SHARED), so each classifier is gone before the next.
    expected = _answers(Classifier.default(callsite_prefilter=False))
    gc.collect()
    store_dir = tmp_path / "store"
    first = Classifier.default(source_store=SourceStore.open(store_dir))
    for f in FILES:
        first.classify_frames((Frame("f", str(f), 1),))  # fills the store
    assert first.stats.sources_from_store == 0
    del first
    gc.collect()
    written = sorted(p.name for p in store_dir.iterdir())
    assert sum(n.endswith(".index.json") for n in written) >= 4, written
    assert sum(n.endswith(".none") for n in written) >= 1, written  # textwrap at least

    stored = SourceStore.open(store_dir)
    warm = Classifier.default(source_store=stored)
    assert _answers(warm) == expected
    # every file read came from the store: none prefiltered or parsed again
    assert warm.stats.sources_from_store == len(FILES) - 1
    assert warm.stats.source_parses == 0
    assert stored.hits == len(FILES) - 1 and stored.bad == 0


@pytest.mark.parametrize("name", ["pickle.py", "json/decoder.py", "typing.py", "argparse.py"])
def test_a_stored_table_is_the_index_on_every_line(name: str) -> None:
    path = STDLIB / name
    text = path.read_text()
    index = SourceIndex(text, str(path), "json" if "/" in name else None)
    table = index.line_table(10**9)
    assert table is not None
    back = StoredIndex(decode_table(encode_table(index.package, table), index.package))
    fresh = SourceIndex(text, str(path), index.package)
    for line in range(0, len(text.splitlines()) + 3):
        assert back.calls_at(line) == fresh.calls_at(line), line


def test_deep_multiline_calls_are_not_stored_as_a_quadratic_table() -> None:
    # 150 nested calls (the parser allows 200) over 150 lines: each line is covered by
    # every call around it, 11k entries for 150 calls
    text = "x = " + "f(\n" * 150 + "0" + ")" * 150 + "\n"
    index = SourceIndex(text, "<deep>", None)
    assert index.line_table(8 * index.call_count + 4096) is None
    assert index.line_table(10**9) is not None  # the bound, not the file, said no


def test_the_key_is_the_bytes_the_package_and_the_prefilters_rules(tmp_path: Path) -> None:
    store = SourceStore.open(tmp_path / "s")
    a = store.entry(b"import pickle\n", "pkg", "rules-1")
    assert a.key == store.entry(b"import pickle\n", "pkg", "rules-1").key
    assert a.key != store.entry(b"import pickle \n", "pkg", "rules-1").key
    assert a.key != store.entry(b"import pickle\n", "other", "rules-1").key
    assert a.key != store.entry(b"import pickle\n", None, "rules-1").key
    b = store.entry(b"import pickle\n", "pkg", "rules-2")
    assert a.key == b.key and a.tag != b.tag  # a rules change asks the prefilter again
    a.put_no_match()
    assert a.no_match() and not b.no_match()
    # another package's table under this key is not this file's
    index = SourceIndex("import pickle\npickle.dumps(1)\n", "<t>", "pkg")
    a.put_index(index)
    other = source_store.StoreEntry(store, a.key, "other", None)
    assert a.index() is not None and other.index() is None


def test_entries_that_are_not_serwatts_are_misses_and_never_followed(tmp_path: Path) -> None:
    store = SourceStore.open(tmp_path / "s")
    src = "import pickle\nx = pickle.loads(b'')\n"
    entry = store.entry(src.encode(), None, None)
    path = store.directory / f"{entry.key}.index.json"
    for planted in (b"", b"{", b'{"format": "serwatt.source-index/1", "package": null}',
                    json.dumps({"format": source_store.FORMAT, "package": None,
                                "sites": [["a", None, 2, 1, 1, 0, 0, 0]],
                                "lines": [[1, 0, 0, [0]]]}).encode(),
                    json.dumps({"format": source_store.FORMAT, "package": None,
                                "sites": [], "lines": [[1, 0, 0, [7]]]}).encode()):  # fmt: skip
        path.write_bytes(planted)
        assert entry.index() is None, planted
    path.unlink()
    secret = tmp_path / "elsewhere.json"
    secret.write_bytes(encode_table(None, {}))
    path.symlink_to(secret)
    assert entry.index() is None  # a link is not read, even to a valid table
    assert store.bad == 6
    marker = store.directory / "m.none"
    marker.symlink_to(secret)
    assert not store._has_marker("m.none")


def test_a_directory_others_can_write_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky, like /tmp: another user could still create an entry first
    store = SourceStore.open(shared)
    assert store.problem is not None and "other users can write it" in store.problem
    entry = store.entry(b"x = 1\n", None, "rules")
    entry.put_no_match()
    assert list(shared.iterdir()) == [] and not entry.no_match()
    # a link another user planted there is not followed, not even by the mkdir
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(target, shared / "evil")
    os.lchown(shared / "evil", 65534, 65534)
    store = SourceStore.open(shared / "evil" / "sub")
    assert store.problem is not None and "symbolic link owned by uid 65534" in store.problem
    assert list(target.iterdir()) == []


def test_a_new_store_is_made_private(tmp_path: Path) -> None:
    store = SourceStore.open(tmp_path / "a" / "b")
    assert store.problem is None
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700


def test_opening_a_full_store_removes_the_oldest_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_store, "MAX_ENTRIES", 10)
    d = tmp_path / "s"
    SourceStore.open(d)
    for i in range(12):
        (d / f"{i:02d}.x.none").write_bytes(b"")
        os.utime(d / f"{i:02d}.x.none", ns=(10**9 * i, 10**9 * i))
    (d / "keep.txt").write_bytes(b"")  # not an entry: left alone
    SourceStore.open(d)
    assert sorted(p.name for p in d.iterdir()) == [f"{i:02d}.x.none" for i in range(7, 12)] + [
        "keep.txt"
    ]


def test_serwatt_profile_fills_the_store_and_off_leaves_none(tmp_path: Path) -> None:
    """Through the command line: the default store under --source-store, and `off`."""
    job = tmp_path / "job.py"
    job.write_text(
        "import json, time\nend = time.time() + 1.5\nwhile time.time() < end:\n"
        "    s = json.dumps({'k': list(range(300))})\n"
    )
    store = tmp_path / "store"
    serwatt = Path(sys.executable).parent / "serwatt"
    for option in (["--source-store", str(store)], ["--source-store", "off"]):
        out = subprocess.run(
            [str(serwatt), "profile", *option, "--json", str(tmp_path / "p.json"),
             "--", sys.executable, str(job)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
    names = [p.name for p in store.iterdir()]
    assert any(n.endswith(".index.json") for n in names), names  # job.py itself calls json
    assert len(list(tmp_path.glob("*"))) == 3  # job.py, p.json, store: `off` made nothing
    shared = tmp_path / "open"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    out = subprocess.run(
        [str(serwatt), "profile", "--source-store", str(shared), "--", sys.executable, "-c", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "note: source store" in out.stderr and "other users can write it" in out.stderr


def test_without_serwatts_own_sources_the_store_is_off_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key hashes serwatt's indexing code; an install without its .py files (a zipapp,
    .pyc only) cannot key entries, so it stores nothing rather than failing the run."""
    monkeypatch.setattr(source_store.source_index, "__file__", str(tmp_path / "gone.py"))
    store = SourceStore.open(tmp_path / "s")
    assert store.problem is not None and "cannot hash serwatt's own indexing code" in store.problem
    entry = store.entry(b"x = 1\n", None, "rules")
    entry.put_no_match()
    assert not (tmp_path / "s").exists() and not entry.no_match()
