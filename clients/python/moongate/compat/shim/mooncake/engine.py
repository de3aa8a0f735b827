"""mooncake.engine: Mooncake's TransferEngine on moongate (moongate.compat.mooncake), with the
module-level names Mooncake's module has: the SUPPORT_* flags of its build, TransferOpcode and
its members Read and Write, TransferNotify."""
from moongate.compat.mooncake import (  # noqa: F401
    SUPPORT_CUDA, SUPPORT_EFA, SUPPORT_HIP, SUPPORT_INTRA_NVLINK, SUPPORT_MNNVL, Read,
    TransferEngine, TransferNotify, TransferOpcode, Write)
