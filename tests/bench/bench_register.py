#!/usr/bin/python3
"""Registration benchmark: does a large registration stall the daemon?

Measures Health/Check latency with h2load (one connection, one stream at a time, in 1-second
slices) twice in the same run: with the daemon idle, and for exactly as long as a registration
of --size bytes with prefault (and memlock try) and then its unregistration run on an engine
worker. Prints p50/p99/max for both, their ratio, and how long the registration took.

Usage: bench_register.py --moongate BIN [--size BYTES] [--seconds IDLE_S] [--shm-dir DIR]
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
from gen_stubs import generate  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def h2load_slice(url, body, seconds):
    """Per-request latencies (ms) of one h2load run of `seconds`, and how many succeeded."""
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        out = subprocess.run(
            ["h2load", "-D", str(seconds), "-c", "1", "-m", "1", "-t", "1", "-d", body, "-H",
             "content-type: application/grpc", "-H", "te: trailers", "--log-file", log.name,
             url], capture_output=True, text=True, timeout=seconds + 60).stdout
        ms = [int(line.split()[2]) / 1000.0 for line in log if len(line.split()) >= 3]
    ok = re.search(r"(\d+) succeeded, (\d+) failed", out)
    return ms, int(ok.group(1)) if ok else 0


def summary(ms, ok):
    ms = sorted(ms)
    pct = lambda p: ms[min(len(ms) - 1, int(p * len(ms)))]
    return {"n": len(ms), "ok": ok, "p50": pct(0.5), "p99": pct(0.99), "max": ms[-1],
            "slow": sum(1 for x in ms if x > 5.0)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--size", type=int, default=4 << 30)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--shm-dir", default="/dev/shm/moongate-bench")
    a = ap.parse_args()
    sys.path.insert(0, generate(os.path.join(tempfile.gettempdir(), "moongate-bench-pygen")))
    import grpc
    from moongate.v1 import memory_pb2, memory_pb2_grpc

    h2c, ops = free_port(), free_port()
    tmp = tempfile.mkdtemp()
    body = os.path.join(tmp, "check.bin")
    with open(body, "wb") as f:
        f.write(b"\0\0\0\0\0")
    proc = subprocess.Popen([a.moongate, "--allow-anonymous", "--listen", "", "--h2c-listen", "127.0.0.1:%d" % h2c,
                             "--ops-listen", "127.0.0.1:%d" % ops, "--unix-socket",
                             os.path.join(tmp, "mg.sock"), "--shm-dir", a.shm_dir,
                             "--access-log=false", "--workers", "2",
                             "--data-listen", "",  # no peers; port 7446 may be taken
                             "--pool-bytes", "0",  # the limit is the one registration's
                             "--max-registered-bytes", str(a.size + (1 << 20))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", h2c), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        url = "http://127.0.0.1:%d/grpc.health.v1.Health/Check" % h2c
        ms, ok = [], 0
        for _ in range(a.seconds):
            m_, o_ = h2load_slice(url, body, 1)
            ms += m_
            ok += o_
        idle = summary(ms, ok)

        timing = {}
        started = threading.Event()

        def register():
            with grpc.insecure_channel("127.0.0.1:%d" % h2c) as ch:
                m = memory_pb2_grpc.MemoryStub(ch)
                started.wait()
                t0 = time.monotonic()
                seg = m.RegisterSegment(memory_pb2.RegisterRequest(
                    name="bench", size=a.size, prefault=True, memlock=memory_pb2.MEMLOCK_TRY),
                    timeout=600).segment
                timing["register"] = time.monotonic() - t0
                timing["locked"] = seg.locked
                t0 = time.monotonic()
                m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id), timeout=600)
                timing["unregister"] = time.monotonic() - t0

        t = threading.Thread(target=register)
        t.start()
        ms, ok, slices = [], 0, 0
        started.set()
        while t.is_alive():  # 1 s slices for as long as the registration (and unregistration) run
            m_, o_ = h2load_slice(url, body, 1)
            ms += m_
            ok += o_
            slices += 1
        t.join()
        busy = summary(ms, ok)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    gib = a.size / (1 << 30)
    print("Health/Check over h2c, 1 connection x 1 stream, in 1 s slices: %d s idle, then for as "
          "long as a registration of %.2f GiB (prefault, memlock try) and its unregistration "
          "ran on a worker (%d s)" % (a.seconds, gib, slices))
    print("%-26s %8s %9s %9s %9s %9s" % ("", "calls", "p50 ms", "p99 ms", "max ms", "> 5 ms"))
    for name, r in (("idle", idle), ("during registration", busy)):
        print("%-26s %8d %9.3f %9.3f %9.3f %9d" % (name, r["n"], r["p50"], r["p99"], r["max"],
                                                   r["slow"]))
    print("p99 during / idle: %.2fx" % (busy["p99"] / idle["p99"]))
    print("registration: %.3f s (%.2f GiB/s), locked=%s; unregistration %.3f s" % (
        timing["register"], gib / timing["register"], timing["locked"], timing["unregister"]))
    return 0 if busy["ok"] == busy["n"] and idle["ok"] == idle["n"] else 1


if __name__ == "__main__":
    sys.exit(main())
