#!/usr/bin/python3
"""The benchmark report, by one command (tests/bench/run.sh report): runs the wire, transfer,
fan-out, scale, control and lease benchmarks (each with its reference measured in the same
run), keeps their raw output, and writes OUT/report.md — the machine it ran on first — with four
plots made by gnuplot:

  wire.png      the shapes serving systems move (scattered 64 KiB and 4 KiB batches, in flight,
                one 1 GiB request, four threads, same-host copies): medians with min-max bars,
                beside their references (iperf3, UCX, one thread, memcpy)
  transfer.png  throughput by block size, WRITE and READ, against iperf3 and UCX (same run)
  control.png   Health/Check requests per second, moongate against the reference gRPC C++
                servers, per transport
  lease.png     destination memory per read: register + unregister against lease + release

Usage: report.py --run RUN_SH --out DIR [--quick]    (--quick: fewer and shorter rounds)
       report.py --out DIR --from-raw                (re-plot saved raw output)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time


def run(cmd, path):
    """Runs one benchmark, keeping stdout and stderr in path (.out, .err)."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    with open(path + ".out", "w") as f:
        f.write(p.stdout)
    with open(path + ".err", "w") as f:
        f.write(p.stderr)
    print("  %s: %.0f s, exit %d" % (" ".join(cmd[1:2]), time.monotonic() - t0, p.returncode),
          file=sys.stderr)
    return p.stdout, p.stderr


def parse_transfer(out, err):
    refs = {}
    for key, pat in (("iperf3", r"iperf3.*?([\d.]+) GB/s"),
                     ("ucx tag_bw", r"tag_bw.*?([\d.]+) GB/s"),
                     ("ucx ucp_put_bw", r"ucp_put_bw.*?([\d.]+) GB/s")):
        m = re.search(pat, out)
        if m:
            refs[key] = float(m.group(1))
    rows = [json.loads(line) for line in (out + "\n" + err).splitlines()
            if line.startswith("{") and '"gbytes_per_s"' in line]
    seen, unique = set(), []
    for r in rows:  # lines appear on both streams
        key = json.dumps(r, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return refs, unique


def parse_control(out):
    rows = []
    for line in out.splitlines():
        m = re.match(r"(\S+)\s+(h2c|tls)\s+(grpc|json)\s+(\d+)\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            rows.append(dict(server=m.group(1), transport=m.group(2), body=m.group(3),
                             rps=float(m.group(4)), p50_ms=float(m.group(5)),
                             p99_ms=float(m.group(6))))
    return rows


def parse_lease(out):
    rows = []
    for line in out.splitlines():
        m = re.match(r"(\d+ x \d+ KiB)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            rows.append(dict(read=m.group(1), register_p50=float(m.group(2)),
                             register_p99=float(m.group(3)), lease_p50=float(m.group(4)),
                             lease_p99=float(m.group(5))))
    floor = re.search(r"floor = .*?([\d.]+) us", out)
    return rows, float(floor.group(1)) if floor else 0.0


def parse_lease_paths(out):
    """The acquire + release runs alone: one row per (transport, polling) with the p50 of the
    largest read shape and the floor of the same run."""
    rows = []
    for part in re.split(r"\n(?=Destination memory for a read)", out):
        head = re.search(r"one connection to (\S+), one call at a time(, busy-polling)?", part)
        floor = re.search(r"floor = .*?([\d.]+) us", part)
        p50s = [float(x) for x in re.findall(r"KiB: lease p50 ([\d.]+) us", part)] or [
            float(x) for x in re.findall(r"(?m)^\d+ x \d+ KiB\s+[\d.]+\s+[\d.]+\s+([\d.]+)", part)]
        if head and floor and p50s:
            rows.append(dict(transport="unix" if head.group(1).startswith("unix:") else "tcp",
                             polling=bool(head.group(2)), floor=float(floor.group(1)),
                             p50=p50s[-1]))
    return rows


def gnuplot(script, out_dir):
    p = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True, cwd=out_dir)
    if p.returncode != 0:
        raise RuntimeError("gnuplot: " + p.stderr)


def size_label(b):
    return "%dM" % (b >> 20) if b >= 1 << 20 else "%dK" % (b >> 10)


def plot_transfer(refs, rows, out_dir):
    blocks = sorted({r["block_bytes"] for r in rows if r["threads"] == 1 and r["ok"]})
    with open(os.path.join(out_dir, "transfer.dat"), "w") as f:
        f.write("# block write_GBps read_GBps\n")
        for i, b in enumerate(blocks):
            w = [r["gbytes_per_s"] for r in rows if r["block_bytes"] == b and r["op"] == "write"
                 and r["threads"] == 1]
            rd = [r["gbytes_per_s"] for r in rows if r["block_bytes"] == b and r["op"] == "read"
                  and r["threads"] == 1]
            f.write("%d %s %s %s\n" % (i, size_label(b), max(w) if w else "NaN",
                                      max(rd) if rd else "NaN"))
    lines = "".join(", %f w l dt 2 lw 2 title '%s (%.2f GB/s)'" % (v, k, v)
                    for k, v in refs.items())
    gnuplot("""set terminal pngcairo size 900,500 font ',10' noenhanced
set output 'transfer.png'
set title 'moongate transfer throughput by block size (one thread, the better of batches of 1 and 16), references from the same run'
set ylabel 'GB/s'
set xlabel 'block size'
set style data linespoints
set key outside right
set grid ytics
plot 'transfer.dat' using 1:3:xtic(2) title 'moongate WRITE' lw 2 pt 7, \\
     '' using 1:4 title 'moongate READ' lw 2 pt 5%s
""" % lines, out_dir)


