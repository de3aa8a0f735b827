#!/usr/bin/python3
"""Small operations: one 4 KiB WRITE to a peer daemon, posted on a submission ring, against
the same WRITE as a Submit with wait over HTTP/2, from C (bench/bench_ringlat, libmgclient) and
from Python, and the floor — a 4 KiB TCP ping-pong between two processes on loopback
(bench/bench_pingpong) — in the same run, and Mooncake's transfer_sync_write through
mooncake.engine (moongate's door, on its ring); then posting 4096 blocks
of 4 KiB on the ring (one submission of prepared pairs) and as one Submit of a prepared group.

Two daemons over TCP loopback; this process is a client of daemon a with a registered source
and prepared lists; an agent of daemon b's holds the target.
  one     --ops WRITEs one at a time, each timed from the post until its completion is seen
          (the ring: read from shared memory, spinning --spin-us first; Submit: the call's
          answer); rounds alternated; median and p99 of each round, and their ratio to the
          floor's
  many    4096 pairs: from the post until the daemon accepted the batch (the ring: its
          acceptance completion, MG_RING_ACCEPTED; the Submit without wait: its answer), and
          the whole transfer; posted on the ring from Python and from C (bench_ringlat many:
          each round the medians of 20 batches), and as a Submit

Usage: bench_ring.py --moongate BIN --pingpong BIN --ringlat BIN [--rounds 5] [--ops 2000]
                     [--spin-us 200]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python", "moongate", "compat",
                                "shim"))  # mooncake.engine
sys.path.insert(0, HERE)
from bench_memory import free_port, start  # noqa: E402
from bench_names import alternate  # noqa: E402

import numpy as np  # noqa: E402

import moongate_client as mg  # noqa: E402
from moongate.v1 import transfer_pb2  # noqa: E402

W = transfer_pb2.WRITE
KiB = 1024


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))]


def floor(pingpong, ops):
    out = subprocess.run([pingpong, "4096", str(ops), "200"], capture_output=True, text=True,
                         check=True).stdout.split()
    return [float(x) for x in out]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--pingpong", required=True)
    ap.add_argument("--ringlat", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--spin-us", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=4096)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mg-bench-ring-") as work:
        pb_port, pa_port = free_port(), free_port()
        limit = ["--max-transfer-requests", str(max(4096, a.blocks))]
        procs = []
        try:
            # each daemon's --peer-port the other's: an agent's "host:port" (Mooncake's target
            # names) reaches the other daemon
            p, sb = start(a.moongate, work, "b", h2c="127.0.0.1:%d" % pb_port,
                          extra=["--advertise", "127.0.0.1:%d" % pb_port,
                                 "--peer-port", str(pa_port)] + limit)
            procs.append(p)
            p, sa = start(a.moongate, work, "a", h2c="127.0.0.1:%d" % pa_port,
                          extra=["--advertise", "127.0.0.1:%d" % pa_port,
                                 "--peer-port", str(pb_port)] + limit)
            procs.append(p)
            run(a, sa, sb, "127.0.0.1:%d" % pb_port)
        finally:
            for p in procs:
                p.terminate()
                p.wait()


def run(a, sa, sb, b_h2c):
    n = a.blocks
    src, dst = bytearray(os.urandom(n * 4 * KiB)), bytearray(n * 4 * KiB)
    (s, _), (t, _) = mg.address_of(src), mg.address_of(dst)
    with mg.Client("unix:" + sa) as ca, mg.Client("unix:" + sb) as cb:
        b_port = cb.register_agent("bench-b").port
        cb.register_memory("dst", t, len(dst), remote_accessible=True)
        ca.register_memory("src", s, len(src))
        local = ca.prepare_list([s + i * 4 * KiB for i in range(n)], [4 * KiB] * n)
        remote = ca.prepare_list([t + i * 4 * KiB for i in range(n)], [4 * KiB] * n,
                                 peer=b_h2c, agent="bench-b")
        ring = ca.attach_ring(entries=4096)
        group = [mg.prepared(W, local, [0], remote, [0])]

        def one_ring():
            t0 = time.perf_counter()
            ring.post_pairs(W, local, [0], remote, [0])
            c = ring.wait(30, spin_us=a.spin_us)
            dt = (time.perf_counter() - t0) * 1e6
            assert len(c) == 1 and c[0].code == 0, c
            return dt

        def one_submit():
            t0 = time.perf_counter()
            ca.transfer([], prepared=group, brief=True)
            return (time.perf_counter() - t0) * 1e6

        def c_client(way):
            out = subprocess.run([a.ringlat, "unix:" + sa, b_h2c, "bench-b", str(t), way,
                                  str(a.ops), "200", str(a.spin_us)], capture_output=True,
                                 text=True, check=True).stdout.split("\n")
            return [float(x.split()[1]) for x in out if x]

        os.environ["MOONGATE_SOCKET"] = sa  # Mooncake's engine: its daemon is a
        from mooncake.engine import TransferEngine
        eng = TransferEngine()
        assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        msrc = bytearray(os.urandom(4096))  # its own memory (src is the native client's)
        (ms, _) = mg.address_of(msrc)
        assert eng.register_memory(ms, len(msrc)) == 0
        session = "127.0.0.1:%d" % b_port

        def one_mooncake():
            t0 = time.perf_counter()
            assert eng.transfer_sync_write(session, ms, t, 4096) == 0
            return (time.perf_counter() - t0) * 1e6

        def measure(way):
            if way == "floor":
                return floor(a.pingpong, a.ops)
            if way in ("ring", "submit"):
                return c_client(way)
            fn = {"ring-py": one_ring, "submit-py": one_submit,
                  "mooncake": one_mooncake}[way]
            for _ in range(100):
                fn()
            return [fn() for _ in range(a.ops)]

        ways = ["floor", "ring", "submit", "ring-py", "submit-py", "mooncake"]
        got = alternate(ways, a.rounds, measure)
        print("one 4 KiB WRITE to a peer daemon, post to completion seen (µs), %d rounds of %d "
              "alternated: median [min-max] of the rounds' p50 and p99" % (a.rounds, a.ops))
        p50 = {w: [statistics.median(r) for r in got[w]] for w in ways}
        p99 = {w: [pct(r, 0.99) for r in got[w]] for w in ways}
        for w, label in (("floor", "TCP ping-pong, 2 processes"),
                         ("ring", "C: ring (spin %d µs)" % a.spin_us),
                         ("submit", "C: Submit with wait"),
                         ("ring-py", "Python: ring (spin %d µs)" % a.spin_us),
                         ("submit-py", "Python: Submit with wait"),
                         ("mooncake", "Python: mooncake.engine sync")):
            print("  %-28s p50 %7.1f [%.1f-%.1f]  p99 %7.1f [%.1f-%.1f]" % (
                label, statistics.median(p50[w]), min(p50[w]), max(p50[w]),
                statistics.median(p99[w]), min(p99[w]), max(p99[w])))
        for w in ways[1:]:
            r50 = [x / f for x, f in zip(p50[w], p50["floor"])]
            r99 = [x / f for x, f in zip(p99[w], p99["floor"])]
            print("  %-9s / floor: p50 %.2f [%.2f-%.2f] (sought <= 3), p99 %.2f [%.2f-%.2f] "
                  "(sought <= 5)" % (w, statistics.median(r50), min(r50), max(r50),
                                     statistics.median(r99), min(r99), max(r99)))
        rm = [x / r for x, r in zip(p50["mooncake"], p50["ring-py"])]
        print("  mooncake.engine transfer_sync_write / the Python ring, p50: %.2f [%.2f-%.2f] "
              "(sought <= 1.3)" % (statistics.median(rm), min(rm), max(rm)))

        pairs = list(range(n))
        many = [mg.prepared(W, local, pairs, remote, pairs)]

        idx = np.arange(n, dtype=np.uint32)

        def post(way):
            if way == "ring-c":  # the same from C (libmgclient): 20 batches, their medians
                out = subprocess.run([a.ringlat, "unix:" + sa, b_h2c, "bench-b", str(t), "many",
                                      "20", "3", "0", str(n)], capture_output=True, text=True,
                                     check=True).stdout.split("\n")
                rows = [[float(x) for x in line.split()[1:]] for line in out if line]
                return tuple(statistics.median(r[k] for r in rows) / 1e3 for k in range(2)) + (
                    n * 4 * KiB / (statistics.median(r[2] for r in rows) / 1e6) / 1e9,)
            if way == "ring":
                t0 = time.perf_counter()
                ring.post_pairs(W, local, idx, remote, idx, accepted=True)
                written = time.perf_counter()
                c = ring.wait(60)
                accepted = time.perf_counter()
                assert c[0].accepted and c[0].batch_id, c
                while True:
                    c = [x for x in ring.wait(60) if not x.accepted]
                    if c:
                        break
                end = time.perf_counter()
                assert c[0].code == 0 and c[0].done == n, c
            else:
                t0 = time.perf_counter()
                bid = ca.submit([], prepared=many)
                written = accepted = time.perf_counter()
                ca.wait(bid, brief=True)
                end = time.perf_counter()
            return ((written - t0) * 1e3, (accepted - t0) * 1e3,
                    n * 4 * KiB / (end - t0) / 1e9)

        got = alternate(["ring", "ring-c", "submit"], a.rounds, post)
        print("%d blocks of 4 KiB by index, one batch, %d rounds alternated: from the post until "
              "the daemon accepted the batch (ms; the ring: its acceptance completion seen, the "
              "Submit: its answer), the ring's own write, and the whole transfer (GB/s)" % (
                  n, a.rounds))
        for w in ("ring", "ring-c", "submit"):
            wr = [x[0] for x in got[w]]
            ms = [x[1] for x in got[w]]
            gbs = [x[2] for x in got[w]]
            print("  %-7s accepted %.3f [%.3f-%.3f] ms%s   transfer %.3f [%.3f-%.3f] GB/s" % (
                w, statistics.median(ms), min(ms), max(ms),
                "  (written %.3f ms)" % statistics.median(wr) if w != "submit" else "",
                statistics.median(gbs), min(gbs), max(gbs)))
        post("submit")  # the last word in dst is src's (the C client writes its own bytes)
        assert dst == src
        ring.close()


if __name__ == "__main__":
    main()
