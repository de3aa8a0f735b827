"""nixl._api: NIXL's agent on moongate (moongate.compat.nixl)."""
from moongate.compat.nixl import (  # noqa: F401
    DEFAULT_COMM_PORT, nixl_agent, nixl_agent_config, nixl_backend_handle,
    nixl_prepped_dlist_handle, nixl_thread_sync_t, nixl_xfer_handle)

__all__ = [
    "DEFAULT_COMM_PORT", "nixl_agent", "nixl_agent_config", "nixl_backend_handle",
    "nixl_prepped_dlist_handle", "nixl_thread_sync_t", "nixl_xfer_handle"]
