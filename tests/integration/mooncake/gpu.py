"""GPU memory through `mooncake.engine` (moongate's shim first on PYTHONPATH), as SGLang's and
vLLM's Mooncake connectors use it: device pointers (from the CUDA driver, libcuda.so.1, or in
the tests its emulator as $MOONGATE_CUDA_LIB) passed to register_memory and to the transfers.

  gpu.py target HOST SIZE
  gpu.py pinned HOST SIZE
      allocates SIZE bytes of device memory (pinned: page-locked host memory, cuMemHostAlloc,
      as cudaHostAlloc makes), registers it and says {"rc", "session", "address", "kind"} in one
      JSON line; then obeys lines on stdin:
        dump OFF LEN   the device bytes there, in hex
        noted LEN      waits for the first notification, then at once the device's first LEN
                       bytes: [name, msg, hex]
        quit
  gpu.py initiator HOST SESSION ADDRESS SIZE
      allocates SIZE bytes of device memory filled with a pattern, registers it, WRITEs it all
      to ADDRESS of SESSION, clears it and READs it back. Says {"register", "kind", "write",
      "read", "same"}.
  gpu.py host HOST SESSION ADDRESS SIZE [NOTE]
      as initiator, but from host memory (a managed buffer); with NOTE, the WRITE carries the
      notification ("gpu", NOTE). Says {"write", "read", "same"}.
  gpu.py unreachable HOST
      registers device memory the driver no longer knows (freed after its allocation) and says
      {"freed": register_memory's answer, "kind"} (the reason is logged on stderr).
  gpu.py on_cuda HOST SESSION ADDRESS SIZE [OFFSET]
      as initiator, on a CUDA stream held by a host function of its own until it is done
      queueing: the pattern's copy into device memory, then transfer_write_on_cuda to
      ADDRESS + OFFSET; then a clearing copy, batch_transfer_read_on_cuda back and the copy out.
      Says {"returned" (both calls returned while their stream was held), "same"}. An OFFSET
      past the target's region makes the WRITE fail on the stream.
"""
import ctypes
import json
import os
import sys
import threading

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

cu = ctypes.CDLL(os.environ.get("MOONGATE_CUDA_LIB") or "libcuda.so.1")


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


def pinned_memory(size):
    ctx, p = ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    assert cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), 0) == 0
    ctypes.memset(p.value, 0, size)
    return p.value


def target(host, size, pinned=False):
    e = engine(host)
    if pinned:  # host memory: read where it lies
        d, read = pinned_memory(size), ctypes.string_at
    else:
        d, read = device_memory(size), from_device
        to_device(d, bytes(size))
    rc = e.register_memory(d, size)
    print(json.dumps({"rc": rc, "session": "%s:%d" % (host, e.get_rpc_port()), "address": d,
                      "kind": e.memory_kind(d)}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "dump":
            print(read(d + int(cmd[1]), int(cmd[2])).hex(), flush=True)
        elif cmd[0] == "noted":
            notes = []
            while not notes:
                notes = e.get_notifies()
            seen = read(d, int(cmd[1])).hex()
            print(json.dumps([notes[0].name, notes[0].msg, seen]), flush=True)
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


def unreachable(host):
    e = engine(host)
    d = device_memory(1 << 20)
    assert cu.cuMemFree_v2(ctypes.c_uint64(d)) == 0
    print(json.dumps({"freed": e.register_memory(d, 1 << 20), "kind": e.memory_kind(d)}),
          flush=True)


def host_initiator(host, session, addr, size, note=None):
    e = engine(host)
    buf = e.allocate_managed_buffer(size)
    data = bytes((i * 7 + 3) & 0xff for i in range(size))
    e.write_bytes_to_buffer(buf, data, size)
    if note is None:
        out = {"write": e.transfer_sync_write(session, buf, addr, size)}
    else:
        out = {"write": e.transfer_sync(session, buf, addr, size, TransferOpcode.Write,
                                        TransferNotify("gpu", note))}
    e.write_bytes_to_buffer(buf, bytes(size), size)
    out["read"] = e.transfer_sync_read(session, buf, addr, size)
    out["same"] = e.read_bytes_from_buffer(buf, size) == data
    print(json.dumps(out), flush=True)


def on_cuda(host, session, addr, size):
    e = engine(host)
    d = device_memory(size)
    data = bytes((i * 7 + 3) & 0xff for i in range(size))
    assert e.register_memory(d, size) == 0
    s, ev = ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(s), 0) == 0 and cu.cuEventCreate(ctypes.byref(ev), 0) == 0
    gate = threading.Event()
    hold = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: gate.wait())
    cu.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, type(hold), ctypes.c_void_p]

    def closed():
        """The stream held until the gate opens: what is queued after runs only then."""
        gate.clear()
        assert cu.cuLaunchHostFunc(s, hold, None) == 0

    def pending():
        """The stream's work queued so far has not ended (CUDA_ERROR_NOT_READY)."""
        assert cu.cuEventRecord(ev, s) == 0
        return cu.cuEventQuery(ev) == 600

    # a WRITE that ran before the copy in (at the call, say) would send zeros
    closed()
    assert cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(d), data, ctypes.c_size_t(size), s) == 0
    e.transfer_write_on_cuda(session, d, addr, size, s.value)
    returned = pending()
    gate.set()
    assert cu.cuStreamSynchronize(s) == 0
    # a READ that ran before the clearing copy, or after the copy out, would leave zeros
    zero, back = bytes(size), ctypes.create_string_buffer(size)
    closed()
    assert cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(d), zero, ctypes.c_size_t(size), s) == 0
    e.batch_transfer_read_on_cuda(session, [d], [addr], [size], s.value)
    assert cu.cuMemcpyDtoHAsync_v2(back, ctypes.c_uint64(d), ctypes.c_size_t(size), s) == 0
    returned = pending() and returned
    gate.set()
    assert cu.cuStreamSynchronize(s) == 0
    print(json.dumps({"returned": returned, "same": back.raw == data}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "host":
        host_initiator(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                       *sys.argv[6:7])
    elif sys.argv[1] == "on_cuda":
        on_cuda(sys.argv[2], sys.argv[3], int(sys.argv[4]) + int((sys.argv[6:] or [0])[0]),
                int(sys.argv[5]))
    elif sys.argv[1] in ("target", "pinned"):
        target(sys.argv[2], int(sys.argv[3]), sys.argv[1] == "pinned")
    elif sys.argv[1] == "unreachable":
        unreachable(sys.argv[2])
    else:
        initiator(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
