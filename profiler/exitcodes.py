"""serwatt's exit codes (a contract): 0 ok, 1 runtime failure, 2 usage / bad input, 78 bad config.

Here, not in the CLI, because the daemon returns them too and nothing may import the CLI.
78 is EX_CONFIG from sysexits.h: systemd's unit does not restart on it.
"""

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_CONFIG = 78
