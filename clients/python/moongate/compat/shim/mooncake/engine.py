"""mooncake.engine: Mooncake's TransferEngine on moongate (moongate.compat.mooncake)."""
from moongate.compat.mooncake import TransferEngine, TransferNotify, TransferOpcode  # noqa: F401
