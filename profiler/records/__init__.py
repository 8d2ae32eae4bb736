"""Run records: every attributed window of every run in one crash-safe SQLite file.

The schema and its upgrades (schema.py), the writer (store.py), the reader (reader.py),
row validation (validation.py), checkpoint rows, run ids and the host fingerprint. May
import collectors and the layers below (classify, sampling, attribution); never the
service, the profile session or the CLI.
"""
