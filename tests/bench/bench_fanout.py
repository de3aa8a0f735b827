#!/usr/bin/python3
"""Many at once: connections, peers and tenants, each against its own baseline in the same run,
the ways alternated round by round.

  conns    Health/Check latency (h2load, 10 connections, one stream each) with 10 connections
           open, and with --conns open (the rest idle HTTP/2 sessions that have each made one
           call). p50 and p99 per round; the ratio many / 10. Then the same h2load with every
           connection active: requests/s and requests per daemon CPU second (latency then
           measures the queue; h2load itself is the limit at 1,000).
  peers    one daemon writing to --peers peer daemons at once: one mgbench process per peer
           (64 KiB x 128 scattered WRITEs, 2 batches in flight, --seconds each), all started
           at the same wall-clock time. GB/s of the slowest and of the fastest peer, their
           ratio, and the sum beside one peer alone.
  tenants  two tenants (bearer tokens of an --auth-file) writing to one peer at once, 4
           batches in flight each, --seconds: each one's share of the bytes. Then the same
           for two clients of one tenant.

Usage: bench_fanout.py --moongate BIN --mgbench BIN [conns|peers|tenants ...] [--rounds 5]
                       [--conns 1000] [--peers 16] [--seconds 4]
"""
import argparse
import hashlib
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_control import cpu_seconds, h2load  # noqa: E402
from bench_memory import free_port  # noqa: E402
from bench_names import alternate  # noqa: E402


STARTED = []  # every daemon started, stopped at the end whatever happens


def start(moongate, work, name, extra=()):
    """A daemon with an h2c control listener and a TCP data plane; returns (proc, h2c port)."""
    d = os.path.join(work, name)
    os.mkdir(d)
    port = free_port()
    log = open(os.path.join(d, "moongate.log"), "w")
    p = subprocess.Popen([moongate, "--allow-anonymous", "--listen", "", "--ops-listen", "",
                          "--h2c-listen", "127.0.0.1:%d" % port, "--peer-tls=false",
                          "--peer-anonymous", "--data-listen", "127.0.0.1:0", "--unix-socket",
                          "", "--shm-dir", d, "--pool-bytes", "0", "--access-log=false",
                          "--memlock", "try"] + list(extra),
                         stdout=log, stderr=subprocess.STDOUT)
    STARTED.append(p)
    for _ in range(400):
        with open(log.name) as f:
            if "event=ready" in f.read():
                return p, port
        if p.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit("moongate did not start; see " + log.name)


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        p.wait(30)


def spread(vals, fmt="%.2f"):
    return "min " + fmt % min(vals) + "  max " + fmt % max(vals)


def report(label, vals, unit, ref=None, fmt="%.2f"):
    m = statistics.median(vals)
    ratio = ("   %.2fx" % (m / statistics.median(ref))) if ref else ""
    print(("  %-44s " + fmt + " %s%s   (%s, %d rounds)") %
          (label, m, unit, ratio, spread(vals, fmt), len(vals)))
    return m


def idle_sessions(port, n):
    """n HTTP/2 sessions to port that have each made one Health/Check, left open."""
    body = b"\x00\x00\x00\x00\x00"
    hdr = (b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # SETTINGS, empty
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + hdr)
        # HEADERS (literal, not indexed) for POST /grpc.health.v1.Health/Check, then DATA.
        block = (b"\x83\x86" + b"\x44" + bytes([len(b"/grpc.health.v1.Health/Check")]) +
                 b"/grpc.health.v1.Health/Check" + b"\x41\x09localhost" +
                 b"\x5f\x10application/grpc" + b"\x40\x02te\x08trailers")
        s.sendall(len(block).to_bytes(3, "big") + b"\x01\x04" + (1).to_bytes(4, "big") + block)
        s.sendall(len(body).to_bytes(3, "big") + b"\x00\x01" + (1).to_bytes(4, "big") + body)
        socks.append(s)
    for s in socks:  # each answered (its SETTINGS and the response came back)
        s.settimeout(30)
        if not s.recv(65536):
            raise SystemExit("moongate closed an idle session")
    return socks


def bench_conns(args, work):
    p, port = start(args.moongate, work, "conns")
    body = os.path.join(work, "health.bin")
    with open(body, "wb") as f:
        f.write(b"\x00\x00\x00\x00\x00")
    url = "http://127.0.0.1:%d/grpc.health.v1.Health/Check" % port
    few, many = 10, args.conns

    def one(way):
        socks = idle_sessions(port, (many if way == "many" else few) - few)
        try:
            r = h2load(url, body, "application/grpc", args.requests, few, 1)
        finally:
            for s in socks:
                s.close()
        if r["ok"] != args.requests:
            raise SystemExit("h2load: %d of %d answered 200" % (r["ok"], args.requests))
        return r

    def active(way):
        n, calls = many if way == "many" else few, max(args.requests, 20 * many)
        cpu = cpu_seconds(p.pid)
        r = h2load(url, body, "application/grpc", calls, n, 1)
        r["per_cpu"] = calls / (cpu_seconds(p.pid) - cpu)
        return r

    print("Health/Check, h2c, 10 connections making calls (%d calls per round):" % args.requests)
    res = alternate(["few", "many"], args.rounds, one)
    for k in ("p50", "p99"):
        ref = [r[k] * 1000 for r in res["few"]]
        report("%s with %d connections open" % (k, few), ref, "us", fmt="%.1f")
        report("%s with %d connections open" % (k, many), [r[k] * 1000 for r in res["many"]],
               "us", ref, fmt="%.1f")
    print("Health/Check, every connection making calls:")
    res = alternate(["few", "many"], args.rounds, active)
    ref = [r["rps"] for r in res["few"]]
    report("requests/s, %d connections" % few, ref, "", fmt="%.0f")
    report("requests/s, %d connections" % many, [r["rps"] for r in res["many"]], "", ref,
           fmt="%.0f")
    ref = [r["per_cpu"] for r in res["few"]]
    report("requests per daemon CPU second, %d connections" % few, ref, "", fmt="%.0f")
    report("requests per daemon CPU second, %d connections" % many,
           [r["per_cpu"] for r in res["many"]], "", ref, fmt="%.0f")
    stop([p])


