"""`serwatt profile`: a session of back-to-back windows over one process tree, and its outputs.

The session and its sinks (energy, record), the serwatt.profile/1 document and the table.
May import records and the layers below it; never the service or the CLI.
"""
