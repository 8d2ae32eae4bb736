"""Classification: which serialization codepath a sampled stack is in, and why.

Codepaths, rule files, the classifier and call-site reading of target sources.
May import collectors.samples and the standard library; nothing else from profiler.
"""
