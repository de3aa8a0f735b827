#!/usr/bin/python3
"""GPU memory staged at both ends against host memory, same daemons, same run.

Two daemons with RDMA off (TCP over loopback) and the CUDA driver ($MOONGATE_CUDA_LIB: the
tests' emulator; else libcuda.so.1, with $MOONGATE_CLIENT_LIB). Through Mooncake's Python API
(moongate.compat.mooncake), one WRITE of --size bytes to a peer's engine, two ways alternated,
--rounds each:
  host:    a managed buffer to a managed buffer (the daemons move the bytes in place)
  device:  device memory to device memory, each registered with register_memory and so staged
           (no RDMA path): this process's copy thread moves the bytes out of its device into its
           daemon's staging buffer, the target process's (tests/integration/mooncake/gpu.py)
           into its device
Medians of the rounds, their spread, and device/host. The emulator's device copies are memcpy
on the same cores as the TCP loopback; a GPU's are DMA (tests/gpu/check.sh prints the real
figure on a GPU node).

--verify then writes a pattern device to device, clears the source, READs it back through the
peer's device and compares (tests/gpu/check.sh runs it so on a GPU node).

Usage: bench_staged.py --moongate BIN [--rounds N] [--size BYTES] [--port P] [--verify]
  --port: the target daemon's h2c port (default: one the kernel picks)
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, HERE)
from bench_memory import free_port, start  # noqa: E402
from bench_names import alternate, timed  # noqa: E402
from moongate.compat.mooncake import TransferEngine  # noqa: E402


def engine(sock):
    os.environ["MOONGATE_SOCKET"] = sock
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return e


def cuda():
    return ctypes.CDLL(os.environ.get("MOONGATE_CUDA_LIB") or "libcuda.so.1")


def device_memory(size):
    cu = cuda()
    ctx, d = ctypes.c_void_p(), ctypes.c_uint64()
    assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0 and cu.cuMemAlloc_v2(ctypes.byref(d), size) == 0
    return d.value


def verify(e, d, where, size):
    """A pattern written device to the peer's device, the source cleared, read back: equal?"""
    cu = cuda()
    data = (bytes(range(251)) * (size // 251 + 1))[:size]
    assert cu.cuMemcpyHtoD_v2(ctypes.c_uint64(d), data, ctypes.c_size_t(size)) == 0
    assert e.transfer_sync_write(where["session"], d, where["address"], size) == 0
    assert cu.cuMemcpyHtoD_v2(ctypes.c_uint64(d), bytes(size), ctypes.c_size_t(size)) == 0
    assert e.transfer_sync_read(where["session"], d, where["address"], size) == 0
    back = ctypes.create_string_buffer(size)
    assert cu.cuMemcpyDtoH_v2(back, ctypes.c_uint64(d), ctypes.c_size_t(size)) == 0
    return back.raw == data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=64 << 20)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--verify", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mg-bench-staged-") as work:
        port = a.port or free_port()
        off = ["--ibverbs-lib", ""]  # staged at both ends, even where the node has RDMA
        pb, sb = start(a.moongate, work, "b", h2c="127.0.0.1:%d" % port, extra=off)
        pa, sa = start(a.moongate, work, "a", extra=["--peer-port", str(port)] + off)
        client = os.path.join(HERE, "..", "..", "clients", "python")
        env = dict(os.environ, MOONGATE_SOCKET=sb, PYTHONPATH=os.pathsep.join(
            [os.path.join(client, "moongate", "compat", "shim"), client]))
        t = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "integration", "mooncake",
                                                           "gpu.py"), "target", "127.0.0.1",
                              str(a.size)], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        try:
            where = json.loads(t.stdout.readline())
            assert where["rc"] == 0 and where["kind"] == "device", where
            run(a, sa, sb, where)
        finally:
            t.stdin.close()
            t.wait()
            for p in (pa, pb):
                p.terminate()
                p.wait()


def run(a, sa, sb, where):
    host_target = engine(sb)
    taddr = host_target.allocate_managed_buffer(a.size)
    host_session = "127.0.0.1:%d" % host_target.get_rpc_port()
    e = engine(sa)
    src = e.allocate_managed_buffer(a.size)
    d = device_memory(a.size)
    rc = e.register_memory(d, a.size)
    assert rc == 0 and e.memory_kind(d) == "device"
    ways = {
        "host": lambda: e.transfer_sync_write(host_session, src, taddr, a.size),
        "device": lambda: e.transfer_sync_write(where["session"], d, where["address"], a.size),
    }
    for w in ways.values():
        assert w() == 0

    def once(w):
        secs = timed(lambda: ways[w]() == 0 or sys.exit("%s failed" % w))
        return a.size / secs / 1e9

    gb = alternate(list(ways), a.rounds, once)
    ratios = [x / y for x, y in zip(gb["device"], gb["host"])]
    print("one WRITE of %d MiB to a peer's engine over TCP, no RDMA, %d rounds alternated "
          "(medians [min-max], GB/s)" % (a.size >> 20, a.rounds))
    for w in ways:
        print("  %-40s %6.3f [%.3f-%.3f]" % (
            {"host": "host -> host (managed buffers)",
             "device": "device -> device, staged at both ends"}[w],
            statistics.median(gb[w]), min(gb[w]), max(gb[w])))
    print("  device / host %.3f [%.3f-%.3f] (median of the rounds' ratios); the figure "
          "sought: >= 0.6" % (statistics.median(ratios), min(ratios), max(ratios)))
    if a.verify:
        same = verify(e, d, where, a.size)
        print("verify: %d bytes written device -> peer device and read back through mooncake."
              "engine (staged): %s" % (a.size, "equal" if same else "DIFFERENT"))
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