def plot_control(rows, out_dir):
    rows = [r for r in rows if r["body"] == "grpc"]
    servers = sorted({r["server"] for r in rows}, key=lambda s: (s != "moongate", s))
    with open(os.path.join(out_dir, "control.dat"), "w") as f:
        f.write("# server h2c tls (requests/s)\n")
        for s in servers:
            v = {r["transport"]: r["rps"] for r in rows if r["server"] == s}
            f.write("%s %s %s\n" % (s, v.get("h2c", "NaN"), v.get("tls", "NaN")))
    gnuplot("""set terminal pngcairo size 900,500 font ',10' noenhanced
set output 'control.png'
set title 'Health/Check requests per second (h2load, same run), moongate against gRPC C++'
set ylabel 'requests/s'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set yrange [0:*]
plot 'control.dat' using 2:xtic(1) title 'h2c', '' using 3 title 'TLS'
""", out_dir)


def plot_lease(rows, floor, out_dir):
    with open(os.path.join(out_dir, "lease.dat"), "w") as f:
        f.write("# read register_p50 lease_p50 (us)\n")
        for r in rows:
            f.write('"%s" %f %f\n' % (r["read"], r["register_p50"], r["lease_p50"]))
    gnuplot("""set terminal pngcairo size 900,500 font ',10' noenhanced
set output 'lease.png'
set title 'Destination memory per read (p50, microseconds, same run): register + unregister vs lease + release'
set ylabel 'microseconds (log scale)'
set logscale y
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
plot 'lease.dat' using 2:xtic(1) title 'register per read', '' using 3 title 'lease per read', \\
     %f with lines dt 2 lw 2 title 'floor: two plain round trips (%.1f us)'
""" % (floor, floor), out_dir)


def machine():
    """Lines saying what the figures ran on."""
    def sh(cmd):
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        return p.stdout.strip() or "?"
    return ["| | |", "|---|---|",
            "| CPU | %s |" % sh("lscpu | sed -n 's/^Model name: *//p' | head -1"),
            "| cores | %d |" % (os.cpu_count() or 0),
            "| memory | %s |" % sh("free -g | awk '/^Mem:/ {print $2 \" GiB\"}'"),
            "| kernel | %s |" % os.uname().release,
            "| TCP congestion control | %s |" % sh("sysctl -n net.ipv4.tcp_congestion_control"),
            "| moongate | %s |" % sh("git rev-parse --short HEAD 2>/dev/null"),
            "| build | %s |" % sh("grep -h '^CMAKE_BUILD_TYPE' build/CMakeCache.txt "
                                  "2>/dev/null | cut -d= -f2"), ""]


def plot_wire(rows, out_dir):
    with open(os.path.join(out_dir, "wire.dat"), "w") as f:
        f.write("# i label median min max\n")
        for i, r in enumerate(rows):
            f.write('%d "%s" %f %f %f\n' % (i, r["what"].replace('"', "'"), r["gbytes_per_s"],
                                            r["min"], r["max"]))
    gnuplot("""set terminal pngcairo size 1200,600 font ',9' noenhanced
set output 'wire.png'
set title 'The shapes serving systems move, and their references (same run): median GB/s, bars min-max'
set ylabel 'GB/s'
set style fill solid 0.7 border -1
set boxwidth 0.7
set grid ytics
set yrange [0:*]
set xtics rotate by -35 left
set bmargin 12
set rmargin 10
plot 'wire.dat' using 1:3:xtic(2) with boxes notitle, '' using 1:3:4:5 with yerrorbars lc 'black' pt 0 notitle
""", out_dir)


