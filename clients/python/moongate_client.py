"""moongate_client: the name moongate.client had first; the same module (see moongate/client.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moongate import client  # noqa: E402

sys.modules[__name__] = client
