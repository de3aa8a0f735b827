"""A Mooncake target process, as Mooncake's users write one (`from mooncake.engine import
TransferEngine`, run with moongate's shim first on PYTHONPATH): it initializes with P2PHANDSHAKE,
allocates a managed buffer, says where it is (one JSON line) and obeys lines on stdin:

  dump OFF LEN   the buffer's bytes there, in hex
  fill OFF HEX   writes them (write_bytes_to_buffer)
  notifies       the notifications so far (get_notifies), as JSON [[name, msg], ...]
  quit

Usage: target.py HOST SIZE
"""
import json
import sys

from mooncake.engine import TransferEngine


def main():
    host, size = sys.argv[1], int(sys.argv[2])
    engine = TransferEngine()
    rc = engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
    addr = engine.allocate_managed_buffer(size) if rc == 0 else 0
    print(json.dumps({"rc": rc, "session": "%s:%d" % (host, engine.get_rpc_port()),
                      "address": addr}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "dump":
            print(engine.read_bytes_from_buffer(addr + int(cmd[1]), int(cmd[2])).hex(),
                  flush=True)
        elif cmd[0] == "fill":
            data = bytes.fromhex(cmd[2])
            print(engine.write_bytes_to_buffer(addr + int(cmd[1]), data, len(data)), flush=True)
        elif cmd[0] == "notifies":
            print(json.dumps([[n.name, n.msg] for n in engine.get_notifies()]), flush=True)
        elif cmd[0] == "quit":
            break


if __name__ == "__main__":
    main()
