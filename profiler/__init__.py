"""serwatt: attribution of CPU time, energy and GPU-wait to serialization codepaths."""

__version__ = "0.1.0"
