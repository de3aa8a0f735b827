#!/usr/bin/python3
"""Costs that stay flat as work grows: per-call times with 10 and with 10,000 registered
segments and live leases, in the same run, call for call.

Two daemons, one holding 10 segments and 10 leases of 4 KiB, the other --many of each; the
client is moongate's Python client on each one's Unix socket. Each round times every call
--calls times on each daemon, the two taking turns call by call (so drift of the machine weighs
on both alike), and keeps each one's median:
  register   RegisterSegment + UnregisterSegment of one more 4 KiB segment
  get        GetSegment of one of the population
  list       ListSegments, a page of 5 from the middle (its page token): the same page at
             both populations
  lease      AcquireLease + ReleaseLease of 4 KiB
  leases     ListLeases, a page of 5 from the middle
Prints the median over the rounds at each population, the spread (min-max), and the ratio
many / few (the median of the rounds' ratios).

Usage: bench_scale.py --moongate BIN [--many 10000] [--rounds 5] [--calls 300]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
os.environ.setdefault("MOONGATE_PYGEN", os.path.join(tempfile.gettempdir(),
                                                     "moongate-bench-pygen"))
import moongate as mg  # noqa: E402
from moongate.v1 import memory_pb2, pool_pb2  # noqa: E402

BATCH = 1024


def populate(c, n, tag):
    """n segments and n leases of 4 KiB; returns (segment ids, lease ids)."""
    segs, leases = [], []
    for start in range(0, n, BATCH):
        k = min(BATCH, n - start)
        r = c.memory.RegisterSegments(memory_pb2.RegisterSegmentsRequest(items=[
            memory_pb2.RegisterRequest(name="%s-%d" % (tag, start + i), size=4096)
            for i in range(k)]), timeout=120)
        segs += [x.segment.id for x in r.results]
        r = c.pool.AcquireLeases(pool_pb2.AcquireLeasesRequest(items=[
            pool_pb2.AcquireLeaseRequest(size=4096, ttl_ms=600000) for _ in range(k)]),
            timeout=120)
        leases += [x.id for x in r.leases]
    return segs, leases


def timed(fn, i):
    t0 = time.perf_counter()
    fn(i)
    return time.perf_counter() - t0


def calls_of(c, segs):
    """The timed calls on client c, whose daemon holds segs (and as many leases)."""
    m, p = c.memory, c.pool

    def middle(fn, req):
        """The page token halfway through the list (pages of at most 1000)."""
        token, left = "", max(1, len(segs) // 2)
        while left > 0:
            token = fn(req(page_size=min(1000, left), page_token=token), timeout=30) \
                .next_page_token
            left -= 1000
        return token
    mid_seg = middle(m.ListSegments, memory_pb2.ListSegmentsRequest)
    mid_lease = middle(p.ListLeases, pool_pb2.ListLeasesRequest)

    def register(i):
        s = m.RegisterSegment(memory_pb2.RegisterRequest(name="probe-%d" % i, size=4096),
                              timeout=30).segment
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=s.id), timeout=30)

    def lease(i):
        lz = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=4096), timeout=30)
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=lz.id), timeout=30)

    return {
        "register": register,
        "get": lambda i: m.GetSegment(memory_pb2.GetSegmentRequest(id=segs[i % len(segs)]),
                                      timeout=30),
        "list": lambda i: m.ListSegments(memory_pb2.ListSegmentsRequest(
            page_size=5, page_token=mid_seg), timeout=30),
        "lease": lease,
        "leases": lambda i: p.ListLeases(pool_pb2.ListLeasesRequest(
            page_size=5, page_token=mid_lease), timeout=30),
    }


def start(moongate, work, name, many):
    d = os.path.join(work, name)
    os.mkdir(d)
    sock = os.path.join(d, "moongate.sock")
    log = open(os.path.join(d, "moongate.log"), "w")
    p = subprocess.Popen([moongate, "--allow-anonymous", "--listen", "", "--ops-listen", "",
                          "--h2c-listen", "", "--data-listen", "", "--unix-socket", sock,
                          "--shm-dir", os.path.join(d, "shm"), "--access-log=false",
                          "--pool-bytes", "512M", "--max-tenant-segments", str(many + 100),
                          "--max-segments", str(many + 100), "--max-batch", str(BATCH)],
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if os.path.exists(sock) and "event=ready" in open(log.name).read():
            break
        time.sleep(0.1)
    c = mg.Client("unix:" + sock, timeout=120)
    for _ in range(600):  # the pool registers after "ready"
        try:
            c.pool.PoolStats(pool_pb2.PoolStatsRequest(), timeout=30)
            break
        except grpc.RpcError:  # UNAVAILABLE: "the buffer pool is still being registered"
            time.sleep(0.1)
    return p, c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--many", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="mg-bench-scale-")
    procs = []
    try:
        sides = {}
        for n in (10, a.many):
            p, c = start(a.moongate, work, "d%d" % n, a.many)
            procs.append(p)
            segs, _ = populate(c, n, "pop-%d" % n)
            sides[n] = calls_of(c, segs)
        res = {10: {}, a.many: {}}
        for r in range(a.rounds):
            for k in sides[10]:
                t = {10: [], a.many: []}
                for i in range(a.calls):
                    for n in ((10, a.many) if i % 2 == 0 else (a.many, 10)):
                        t[n].append(timed(sides[n][k], i))
                for n in t:
                    res[n].setdefault(k, []).append(statistics.median(t[n]))
            print("round %d done" % (r + 1), file=sys.stderr)
        print("per call, us (median of %d rounds of %d calls, the two daemons taking turns call "
              "by call; [min-max])" % (a.rounds, a.calls))
        print("%-10s %22s %22s %8s" % ("call", "at 10", "at %d" % a.many, "ratio"))
        for k in sides[10]:
            few = [x * 1e6 for x in res[10][k]]
            many = [x * 1e6 for x in res[a.many][k]]
            ratio = statistics.median(y / x for x, y in zip(few, many))
            print("%-10s %8.1f [%5.1f-%6.1f] %8.1f [%5.1f-%6.1f] %8.2f" % (
                k, statistics.median(few), min(few), max(few), statistics.median(many),
                min(many), max(many), ratio))
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
