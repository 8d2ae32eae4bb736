"""The per-node daemon: config, discovery, the sampling loop, the ledger and /metrics.

May import records and the layers below it; never the profile session or the CLI.
"""
