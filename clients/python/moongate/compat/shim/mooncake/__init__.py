"""`mooncake` for code written against Mooncake's Python package, served by moongate: put this
directory's parent first on PYTHONPATH (python3 -m moongate.compat.mooncake --pythonpath)."""
