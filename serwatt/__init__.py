"""serwatt: attribution of CPU time, energy and GPU-wait to serialization codepaths.

The one top-level import name. `serwatt.profiler` and `serwatt.collectors` are the
repository's profiler/ and collectors/ folders (pyproject's package-dir; in a checkout, the
links beside this file). Imports nothing, so importing a collector imports no profiler code.
"""
