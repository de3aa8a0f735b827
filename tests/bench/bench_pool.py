#!/usr/bin/python3
"""Reads into pooled leases through the BufferPool shape, against the native lease API and
against registering the destination for every read; same daemons, same run.

--reads READs of --size bytes from a peer's segment (two daemons, TCP over loopback), each into
destination memory got for it and given back after:
  register:   RegisterSegment + READ + UnregisterSegment (register-per-read)
  lease:      Client.lease (AcquireLease) + READ + ReleaseLease, the native API
  bufferpool: BufferPool.acquire + READ + lease.release(), moongate.pool
The three alternate, --rounds times each. Printed: the median seconds of each, the speed-up of
lease and of bufferpool over register-per-read, and bufferpool's speed-up as a share of the
native API's (the BufferPool shape costs nothing when it is 1.0).

Usage: bench_pool.py --moongate BIN [--rounds N] [--reads N] [--size BYTES]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moongate_client as mg  # noqa: E402
from bench_memory import free_port, start  # noqa: E402
from bench_names import alternate, timed  # noqa: E402
from moongate.pool import BufferPool  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reads", type=int, default=1024)
    ap.add_argument("--size", type=int, default=1 << 20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mg-bench-pool-") as work:
        port = free_port()
        pb, sb = start(a.moongate, work, "b", h2c="127.0.0.1:%d" % port)
        pa, sa = start(a.moongate, work, "a", extra=["--pool-bytes", "64M"])
        peer = "127.0.0.1:%d" % port
        try:
            with mg.Client("unix:" + sb) as cb, mg.Client("unix:" + sa) as c, \
                    BufferPool(16 * a.size, client=c) as pool:
                src = cb.register("src", a.size, remote_accessible=True)
                with cb.map(src) as v:
                    v[:] = os.urandom(a.size)

                def read(**local):
                    c.transfer([mg.read(peer=peer, remote_segment=src.id, length=a.size,
                                        **local)])

                def register():
                    for i in range(a.reads):
                        s = c.register("dst%d" % i, a.size)
                        read(segment=s.id)
                        c.unregister(s.id)

                def lease():
                    for _ in range(a.reads):
                        with c.lease(a.size) as lz:
                            read(lease=lz.id)

                def bufferpool():
                    for _ in range(a.reads):
                        with pool.acquire(a.size) as lz:
                            read(lease=lz.id)

                fns = {"register": register, "lease": lease, "bufferpool": bufferpool}
                for _ in range(600):  # the daemon registers its pool after it starts
                    try:
                        c.lease(a.size).release()
                        break
                    except mg.Error:
                        time.sleep(0.05)
                with pool.acquire(a.size) as warm:  # the session, the pool's mapping
                    read(lease=warm.id)
                res = alternate(list(fns), a.rounds, lambda w: timed(fns[w]))
        finally:
            for p in (pa, pb):
                p.terminate()
                p.wait()
    med = {w: statistics.median(v) for w, v in res.items()}
    print("%d READs of %d bytes from a peer (TCP, loopback), %d rounds, medians:" %
          (a.reads, a.size, a.rounds))
    for w in fns:
        print("  %-11s %8.3f s  %8.1f reads/s   (%s)" % (
            w, med[w], a.reads / med[w], " ".join("%.3f" % x for x in res[w])))
    native, shaped = med["register"] / med["lease"], med["register"] / med["bufferpool"]
    print("  speed-up over register-per-read: lease %.2fx, bufferpool %.2fx" % (native, shaped))
    print("  bufferpool's speed-up / the native API's: %.3f" % (shaped / native))


if __name__ == "__main__":
    main()
