"""A Mooncake initiator that loops, as a serving process does (`from mooncake.engine import
TransferEngine`, moongate's shim first on PYTHONPATH): iteration i writes 4 KiB of pattern i to
slot i % SLOTS of the target's buffer with a notification ("loop", "i"), reads it back and
compares. One line per iteration on stdout, with the system's monotonic clock:

  ok I T        written, notified, read back the same
  fail I T WHY  something failed (the engine logged why)

It stops when a line arrives on stdin, then prints "end". Usage: loop.py TARGET ADDRESS SLOTS
"""
import select
import sys
import time

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode


def pattern(i):
    return (i.to_bytes(4, "little") * 1024)[:4096]


def main():
    target, taddr, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    e = TransferEngine()
    if e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        print("fail -1 %f initialize" % time.monotonic(), flush=True)
        return
    src = e.allocate_managed_buffer(8192)
    i = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        peer = taddr + (i % slots) * 4096
        e.write_bytes_to_buffer(src, pattern(i), 4096)
        rc = e.transfer_sync(target, src, peer, 4096, TransferOpcode.Write,
                             notify=TransferNotify("loop", str(i)))
        why = "write"
        if rc == 0:
            rc = e.transfer_sync_read(target, src + 4096, peer, 4096)
            why = "read"
        if rc == 0 and e.read_bytes_from_buffer(src + 4096, 4096) != pattern(i):
            rc, why = -1, "compare"
        if rc == 0:
            print("ok %d %f" % (i, time.monotonic()), flush=True)
        else:
            print("fail %d %f %s" % (i, time.monotonic(), why), flush=True)
            time.sleep(0.02)  # a daemon on its way back: no hot loop
        i += 1
    e.close()
    print("end", flush=True)


if __name__ == "__main__":
    main()
