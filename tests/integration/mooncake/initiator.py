"""A Mooncake initiator process following the calls Mooncake's users make (vLLM's and SGLang's
connectors, Mooncake's own initiator test): sync and async writes and reads, batches, status
polling, notifications, failures. Each step's outcome goes in one JSON object on stdout; the
test compares them with what Mooncake's API answers.

Usage: initiator.py TARGET_SESSION TARGET_ADDRESS FIRST_ADDRESS
(FIRST_ADDRESS: the buffer the target registered first, what get_first_buffer_address answers)
"""
import json
import os
import sys

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

MiB = 1 << 20


def main():
    target, taddr, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    out = {}
    e = TransferEngine()
    out["initialize"] = e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "")
    src, dst = e.allocate_managed_buffer(MiB), e.allocate_managed_buffer(MiB)
    out["allocated"] = bool(src and dst and src != dst)
    data = os.urandom(256 * 1024)
    out["write_bytes"] = e.write_bytes_to_buffer(src, data, len(data))
    out["read_bytes_same"] = e.read_bytes_from_buffer(src, len(data)) == data

    # sync, one buffer
    out["sync_write"] = e.transfer_sync_write(target, src, taddr, len(data))
    out["sync_read"] = e.transfer_sync_read(target, dst, taddr, len(data))
    out["sync_same"] = e.read_bytes_from_buffer(dst, len(data)) == data

    # sync batches: 16 blocks of 4 KiB to [taddr + 512 KiB, ...), back in reverse order
    n = 16
    srcs = [src + i * 4096 for i in range(n)]
    peers = [taddr + 512 * 1024 + i * 4096 for i in range(n)]
    out["batch_sync_write"] = e.batch_transfer_sync_write(target, srcs, peers, [4096] * n)
    backs = [dst + 256 * 1024 + (n - 1 - i) * 4096 for i in range(n)]
    out["batch_sync_read"] = e.batch_transfer_sync_read(target, backs, peers, [4096] * n)
    got = e.read_bytes_from_buffer(dst + 256 * 1024, n * 4096)
    out["batch_same"] = all(got[(n - 1 - i) * 4096:(n - i) * 4096] == data[i * 4096:(i + 1) * 4096]
                            for i in range(n))

    # async: a write waited for with get_batch_transfer_status, a read polled
    bid = e.batch_transfer_async_write(target, [src], [taddr + 768 * 1024], [64 * 1024])
    out["async_write_id"] = bid != 0
    out["batch_status"] = e.get_batch_transfer_status([bid])
    bid = e.batch_transfer_async_read(target, [dst + 768 * 1024], [taddr + 768 * 1024],
                                      [64 * 1024])
    polls, st = 0, 0
    while st == 0:
        st = e.transfer_check_status(bid)
        polls += 1
    out["check_status"] = st
    out["check_status_after_free"] = e.transfer_check_status(bid)
    out["async_same"] = e.read_bytes_from_buffer(dst + 768 * 1024, 64 * 1024) == data[:64 * 1024]
    bid = e.transfer_submit_write(target, src, taddr + 896 * 1024, 4096)
    st = 0
    while st == 0:
        st = e.transfer_check_status(bid)
    out["submit_write"] = st

    # notifications with transfers
    out["sync_notify"] = e.transfer_sync(target, src, taddr, 4096, TransferOpcode.Write,
                                         notify=TransferNotify("req-1", "written"))
    out["batch_notify"] = e.batch_transfer_sync(target, [dst], [taddr], [4096],
                                                TransferEngine.TransferOpcode.Read,
                                                TransferNotify("req-2", "read"))
    # bytes of any value (a pickled message), NUL included
    out["bytes_notify"] = e.transfer_sync(target, src, taddr, 4096, TransferOpcode.Write,
                                          notify=TransferNotify("req-3", b"\x80\x04\x00\xffend"))

    # names
    out["first_buffer"] = e.get_first_buffer_address(target) == first
    out["probe"] = e.send_probe(target)
    host = target.rpartition(":")[0]
    out["probe_unknown"] = e.send_probe(host + ":1")

    # failures
    out["unknown_sync"] = e.transfer_sync_write(host + ":1", src, taddr, 4096)
    out["unknown_async"] = e.batch_transfer_async_write(host + ":1", [src], [taddr], [4096])
    out["beyond_region"] = e.transfer_sync_read(target, dst, taddr + MiB - 100, 4096)
    out["mismatch"] = e.batch_transfer_sync_write(target, [src, src], [taddr], [1, 1])

    # memory the caller allocated: process memory, the local side of transfers
    heap = bytearray(data[:64 * 1024])
    haddr = (__import__("ctypes").c_char * len(heap)).from_buffer(heap)
    addr = __import__("ctypes").addressof(haddr)
    out["register"] = e.register_memory(addr, len(heap))
    out["kind"] = [e.memory_kind(addr), e.memory_kind(src)]
    out["overlap"] = e.register_memory(addr + 4096, 4096)
    out["heap_write"] = e.transfer_sync_write(target, addr, taddr + MiB - 64 * 1024, len(heap))
    out["unregister"] = e.unregister_memory(addr)
    out["unregister_again"] = e.unregister_memory(addr)
    del haddr
    out["free"] = e.free_managed_buffer(src, MiB)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
