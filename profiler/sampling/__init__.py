"""Sampling: one window of one target, from py-spy samples and /proc CPU to a WindowReport.

Collects (collectors/pyspy, collectors/procstat), classifies and weights samples by CPU.
May import collectors and profiler.classify.
"""
