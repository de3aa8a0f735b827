#!/usr/bin/python3
"""GPU memory staged at both ends against host memory, same daemons, same run.

Two daemons without RDMA devices (TCP over loopback) and the CUDA driver emulator
($MOONGATE_CUDA_LIB, with $MOONGATE_CLIENT_LIB). Through Mooncake's Python API
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

Usage: bench_staged.py --moongate BIN [--rounds N] [--size BYTES]
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


def device_memory(size):
    cu = ctypes.CDLL(os.environ["MOONGATE_CUDA_LIB"])
    ctx, d = ctypes.c_void_p(), ctypes.c_uint64()
    assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0 and cu.cuMemAlloc_v2(ctypes.byref(d), size) == 0
    return d.value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=64 << 20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mg-bench-staged-") as work:
        port = free_port()
        pb, sb = start(a.moongate, work, "b", h2c="127.0.0.1:%d" % port)
        pa, sa = start(a.moongate, work, "a", extra=["--peer-port", str(port)])
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


if __name__ == "__main__":
    main()
