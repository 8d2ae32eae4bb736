"""The save function call a sample is in (profiler/classify/saver.py): the innermost
frame of the job's own files named like a save, keyed by where it was called from."""

from __future__ import annotations

from serwatt.collectors.samples import Frame
from serwatt.profiler.classify.saver import saver_call

JOB = "/srv/job/train.py"
STDLIB_JSON = "/usr/lib/python3.11/json/__init__.py"
TORCH = "/opt/venv/lib/python3.11/site-packages/torch/serialization.py"


def stack(*frames: tuple[str, str, int]) -> list[Frame]:
    """Leaf first, as py-spy gives them."""
    return [Frame(name=n, filename=f, line=ln) for n, f, ln in frames]


def test_the_jobs_save_function_keyed_by_its_call_site() -> None:
    main = ("main", JOB, 700)
    train = ("train", JOB, 575)
    prep = stack(("<dictcomp>", JOB, 306), ("save_json", JOB, 301), train, main)
    dump = stack(
        ("iterencode", STDLIB_JSON.replace("__init__", "encoder"), 258),
        ("dump", STDLIB_JSON, 179),
        ("save_json", JOB, 312),
        train,
        main,
    )
    key = f"{JOB}:save_json called at {JOB}:575"
    # the same call whatever line of it ran; json's own `dump` is no job's save function
    assert saver_call(prep) == saver_call(dump) == key
    # a second call from another line of train is another call
    other = stack(("save_json", JOB, 301), ("train", JOB, 590), main)
    assert saver_call(other) != key and saver_call(other).endswith(f"{JOB}:590")


def test_no_save_function_of_the_job_gives_no_key() -> None:
    # torch.save straight from a training loop (nanoGPT): torch's `save` is a package's
    direct = stack(("save", TORCH, 651), ("<module>", JOB, 290))
    assert saver_call(direct) == ""
    assert saver_call(stack(("forward", JOB, 40), ("train", JOB, 560))) == ""
    assert saver_call([]) == ""


def test_native_frames_are_skipped_and_the_innermost_save_function_counts() -> None:
    frames = [
        Frame(name="memcpy", filename="libc.so.6", line=0, module="/lib/libc.so.6"),
        Frame(name="Checkpointer.save", filename=JOB, line=80),
        Frame(name="save_checkpoint", filename=JOB, line=120),
        Frame(name="<module>", filename=JOB, line=300),
    ]
    assert saver_call(frames) == f"{JOB}:Checkpointer.save called at {JOB}:120"
    # the outermost frame has no caller to key it by
    assert saver_call([Frame("dump_state", JOB, 9)]) == f"{JOB}:dump_state called at ?"