def write_report(out_dir, refs, transfer, control, lease, floor, paths, wire=(), texts=()):
    lines = ["# moongate benchmark report", "",
             "Made by `tests/bench/run.sh report` on %s (%s); raw output beside this file." % (
                 time.strftime("%Y-%m-%d %H:%M"), os.uname().nodename), ""]
    lines += ["## The machine", ""] + machine()
    if wire:
        lines += ["## The wire: the shapes serving systems move", "", "![wire](wire.png)", "",
                  "Medians of the rounds, min-max, and the ratio of the medians to the reference "
                  "measured in the same rounds (`tests/bench/bench_wire.py`).", "",
                  "| what | GB/s | min-max | reference | ratio | target |",
                  "|---|---|---|---|---|---|"]
        for r in wire:
            lines.append("| %s | %.2f | %.2f-%.2f | %s | %s | %s |" % (
                r["what"], r["gbytes_per_s"], r["min"], r["max"], r.get("reference", "-"),
                "%.2fx" % r["ratio"] if "ratio" in r else "-",
                ("%.2fx %s" % (r["target"], "met" if r["ratio"] >= r["target"] else "not met"))
                if r.get("target") else "-"))
        lines.append("")
    for title, text in texts:
        lines += ["## " + title, "", "```", text.strip(), "```", ""]
    lines += ["## Transfers", "", "![transfer](transfer.png)", "",
              "| op | block | batch | threads | GB/s | / iperf3 | / ucx put |",
              "|---|---|---|---|---|---|---|"]
    for r in transfer:
        lines.append("| %s | %s | %d | %d | %.3f | %.2fx | %s |" % (
            r["op"].upper(), size_label(r["block_bytes"]), r["batch"], r["threads"],
            r["gbytes_per_s"], r["gbytes_per_s"] / refs.get("iperf3", float("nan")),
            "%.2fx" % (r["gbytes_per_s"] / refs["ucx ucp_put_bw"])
            if refs.get("ucx ucp_put_bw") else "-"))
    lines += ["", "References: " + ", ".join("%s %.2f GB/s" % kv for kv in refs.items()), ""]
    lines += ["## Control plane", "", "![control](control.png)", "",
              "| server | transport | body | requests/s | p50 ms | p99 ms |",
              "|---|---|---|---|---|---|"]
    for r in control:
        lines.append("| %s | %s | %s | %.0f | %.3f | %.3f |" % (
            r["server"], r["transport"], r["body"], r["rps"], r["p50_ms"], r["p99_ms"]))
    lines += ["", "## Leases against register-per-read", "", "![lease](lease.png)", "",
              "| read | register p50 us | lease p50 us | ratio | lease p99 us |",
              "|---|---|---|---|---|"]
    for r in lease:
        lines.append("| %s | %.1f | %.1f | %.1fx | %.1f |" % (
            r["read"], r["register_p50"], r["lease_p50"], r["register_p50"] / r["lease_p50"],
            r["lease_p99"]))
    lines += ["", "Floor (two plain round trips, same run): %.1f us." % floor, ""]
    lines += ["Acquire + release alone, 16384 pairs, one call at a time (polling: `--busy-poll-us"
              " 200` on the daemon, `busy_poll_us = 200` in the client):", "",
              "| transport | waiting | lease p50 us | floor us | / floor |", "|---|---|---|---|---|"]
    for r in paths:
        lines.append("| %s | %s | %.1f | %.1f | %.2fx |" % (
            r["transport"], "polling" if r["polling"] else "sleeping", r["p50"], r["floor"],
            r["p50"] / r["floor"]))
    lines.append("")
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", help="tests/bench/run.sh")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--from-raw", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    raw = lambda n: os.path.join(a.out, n)  # noqa: E731
    if not a.from_raw:
        quick = ["--rounds", "2"] if a.quick else []
        run([a.run, "wire", "--", "--json", raw("wire.json")] + quick, raw("wire"))
        run([a.run, "fanout", "--"] + quick, raw("fanout"))
        run([a.run, "scale", "--"] + quick, raw("scale"))
        run([a.run, "transfer"], raw("transfer"))
        ctl = ["--", "--requests", "50000", "--rounds", "1"] if a.quick else []
        run([a.run, "control"] + ctl, raw("control"))
        run([a.run, "lease"], raw("lease"))

    def text(n):
        with open(raw(n)) as f:
            return f.read()
    refs, transfer = parse_transfer(text("transfer.out"), text("transfer.err"))
    control = parse_control(text("control.out"))
    lease, floor = parse_lease(text("lease.out"))
    paths = parse_lease_paths(text("lease.out"))
    if not transfer or not control or not lease:
        sys.exit("report.py: a benchmark produced no figures (transfer %d, control %d, lease %d "
                 "rows); see the raw output in %s" % (len(transfer), len(control), len(lease),
                                                      a.out))
    wire = []
    if os.path.exists(raw("wire.json")):
        with open(raw("wire.json")) as f:
            wire = [json.loads(line) for line in f if line.strip()]
        plot_wire(wire, a.out)
    texts = [(t, text(n + ".out")) for t, n in (
        ("Many at once: connections, peers, tenants", "fanout"),
        ("Costs as work grows: 10 and 10,000 segments and leases", "scale"))
        if os.path.exists(raw(n + ".out"))]
    plot_transfer(refs, transfer, a.out)
    plot_control(control, a.out)
    plot_lease(lease, floor, a.out)
    write_report(a.out, refs, transfer, control, lease, floor, paths, wire, texts)
    print(os.path.join(a.out, "report.md"))


if __name__ == "__main__":
    main()
