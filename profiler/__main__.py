import sys

from profiler.cli.main import main

sys.exit(main())
