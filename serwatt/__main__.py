"""`python -m serwatt`: the `serwatt` command."""

import sys

from serwatt.profiler.cli.main import main

sys.exit(main())
