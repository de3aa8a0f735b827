"""Many multiplexed calls from h2load over h2c and TLS. h2load counts HTTP 200 as success, so
the check is the daemon's own count of calls answered with grpc-status 0."""
import re
import subprocess

import pytest

N = 3000


def ok_checks(d):
    return d.metric("moongate_grpc_handled_total", grpc_service="grpc.health.v1.Health",
                    grpc_method="Check", grpc_code="OK") or 0


@pytest.mark.parametrize("scheme", ["h2c", "tls"])
def test_h2load_many_streams(daemon, tmp_path, scheme):
    body = tmp_path / "check.bin"
    body.write_bytes(b"\0\0\0\0\0")
    url = ("http://%s" % daemon.h2c if scheme == "h2c" else "https://localhost:%d" %
           daemon.tls_port) + "/grpc.health.v1.Health/Check"
    before = ok_checks(daemon)
    p = subprocess.run(["h2load", "-n", str(N), "-c", "4", "-m", "64", "-d", str(body),
                        "-H", "content-type: application/grpc", "-H", "te: trailers", url],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert re.search(r"%d succeeded, 0 failed, 0 errored" % N, p.stdout), p.stdout
    assert ok_checks(daemon) - before == N
    # Nothing left open once the load is over.
    assert daemon.metric("moongate_streams_active") == 0


@pytest.mark.parametrize("target", ["unix", "h2c", "tls"])
def test_mgbench_many_calls_through_the_client_library(daemon, target):
    import os
    from conftest import BUILD
    args = {"unix": ["--target", "unix:" + daemon.sock],
            "h2c": ["--target", daemon.h2c, "--plaintext"],
            "tls": ["--target", daemon.tls, "--ca", daemon.ca]}[target]
    before = ok_checks(daemon)
    p = subprocess.run([os.path.join(BUILD, "mgbench"), *args, "--conns", "3", "--streams",
                        "150", "--requests", str(N), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    import json
    out = json.loads(p.stdout)
    assert out["requests"] == N and out["ok"] == N
    assert ok_checks(daemon) - before == N


def mgbench_transfer(*args):
    import os
    from conftest import BUILD
    return subprocess.run([os.path.join(BUILD, "mgbench"), "transfer", *args],
                          capture_output=True, text=True, timeout=300)


def test_mgbench_transfer_layout_scattered_and_in_flight():
    """--scatter: no two blocks of a batch touch on either side, the sides' orders differ; the
    batches in flight and the threads each have their own region, inside the segment."""
    block, batch, inflight, threads = 65536, 128, 4, 2
    p = mgbench_transfer("--target", "x", "--peer", "y", "--blocks", "64K", "--batches",
                         str(batch), "--inflight", str(inflight), "--threads", str(threads),
                         "--scatter", "--print-layout")
    assert p.returncode == 0, p.stderr
    seg = block * batch * inflight * threads * 2
    seen = {"local": set(), "remote": set()}
    orders = {}
    for line in p.stdout.splitlines():
        _, t, k, side, *offs = line.split()
        offs = [int(o) for o in offs]
        assert len(offs) == batch and len(set(offs)) == batch
        s = sorted(offs)
        assert all(b - a >= 2 * block for a, b in zip(s, s[1:])), (t, k, side)  # none touch
        assert all(o % block == 0 and 0 <= o and o + block <= seg for o in offs)
        assert not seen[side] & set(offs)  # regions of other batches and threads apart
        seen[side] |= set(offs)
        orders[(t, k, side)] = offs
        assert offs != s  # not in address order
    assert len(orders) == 2 * inflight * threads
    assert all(orders[(t, k, "local")] != orders[(t, k, "remote")] for t, k, _ in orders)


def test_mgbench_transfer_batches_in_flight(make_daemon):
    """Four scattered batches in flight per thread, both ways: every batch ends DONE and the
    daemon counts every block, and the one untimed WRITE (and READ) of the whole segments that
    warmed them first."""
    b = make_daemon()
    a = make_daemon("--peer-tls=false")
    before = a.metric("moongate_transfer_requests_total", op="write", result="done") or 0
    p = mgbench_transfer("--target", "unix:" + a.sock, "--peer", b.h2c, "--blocks", "64K",
                         "--batches", "16", "--inflight", "4", "--scatter", "--threads", "2",
                         "--bytes", "8M", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    import json
    lines = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert [(ln["op"], ln["inflight"], ln["scatter"], ln["ok"]) for ln in lines] == \
        [("write", 4, True, True), ("read", 4, True, True)]
    assert all(ln["batches"] == 40 for ln in lines), lines  # 8 MiB / 1 MiB / 2 threads, >= 20
    assert (a.metric("moongate_transfer_requests_total", op="write", result="done") or 0) - \
        before == 40 * 16 + 1
    assert a.metric("moongate_transfer_requests_total", op="read", result="done") == 40 * 16 + 1


def test_mgbench_transfer_for_seconds_from_a_start_time_with_a_token(make_daemon, tmp_path):
    """--seconds runs for that long instead of --bytes, --start-at waits for the wall-clock
    time, MOONGATE_TOKEN goes to both daemons (which take no anonymous caller): the batches it
    reports are the daemon's count, under the token's tenant."""
    import hashlib
    import json
    import os
    import time
    auth = tmp_path / "auth"
    auth.write_text("token sha256:%s bench\n" % hashlib.sha256(b"bench-token").hexdigest())
    b = make_daemon("--allow-anonymous=false", "--auth-file", str(auth))
    a = make_daemon("--allow-anonymous=false", "--auth-file", str(auth), "--peer-tls=false")
    args = ("--target", a.h2c, "--peer", b.h2c, "--blocks", "64K", "--batches", "4", "--ops",
            "write", "--json", "--cold")  # --cold: no warm-up moves anything uncounted
    p = mgbench_transfer(*args)  # no token: refused
    assert p.returncode != 0 and "no credentials" in p.stderr, p.stdout + p.stderr
    os.environ["MOONGATE_TOKEN"] = "bench-token"
    try:
        at = time.time() + 1.5
        p = mgbench_transfer(*args, "--seconds", "0.5", "--start-at", "%.3f" % at)
        end = time.time()
    finally:
        del os.environ["MOONGATE_TOKEN"]
    assert p.returncode == 0, p.stdout + p.stderr
    assert end >= at + 0.5
    r = json.loads(p.stdout)
    assert r["ok"] and r["batches"] >= 1
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="bench", op="write",
                    transport="tcp") == r["batches"] * 4 * 65536


def test_mgbench_transfer_copies_beside_memcpy(make_daemon):
    """--peer "": copies between two segments of one daemon, and memcpy beside them, after one
    untimed copy of the whole segments each way."""
    d = make_daemon()
    p = mgbench_transfer("--target", "unix:" + d.sock, "--peer", "", "--blocks", "64K",
                         "--batches", "4", "--bytes", "1M", "--big", "4M", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    import json
    lines = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert [(ln["op"], ln["block_bytes"]) for ln in lines] == [
        ("write", 65536), ("write", 4 << 20), ("read", 65536), ("read", 4 << 20),
        ("memcpy", 4 << 20)], lines
    assert all(ln["ok"] for ln in lines[:4]) and lines[4]["gbytes_per_s"] > 0
    assert d.metric("moongate_peer_bytes_total", peer="local", tenant="default", op="write",
                    transport="copy") == 20 * 4 * 65536 + 3 * (4 << 20) + (4 << 20)
