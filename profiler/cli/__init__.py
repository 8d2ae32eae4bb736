"""`serwatt` command line: the dispatcher (main) and one module per subcommand.

May import anything in profiler; nothing imports it except the console entry point.
"""
