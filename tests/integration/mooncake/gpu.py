"""GPU memory through `mooncake.engine` (moongate's shim first on PYTHONPATH), as SGLang's and
vLLM's Mooncake connectors use it: device pointers (from the CUDA driver, here its emulator as
$MOONGATE_CUDA_LIB) passed to register_memory and to the transfers.

  gpu.py target HOST SIZE
      allocates SIZE bytes of device memory, registers it and says {"rc", "session",
      "address", "kind"} in one JSON line; then obeys lines on stdin:
        dump OFF LEN   the device bytes there, in hex
        quit
  gpu.py initiator HOST SESSION ADDRESS SIZE
      allocates SIZE bytes of device memory filled with a pattern, registers it, WRITEs it all
      to ADDRESS of SESSION, clears it and READs it back. Says {"register", "kind", "write",
      "read", "same"}.
"""
import ctypes
import json
import os
import sys

from mooncake.engine import TransferEngine

cu = ctypes.CDLL(os.environ["MOONGATE_CUDA_LIB"])


def device_memory(size):
    ctx, dptr = ctypes.c_void_p(), ctypes.c_uint64()
    assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0 and cu.cuMemAlloc_v2(ctypes.byref(dptr), size) == 0
    return dptr.value


def to_device(dptr, data):
    assert cu.cuMemcpyHtoD_v2(ctypes.c_uint64(dptr), data, ctypes.c_size_t(len(data))) == 0


def from_device(dptr, n):
    buf = ctypes.create_string_buffer(n)
    assert cu.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(dptr), ctypes.c_size_t(n)) == 0
    return buf.raw


def engine(host):
    e = TransferEngine()
    assert e.initialize(host, "P2PHANDSHAKE", "rdma", "") == 0
    return e


def target(host, size):
    e = engine(host)
    d = device_memory(size)
    to_device(d, bytes(size))
    rc = e.register_memory(d, size)
    print(json.dumps({"rc": rc, "session": "%s:%d" % (host, e.get_rpc_port()), "address": d,
                      "kind": e.memory_kind(d)}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "dump":
            print(from_device(d + int(cmd[1]), int(cmd[2])).hex(), flush=True)
        elif cmd[0] == "quit":
            break


def initiator(host, session, addr, size):
    e = engine(host)
    d = device_memory(size)
    data = bytes((i * 7 + 3) & 0xff for i in range(size))
    to_device(d, data)
    out = {"register": e.register_memory(d, size), "kind": e.memory_kind(d)}
    out["write"] = e.transfer_sync_write(session, d, addr, size)
    to_device(d, bytes(size))
    out["read"] = e.transfer_sync_read(session, d, addr, size)
    out["same"] = from_device(d, size) == data
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "target":
        target(sys.argv[2], int(sys.argv[3]))
    else:
        initiator(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
