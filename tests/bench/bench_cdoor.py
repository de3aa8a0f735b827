#!/usr/bin/python3
"""One small WRITE through Mooncake's C API on moongate (libtransfer_engine.so, the door
TensorRT-LLM and NIXL's Mooncake plugin use) against moongate's native C client, same daemons,
same run.

Two daemons (TCP over loopback; a's --peer-port is b's, so that "127.0.0.1:port" names an
engine on b); a target engine on b (te_harness target: a sealed memfd registered). On a, one
WRITE of --size bytes at a time, waited to its end before the next, --n of them a run, three
ways taken in a rotating order each round, --rounds rounds:
  c:        te_harness latency: allocateBatchID(1), submitTransfer, getTransferStatus in a tight
            loop until COMPLETED, freeBatchID (the serving systems' shape); the time from just
            before submitTransfer to the poll that saw COMPLETED, after 200 untimed
  native:   mgbench transfer, one thread, one batch in flight: Submit, then Wait; the time
            from Submit to Wait's answer
  one call: the same with --submit-wait: Submit answers at the batch's end (one call)
Each run prints its p50; then medians [min-max] of the rounds' p50s, and the median of the
rounds' ratios C / native. Both sides reach daemon a over its Unix socket.

Usage: bench_cdoor.py --moongate BIN --lib LIB --harness TE_HARNESS --mgbench MGBENCH
                      [--rounds 5] [--n 2000] [--size 4096]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_memory import free_port, start  # noqa: E402
from bench_names import alternate  # noqa: E402

WAYS = ["c", "native", "one call"]
LABELS = {"c": "transfer_engine_c.h (C)", "native": "mgbench, Submit then Wait",
          "one call": "mgbench, Submit with wait"}


def env_for(sock):
    env = dict(os.environ, MOONGATE_SOCKET=sock)
    env.pop("MOONGATE_TOKEN", None)
    return env


def c_door(a, sock, where, n):
    """te_harness latency: its JSON line."""
    run = subprocess.run([a.harness, a.lib, "latency", where["session"], str(where["address"]),
                          str(n), str(a.size)], env=env_for(sock), capture_output=True,
                         text=True, timeout=600)
    if run.returncode != 0:
        raise SystemExit("te_harness latency failed (%d): %s" % (run.returncode, run.stderr))
    got = json.loads(run.stdout)
    if got["failed"]:
        raise SystemExit("te_harness latency: %d WRITEs failed: %s" % (got["failed"], run.stderr))
    return got


def mgbench(a, sock, peer, n, *extra):
    """mgbench transfer, one WRITE of --size at a time (n of them, at most 2000): its JSON line."""
    run = subprocess.run([a.mgbench, "transfer", "--target", "unix:" + sock, "--peer", peer,
                          "--blocks", str(a.size), "--batches", "1", "--ops", "write",
                          "--threads", "1", "--inflight", "1", "--bytes", str(n * a.size),
                          "--json"] + list(extra), env=env_for(sock), capture_output=True,
                         text=True, timeout=600)
    rows = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    if run.returncode != 0 or len(rows) != 1 or not rows[0]["ok"]:
        raise SystemExit("mgbench transfer failed (%d): %s%s" % (run.returncode, run.stdout,
                                                                 run.stderr))
    return rows[0]


def spread(xs, unit):
    return "%8.1f %s [%.1f-%.1f]" % (statistics.median(xs), unit, min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--harness", required=True)
    ap.add_argument("--mgbench", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000, help="WRITEs a run (mgbench: at most 2000)")
    ap.add_argument("--size", type=int, default=4096)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mg-bench-cdoor-") as work:
        port = free_port()
        pb, sb = start(a.moongate, work, "b", h2c="127.0.0.1:%d" % port)
        pa, sa = start(a.moongate, work, "a", extra=["--peer-port", str(port)])
        log = open(os.path.join(work, "target.log"), "w")
        target = subprocess.Popen([a.harness, a.lib, "target", str(1 << 20)], env=env_for(sb),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                  text=True)
        try:
            first = target.stdout.readline()
            if not first:
                raise SystemExit("te_harness target failed: " + open(log.name).read())
            where = json.loads(first)
            run(a, sa, "127.0.0.1:%d" % port, where)
        finally:
            target.stdin.write("quit\n")
            target.stdin.close()
            target.wait(30)
            log.close()
            for p in (pa, pb):
                p.terminate()
                p.wait()


def run(a, sa, peer, where):
    rows = {}

    def one(way):
        if way == "c":
            r = c_door(a, sa, where, a.n)
            rows.setdefault(way, []).append(r)
            return r["p50_us"]
        r = mgbench(a, sa, peer, a.n, *(["--submit-wait"] if way == "one call" else []))
        rows.setdefault(way, []).append(r)
        return r["latency_p50_us"]

    c_door(a, sa, where, 200)  # the sessions, the peer's connections, the agent resolved
    mgbench(a, sa, peer, 200)
    us = alternate(WAYS, a.rounds, one)
    rows = {w: rows[w] for w in WAYS}
    print("one WRITE of %d bytes to a peer daemon's engine over TCP, one at a time, %d a run, "
          "%d rounds (p50 of each run, us)" % (a.size, a.n, a.rounds))
    for r in range(a.rounds):
        c, nat, one_ = rows["c"][r], rows["native"][r], rows["one call"][r]
        print("  round %d  C %7.1f (p99 %7.1f)   native %7.1f (p99 %7.1f)   ratio %.3f   "
              "one call %7.1f   ratio %.3f" % (
                  r + 1, c["p50_us"], c["p99_us"], nat["latency_p50_us"],
                  nat["latency_p99_us"], c["p50_us"] / nat["latency_p50_us"],
                  one_["latency_p50_us"], c["p50_us"] / one_["latency_p50_us"]))
    print("medians of the rounds' p50s [min-max]")
    for w in WAYS:
        print("  %-28s %s" % (LABELS[w], spread(us[w], "us")))
    for ref in ("native", "one call"):
        ratios = [c / n for c, n in zip(us["c"], us[ref])]
        print("  C / %-24s %8.3f   [%.3f-%.3f] (median of the rounds' ratios)%s" % (
            LABELS[ref], statistics.median(ratios), min(ratios), max(ratios),
            "; the figure sought: <= 1.2" if ref == "native" else ""))
    med = {w: (statistics.median(x["avg_us" if w == "c" else "latency_avg_us"] for x in rows[w]),
               statistics.median(x["submit_avg_us"] for x in rows[w])) for w in WAYS}
    print("where the time goes, medians of the rounds' averages (us): the first call, then the "
          "rest to the end")
    print("  C:        %7.1f = submitTransfer %7.1f + polls until COMPLETED %7.1f" % (
        med["c"][0], med["c"][1], med["c"][0] - med["c"][1]))
    print("  native:   %7.1f = Submit         %7.1f + Wait                  %7.1f" % (
        med["native"][0], med["native"][1], med["native"][0] - med["native"][1]))
    print("  one call: %7.1f = Submit with wait" % med["one call"][0])
    print("the C door's allocateBatchID %.2f us, freeBatchID %.2f us (averages, outside the "
          "timed span); %.0f polls a WRITE" % (
              statistics.median(x["allocate_avg_us"] for x in rows["c"]),
              statistics.median(x["free_avg_us"] for x in rows["c"]),
              statistics.median(x["polls_avg"] for x in rows["c"])))


if __name__ == "__main__":
    main()
