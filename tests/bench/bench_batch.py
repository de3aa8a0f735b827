#!/usr/bin/python3
"""Batch registration benchmark: does RegisterSegments spread the pinning cost over the workers?

Registers --count segments of --size bytes each (prefault, memlock try) three ways, in the same
run, on fresh daemons: one RegisterSegment call per segment, one after another (the reference:
what a client that registers region by region pays); one RegisterSegments batch on a daemon
with one worker; and the same batch on a daemon with --workers N (default: the machine's cores).
Prints each time, GiB/s, and the speed-ups over the reference and over one worker.

Usage: bench_batch.py --moongate BIN [--count N] [--size BYTES] [--workers N] [--shm-dir DIR]
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
from gen_stubs import generate  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(moongate, workers, shm_dir, max_bytes):
    h2c, tmp = free_port(), tempfile.mkdtemp()
    proc = subprocess.Popen([moongate, "--allow-anonymous", "--listen", "", "--h2c-listen", "127.0.0.1:%d" % h2c,
                             "--ops-listen", "", "--unix-socket", os.path.join(tmp, "mg.sock"),
                             "--shm-dir", shm_dir, "--access-log=false",
                             "--workers", str(workers), "--max-registered-bytes", str(max_bytes)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", h2c), timeout=1).close()
            return proc, "127.0.0.1:%d" % h2c
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("moongate did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--size", type=int, default=256 << 20)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--shm-dir", default="/dev/shm/moongate-bench")
    ap.add_argument("--memlock", choices=["off", "try", "require"], default="try")
    a = ap.parse_args()
    sys.path.insert(0, generate(os.path.join(tempfile.gettempdir(), "moongate-bench-pygen")))
    import grpc
    from moongate.v1 import memory_pb2, memory_pb2_grpc

    memlock = {"off": memory_pb2.MEMLOCK_OFF, "try": memory_pb2.MEMLOCK_TRY,
               "require": memory_pb2.MEMLOCK_REQUIRE}[a.memlock]

    def items():
        return [memory_pb2.RegisterRequest(name="seg-%d" % i, size=a.size, prefault=True,
                                           memlock=memlock)
                for i in range(a.count)]

    def run(workers, batch):
        proc, target = start(a.moongate, workers, a.shm_dir, a.count * a.size + (1 << 20))
        try:
            with grpc.insecure_channel(target) as ch:
                m = memory_pb2_grpc.MemoryStub(ch)
                t0 = time.monotonic()
                if batch:
                    r = m.RegisterSegments(memory_pb2.RegisterSegmentsRequest(items=items()),
                                           timeout=600)
                    bad = [x.status.message for x in r.results if x.status.code != 0]
                    assert not bad, bad
                    ids = [x.segment.id for x in r.results]
                else:
                    ids = [m.RegisterSegment(it, timeout=600).segment.id for it in items()]
                secs = time.monotonic() - t0
                m.UnregisterSegments(memory_pb2.UnregisterSegmentsRequest(ids=ids), timeout=600)
            return secs
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)

    run(a.workers, True)  # warm-up: the first run also pays for the kernel handing out memory
    one_by_one = run(a.workers, False)
    batch_1 = run(1, True)
    batch_n = run(a.workers, True)
    gib = a.count * a.size / (1 << 30)
    print("Registering %d segments of %d MiB (%.2f GiB, prefault, memlock %s), fresh "
          "daemon each time" % (a.count, a.size >> 20, gib, a.memlock))
    print("%-44s %9s %9s %9s" % ("", "seconds", "GiB/s", "speed-up"))
    for name, secs in (("RegisterSegment one by one (%d workers)" % a.workers, one_by_one),
                       ("RegisterSegments batch, 1 worker", batch_1),
                       ("RegisterSegments batch, %d workers" % a.workers, batch_n)):
        print("%-44s %9.3f %9.2f %8.2fx" % (name, secs, gib / secs, one_by_one / secs))
    print("batch on %d workers / batch on 1 worker: %.2fx faster" % (a.workers, batch_1 / batch_n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
