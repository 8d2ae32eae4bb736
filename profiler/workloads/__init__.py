"""Workloads serwatt ships: the demo mix and the checkpointing training loop."""
