"""The `--swap torch` start-up hook (sitecustomize.py) of `serwatt ab`."""
