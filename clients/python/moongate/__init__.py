"""moongate: the Python client of the moongate daemon.

    import moongate as mg
    with mg.Client("unix:/run/moongate/moongate.sock") as c: ...

Modules: moongate.client (Client, AsyncClient; re-exported here), moongate.pool (BufferPool:
leases in the shape TransferQueue uses), moongate.compat.mooncake (Mooncake's TransferEngine on
moongate). The stubs of moongate's protos are moongate.v1: an installed package ships them; in
a source tree they are generated at first use (gen_stubs.py) into $MOONGATE_PYGEN, else
build/pygen of the tree, unless a directory on sys.path already holds them.
"""
import os
import sys


def _stubs_path():
    """The directory holding moongate/v1 generated from the protos, for a source tree."""
    for entry in sys.path:
        if os.path.isfile(os.path.join(entry or ".", "moongate", "v1", "memory_pb2.py")):
            return entry or "."
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))
    from gen_stubs import generate
    out = generate(os.environ.get("MOONGATE_PYGEN") or os.path.join(here, "..", "..", "..",
                                                                    "build", "pygen"))
    sys.path.append(out)  # the standard protos' stubs (mgstd) too
    return out


if not os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), "v1",
                                   "memory_pb2.py")):
    __path__.append(os.path.join(_stubs_path(), "moongate"))

from moongate.client import *  # noqa: E402,F401,F403
from moongate.client import __all__  # noqa: E402,F401
