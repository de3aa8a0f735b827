#!/usr/bin/python3
"""Control-plane benchmark: h2load against grpc.health.v1.Health/Check on moongate and on two
reference gRPC C++ servers (Debian's libgrpc++: the synchronous API and the callback API), in
the same run, over h2c and TLS; plus moongate's JSON route. Prints requests/s, latency percentiles and server CPU for each, and the
moongate/reference ratios.

The server runs pinned to one CPU and h2load to another, so "requests/s per server core" is
requests divided by the server's CPU seconds (utime + stime from /proc). h2load counts any
HTTP 200 as success, so every run is also checked for grpc-status: moongate's own counter of
OK answers must grow by exactly the number of requests, and one curl call per target must show
`grpc-status: 0` in the trailers.

Usage: bench_control.py --moongate BIN --ref BIN --certs DIR [--requests N] [--conns C]
                        [--streams M] [--rounds R]
"""
import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1
SERVER_CPU = str(NCPU - 1)
CLIENT_CPU = "0"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """utime + stime of every thread of pid."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_port(port, proc, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %d" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not listen on %d" % port)


def curl_status(url, ca, body, ctype):
    args = ["curl", "-sS", "-D", "-", "-o", "/dev/null", "--data-binary", "@-", "-H",
            "content-type: " + ctype]
    args += ["--http2", "--cacert", ca] if url.startswith("https") else ["--http2-prior-knowledge"]
    if ctype == "application/grpc":
        args += ["-H", "te: trailers"]
    out = subprocess.run(args + [url], input=body, capture_output=True).stdout.decode()
    m = re.search(r"grpc-status: (\d+)", out)
    h = re.search(r"^HTTP/2 (\d+)", out, re.M)
    return (int(m.group(1)) if m else None), (int(h.group(1)) if h else None)


def h2load(url, body_file, ctype, n, conns, streams, ca=None):
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        args = ["taskset", "-c", CLIENT_CPU, "h2load", "-n", str(n), "-c", str(conns), "-m",
                str(streams), "-t", "1", "-d", body_file, "-H", "content-type: " + ctype,
                "--log-file", log.name, url]
        if ctype == "application/grpc":
            args[-1:-1] = ["-H", "te: trailers"]
        t0 = time.monotonic()
        out = subprocess.run(args, capture_output=True, text=True, timeout=600).stdout
        wall = time.monotonic() - t0
        durations = []
        ok = 0
        for line in log:
            parts = line.split()
            if len(parts) >= 3:
                durations.append(int(parts[2]) / 1000.0)  # µs -> ms
                ok += parts[1] == "200"
    m = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    durations.sort()
    pct = lambda p: durations[min(len(durations) - 1, int(p * len(durations)))]
    return {"rps": n / secs, "secs": secs, "wall": wall, "done": int(done.group(1)),
            "ok": ok, "p50": pct(0.50), "p99": pct(0.99), "mean": statistics.mean(durations)}


class Server:
    def __init__(self, args, port):
        self.proc = subprocess.Popen(["taskset", "-c", SERVER_CPU] + args,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port, self.proc)

    def cpu(self):
        return cpu_seconds(self.proc.pid)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def moongate_ok_count(ops_port, method="Check"):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % ops_port) as r:
        text = r.read().decode()
    m = re.search(r'moongate_grpc_handled_total\{grpc_service="grpc.health.v1.Health",'
                  r'grpc_method="%s",grpc_code="OK"\} (\d+)' % method, text)
    return int(m.group(1)) if m else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--certs", required=True)
    ap.add_argument("--requests", type=int, default=200000)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="runs per case; the median is shown")
    a = ap.parse_args()
    ca = os.path.join(a.certs, "ca.pem")
    cert, key = os.path.join(a.certs, "server.pem"), os.path.join(a.certs, "server.key")

    grpc_body = tempfile.NamedTemporaryFile(delete=False)
    grpc_body.write(b"\0\0\0\0\0")  # one empty HealthCheckRequest
    grpc_body.close()
    json_body = tempfile.NamedTemporaryFile(delete=False)
    json_body.write(b"{}")
    json_body.close()

    mg_h2c, mg_tls, mg_ops = free_port(), free_port(), free_port()
    ref_h2c, ref_tls = free_port(), free_port()
    tmp = tempfile.mkdtemp()
    mg = Server([a.moongate, "--allow-anonymous", "--listen", "127.0.0.1:%d" % mg_tls, "--h2c-listen",
                 "127.0.0.1:%d" % mg_h2c, "--ops-listen", "127.0.0.1:%d" % mg_ops,
                 "--unix-socket", os.path.join(tmp, "mg.sock"), "--tls-cert", cert,
                 "--tls-key", key, "--access-log=false", "--workers", "1",
                 "--max-concurrent-streams", "1000"], mg_tls)
    ref = Server([a.ref, str(ref_h2c), str(ref_tls), cert, key], ref_tls)
    wait_port(ref_h2c, ref.proc)
    cb_h2c, cb_tls = free_port(), free_port()
    cb = Server([a.ref, "--callback", str(cb_h2c), str(cb_tls), cert, key], cb_tls)
    wait_port(cb_h2c, cb.proc)

    path = "/grpc.health.v1.Health/Check"
    cases = [
        ("moongate", "h2c", "grpc", mg, "http://127.0.0.1:%d" % mg_h2c),
        ("grpc-sync", "h2c", "grpc", ref, "http://127.0.0.1:%d" % ref_h2c),
        ("grpc-cb", "h2c", "grpc", cb, "http://127.0.0.1:%d" % cb_h2c),
        ("moongate", "tls", "grpc", mg, "https://localhost:%d" % mg_tls),
        ("grpc-sync", "tls", "grpc", ref, "https://localhost:%d" % ref_tls),
        ("grpc-cb", "tls", "grpc", cb, "https://localhost:%d" % cb_tls),
        ("moongate", "h2c", "json", mg, "http://127.0.0.1:%d" % mg_h2c),
        ("moongate", "tls", "json", mg, "https://localhost:%d" % mg_tls),
    ]
    print("h2load -n %d -c %d -m %d -t 1 on CPU %s; servers pinned to CPU %s; median of %d "
          "rounds" % (a.requests, a.conns, a.streams, CLIENT_CPU, SERVER_CPU, a.rounds))
    results = {}
    failures = 0
    try:
        for name, transport, proto, server, base in cases:
            ctype = "application/grpc" if proto == "grpc" else "application/json"
            body = grpc_body.name if proto == "grpc" else json_body.name
            with open(body, "rb") as f:
                gs, http = curl_status(base + path, ca, f.read(), ctype)
            if proto == "grpc" and gs != 0:
                print("  %s %s: curl saw grpc-status %s: not measured" % (name, transport, gs))
                failures += 1
                continue
            if proto == "json" and http != 200:
                print("  %s %s json: HTTP %s: not measured" % (name, transport, http))
                failures += 1
                continue
            runs = []
            for _ in range(a.rounds):
                before_ok = moongate_ok_count(mg_ops) if server is mg else None
                c0 = server.cpu()
                r = h2load(base + path, body, ctype, a.requests, a.conns, a.streams)
                r["cpu"] = server.cpu() - c0
                r["per_core"] = a.requests / r["cpu"] if r["cpu"] > 0 else float("nan")
                if server is mg:
                    grew = moongate_ok_count(mg_ops) - before_ok
                    if grew != a.requests:
                        print("  %s %s %s: only %d of %d answers were grpc-status 0" % (
                            name, transport, proto, grew, a.requests))
                        failures += 1
                if r["done"] != a.requests or r["ok"] != a.requests:
                    print("  %s %s %s: %d done, %d HTTP 200 of %d" % (
                        name, transport, proto, r["done"], r["ok"], a.requests))
                    failures += 1
                runs.append(r)
            runs.sort(key=lambda r: r["rps"])
            results[(name, transport, proto)] = runs[len(runs) // 2]
    finally:
        mg.stop()
        ref.stop()
        cb.stop()

    hdr = "%-10s %-5s %-5s %12s %9s %9s %10s %14s"
    print(hdr % ("server", "conn", "body", "requests/s", "p50 ms", "p99 ms", "server CPU",
                 "req/s per core"))
    for (name, transport, proto), r in results.items():
        print("%-10s %-5s %-5s %12.0f %9.3f %9.3f %9.2fs %14.0f" % (
            name, transport, proto, r["rps"], r["p50"], r["p99"], r["cpu"], r["per_core"]))
    print()
    for transport in ("h2c", "tls"):
        m = results.get(("moongate", transport, "grpc"))
        for ref_name in ("grpc-sync", "grpc-cb"):
            r = results.get((ref_name, transport, "grpc"))
            if m and r:
                print("moongate / %-9s over %s: requests/s %5.2fx, requests/s per core %5.2fx, "
                      "p99 latency %.2fx (lower is better)" % (
                          ref_name, transport, m["rps"] / r["rps"],
                          m["per_core"] / r["per_core"], m["p99"] / r["p99"]))
    for transport in ("h2c", "tls"):
        j, g = results.get(("moongate", transport, "json")), results.get(("moongate", transport,
                                                                          "grpc"))
        if j and g:
            print("moongate JSON / gRPC over %s: requests/s %.2fx" % (transport,
                                                                     j["rps"] / g["rps"]))
    os.unlink(grpc_body.name)
    os.unlink(json_body.name)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
