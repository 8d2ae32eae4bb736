"""Attribution: the node energy and GPU idle time of a window, split over its codepaths.

The energy tracker (RAPL/model/NVML over time), the pure split maths, and the one
attributed-window value every consumer reads. May import collectors, classify, sampling.
"""