def mgbench(args, target, peer, start_at, inflight, env=None):
    return subprocess.Popen([args.mgbench, "transfer", "--target", "127.0.0.1:%d" % target,
                             "--peer", "127.0.0.1:%d" % peer, "--blocks", "64K", "--batches",
                             "128", "--ops", "write", "--scatter", "--inflight", str(inflight),
                             "--seconds", str(args.seconds), "--start-at", "%.3f" % start_at,
                             "--json"], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})))


def together(procs):
    """Each process's JSON line: bytes moved and GB/s."""
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit("mgbench failed: " + text)
        r = json.loads(text.strip().splitlines()[-1])
        r["bytes"] = r["batches"] * r["block_bytes"] * r["batch"]
        out.append(r)
    return out


def bench_peers(args, work):
    a, pa = start(args.moongate, work, "a")
    peers = [start(args.moongate, work, "p%d" % i) for i in range(args.peers)]
    every = [a] + [p for p, _ in peers]

    def one(way):
        use = peers if way == "all" else peers[:1]
        # after every process registered its segments and warmed them (mgbench's untimed pass)
        at = time.time() + 3.0 + 0.15 * len(use)
        res = together([mgbench(args, pa, port, at, 2) for _, port in use])
        rates = [r["gbytes_per_s"] for r in res]
        return {"min": min(rates), "max": max(rates), "sum": sum(rates)}

    print("%d peers written to at once (64 KiB x 128 scattered WRITE, 2 in flight, %g s):" %
          (args.peers, args.seconds))
    res = alternate(["one", "all"], args.rounds, one)
    report("one peer alone", [r["sum"] for r in res["one"]], "GB/s")
    report("%d peers, all together" % args.peers, [r["sum"] for r in res["all"]], "GB/s",
           [r["sum"] for r in res["one"]])
    report("%d peers, the slowest" % args.peers, [r["min"] for r in res["all"]], "GB/s")
    report("%d peers, the fastest" % args.peers, [r["max"] for r in res["all"]], "GB/s")
    report("slowest / fastest", [r["min"] / r["max"] for r in res["all"]], "", fmt="%.3f")
    stop(every)


def bench_tenants(args, work):
    tokens = {"t1": "bench-token-one-0123456789", "t2": "bench-token-two-0123456789"}
    auth = os.path.join(work, "auth")
    with open(auth, "w") as f:
        for tenant, tok in tokens.items():
            f.write("token sha256:%s %s\n" % (hashlib.sha256(tok.encode()).hexdigest(), tenant))
    a, pa = start(args.moongate, work, "ta", ["--auth-file", auth])
    b, pb = start(args.moongate, work, "tb", ["--auth-file", auth])

    def one(way):
        at = time.time() + 3.0
        envs = ([{"MOONGATE_TOKEN": tokens["t1"]}, {"MOONGATE_TOKEN": tokens["t2"]}]
                if way == "tenants" else [{"MOONGATE_TOKEN": tokens["t1"]}] * 2)
        res = together([mgbench(args, pa, pb, at, 4, env) for env in envs])
        total = sum(r["bytes"] for r in res)
        return {"share": min(r["bytes"] for r in res) / total,
                "sum": sum(r["gbytes_per_s"] for r in res)}

    print("Two clients, 4 batches in flight each (64 KiB x 128 scattered WRITE, %g s):" %
          args.seconds)
    res = alternate(["tenants", "one tenant"], args.rounds, one)
    report("two tenants: the smaller share of the bytes", [r["share"] for r in res["tenants"]],
           "", fmt="%.3f")
    report("two tenants: GB/s together", [r["sum"] for r in res["tenants"]], "GB/s")
    report("one tenant, two clients: the smaller share", [r["share"] for r in res["one tenant"]],
           "", fmt="%.3f")
    report("one tenant, two clients: GB/s together", [r["sum"] for r in res["one tenant"]],
           "GB/s")
    stop([a, b])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--mgbench", required=True)
    ap.add_argument("what", nargs="*", default=["conns", "peers", "tenants"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--peers", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=4)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.conns + 256)), hard))
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="mg-fanout-") as work:
        try:
            for w in args.what:
                {"conns": bench_conns, "peers": bench_peers, "tenants": bench_tenants}[w](args,
                                                                                        work)
        finally:
            stop(STARTED)


if __name__ == "__main__":
    main()
