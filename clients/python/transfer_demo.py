#!/usr/bin/python3
"""Moves bytes between two moongate daemons and checks them: registers a segment on each
(remote-accessible on the second), fills the first with random bytes, asks the first daemon to
WRITE them into the second — with a notification that B's readers get once the bytes are in
place — and to READ them back into a third segment, waits for both batches with a progress
line, compares SHA-256 digests of the mapped files and prints the throughput. Then it leases a
1 MiB buffer from A's pool, READs a block of B into it and checks it too.

Usage: transfer_demo.py --a HOST:PORT --b HOST:PORT [--peer HOST:PORT] [--ca CA.pem]
                        [--ca-b CA.pem] [--token-file FILE] [--bytes N]
(--a/--b: the daemons' control endpoints; with --ca over TLS, else h2c; --ca-b: the CA of B's
certificate when it is not --ca's; --token-file: a bearer token both daemons know, or
MOONGATE_TOKEN)
"""
import argparse
import hashlib
import mmap
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_stubs import generate  # noqa: E402


def channel(grpc, target, ca, token=None):
    """A channel to a daemon: TLS with `ca`, else h2c; every call carries the bearer token."""
    if ca:
        with open(ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(f.read())
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(target, creds)
    ch = grpc.insecure_channel(target)
    if not token:
        return ch

    class Bearer(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, cont, details, request):
            md = list(details.metadata or []) + [("authorization", "Bearer " + token)]
            return cont(details._replace(metadata=md), request)
    return grpc.intercept_channel(ch, Bearer())


def digest(path, length):
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as v:
        return hashlib.sha256(v[:length]).hexdigest()


def read_into_lease(pool_pb2, pool, transfer_pb2, t, peer, dst, src, n):
    """READs 1 MiB from the middle of B's segment into a lease of A's buffer pool."""
    blk = min(1 << 20, n)
    off = (n // 2) // 4096 * 4096 if n > blk else 0
    lease = pool.AcquireLease(pool_pb2.AcquireLeaseRequest(size=blk, ttl_ms=30000))
    try:
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[transfer_pb2.TransferRequest(
            op=transfer_pb2.READ, local_lease=lease.id, peer=peer, remote_segment=dst.id,
            remote_offset=off, length=blk)])).batch_id
        while t.GetBatch(transfer_pb2.GetBatchRequest(id=bid)).state == transfer_pb2.RUNNING:
            time.sleep(0.01)
        with open(lease.path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as v:
            got = hashlib.sha256(v[lease.offset:lease.offset + blk]).hexdigest()
        with open(src.path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as v:
            want = hashlib.sha256(v[off:off + blk]).hexdigest()
        print("lease %d (pool %s, offset %d): READ %d bytes of B at %d into it: %s" % (
            lease.id, lease.pool, lease.offset, blk, off, "ok" if got == want else "MISMATCH"))
        return got == want
    finally:
        pool.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=lease.id))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--peer", help="B's control endpoint as A reaches it (default: --b)")
    ap.add_argument("--ca")
    ap.add_argument("--ca-b", help="CA of B's certificate (default: --ca)")
    ap.add_argument("--token-file", help="bearer token (first line of the file)")
    ap.add_argument("--bytes", type=int, default=1 << 30)
    a = ap.parse_args()
    token = os.environ.get("MOONGATE_TOKEN")
    if a.token_file:
        with open(a.token_file) as f:
            token = f.readline().strip()
    sys.path.insert(0, generate(os.environ.get("MOONGATE_PYGEN",
                                               os.path.join(tempfile.gettempdir(), "mg-pygen"))))
    import grpc
    from moongate.v1 import (memory_pb2, memory_pb2_grpc, notify_pb2, notify_pb2_grpc, pool_pb2,
                             pool_pb2_grpc, transfer_pb2, transfer_pb2_grpc)

    n = a.bytes
    with channel(grpc, a.a, a.ca, token) as ca_ch, \
            channel(grpc, a.b, a.ca_b or a.ca, token) as cb_ch:
        ma, mb = memory_pb2_grpc.MemoryStub(ca_ch), memory_pb2_grpc.MemoryStub(cb_ch)
        t = transfer_pb2_grpc.TransferStub(ca_ch)
        src = ma.RegisterSegment(memory_pb2.RegisterRequest(name="demo-src", size=n,
                                                            prefault=True)).segment
        back = ma.RegisterSegment(memory_pb2.RegisterRequest(name="demo-back", size=n,
                                                             prefault=True)).segment
        dst = mb.RegisterSegment(memory_pb2.RegisterRequest(name="demo-dst", size=n, prefault=True,
                                                            remote_accessible=True)).segment
        try:
            with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
                for off in range(0, n, 64 << 20):
                    chunk = os.urandom(min(64 << 20, n - off))
                    v[off:off + len(chunk)] = chunk
            want = digest(src.path, n)
            print("segments: A %d (%s), B %d (remote-accessible), %.2f GiB each"
                  % (src.id, src.path, dst.id, n / (1 << 30)))
            for op, local, label in ((transfer_pb2.WRITE, src, "WRITE A -> B"),
                                     (transfer_pb2.READ, back, "READ  B -> A")):
                slice_ = 64 << 20  # one request per 64 MiB: progress as they finish
                reqs = [transfer_pb2.TransferRequest(
                    op=op, local_segment=local.id, local_offset=o, peer=a.peer or a.b,
                    remote_segment=dst.id, remote_offset=o, length=min(slice_, n - o))
                    for o in range(0, n, slice_)]
                notify = [transfer_pb2.NotifyPeer(peer=a.peer or a.b, topic="demo",
                                                  payload=b"A wrote %d bytes" % n)]
                t0 = time.monotonic()
                bid = t.Submit(transfer_pb2.SubmitRequest(
                    requests=reqs, notify=notify if op == transfer_pb2.WRITE else [])).batch_id
                while True:
                    b = t.GetBatch(transfer_pb2.GetBatchRequest(id=bid))
                    done = sum(r.bytes_done for r in b.requests)
                    bar = "#" * int(30 * done / n)
                    print("\r%s [%-30s] %5.1f%%" % (label, bar, 100.0 * done / n), end="",
                          flush=True)
                    if b.state != transfer_pb2.RUNNING:
                        break
                    time.sleep(0.05)
                secs = time.monotonic() - t0
                if b.state != transfer_pb2.DONE:
                    bad = [r for r in b.requests if r.state == transfer_pb2.FAILED][0]
                    print("\n%s failed: %s" % (label, bad.message))
                    return 1
                print("  %.2f GB/s" % (n / secs / 1e9))
                if op == transfer_pb2.WRITE:  # what a reader on B sees, after the data
                    got = notify_pb2_grpc.NotifyStub(cb_ch).Poll(
                        notify_pb2.PollRequest(topic="demo")).notifications
                    print("notification on B, topic demo: %s" % (
                        got[0].payload.decode() if got else "none"))
            got_b, got_back = digest(dst.path, n), digest(back.path, n)
            print("sha256 A %s\n       B %s %s\n  A back %s %s" % (
                want[:16], got_b[:16], "ok" if got_b == want else "MISMATCH",
                got_back[:16], "ok" if got_back == want else "MISMATCH"))
            leased = read_into_lease(pool_pb2, pool_pb2_grpc.PoolStub(ca_ch), transfer_pb2, t,
                                     a.peer or a.b, dst, src, n)
            return 0 if got_b == want and got_back == want and leased else 1
        finally:
            ma.UnregisterSegments(memory_pb2.UnregisterSegmentsRequest(ids=[src.id, back.id]))
            mb.UnregisterSegment(memory_pb2.UnregisterRequest(id=dst.id))


if __name__ == "__main__":
    sys.exit(main())
