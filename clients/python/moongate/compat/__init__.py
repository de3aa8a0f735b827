"""APIs of other transfer libraries on moongate: mooncake (Mooncake's TransferEngine) and nixl
(NIXL's Python agent). Each is importable under its own name from the shim directory that
`python3 -m moongate.compat.<name> --pythonpath` prints."""
import os
import sys


def pythonpath_main(name, imports):
    """`python3 -m moongate.compat.NAME --pythonpath`: prints the shim directory, then where the
    moongate package lies, for PYTHONPATH; else the usage (`imports`: what it makes work)."""
    if sys.argv[1:] == ["--pythonpath"]:
        here = os.path.dirname(os.path.abspath(__file__))
        print(os.pathsep.join([os.path.join(here, "shim"),
                               os.path.dirname(os.path.dirname(here))]))
        return 0
    print("usage: python3 -m moongate.compat.%s --pythonpath\n"
          "  prints the directory to put first on PYTHONPATH for `%s` to load this module" % (
              name, imports))
    return 2
