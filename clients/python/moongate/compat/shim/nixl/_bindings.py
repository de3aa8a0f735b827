"""nixl._bindings: what NIXL's binding module gives Python code (its exception classes, the
transfer telemetry, descriptor lists, enums), from moongate.compat.nixl."""
from moongate.compat.nixl import (  # noqa: F401
    BLK_SEG, DEFAULT_COMM_PORT, DRAM_SEG, FILE_SEG, NIXL_INIT_AGENT, NIXL_READ, NIXL_WRITE,
    OBJ_SEG, VRAM_SEG, nixl_mem_t, nixlBackendError, nixlCancelledError, nixlInvalidParamError,
    nixlMismatchError, nixlNoTelemetryError, nixlNotAllowedError, nixlNotFoundError,
    nixlNotPostedError, nixlNotSupportedError, nixlRegDList, nixlRemoteDisconnectError,
    nixlRepostActiveError, nixlUnknownError, nixlXferDList, nixlXferTelemetry)

__all__ = [
    "BLK_SEG", "DEFAULT_COMM_PORT", "DRAM_SEG", "FILE_SEG", "NIXL_INIT_AGENT", "NIXL_READ",
    "NIXL_WRITE", "OBJ_SEG", "VRAM_SEG", "nixl_mem_t", "nixlBackendError",
    "nixlCancelledError", "nixlInvalidParamError", "nixlMismatchError", "nixlNoTelemetryError",
    "nixlNotAllowedError", "nixlNotFoundError", "nixlNotPostedError", "nixlNotSupportedError",
    "nixlRegDList", "nixlRemoteDisconnectError", "nixlRepostActiveError", "nixlUnknownError",
    "nixlXferDList", "nixlXferTelemetry"]
