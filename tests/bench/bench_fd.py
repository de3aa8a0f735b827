#!/usr/bin/python3
"""Registering memory the client has (a memfd passed on the fd socket) against registering a
segment the daemon makes, same size, same daemon, same run.

Each round registers --size bytes both ways, alternating which goes first, and unregisters
them: a daemon-made ANON segment (RegisterSegment) and a memfd the client made (pass_fd on the
fd socket, then RegisterSegment source FD), each with prefault (the pages allocated and mapped:
a region ready for transfers) and without. The client's wall time per registration, medians
of --rounds, and the ratio fd / anon.

Usage: bench_fd.py --moongate BIN [--size BYTES] [--rounds N]
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
import moongate_client as mg  # noqa: E402
from moongate.v1 import memory_pb2  # noqa: E402


def start(moongate, work):
    sock = os.path.join(work, "moongate.sock")
    log = open(os.path.join(work, "moongate.log"), "w")
    p = subprocess.Popen([moongate, "--allow-anonymous", "--listen", "", "--ops-listen", "",
                          "--data-listen", "", "--unix-socket", sock,
                          "--shm-dir", os.path.join(work, "shm"), "--pool-bytes", "0",
                          "--access-log=false", "--max-registered-bytes", "64G"],
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as work:
        os.mkdir(os.path.join(work, "shm"))
        p, sock = start(a.moongate, work)
        try:
            with mg.Client("unix:" + sock, timeout=300) as c:
                one(c, "anon", 1 << 20, True, 0)  # warm the connection and the workers
                print("registration of %d MiB, %d rounds (medians; ratio fd/anon)" %
                      (a.size >> 20, a.rounds))
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
        finally:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
