#!/usr/bin/python3
"""The data path against the wire: each shape a serving system moves, beside its reference
measured in the same run, the shapes and references alternated round by round (the order
rotates), medians of --rounds with their spread (min-max) and the ratio of the medians.

Two daemons on loopback (TCP data plane), driven by mgbench transfer (the scattered shapes
for 3 s each, as iperf3 runs):
  64K x 128 scattered WRITE / READ, one thread, 1 and 4 batches in flight   against iperf3
  4K x 4096 scattered WRITE, one thread, 4 in flight                         against iperf3
  one 1 GiB WRITE                                                            against UCX tag_bw
  4 KiB x 1024, 64 KiB x 128, 1 MiB x 16 WRITEs: four threads                against one thread
  1 GiB copy on one daemon (peer "")                                         against memcpy
References: iperf3 (one stream, 1 MiB writes, 3 s), ucx_perftest tag_bw over TCP (1 MiB),
memcpy of 1 GiB on one thread (prefaulted, in mgbench, the same process as the copy). The one
1 GiB WRITE is also put beside tag_bw moving 1 GiB messages (the same shape; no target), and
two shapes run again between daemons with --tcp-congestion cubic beside iperf3 -C cubic.

The daemons' segments live in /dev/shm as this machine has it; with --huge-pages in a tmpfs
mounted huge=within_size for the run (root only), so they are made of 2 MiB pages — as an
operator gets by mounting the daemon's --shm-dir so (docs/operations.md).

Usage: bench_wire.py --moongate BIN --mgbench BIN [--rounds 5] [--json FILE] [--huge-pages]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fanout import start, stop  # noqa: E402
from bench_memory import free_port  # noqa: E402
from bench_names import alternate  # noqa: E402


def iperf3(congestion=None):
    port = free_port()
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # (a probe would be the one client iperf3 -1 serves)
    out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-l", "1M", "-t", "3",
                          "-J"] + (["-C", congestion] if congestion else []),
                         capture_output=True, text=True, timeout=60).stdout
    srv.wait(30)
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 8e9


def ucx_tag_bw(size, count):
    """ucx_perftest tag_bw over TCP: `count` messages of `size` bytes, GB/s."""
    port = free_port()
    env = dict(os.environ, UCX_TLS="tcp")
    args = ["ucx_perftest", "-t", "tag_bw", "-s", str(size), "-n", str(count), "-p", str(port)]
    srv = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    out = subprocess.run(args[:1] + ["127.0.0.1"] + args[1:], env=env, capture_output=True,
                         text=True, timeout=300).stdout
    srv.wait(30)
    for line in out.splitlines():
        if line.startswith("Final:"):
            return float(line.split()[6]) * 1048576 / 1e9  # MB/s column, MiB
    raise SystemExit("ucx_perftest printed no Final line:\n" + out)


def mgbench(args, target, peer, *opts):
    """The JSON lines of one mgbench transfer run (the configuration measured is the last)."""
    p = subprocess.run([args.mgbench, "transfer", "--target", target, "--peer", peer, "--json",
                        *opts], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit("mgbench %s: %s%s" % (" ".join(opts), p.stdout, p.stderr))
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def scattered(block, n, op, inflight, nbytes):
    """A scattered shape, batches kept in flight for 3 s (as iperf3 runs) over segments of
    nbytes: the steady state, not the first batches' ramp."""
    return ["--blocks", block, "--batches", n, "--ops", op, "--scatter", "--inflight", inflight,
            "--bytes", nbytes, "--seconds", "3"]


# name: (mgbench options, reference, the target as a ratio or None)
SHAPES = {}
for _op in ("WRITE", "READ"):
    for _inflight, _target in (("1", 0.8), ("4", 1.0)):
        SHAPES["64K x 128 scattered %s, %s in flight" % (_op, _inflight)] = (
            scattered("64K", "128", _op.lower(), _inflight, "512M"), "iperf3", _target)
SHAPES["4K x 4096 scattered WRITE, 4 in flight"] = (
    scattered("4K", "4096", "write", "4", "256M"), "iperf3", 0.25)
SHAPES["one 1 GiB WRITE"] = (
    ["--blocks", "64K", "--batches", "1", "--ops", "write", "--bytes", "64K", "--big", "1G"],
    "ucx tag_bw", 1.0)
for _blk, _n, _bytes in (("4K", "1024", "128M"), ("64K", "128", "512M"), ("1M", "16", "512M")):
    for _thr in ("1", "4"):
        SHAPES["%s x %s WRITE, %s thread%s" % (_blk, _n, _thr, "s" if _thr != "1" else "")] = (
            ["--blocks", _blk, "--batches", _n, "--ops", "write", "--threads", _thr, "--bytes",
             _bytes], "%s x %s WRITE, 1 thread" % (_blk, _n) if _thr == "4" else "iperf3",
            0.95 if _thr == "4" else None)

# Shapes also put beside a second reference, with no target: UCX moving the same shape. tag_bw's
# 1 MiB messages (the reference) are sent from and received into buffers that stay in
# cache; one 1 GiB WRITE moves memory that does not.
ALSO = {"one 1 GiB WRITE": "ucx tag_bw, 1 GiB messages"}

