#!/usr/bin/python3
"""What an end-to-end digest (SubmitRequest.digest: CRC32C of every slice on both sides) costs:
the same transfers with and without it between two daemons over TCP, alternated round by
round, medians of --rounds (3) with min and max, and the ratio with / without. The target for
one 1 GiB WRITE: at least 0.75 (at most 25% slower).

Usage: bench_digest.py --moongate BIN --mgbench BIN [--rounds 3]
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fanout import start, stop  # noqa: E402
from bench_names import alternate  # noqa: E402
from bench_wire import mgbench, scattered  # noqa: E402

# name: (mgbench options, the target ratio with / without or None)
SHAPES = {
    "one 1 GiB WRITE": (["--blocks", "64K", "--batches", "1", "--ops", "write", "--bytes", "64K",
                         "--big", "1G"], 0.75),
    "one 1 GiB READ": (["--blocks", "64K", "--batches", "1", "--ops", "read", "--bytes", "64K",
                        "--big", "1G"], None),
    "64K x 128 scattered WRITE, 4 in flight": (scattered("64K", "128", "write", "4", "512M"),
                                               None),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--mgbench", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ways = [(s, d) for s in SHAPES for d in (False, True)]
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="mg-digest-") as work:
        a, pa = start(args.moongate, work, "a")
        b, pb = start(args.moongate, work, "b")
        ta, tb = "127.0.0.1:%d" % pa, "127.0.0.1:%d" % pb
        try:
            res = alternate(ways, args.rounds, lambda w: mgbench(
                args, ta, tb, *(SHAPES[w[0]][0] + (["--digest"] if w[1] else [])))[-1][
                    "gbytes_per_s"])
        finally:
            stop([a, b])
    print("GB/s over TCP, medians of %d (min-max); ratio with digest / without" % args.rounds)
    for shape, (_, target) in SHAPES.items():
        plain, dig = res[(shape, False)], res[(shape, True)]
        ratio = statistics.median(dig) / statistics.median(plain)
        goal = "" if target is None else "   target >= %.2f: %s" % (
            target, "met" if ratio >= target else "not met")
        print("  %-40s without %.2f (%.2f-%.2f)  with %.2f (%.2f-%.2f)  ratio %.2f%s" %
              (shape, statistics.median(plain), min(plain), max(plain), statistics.median(dig),
               min(dig), max(dig), ratio, goal))


if __name__ == "__main__":
    main()
