#!/usr/bin/python3
"""Memory the client has, against the daemon's own, same daemons, same run.

1. Registration: each round registers --size bytes both ways, alternating which goes first, and
   unregisters them: a daemon-made ANON segment (RegisterSegment) and a memfd the client made
   (pass_fd on the fd socket, then RegisterSegment source FD), each with prefault (the pages
   allocated and mapped: a region ready for transfers) and without. The client's wall time per
   registration, medians of --rounds, and the ratio fd / anon.
2. Naming local memory by address: WRITEs of --block-bytes blocks (one Submit with wait of
   --blocks blocks, the compact Blocks form) from a buffer the client allocated
   (allocate_buffer) to a peer daemon over the TCP data plane, the local side named by segment id
   and by address, alternating, --transfer-rounds each. Medians of the throughput and the ratio
   address / id.
3. The same WRITE from memory the client allocated itself (a bytearray registered as PROCESS,
   read with process_vm_readv and staged over TCP) against the buffer by address.
4. 64 MiB, one request (section "big", not run by default): one WRITE of --big-bytes to a peer's
   segment (daemon-made, remote-accessible, prefaulted) from a memfd registered by descriptor
   (allocate_buffer, the reference) and from a bytearray registered as PROCESS, both filled
   first; one warm-up each, then --big-rounds rounds alternated (AB, BA, ...). Every round's
   GB/s, the medians [min-max] and the ratio process / memfd (the median of the rounds'
   ratios). Then a READ of the peer's segment into each, the same way. Then the other end: a
   WRITE from the memfd into the peer's memory, a memfd (allocate_buffer, remote-accessible)
   against a bytearray registered there as PROCESS, remote-accessible, by a client of its own
   (the peer lands it with process_vm_writev); and a READ out of each.

Usage: bench_memory.py --moongate BIN [--sections registration,address,big] [--size BYTES]
                       [--rounds N] [--transfer-rounds N] [--big-bytes BYTES] [--big-rounds N]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
import moongate_client as mg  # noqa: E402
from moongate.v1 import transfer_pb2  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(moongate, work, name, h2c=None, extra=()):
    """A daemon with its Unix socket in work/name (and an h2c listener for peers)."""
    os.mkdir(os.path.join(work, name))
    sock = os.path.join(work, name, "moongate.sock")
    log = open(os.path.join(work, name, "moongate.log"), "w")
    p = subprocess.Popen([moongate, "--allow-anonymous", "--listen", "", "--ops-listen", "",
                          "--h2c-listen", h2c or "", "--peer-tls=false", "--peer-anonymous",
                          "--data-listen", "127.0.0.1:0" if h2c else "", "--unix-socket", sock,
                          "--shm-dir", os.path.join(work, name), "--pool-bytes", "0",
                          "--access-log=false", "--max-registered-bytes", "64G"] + list(extra),
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        if os.path.exists(sock + ".fd"):
            return p, sock
        time.sleep(0.05)
    raise SystemExit("moongate did not start; see " + log.name)


def one(c, way, size, prefault, n):
    """Seconds one registration took, as the client sees it; unregisters it after."""
    if way == "anon":
        t0 = time.perf_counter()
        seg = c.register("anon%d" % n, size, prefault=prefault)
        t = time.perf_counter() - t0
    else:
        fd = os.memfd_create("bench")
        os.ftruncate(fd, size)
        t0 = time.perf_counter()
        seg = c.register_fd("fd%d" % n, fd, prefault=prefault)
        t = time.perf_counter() - t0
        os.close(fd)
    c.unregister(seg.id)
    return t


def registration(c, a):
    for way in ("anon", "fd"):  # warm up: the connection, the workers, the first GiB of tmpfs
        one(c, way, a.size, True, 0)
    print("registration of %d MiB, %d rounds (medians; ratio fd/anon)" % (a.size >> 20, a.rounds))
    n = 1
    for prefault in (True, False):
        t = {"anon": [], "fd": []}
        for r in range(a.rounds):
            for way in (("anon", "fd") if r % 2 == 0 else ("fd", "anon")):
                t[way].append(one(c, way, a.size, prefault, n))
                n += 1
        ma, mf = statistics.median(t["anon"]), statistics.median(t["fd"])
        print("  %-12s anon %9.3f ms   fd %9.3f ms   ratio %.3f   (anon %s, fd %s)" %
              ("prefault" if prefault else "no prefault", ma * 1e3, mf * 1e3, mf / ma,
               " ".join("%.1f" % (x * 1e3) for x in t["anon"]),
               " ".join("%.1f" % (x * 1e3) for x in t["fd"])))


def by_address(c, peer, a):
    total = a.blocks * a.block_bytes
    buf = c.allocate_buffer(total)
    buf.view[:] = os.urandom(1 << 20) * (total >> 20)
    dst = peer.register("dst", total, remote_accessible=True)
    offsets = [k * a.block_bytes for k in range(a.blocks)]

    heap = bytearray(bytes(buf.view))
    heap_addr, _ = mg.address_of(heap)
    heap_seg = c.register_memory("heap", heap_addr, total)

    def submit(way):
        bl = transfer_pb2.Blocks(op=transfer_pb2.WRITE, peer=a.peer, remote_segment=dst.id,
                                 local_offsets=offsets, remote_offsets=offsets,
                                 lengths=[a.block_bytes] * a.blocks)
        if way == "id":
            bl.local_segment = buf.segment.id
        elif way == "process":
            bl.local_address = heap_addr
        else:
            bl.local_address = buf.address
        t0 = time.perf_counter()
        r = c.transfers.Submit(transfer_pb2.SubmitRequest(blocks=[bl], wait=True), timeout=300)
        t = time.perf_counter() - t0
        assert r.batch.state == transfer_pb2.DONE, r.batch
        return total / t / 1e9

    submit("id")  # the session and the data-plane connections
    gb = {"id": [], "address": []}
    for r in range(a.transfer_rounds):
        for way in (("id", "address") if r % 2 == 0 else ("address", "id")):
            gb[way].append(submit(way))
    mi, ma = statistics.median(gb["id"]), statistics.median(gb["address"])
    print("WRITE of %d blocks of %d KiB (%d MiB) to a peer over TCP, %d rounds (medians)" %
          (a.blocks, a.block_bytes >> 10, total >> 20, a.transfer_rounds))
    print("  by segment id %6.2f GB/s   by address %6.2f GB/s   ratio %.3f" % (mi, ma, ma / mi))
    print("  (id %s; address %s)" % (" ".join("%.2f" % x for x in gb["id"]),
                                      " ".join("%.2f" % x for x in gb["address"])))
    gb = {"address": [], "process": []}
    for r in range(a.transfer_rounds):
        for way in (("address", "process") if r % 2 == 0 else ("process", "address")):
            gb[way].append(submit(way))
    ma, mp = statistics.median(gb["address"]), statistics.median(gb["process"])
    print("the same from the process's own memory (process_vm, staged) against the buffer")
    print("  buffer %6.2f GB/s   process_vm %6.2f GB/s   ratio %.3f" % (ma, mp, mp / ma))
    c.unregister(heap_seg.id)
    buf.free()


def spread(xs):
    return "%.3f [%.3f-%.3f]" % (statistics.median(xs), min(xs), max(xs))


def alternate(what, run, ways, rounds):
    """One warm-up each, then `rounds` rounds of run(way) alternated (AB, BA, ...): every
    round's GB/s, the medians [min-max] and the ratio ways[1] / ways[0] (the rounds' ratios)."""
    run(ways[0])
    run(ways[1])
    gb = {ways[0]: [], ways[1]: []}
    for r in range(rounds):
        for way in (ways if r % 2 == 0 else ways[::-1]):
            gb[way].append(run(way))
    ratios = [p / m for m, p in zip(gb[ways[0]], gb[ways[1]])]
    print("  %-14s %s %s GB/s   %s %s GB/s   %s/%s %s" %
          (what, ways[0], spread(gb[ways[0]]), ways[1], spread(gb[ways[1]]), ways[1], ways[0],
           spread(ratios)))
    for r in range(rounds):
        print("    round %d (%s first): %s %.3f  %s %.3f  ratio %.3f" %
              (r + 1, ways[r % 2], ways[0], gb[ways[0]][r], ways[1], gb[ways[1]][r], ratios[r]))


def one_request(c, cb, peer, a):
    """One WRITE (and READ) of --big-bytes: from (into) a memfd against process memory on
    daemon a, to (from) a peer's segment; then from a memfd on a into (out of) a memfd against
    process memory on the peer, registered remote-accessible by a process of its own."""
    size = a.big_bytes
    data = os.urandom(1 << 20) * (size >> 20)
    dst = peer.register("big-dst", size, remote_accessible=True, prefault=True)
    buf = c.allocate_buffer(size)
    buf.view[:] = data  # every page of the memfd written
    heap = bytearray(size)  # calloc'd: zero pages until written
    heap[:] = data
    heap_addr, _ = mg.address_of(heap)
    heap_seg = c.register_memory("big-heap", heap_addr, size)
    there = cb.allocate_buffer(size, remote_accessible=True)
    there.view[:] = data
    there_heap = bytearray(size)
    there_heap[:] = data
    th_addr, _ = mg.address_of(there_heap)
    th_seg = cb.register_memory("big-there", th_addr, size, remote_accessible=True)
    local = {"memfd": buf.segment.id, "process": heap_seg.id}
    remote = {"memfd": there.segment.id, "process": th_seg.id}

    def timed(r):
        t0 = time.perf_counter()
        c.transfer([r])
        return size / (time.perf_counter() - t0) / 1e9

    print("64 MiB, one request: %d MiB between daemon a and its peer over TCP, one Submit with "
          "wait, %d rounds alternated (medians [min-max])" % (size >> 20, a.big_rounds))
    for name, op in (("WRITE", mg.write), ("READ", mg.read)):
        alternate(name + " from", lambda way: timed(op(segment=local[way], peer=a.peer,
                                                       remote_segment=dst.id, length=size)),
                  ("memfd", "process"), a.big_rounds)
    for name, op in (("WRITE", mg.write), ("READ", mg.read)):
        alternate(name + " into", lambda way: timed(op(segment=buf.segment.id, peer=a.peer,
                                                       remote_segment=remote[way],
                                                       length=size)),
                  ("memfd", "process"), a.big_rounds)
    if bytes(buf.view) != data or heap != data or bytes(there.view) != data or \
            there_heap != data:
        raise SystemExit("the bytes read back differ from those written")
    c.unregister(heap_seg.id)
    cb.unregister(th_seg.id)
    buf.free()
    there.free()
    peer.unregister(dst.id)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--block-bytes", type=int, default=64 << 10)
    ap.add_argument("--transfer-rounds", type=int, default=9)
    ap.add_argument("--sections", default="registration,address",
                    help="comma-separated: registration, address, big (default: the first two)")
    ap.add_argument("--big-bytes", type=int, default=64 << 20)
    ap.add_argument("--big-rounds", type=int, default=5)
    a = ap.parse_args()
    sections = a.sections.split(",")
    unknown = set(sections) - {"registration", "address", "big"}
    if unknown:
        ap.error("--sections: unknown %s (registration, address, big)" % ", ".join(sorted(unknown)))
    with tempfile.TemporaryDirectory(dir="/dev/shm") as work:
        a.peer = "127.0.0.1:%d" % free_port()
        p, sock = start(a.moongate, work, "a")
        q, sock_b = start(a.moongate, work, "b", h2c=a.peer)
        try:
            with mg.Client("unix:" + sock, timeout=300) as c, \
                    mg.Client("unix:" + sock_b, timeout=300) as cb, \
                    mg.Client(a.peer, plaintext=True, timeout=300) as peer:
                if "registration" in sections:
                    registration(c, a)
                if "address" in sections:
                    by_address(c, peer, a)
                if "big" in sections:
                    one_request(c, cb, peer, a)
        finally:
            for d in (p, q):
                d.terminate()
                d.wait()


if __name__ == "__main__":
    main()
