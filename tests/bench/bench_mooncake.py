#!/usr/bin/python3
"""Mooncake's APIs on moongate against moongate's own, same daemons, same run: what the drop-in
shapes cost.

Two daemons (TCP over loopback); a target engine on b with a managed buffer; on a, the same
transfers made three ways, alternating, --rounds each:
  native:   moongate.Client.transfer (Submit with wait, one Blocks group, by agent and address)
  python:   mooncake.engine.TransferEngine (moongate.compat.mooncake), batch_transfer_sync_write
  c:        libtransfer_engine.so through ctypes: allocateBatchID, submitTransfer, getTransferStatus
            polled until every task completed, freeBatchID (the polling loop is Python's)
Shapes: --blocks blocks of --block-bytes (throughput, GB/s) and one WRITE of --small bytes
(latency, us). Medians, and each way's ratio to native.

Usage: bench_mooncake.py --moongate BIN --lib BUILD/libtransfer_engine.so [--rounds N]
"""
import argparse
import ctypes
import fcntl
import mmap
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moongate_client as mg  # noqa: E402
from bench_memory import free_port, start  # noqa: E402
from bench_names import alternate, line, timed  # noqa: E402
from moongate.compat.mooncake import TransferEngine  # noqa: E402
from moongate.v1 import transfer_pb2  # noqa: E402


class Req(ctypes.Structure):  # transfer_request_t
    _fields_ = [("opcode", ctypes.c_int), ("source", ctypes.c_void_p),
                ("target_id", ctypes.c_int32), ("target_offset", ctypes.c_uint64),
                ("length", ctypes.c_uint64)]


class Status(ctypes.Structure):  # transfer_status_t
    _fields_ = [("status", ctypes.c_int), ("transferred_bytes", ctypes.c_uint64)]


def c_api(path):
    te = ctypes.CDLL(path)
    te.createTransferEngine.restype = ctypes.c_void_p
    te.createTransferEngine.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_uint64, ctypes.c_int]
    te.registerLocalMemory.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_char_p, ctypes.c_int]
    te.openSegment.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    te.allocateBatchID.restype = ctypes.c_uint64
    te.allocateBatchID.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    te.submitTransfer.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(Req),
                                  ctypes.c_size_t]
    te.getTransferStatus.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t,
                                     ctypes.POINTER(Status)]
    te.freeBatchID.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    te.destroyTransferEngine.argtypes = [ctypes.c_void_p]
    return te


def sealed(size):
    """A memfd kept open and mapped (registered by descriptor through the C API)."""
    fd = os.memfd_create("bench", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    mm = mmap.mmap(fd, size)
    return fd, mm, mg.address_of(mm)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--block-bytes", type=int, default=64 << 10)
    ap.add_argument("--small", type=int, default=4096)
    a = ap.parse_args()
    size = a.blocks * a.block_bytes
    with tempfile.TemporaryDirectory(prefix="mg-bench-mc-") as work:
        port = free_port()
        pb, sb = start(a.moongate, work, "b", h2c="127.0.0.1:%d" % port)
        pa, sa = start(a.moongate, work, "a", extra=["--peer-port", str(port)])
        try:
            run(a, sa, sb, size)
        finally:
            for p in (pa, pb):
                p.terminate()
                p.wait()


def run(a, sa, sb, size):
    os.environ["MOONGATE_SOCKET"] = sb
    target = TransferEngine()
    assert target.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    taddr, session = target.allocate_managed_buffer(size), "127.0.0.1:%d" % target.get_rpc_port()
    os.environ["MOONGATE_SOCKET"] = sa
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = e.allocate_managed_buffer(size)
    c = mg.Client("unix:" + sa)
    nbuf = c.allocate_buffer(size)
    te = c_api(a.lib)
    ce = te.createTransferEngine(b"P2PHANDSHAKE", b"127.0.0.1", b"127.0.0.1", 0, 1)
    fd, mm, caddr = sealed(size)
    assert ce and te.registerLocalMemory(ce, caddr, size, b"cpu:0", 1) == 0
    seg = te.openSegment(ce, session.encode())
    assert seg > 0

    def native(n, nbytes):
        offs = [k * nbytes for k in range(n)]
        bl = transfer_pb2.Blocks(op=transfer_pb2.WRITE, local_address=nbuf.address,
                                 local_offsets=offs, remote_agent=session, remote_address=taddr,
                                 remote_offsets=offs, lengths=[nbytes] * n)
        r = c._call(c.transfers.Submit, transfer_pb2.SubmitRequest(blocks=[bl], wait=True))
        assert r.batch.state == transfer_pb2.DONE

    def python(n, nbytes):
        assert e.batch_transfer_sync_write(session, [src + k * nbytes for k in range(n)],
                                           [taddr + k * nbytes for k in range(n)],
                                           [nbytes] * n) == 0

    def c_way(n, nbytes):
        reqs = (Req * n)(*[Req(1, caddr + k * nbytes, seg, taddr + k * nbytes, nbytes)
                           for k in range(n)])
        b, st = te.allocateBatchID(ce, n), Status()
        assert te.submitTransfer(ce, b, reqs, n) == 0
        for k in range(n):
            while te.getTransferStatus(ce, b, k, ctypes.byref(st)) == 0 and st.status < 3:
                pass
            assert st.status == 4, st.status
        assert te.freeBatchID(ce, b) == 0

    ways = {"native": native, "python": python, "c": c_way}
    for w in ways.values():
        w(a.blocks, a.block_bytes)
    gb = alternate(list(ways), a.rounds,
                   lambda w: size / timed(lambda: ways[w](a.blocks, a.block_bytes)) / 1e9)
    us = alternate(list(ways), a.rounds * 20,
                   lambda w: timed(lambda: ways[w](1, a.small)) * 1e6)
    print("WRITE of %d blocks of %d KiB to a peer's engine over TCP, %d rounds (medians, GB/s)"
          % (a.blocks, a.block_bytes >> 10, a.rounds))
    line("native moongate.Client", gb["native"], "GB/s")
    line("mooncake.engine (Python)", gb["python"], "GB/s", gb["native"])
    line("transfer_engine_c.h (C)", gb["c"], "GB/s", gb["native"])
    print("one WRITE of %d bytes, %d rounds (medians, us)" % (a.small, a.rounds * 20))
    line("native moongate.Client", us["native"], "us")
    line("mooncake.engine (Python)", us["python"], "us", us["native"])
    line("transfer_engine_c.h (C)", us["c"], "us", us["native"])
    te.destroyTransferEngine(ce)
    mm.close()
    os.close(fd)


if __name__ == "__main__":
    main()
