#!/usr/bin/python3
"""The NIXL door against moongate's native API, same daemons, same run.

Two daemons over TCP loopback; a prefill agent on daemon b holds --blocks blocks of --block
bytes in one registered region (a NumPy array), a decode agent on daemon a the same.
  transfer  vLLM's shape: one READ of every block by index, through nixl._api
            (make_prepped_xfer of the prepared lists, transfer, check_xfer_state until DONE,
            with a notification) against the native API with the same lists on the daemon
            (Client.prepare_list, one Submit of a prepared group with wait and the same
            notification), alternated, --rounds each; medians, spread, and the door's rate over
            the native one
  post      posting --post-descs descriptors of 4 KiB: make_prepped_xfer + transfer (indices
            into prepared lists) against initialize_xfer + transfer (the descriptors
            themselves), alternated; each transfer waited for, untimed, before the next.
            Medians, spread, and prepared / unprepared

Usage: bench_nixl.py --moongate BIN [--rounds 5] [--blocks 1024] [--block 65536]
                     [--post-descs 10000] [--post-rounds 9]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "..", "..", "clients", "python")
sys.path.insert(0, CLIENT)
sys.path.insert(0, HERE)
from bench_memory import free_port, start  # noqa: E402
from bench_names import alternate  # noqa: E402

import numpy as np  # noqa: E402

import moongate_client as mg  # noqa: E402,F401  (the stubs)
from moongate.compat import nixl  # noqa: E402
from moongate.v1 import transfer_pb2  # noqa: E402


def agent(sock, name):
    os.environ["MOONGATE_SOCKET"] = sock
    return nixl.nixl_agent(name, nixl.nixl_agent_config(backends=["UCX"]))


def spread(v):
    return "%.3f [%.3f-%.3f]" % (statistics.median(v), min(v), max(v))


def done(ag, x):
    while ag.check_xfer_state(x) == "PROC":
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--block", type=int, default=64 << 10)
    ap.add_argument("--post-descs", type=int, default=10000)
    ap.add_argument("--post-rounds", type=int, default=9)
    a = ap.parse_args()
    n, bl = a.blocks, a.block
    size = max(n * bl, a.post_descs * 4096)
    with tempfile.TemporaryDirectory(prefix="mg-bench-nixl-") as work:
        pb_port, pa_port = free_port(), free_port()
        limit = ["--max-transfer-requests", str(max(4096, n, a.post_descs))]
        procs = []
        try:
            pb_, sb = start(a.moongate, work, "b", h2c="127.0.0.1:%d" % pb_port,
                            extra=["--advertise", "127.0.0.1:%d" % pb_port] + limit)
            procs.append(pb_)
            pa_, sa = start(a.moongate, work, "a", h2c="127.0.0.1:%d" % pa_port,
                            extra=["--advertise", "127.0.0.1:%d" % pa_port] + limit)
            procs.append(pa_)
            run(a, sa, sb, n, bl, size)
        finally:
            for p in procs:
                p.terminate()
                p.wait()


def run(a, sa, sb, n, bl, size):
    mem_b = np.frombuffer(os.urandom(size), dtype=np.uint8).copy()
    mem_a = np.zeros(size, dtype=np.uint8)
    base_b, base_a = int(mem_b.ctypes.data), int(mem_a.ctypes.data)
    p = agent(sb, "bench-prefill")
    p.register_memory([(base_b, size, 0, "")], "DRAM")
    d = agent(sa, "bench-decode")
    d.register_memory([(base_a, size, 0, "")], "DRAM")
    d.add_remote_agent(p.get_agent_metadata())
    blocks_a = np.array([(base_a + i * bl, bl, 0) for i in range(n)], dtype=np.uint64)
    blocks_b = np.array([(base_b + i * bl, bl, 0) for i in range(n)], dtype=np.uint64)
    local = d.prep_xfer_dlist("NIXL_INIT_AGENT", blocks_a, "DRAM")
    remote = d.prep_xfer_dlist("bench-prefill", blocks_b, "DRAM")
    idx = np.arange(n, dtype=np.int64)
    # the native API: the same lists, prepared by the native client on the same daemon
    c = mg.Client("unix:" + sa)
    rem = d._remote("bench-prefill", "bench")
    nl = c.prepare_list([base_a + i * bl for i in range(n)], [bl] * n)
    nr = c.prepare_list([base_b + i * bl for i in range(n)], [bl] * n, peer=rem.peer,
                        agent=rem.agent)
    group = mg.prepared(transfer_pb2.READ, nl, list(range(n)), nr, list(range(n)))
    note = mg.notify(rem.peer, rem.topic, nixl.note_payload("bench-decode", b"bench:1"))

    def door():
        x = d.make_prepped_xfer("READ", local, idx, remote, idx, b"bench:1")
        d.transfer(x)
        done(d, x)
        d.release_xfer_handle(x)

    def native():  # the same notification to the prefill agent
        c.transfer([], prepared=[group], notify=[note], brief=True)

    ways = {"door": door, "native": native}
    for w in ways.values():
        w()
    assert mem_a[:n * bl].tobytes() == mem_b[:n * bl].tobytes()

    def once(w):
        t0 = time.perf_counter()
        ways[w]()
        return n * bl / (time.perf_counter() - t0) / 1e9

    gb = alternate(list(ways), a.rounds, once)
    ratios = [x / y for x, y in zip(gb["door"], gb["native"])]
    print("READ of %d blocks of %d KiB by index, one transfer, %d rounds alternated "
          "(GB/s, medians [min-max])" % (n, bl >> 10, a.rounds))
    print("  nixl._api make_prepped_xfer + transfer + check_xfer_state  %s" % spread(gb["door"]))
    print("  native Submit of a prepared group, with wait and notify    %s" % spread(
        gb["native"]))
    print("  door / native %s (median of the rounds' ratios); the figure sought: >= 0.95" %
          spread(ratios))
    p.get_new_notifs()

    # posting: indices into prepared lists against the descriptors themselves
    m = a.post_descs
    la = np.array([(base_a + i * 4096, 4096, 0) for i in range(m)], dtype=np.uint64)
    ra = np.array([(base_b + i * 4096, 4096, 0) for i in range(m)], dtype=np.uint64)
    pl = d.prep_xfer_dlist("NIXL_INIT_AGENT", la, "DRAM")
    pr = d.prep_xfer_dlist("bench-prefill", ra, "DRAM")
    ll, rl = d.get_xfer_descs(la, "DRAM"), d.get_xfer_descs(ra, "DRAM")
    pidx = np.arange(m, dtype=np.int64)

    def post(w):
        t0 = time.perf_counter()
        if w == "prepared":
            x = d.make_prepped_xfer("READ", pl, pidx, pr, pidx)
        else:
            x = d.initialize_xfer("READ", ll, rl, "bench-prefill")
        d.transfer(x)
        t = time.perf_counter() - t0
        done(d, x)
        d.release_xfer_handle(x)
        return t * 1e3

    post("prepared")
    post("unprepared")
    ms = alternate(["prepared", "unprepared"], a.post_rounds, post)
    r = [x / y for x, y in zip(ms["prepared"], ms["unprepared"])]
    print("posting a READ of %d descriptors of 4 KiB, %d rounds alternated (ms, medians "
          "[min-max])" % (m, a.post_rounds))
    print("  make_prepped_xfer + transfer (indices)   %s" % spread(ms["prepared"]))
    print("  initialize_xfer + transfer (descriptors) %s" % spread(ms["unprepared"]))
    print("  prepared / unprepared %s; the figure sought: <= 0.2" % spread(r))
    c.close()
    d.close()
    p.close()


if __name__ == "__main__":
    main()
