"""Reads mgbench transfer --json lines on stdin and prints them as a table beside the
references measured in the same run (iperf3, ucx_perftest), with the ratios the transfer
benchmark is judged by."""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--iperf", type=float, required=True)
ap.add_argument("--tag", type=float, default=0.0)
ap.add_argument("--put", type=float, default=0.0)
args = ap.parse_args()
rows = [json.loads(line) for line in sys.stdin if line.startswith("{")]


def size(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)


print("\n%-5s %9s %6s %4s %9s %8s %8s %11s %11s %11s %10s" % (
    "op", "block", "batch", "thr", "GB/s", "/iperf3", "/ucx put", "avg us", "p50 us", "p99 us",
    "submit us"))
for r in rows:
    print("%-5s %9s %6d %4d %9.3f %7.2fx %7.2fx %11.1f %11.1f %11.1f %10.1f%s%s" % (
        r["op"].upper(), size(r["block_bytes"]), r["batch"], r["threads"], r["gbytes_per_s"],
        r["gbytes_per_s"] / args.iperf, r["gbytes_per_s"] / args.put if args.put else 0,
        r["latency_avg_us"], r["latency_p50_us"], r["latency_p99_us"], r["submit_avg_us"],
        "  (Submit with wait)" if r.get("submit_wait") else "", "" if r["ok"] else "  FAILED"))


def find(op, block, batch, threads, submit_wait=False):
    for r in rows:
        if (r["op"], r["block_bytes"], r["batch"], r["threads"],
                r.get("submit_wait", False)) == (op, block, batch, threads, submit_wait):
            return r
    return None


print("\nreferences: iperf3 %.2f GB/s, ucx tag_bw %.2f GB/s, ucx ucp_put_bw %.2f GB/s" % (
    args.iperf, args.tag, args.put))
for op in ("write", "read"):
    r = find(op, 1 << 30, 1, 1)
    if r:
        print("1 GiB %-5s: %.2f GB/s = %.2fx iperf3 (target >= 0.8x), %.2fx ucp_put_bw "
              "(target >= 2x)" % (op.upper(), r["gbytes_per_s"], r["gbytes_per_s"] / args.iperf,
                                  r["gbytes_per_s"] / args.put if args.put else 0))
for op in ("write", "read"):
    one, four = find(op, 64 << 20, 4, 1), find(op, 64 << 20, 4, 4)
    if one and four:
        print("4 threads %-5s: %.2f GB/s = %.2fx of 1 thread (target >= 0.9x)" % (
            op.upper(), four["gbytes_per_s"], four["gbytes_per_s"] / one["gbytes_per_s"]))
r = find("write", 4096, 1, 1)
if r:
    print("4 KiB WRITE, Submit then Wait: p50 %.1f us (target < 250 us)" % r["latency_p50_us"])
r = find("write", 4096, 1, 1, submit_wait=True)
if r:
    print("4 KiB WRITE, Submit with wait (one call): p50 %.1f us (target < 250 us)" %
          r["latency_p50_us"])
r = find("write", 4096, 4096, 1)
if r:
    print("4096-block batch submit: avg %.1f us (target < 5000 us)" % r["submit_avg_us"])
