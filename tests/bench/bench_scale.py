#!/usr/bin/python3
"""Costs that stay flat as work grows: per-call times with 10 and with 10,000 registered
segments and live leases, in the same run, alternating.

One daemon; the client is moongate's Python client on the Unix socket. Per round and
population (10, then --many), the daemon is filled with that many 4 KiB segments and leases,
then each call is timed --calls times (the median kept):
  register   RegisterSegment + UnregisterSegment of one more 4 KiB segment
  get        GetSegment of one of the population
  list       ListSegments, a page of 5 from the middle (its page token): the same page at
             both populations
  lease      AcquireLease + ReleaseLease of 4 KiB
  leases     ListLeases, a page of 5 from the middle
Prints the median over the rounds at each population, the spread (min-max), and the ratio
many / few.

Usage: bench_scale.py --moongate BIN [--many 10000] [--rounds 5] [--calls 300]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

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


def empty(c, segs, leases):
    for start in range(0, len(segs), BATCH):
        c.memory.UnregisterSegments(memory_pb2.UnregisterSegmentsRequest(
            ids=segs[start:start + BATCH]), timeout=120)
    for lid in leases:
        c.pool.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=lid), timeout=30)


def per_call(fn, calls):
    """Median seconds of fn() over `calls` calls."""
    t = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn(i)
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


def measure(c, segs, calls):
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
        "register": per_call(register, calls),
        "get": per_call(lambda i: m.GetSegment(memory_pb2.GetSegmentRequest(
            id=segs[i % len(segs)]), timeout=30), calls),
        "list": per_call(lambda i: m.ListSegments(memory_pb2.ListSegmentsRequest(
            page_size=5, page_token=mid_seg), timeout=30), calls),
        "lease": per_call(lease, calls),
        "leases": per_call(lambda i: p.ListLeases(pool_pb2.ListLeasesRequest(
            page_size=5, page_token=mid_lease), timeout=30), calls),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--many", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="mg-bench-scale-")
    sock = os.path.join(work, "moongate.sock")
    log = open(os.path.join(work, "moongate.log"), "w")
    d = subprocess.Popen([a.moongate, "--allow-anonymous", "--listen", "", "--ops-listen", "",
                          "--h2c-listen", "", "--data-listen", "", "--unix-socket", sock,
                          "--shm-dir", os.path.join(work, "shm"), "--access-log=false",
                          "--pool-bytes", "512M", "--max-tenant-segments", str(a.many + 100),
                          "--max-segments", str(a.many + 100), "--max-batch", str(BATCH)],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if os.path.exists(sock) and "event=ready" in open(log.name).read():
                break
            time.sleep(0.1)
        c = mg.Client("unix:" + sock, timeout=120)
        res = {10: [], a.many: []}
        for r in range(a.rounds):
            for n in (10, a.many):
                segs, leases = populate(c, n, "pop-%d-%d" % (r, n))
                res[n].append(measure(c, segs, a.calls))
                empty(c, segs, leases)
            print("round %d done" % (r + 1), file=sys.stderr)
        print("per call, us (median of %d rounds of %d calls; [min-max])" % (a.rounds, a.calls))
        print("%-10s %22s %22s %8s" % ("call", "at 10", "at %d" % a.many, "ratio"))
        for k in ("register", "get", "list", "lease", "leases"):
            few = [x[k] * 1e6 for x in res[10]]
            many = [x[k] * 1e6 for x in res[a.many]]
            print("%-10s %8.1f [%5.1f-%6.1f] %8.1f [%5.1f-%6.1f] %8.2f" % (
                k, statistics.median(few), min(few), max(few), statistics.median(many),
                min(many), max(many), statistics.median(many) / statistics.median(few)))
        c.close()
    finally:
        d.terminate()
        d.wait()
        log.close()


if __name__ == "__main__":
    main()
