"""The A/B report: compare baseline runs with candidate runs and say what the change is worth.

Statistics, comparability, cluster projection, receipts and rendering are pure functions
of the input dataclasses in `profiler.report.inputs`; this package imports only those,
`profiler.codepaths` (the closed codepath set), `profiler.config` (the line-tracking YAML
checker for the cluster file), numpy, scipy, yaml and blake3 — never records or hardware.
"""
