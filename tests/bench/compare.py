#!/usr/bin/env python3
"""Two builds of moongate side by side: the control plane, leases and transfers, alternated.

    compare.py --old BUILD_DIR --new BUILD_DIR [--rounds 3] [--quick]

Each round runs every case once with each build, the order of the two builds swapping from round
to round (old first, then new first, ...), so a machine that drifts (thermal, page cache, other
load) weighs on both. The table gives each build's median over the rounds, the spread (min-max)
and the ratio new / old, "higher is better" or "lower is better" as the case says.

The control and lease cases pin the daemon to CPU 1 and the client to CPU 0 (taskset), as the
control-plane benchmark does, when the machine has two CPUs or more.

Cases:
  control   h2load, Health/Check over h2c, one daemon worker, -c 8 -m 32: requests/s
  lease     bench_lease --lease-only --pairs N over the Unix socket: AcquireLease + ReleaseLease
            p50 in microseconds per pair (lower is better)
  64K x128  two daemons, mgbench transfer WRITE, 128 blocks of 64 KiB per batch, one thread: GB/s
  1M x16    the same with 16 blocks of 1 MiB: GB/s
  1G        one 1 GiB WRITE request (mgbench --big 1G): GB/s
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


PIN = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2


def pinned(cpu, args):
    return (["taskset", "-c", str(cpu)] + args) if PIN and cpu is not None else args


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """One moongate of a build, on loopback h2c and a Unix socket, its own shm dir."""

    def __init__(self, build, *extra, cpu=None):
        self.shm = tempfile.mkdtemp(prefix="mg-compare-", dir="/dev/shm")
        self.port = free_port()
        self.sock = os.path.join(self.shm, "moongate.sock")
        self.log = open(os.path.join(self.shm, "log"), "w+")
        args = [os.path.join(build, "moongate"), "--allow-anonymous", "--listen", "",
                "--h2c-listen", "127.0.0.1:%d" % self.port, "--ops-listen", "",
                "--unix-socket", self.sock, "--shm-dir", self.shm, "--access-log=false",
                "--memlock", "try", "--peer-tls=false", "--peer-anonymous"] + list(extra)
        self.proc = subprocess.Popen(pinned(cpu, args), stdout=self.log,
                                     stderr=subprocess.STDOUT)
        for _ in range(200):
            self.log.seek(0)
            if "event=ready" in self.log.read():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.log.seek(0)
        raise RuntimeError("moongate did not start: " + self.log.read()[-2000:])

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.shm, ignore_errors=True)


def control(build, quick):
    d = Daemon(build, "--workers", "1", "--data-listen", "", "--pool-bytes", "0", cpu=1)
    try:
        with tempfile.NamedTemporaryFile(suffix=".bin") as body:
            body.write(b"\0\0\0\0\0")  # one gRPC frame: an empty HealthCheckRequest
            body.flush()
            n = 50000 if quick else 200000
            out = subprocess.run(pinned(0, [
                "h2load", "-n", str(n), "-c", "8", "-m", "32", "-t", "1", "-d", body.name,
                "-H", "content-type: application/grpc", "-H", "te: trailers",
                "http://127.0.0.1:%d/grpc.health.v1.Health/Check" % d.port]),
                capture_output=True, text=True, timeout=600).stdout
        m = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
        ok = re.search(r"status codes: (\d+) 2xx", out)
        if not m or not ok or int(ok.group(1)) != n:
            raise RuntimeError("h2load: " + out[-1500:])
        secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        return n / secs
    finally:
        d.stop()


def lease(build, quick):
    d = Daemon(build, "--workers", "2", "--data-listen", "", "--pool-bytes", "64M", cpu=1)
    try:
        out = subprocess.run(pinned(0, [
            os.path.join(build, "bench", "bench_lease"), "--target", "unix:" + d.sock,
            "--lease-only", "--pairs", "5000" if quick else "20000"]),
            capture_output=True, text=True, timeout=600).stdout
        m = re.search(r"lease p50 ([\d.]+) us", out)
        if not m:
            raise RuntimeError("bench_lease: " + out[-1500:])
        return float(m.group(1))
    finally:
        d.stop()


def transfers(build, quick):
    """GB/s of the three transfer shapes, two daemons of the build."""
    a = Daemon(build, "--data-listen", "127.0.0.1:0", "--pool-bytes", "0")
    b = Daemon(build, "--data-listen", "127.0.0.1:0", "--pool-bytes", "0")
    mgbench = os.path.join(build, "mgbench")
    base = [mgbench, "transfer", "--target", "127.0.0.1:%d" % a.port,
            "--peer", "127.0.0.1:%d" % b.port, "--ops", "write", "--json"]
    total = "256M" if quick else "1G"
    got = {}
    try:
        for name, extra in (("64K x128", ["--blocks", "64K", "--batches", "128"]),
                            ("1M x16", ["--blocks", "1M", "--batches", "16"])):
            out = subprocess.run(base + extra + ["--bytes", total, "--threads", "1"],
                                 capture_output=True, text=True, timeout=900).stdout
            rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            if not rows or not all(r["ok"] for r in rows):
                raise RuntimeError("mgbench: " + out[-1500:])
            got[name] = rows[0]["gbytes_per_s"]
        out = subprocess.run(base + ["--blocks", "64K", "--batches", "1", "--bytes", "64M",
                                     "--big", total], capture_output=True, text=True,
                             timeout=900).stdout
        rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        big = [r for r in rows if r["block_bytes"] >= (256 << 20)]
        if not big or not all(r["ok"] for r in rows):
            raise RuntimeError("mgbench --big: " + out[-1500:])
        got["1G"] = big[0]["gbytes_per_s"]
        return got
    finally:
        a.stop()
        b.stop()


CASES = [  # name, unit, higher is better
    ("control", "req/s", True),
    ("lease", "us p50", False),
    ("64K x128", "GB/s", True),
    ("1M x16", "GB/s", True),
    ("1G", "GB/s", True),
]


def one_round(build, quick):
    r = {"control": control(build, quick), "lease": lease(build, quick)}
    r.update(transfers(build, quick))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="build directory of the older revision")
    ap.add_argument("--new", required=True, help="build directory of this revision")
    ap.add_argument("--old-name", default="old")
    ap.add_argument("--new-name", default="new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    runs = {"old": [], "new": []}
    for i in range(a.rounds):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for side in order:
            r = one_round(a.old if side == "old" else a.new, a.quick)
            runs[side].append(r)
            print("round %d %-4s " % (i + 1, side) +
                  "  ".join("%s %.4g" % (k, r[k]) for k, _, _ in CASES), flush=True)
    print("\n%d alternated rounds; median [min-max] of each build; ratio new/old of the medians"
          % a.rounds)
    print("| case | unit | %s | %s | new/old | better |" % (a.old_name, a.new_name))
    print("|---|---|---:|---:|---:|---|")
    for name, unit, higher in CASES:
        o = [r[name] for r in runs["old"]]
        n = [r[name] for r in runs["new"]]
        mo, mn = statistics.median(o), statistics.median(n)
        print("| %s | %s | %.4g [%.4g-%.4g] | %.4g [%.4g-%.4g] | %.3f | %s |" %
              (name, unit, mo, min(o), max(o), mn, min(n), max(n), mn / mo,
               "higher" if higher else "lower"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
