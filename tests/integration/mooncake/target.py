"""A Mooncake target process, as Mooncake's users write one (`from mooncake.engine import
TransferEngine`, run with moongate's shim first on PYTHONPATH): it initializes with P2PHANDSHAKE,
allocates a managed buffer, says where it is (one JSON line) and obeys lines on stdin:

  dump OFF LEN   the buffer's bytes there, in hex
  peek ADDR LEN  the bytes at an address of memory it registered, in hex
  fill OFF HEX   writes them (write_bytes_to_buffer)
  notifies       the notifications so far (get_notifies), as JSON [[name, msg], ...] (a name or
                 msg that came as bytes as {"bytes": HEX})
  quit

Usage: target.py HOST SIZE
"""
import ctypes
import fcntl
import json
import mmap
import os
import sys

from mooncake.engine import TransferEngine


def as_json(v):
    return {"bytes": v.hex()} if isinstance(v, bytes) else v


def main():
    host, size = sys.argv[1], int(sys.argv[2])
    engine = TransferEngine()
    rc = engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
    addr = engine.allocate_managed_buffer(size) if rc == 0 else 0
    # and memory of its own, mapped from a memfd it keeps open (sealed: RDMA may register it)
    fd = os.memfd_create("kv", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 1 << 16)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    shared = mmap.mmap(fd, 1 << 16)
    saddr = ctypes.addressof(ctypes.c_char.from_buffer(shared))
    src = engine.register_memory(saddr, 1 << 16)
    print(json.dumps({"rc": rc or src, "session": "%s:%d" % (host, engine.get_rpc_port()),
                      "address": addr, "shared": saddr,
                      "shared_kind": engine.memory_kind(saddr)}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "dump":
            print(engine.read_bytes_from_buffer(addr + int(cmd[1]), int(cmd[2])).hex(),
                  flush=True)
        elif cmd[0] == "peek":
            print(engine.read_bytes_from_buffer(int(cmd[1]), int(cmd[2])).hex(), flush=True)
        elif cmd[0] == "fill":
            data = bytes.fromhex(cmd[2])
            print(engine.write_bytes_to_buffer(addr + int(cmd[1]), data, len(data)), flush=True)
        elif cmd[0] == "notifies":
            print(json.dumps([[as_json(n.name), as_json(n.msg)] for n in engine.get_notifies()]),
                  flush=True)
        elif cmd[0] == "quit":
            break


if __name__ == "__main__":
    main()
