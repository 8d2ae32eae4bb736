"""py-spy as a signal source: one sampling window of one process at a time.

plan: what one window runs (the py-spy runs and their rates, the CPU polls);
runner: the py-spy subprocess driver (windows, stop, failures); speedscope: its output
parsed into timed samples (pure); threads: py-spy thread labels mapped to kernel tids.
Imports only collectors.*; never profiler.
"""

from serwatt.collectors.pyspy.plan import DEFAULT_RATE_HZ, SamplingPlan
from serwatt.collectors.pyspy.runner import (
    PYSPY_FLAGS,
    NotPython,
    PtraceDenied,
    PySpy,
    PySpyMissing,
    SamplingError,
    StopEvent,
    TargetGone,
    UnsupportedPython,
    precheck,
)
from serwatt.collectors.pyspy.speedscope import WindowSamples

__all__ = [
    "DEFAULT_RATE_HZ",
    "PYSPY_FLAGS",
    "NotPython",
    "PtraceDenied",
    "PySpy",
    "PySpyMissing",
    "SamplingError",
    "SamplingPlan",
    "StopEvent",
    "TargetGone",
    "UnsupportedPython",
    "WindowSamples",
    "precheck",
]
