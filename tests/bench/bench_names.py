#!/usr/bin/python3
"""Names the way users name things, against ids, same daemons, same run.

1. Remote memory by (agent, address): WRITEs of --blocks blocks of --block-bytes (one Submit
   with wait, the compact Blocks form) from a buffer to a peer, the remote side named by segment
   id, by (agent name, address) with the peer's endpoint, and by the agent's one-string form
   "host:port"; alternating, --rounds each. Medians of the throughput and the ratios to by-id.
2. The peer named by DNS name ("localhost:port", looked up on a worker) against its numeric
   address, the same WRITE.
3. One small WRITE (--small bytes, Submit with wait), by id and by (agent, address): what a
   resolved (cached) agent costs a latency-bound caller. Medians of the microseconds.
4. The Submit of 4096 blocks of 16 bytes (answered before they move): what resolving each
   block's (agent, address) costs against ids.
5. A notification on its own (Notify/Send, answered once the peer queued it) against the same
   notification carried by a batch of one --small WRITE (Submit with wait).

Usage: bench_names.py --moongate BIN [--rounds N] [--blocks N] [--block-bytes N]
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
from moongate.v1 import transfer_pb2  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternate(ways, rounds, fn):
    """{way: [results]}, the ways taken in a rotating order each round."""
    out = {w: [] for w in ways}
    for r in range(rounds):
        for k in range(len(ways)):
            w = ways[(r + k) % len(ways)]
            out[w].append(fn(w))
    return out


def line(label, vals, unit, ref=None):
    """The median, its ratio to ref's, and the spread: every value, or p10..p90 of many."""
    m = statistics.median(vals)
    ratio = "   ratio %.3f" % (m / statistics.median(ref)) if ref else ""
    if len(vals) > 12:
        q = statistics.quantiles(vals, n=10)
        spread = "p10 %.2f  p90 %.2f" % (q[0], q[-1])
    else:
        spread = " ".join("%.2f" % x for x in vals)
    print("  %-26s %9.2f %s%s   (%s)" % (label, m, unit, ratio, spread))


def bulk(c, a, buf, dst, kv, port):
    total = a.blocks * a.block_bytes
    offsets = [k * a.block_bytes for k in range(a.blocks)]

    def submit(way):
        bl = transfer_pb2.Blocks(op=transfer_pb2.WRITE, local_address=buf.address,
                                 local_offsets=offsets, remote_offsets=offsets,
                                 lengths=[a.block_bytes] * a.blocks)
        if way == "id":
            bl.peer, bl.remote_segment = a.peer, dst.segment.id
        elif way == "dns":
            bl.peer, bl.remote_segment = "localhost:%d" % port, dst.segment.id
        elif way == "agent":
            bl.peer, bl.remote_agent, bl.remote_address = a.peer, "bench", kv.address
        else:
            bl.remote_agent, bl.remote_address = "127.0.0.1:%d" % a.agent_port, kv.address
        r = []
        t = timed(lambda: r.append(c.transfers.Submit(
            transfer_pb2.SubmitRequest(blocks=[bl], wait=True), timeout=300)))
        assert r[0].batch.state == transfer_pb2.DONE, r[0].batch
        return total / t / 1e9

    for w in ("id", "agent", "one-string", "dns"):
        submit(w)  # sessions, connections, the agent and the name looked up once
    gb = alternate(["id", "agent", "one-string", "dns"], a.rounds, submit)
    print("WRITE of %d blocks of %d KiB (%d MiB) to a peer over TCP, %d rounds (medians, GB/s)"
          % (a.blocks, a.block_bytes >> 10, total >> 20, a.rounds))
    line("by segment id", gb["id"], "GB/s")
    line("by (agent, address)", gb["agent"], "GB/s", gb["id"])
    line("by \"host:port\", address", gb["one-string"], "GB/s", gb["id"])
    line("peer by DNS name", gb["dns"], "GB/s", gb["id"])


