"""Signal sources. Each module reads one signal and returns frozen dataclasses in
base units (seconds, joules, bytes), or says why the signal is unavailable.

Nothing here imports prometheus_client; only collectors/nvml.py imports pynvml.
"""