# Two shapes again between daemons started with --tcp-congestion cubic, beside iperf3 -C cubic
# (no target): what the data plane does where the system's congestion control is not the one
# the operator would pick for a low-latency link (BBR, here: it paces every connection).
CUBIC = "cubic"
SHAPES_CC = {
    "64K x 128 scattered WRITE, 4 in flight, cubic": scattered("64K", "128", "write", "4", "512M"),
    "one 1 GiB WRITE, cubic": SHAPES["one 1 GiB WRITE"][0]}


def mount_huge(work):
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=within_size,size=12g",
                        "moongate-bench", work], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("--huge-pages: cannot mount a tmpfs with huge=within_size (root is "
                         "needed): %s" % r.stderr.strip())


def measure(args, work):
    """Every shape and reference, alternated round by round: {way: [figures of each round]}."""
    a, pa = start(args.moongate, work, "a")
    b, pb = start(args.moongate, work, "b")
    ta, tb = "127.0.0.1:%d" % pa, "127.0.0.1:%d" % pb
    cc = ["--tcp-congestion", CUBIC]
    (ca, pca), (cb, pcb) = start(args.moongate, work, "ca", cc), start(args.moongate, work, "cb", cc)

    def one(way):
        if way == "iperf3":
            return {"iperf3": iperf3()}
        if way == "iperf3, cubic":
            return {way: iperf3(CUBIC)}
        if way in SHAPES_CC:
            return {way: mgbench(args, "127.0.0.1:%d" % pca, "127.0.0.1:%d" % pcb,
                                 *SHAPES_CC[way])[-1]["gbytes_per_s"]}
        if way == "ucx tag_bw":
            return {"ucx tag_bw": ucx_tag_bw(1 << 20, 2000),
                    "ucx tag_bw, 1 GiB messages": ucx_tag_bw(1 << 30, 8)}
        if way == "copy":
            rows = mgbench(args, ta, "", "--blocks", "64K", "--batches", "1", "--ops",
                           "write", "--bytes", "1M", "--big", "1G")
            return {"1 GiB copy, peer \"\"": rows[1]["gbytes_per_s"],
                    "memcpy 1 GiB, one thread": rows[2]["gbytes_per_s"]}
        return {way: mgbench(args, ta, tb, *SHAPES[way][0])[-1]["gbytes_per_s"]}

    try:
        return alternate(["iperf3", "ucx tag_bw", "copy"] + list(SHAPES) + ["iperf3, cubic"] +
                         list(SHAPES_CC), args.rounds, one)
    finally:
        stop([a, b, ca, cb])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--mgbench", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also write every figure here, one JSON object per line")
    ap.add_argument("--huge-pages", action="store_true",
                    help="segments in a tmpfs mounted huge=within_size (root)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="mg-wire-") as work:
        if args.huge_pages:
            mount_huge(work)
        try:
            t0 = time.monotonic()
            res = measure(args, work)
        finally:
            if args.huge_pages:
                subprocess.run(["umount", work], check=False)
    vals = {}
    for way, rounds in res.items():
        for r in rounds:
            for k, v in r.items():
                vals.setdefault(k, []).append(v)
    refs = dict((k, (v[1], v[2])) for k, v in SHAPES.items())
    refs['1 GiB copy, peer ""'] = ("memcpy 1 GiB, one thread", 0.8)
    refs.update((k, ("iperf3, cubic", None)) for k in SHAPES_CC)
    print("%d rounds, %.0f s, segments in %s; GB/s: median (min-max); ratio of the medians to "
          "the reference" % (args.rounds, time.monotonic() - t0,
                             "2 MiB pages (tmpfs huge=within_size)" if args.huge_pages
                             else "/dev/shm as mounted here"))
    out = []
    for k, v in vals.items():
        m = statistics.median(v)
        ref, target = refs.get(k, (None, None))
        row = {"what": k, "gbytes_per_s": m, "min": min(v), "max": max(v), "rounds": len(v)}
        line = "  %-46s %6.2f GB/s (%5.2f-%5.2f)" % (k, m, min(v), max(v))
        if ref:
            ratio = m / statistics.median(vals[ref])
            row.update(reference=ref, ratio=ratio, target=target)
            line += "  %5.2fx %s" % (ratio, ref)
            if target:
                line += "  (target %.2fx: %s)" % (target, "met" if ratio >= target else "NOT met")
        print(line)
        out.append(row)
        if k in ALSO and ALSO[k] in vals:
            ratio = m / statistics.median(vals[ALSO[k]])
            print("  %-46s %6.2f GB/s (%5.2f-%5.2f)  %5.2fx %s" % (
                k + ", same shape", m, min(v), max(v), ratio, ALSO[k]))
            out.append(dict(row, what=k + ", same shape", reference=ALSO[k], ratio=ratio,
                            target=None))
    if args.json:
        with open(args.json, "w") as f:
            for row in out:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