def small(c, a, buf, dst, kv):
    def one(way):
        if way == "id":
            r = mg.write(address=buf.address, peer=a.peer, remote_segment=dst.segment.id,
                         length=a.small)
        else:
            r = mg.write(address=buf.address, peer=a.peer, agent="bench",
                         remote_address=kv.address, length=a.small)
        return timed(lambda: c.transfer([r])) * 1e6

    for w in ("id", "agent"):
        one(w)
    us = alternate(["id", "agent"], a.rounds * 20, one)
    print("one WRITE of %d bytes, Submit with wait, %d rounds (medians, us)" %
          (a.small, a.rounds * 20))
    line("by segment id", us["id"], "us")
    line("by (agent, address)", us["agent"], "us", us["id"])


def submit_cost(c, a, buf, kv):
    """What naming 4096 blocks by agent costs the Submit itself (answered before they move)."""
    n = 4096
    offs = [k * 16 for k in range(n)]

    def one(way):
        bl = transfer_pb2.Blocks(op=transfer_pb2.WRITE, local_address=buf.address, peer=a.peer,
                                 local_offsets=offs, remote_offsets=offs, lengths=[16] * n)
        if way == "id":
            bl.remote_segment = kv.segment.id
        else:
            bl.remote_agent, bl.remote_address = "bench", kv.address
        r = []
        t = timed(lambda: r.append(c.transfers.Submit(
            transfer_pb2.SubmitRequest(blocks=[bl]), timeout=60)))
        c.wait(r[0].batch_id)
        return t * 1e3

    for w in ("id", "agent"):
        one(w)
    ms = alternate(["id", "agent"], a.rounds * 2, one)
    print("Submit of %d blocks of 16 bytes, answered before they move, %d rounds (medians, ms)"
          % (n, a.rounds * 2))
    line("by segment id", ms["id"], "ms")
    line("by (agent, address)", ms["agent"], "ms", ms["id"])


def notes(c, a, buf, dst, peer_c):
    def one(way):
        if way == "send":
            t = timed(lambda: c.send("bench", b"x" * 64, peer=a.peer))
        else:
            t = timed(lambda: c.transfer(
                [mg.write(address=buf.address, peer=a.peer, remote_segment=dst.segment.id,
                          length=a.small)], notify=[mg.notify(a.peer, "bench", b"x" * 64)]))
        peer_c.poll("bench", max=1000)  # keep the topic from filling
        return t * 1e6

    for w in ("send", "batch"):
        one(w)
    us = alternate(["batch", "send"], a.rounds * 20, one)
    print("a notification, %d rounds (medians, us)" % (a.rounds * 20))
    line("in a batch of one WRITE", us["batch"], "us")
    line("Notify/Send", us["send"], "us", us["batch"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--block-bytes", type=int, default=64 << 10)
    ap.add_argument("--small", type=int, default=4096)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as work:
        port = free_port()
        a.peer = "127.0.0.1:%d" % port
        # the one-string form reaches the daemon at 127.0.0.1:--peer-port: b's port
        p, sock = start(a.moongate, work, "a", extra=("--peer-port", str(port)))
        q, sock_b = start(a.moongate, work, "b", h2c=a.peer)
        total = a.blocks * a.block_bytes
        try:
            with mg.Client("unix:" + sock, timeout=300) as c, \
                    mg.Client("unix:" + sock_b, timeout=300) as peer_c:
                a.agent_port = peer_c.register_agent("bench").port
                kv = peer_c.allocate_buffer(total, remote_accessible=True)
                dst = peer_c.allocate_buffer(total, remote_accessible=True)
                buf = c.allocate_buffer(total)
                buf.view[:] = os.urandom(1 << 20) * (total >> 20)
                bulk(c, a, buf, dst, kv, port)
                small(c, a, buf, dst, kv)
                submit_cost(c, a, buf, kv)
                notes(c, a, buf, dst, peer_c)
        finally:
            for d in (p, q):
                d.terminate()
                d.wait()


if __name__ == "__main__":
    main()
