"""Memory blocks of the process's own, as Mooncake's users register KV-cache pools: anonymous
mmap blocks (no file behind them) registered with `batch_register_memory` or `register_memory`,
then a peer's target. Written against `mooncake.engine` only (moongate's shim first on
PYTHONPATH).

  blocks.py target HOST N SIZE [batch]
      maps N blocks of SIZE bytes, fills block i with the byte i + 1, registers them and says
      {"rc", "session", "blocks": [addr, ...]} in one JSON line; then obeys lines on stdin:
        peek ADDR LEN   the bytes at ADDR, in hex
        quit
  blocks.py initiator HOST TARGET N SIZE
      maps a receive block of SIZE bytes and registers it; asks get_first_buffer_address; READs
      every block of the target (named by the addresses of its JSON line, read from stdin),
      checks each, then WRITEs the byte 0xee over the first 4 KiB of every block. Says
      {"first": addr, "reads": [rc, ...], "same": [bool, ...], "writes": [rc, ...]}.
"""
import ctypes
import json
import mmap
import sys

from mooncake.engine import TransferEngine


def block(size):
    """An anonymous private mapping (what malloc gives for large sizes) and its address."""
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def target(host, n, size, batch):
    engine = TransferEngine()
    rc = engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
    blocks = [block(size) for _ in range(n)]
    for i, (m, _) in enumerate(blocks):
        m[:] = bytes([i + 1]) * size
    addrs = [a for _, a in blocks]
    if rc == 0 and batch:
        rc = engine.batch_register_memory(addrs, [size] * n)
    for a in addrs if rc == 0 and not batch else ():
        rc = rc or engine.register_memory(a, size)
    print(json.dumps({"rc": rc, "session": "%s:%d" % (host, engine.get_rpc_port()),
                      "blocks": addrs}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "peek":
            addr, n = int(cmd[1]), int(cmd[2])
            print(ctypes.string_at(addr, n).hex(), flush=True)
        elif cmd[0] == "quit":
            break


def initiator(host, session, n, size):
    engine = TransferEngine()
    assert engine.initialize(host, "P2PHANDSHAKE", "tcp", "") == 0
    theirs = json.loads(sys.stdin.readline())["blocks"]
    m, recv = block(size)
    assert engine.register_memory(recv, size) == 0
    out = {"first": engine.get_first_buffer_address(session), "reads": [], "same": [],
           "writes": []}
    for i, addr in enumerate(theirs):
        m[:] = bytes(size)
        out["reads"].append(engine.transfer_sync_read(session, recv, addr, size))
        out["same"].append(m[:] == bytes([i + 1]) * size)
    m[:4096] = b"\xee" * 4096
    for addr in theirs:
        out["writes"].append(engine.transfer_sync_write(session, recv, addr, 4096))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "target":
        target(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:] == ["batch"])
    else:
        initiator(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
