"""Two daemons on two hosts: daemon A in this network namespace, daemon B in a namespace of its
own, joined by a veth pair (10.77.<n>.1 here, 10.77.<n>.2 there). Transfers cross the link; then
the link is cut (`ip link set down`) in the middle of a large WRITE: the request fails with
UNAVAILABLE naming B within the data plane's I/O timeout and the session's retry, A keeps
serving, and once the link is back the next transfer goes through without restarting either
daemon. A receiver on A waiting for B's bytes (an expectation with a 120 s deadline) hears
that B is unreachable once the link is cut, by the probes, not the deadline. Skipped, saying
why, where namespaces cannot be made (no root, no CAP_NET_ADMIN)."""
import mmap
import os
import subprocess
import time

import grpc
import pytest

from conftest import h2c_channel, wait_batch
from moongate.v1 import memory_pb2, memory_pb2_grpc, notify_pb2, notify_pb2_grpc
from moongate.v1 import transfer_pb2, transfer_pb2_grpc

MiB = 1 << 20
# the namespace and veth names come from the worker's pid: tests of one worker never collide
pytestmark = pytest.mark.xdist_group("netns")


def ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True, check=check)


@pytest.fixture
def netns():
    """(namespace, here, there, the veth end in this namespace)."""
    n = os.getpid() % 200 + 20
    ns, here, there = "mg-test-%d" % os.getpid(), "mgv%da" % n, "mgv%db" % n
    try:
        ip("netns", "add", ns)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip("cannot create a network namespace here: %s" %
                    (getattr(e, "stderr", "") or e).strip())
    try:
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", ns)
        ip("addr", "add", "10.77.%d.1/24" % n, "dev", here)
        ip("link", "set", here, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", "10.77.%d.2/24" % n, "dev", there)
        ip("netns", "exec", ns, "ip", "link", "set", there, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, "10.77.%d.1" % n, "10.77.%d.2" % n, here
    finally:
        ip("link", "del", here, check=False)
        ip("netns", "del", ns, check=False)


def register(d, name, size, remote=False):
    with h2c_channel(d) as ch:
        return memory_pb2_grpc.MemoryStub(ch).RegisterSegment(memory_pb2.RegisterRequest(
            name=name, size=size, remote_accessible=remote), timeout=10).segment


def write(src, peer, dst, length):
    return transfer_pb2.TransferRequest(op=transfer_pb2.WRITE, local_segment=src, peer=peer,
                                        remote_segment=dst, length=length)


def test_two_namespaces_and_a_link_cut(make_daemon, netns):
    ns, _, there, link = netns
    # A reaches B over the link; the cut must be noticed in 2 s, not the default 10.
    a = make_daemon("--peer-tls=false", "--data-io-timeout", "2")
    b = make_daemon("--peer-tls=false", "--allow-h2c-any", wrap=["ip", "netns", "exec", ns],
                    host=there)
    n = 256 * MiB
    src = register(a, "src", n)
    dst = register(b, "dst", n, remote=True)
    data = os.urandom(8 * MiB)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:len(data)] = data
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        # Across the link, checked on B's side.
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[write(src.id, b.h2c, dst.id,
                                                                  len(data))])).batch_id
        assert wait_batch(t, bid, 30).state == transfer_pb2.DONE
        with open(dst.path, "rb") as f:
            assert f.read(len(data)) == data
        # Cut the link once bytes are flowing.
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[write(src.id, b.h2c, dst.id, n)],
                                                  timeout_ms=120000)).batch_id
        deadline = time.monotonic() + 30
        while t.GetBatch(transfer_pb2.GetBatchRequest(id=bid)).requests[0].bytes_done == 0:
            assert time.monotonic() < deadline, "no byte confirmed across the link"
            time.sleep(0.01)
        ip("link", "set", link, "down")
        t0 = time.monotonic()
        batch = wait_batch(t, bid, 60)
        took = time.monotonic() - t0
        r = batch.requests[0]
        assert r.state == transfer_pb2.FAILED and r.code == grpc.StatusCode.UNAVAILABLE.value[0], r
        assert b.h2c in r.message, r.message
        assert took < 30, "the cut took %.1f s to notice" % took
        m = memory_pb2_grpc.MemoryStub(ch)
        assert m.GetSegment(memory_pb2.GetSegmentRequest(id=src.id)).holders == 0
        # The link comes back: the same daemons move bytes again.
        ip("link", "set", link, "up")
        deadline = time.monotonic() + 30
        while True:
            bid = t.Submit(transfer_pb2.SubmitRequest(requests=[write(src.id, b.h2c, dst.id,
                                                                      MiB)])).batch_id
            if wait_batch(t, bid, 60).state == transfer_pb2.DONE:
                break
            assert time.monotonic() < deadline, "transfers did not recover after the link came back"
            time.sleep(0.5)
    assert a.alive() and b.alive()


def test_a_receiver_hears_when_the_senders_link_is_cut(make_daemon, netns):
    """B sends to A from its own namespace; a client of A declared an expectation for B. The
    link goes down: A's probes of B go unanswered (the connection stays open, nothing comes
    back), and after --peer-liveness-timeout the waiting Watch hears OUTCOME_SENDER_UNREACHABLE
    naming B, well before its 120 s deadline."""
    ns, _, there, link = netns
    a = make_daemon("--peer-tls=false", "--peer-liveness-timeout", "2000")
    b = make_daemon("--peer-tls=false", "--allow-h2c-any", wrap=["ip", "netns", "exec", ns],
                    host=there)
    with h2c_channel(a) as ch:
        nb = notify_pb2_grpc.NotifyStub(ch)
        e = nb.Expect(notify_pb2.ExpectRequest(topic="kv/cut", timeout_ms=120000, peer=b.h2c))
        deadline = time.monotonic() + 30
        while not [x for x in nb.ListExpectations(notify_pb2.ListExpectationsRequest())
                   .expectations if x.id == e.id and x.epoch]:
            assert time.monotonic() < deadline, "B never answered A's probe across the link"
            time.sleep(0.02)
        call = nb.Watch(notify_pb2.WatchRequest(topic="kv/cut"), timeout=60)
        ip("link", "set", link, "down")
        try:
            n = next(iter(call))  # the Watch's own 60 s bound: well inside the deadline
        finally:
            call.cancel()
        assert n.outcome == notify_pb2.OUTCOME_SENDER_UNREACHABLE, n
        assert b.h2c in n.message and "--peer-liveness-timeout" in n.message, n.message
        assert a.metric("moongate_expectations_ended_total", result="sender_unreachable") == 1
    ip("link", "set", link, "up")
    assert a.alive() and b.alive()
