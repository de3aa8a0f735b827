"""`nixl` for code written against NIXL's Python package, served by moongate: put this
directory's parent first on PYTHONPATH (python3 -m moongate.compat.nixl --pythonpath). As NIXL's
package, it exports nixl._api's public names."""
from nixl._api import (  # noqa: F401
    DEFAULT_COMM_PORT, nixl_agent, nixl_agent_config, nixl_backend_handle,
    nixl_prepped_dlist_handle, nixl_thread_sync_t, nixl_xfer_handle)

__all__ = [
    "DEFAULT_COMM_PORT", "nixl_agent", "nixl_agent_config", "nixl_backend_handle",
    "nixl_prepped_dlist_handle", "nixl_thread_sync_t", "nixl_xfer_handle"]
