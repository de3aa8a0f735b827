"""Transfers between two real daemons on loopback: a client asks daemon A to WRITE bytes of its
segment into a segment of daemon B and to READ them back; A opens a session on B
(Peer/OpenSession) and moves the bytes over B's TCP data plane. Checked in B's and A's mapped
files; bad batches refused whole, remote refusals and unreachable peers reported per request."""
import mmap
import os
import subprocess
import time

import grpc
import pytest

from conftest import MOONGATE, h2c_channel, register, req, wait_batch
from moongate.v1 import memory_pb2, memory_pb2_grpc, transfer_pb2, transfer_pb2_grpc

MiB = 1 << 20


def two_daemons(make_daemon):
    return make_daemon("--peer-tls=false"), make_daemon("--peer-tls=false")


def test_write_and_read_between_two_daemons(make_daemon):
    a, b = two_daemons(make_daemon)
    src = register(a, "src", 8 * MiB + 5)
    dst = register(b, "dst", 8 * MiB + 5, remote=True)
    data = os.urandom(8 * MiB + 5)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = data
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4 * MiB),
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4 * MiB + 5, 4 * MiB, 4 * MiB),
        ])).batch_id
        batch = wait_batch(t, bid)
        assert batch.state == transfer_pb2.DONE, batch
        assert (batch.done, batch.failed) == (2, 0)
        assert [r.bytes_done for r in batch.requests] == [4 * MiB, 4 * MiB + 5]
        with open(dst.path, "rb") as f:
            assert f.read() == data  # in B's memory
        # Read it back into another segment of A, unaligned, in one request.
        back = register(a, "back", 8 * MiB + 5)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.READ, back.id, b.h2c, dst.id, 3 * MiB + 7, 11, 13)])).batch_id
        assert wait_batch(t, bid).state == transfer_pb2.DONE
        with open(back.path, "rb") as f:
            f.seek(11)
            assert f.read(3 * MiB + 7) == data[13:13 + 3 * MiB + 7]
    assert b.metric("moongate_data_bytes_total", dir="in") == len(data)
    assert b.metric("moongate_data_bytes_total", dir="out") == 3 * MiB + 7
    assert a.metric("moongate_transfer_requests_total", op="write", result="done") == 2
    assert a.metric("moongate_transfer_requests_total", op="read", result="done") == 1
    assert a.metric("moongate_transfer_bytes_total", op="write") == len(data)
    assert a.metric("moongate_transfer_bytes_total", op="read") == 3 * MiB + 7
    assert a.metric("moongate_transfer_requests_in_flight") == 0
    assert a.metric("moongate_transfer_seconds_count") == 3
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write",
                    transport="tcp") == len(data)
    assert a.metric("moongate_peer_requests_total", peer=b.h2c, tenant="default", op="read", result="done") == 1
    assert a.metric("moongate_peer_connections", peer=b.h2c, tenant="default", state="busy") == 0
    assert a.metric("moongate_peer_connections", peer=b.h2c, tenant="default", state="idle") >= 1


@pytest.mark.parametrize("mutate,needle", [
    (dict(length=0), "request 1: length must be greater than 0"),
    (dict(peer="peer_example:7443"), "request 1: peer must be host:port"),
    (dict(local_segment=12345), "request 1: no such local segment"),
    (dict(local_offset=MiB), "request 1: local offset + length is outside"),
    (dict(remote_offset=2**64 - 1), "request 1: remote offset + length overflows"),
])
def test_bad_batches_are_refused_whole(make_daemon, mutate, needle):
    a, b = two_daemons(make_daemon)
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    good = dict(op=transfer_pb2.WRITE, local_segment=src.id, peer=b.h2c, remote_segment=dst.id,
                length=4096)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            t.Submit(transfer_pb2.SubmitRequest(requests=[
                transfer_pb2.TransferRequest(**good),
                transfer_pb2.TransferRequest(**dict(good, **mutate))]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in e.value.details() and "nothing was moved" in e.value.details()
        # Nothing holds the local segment afterwards.
        m = memory_pb2_grpc.MemoryStub(ch)
        assert m.GetSegment(memory_pb2.GetSegmentRequest(id=src.id)).holders == 0
    assert (b.metric("moongate_data_slices_total", op="write") or 0) == 0


def test_remote_targets_checked_before_anything_moves(make_daemon):
    """A's daemon asks B for its targets' descriptors (Peer/DescribeTarget) before the batch
    starts: a target that is not remote-accessible, too small or unknown refuses the whole batch,
    naming the request, and nothing moves. What it learnt is cached per peer and epoch; when
    the data plane contradicts the cache (the target went away), the request fails NOT_FOUND,
    the entry is forgotten, and the next Submit asks again and refuses the batch."""
    a, b = two_daemons(make_daemon)
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    gone = register(b, "gone", MiB, remote=True)
    private = register(b, "private", MiB)
    good = req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 100)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        for bad, needle in [
                (req(transfer_pb2.WRITE, src.id, b.h2c, private.id, 100),
                 "request 1: segment %d on peer %s is not remote-accessible" % (private.id, b.h2c)),
                (req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 100, 0, MiB),
                 "request 1: remote offset + length is outside segment %d on peer %s (1048576 "
                 "bytes)" % (dst.id, b.h2c)),
                (req(transfer_pb2.WRITE, src.id, b.h2c, 424242, 100),
                 "request 1: peer %s has no segment 424242" % b.h2c)]:
            with pytest.raises(grpc.RpcError) as e:
                t.Submit(transfer_pb2.SubmitRequest(requests=[good, bad]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert needle in e.value.details() and "nothing was moved" in e.value.details(), \
                e.value.details()
        assert (b.metric("moongate_data_slices_total", op="write") or 0) == 0
        # A peer nobody answers for: the batch starts, its request fails by name.
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, src.id, "127.0.0.1:1", dst.id, 100), good,
            req(transfer_pb2.WRITE, src.id, b.h2c, gone.id, 100)])).batch_id
        batch = wait_batch(t, bid)
        assert [r.code for r in batch.requests] == [grpc.StatusCode.UNAVAILABLE.value[0], 0, 0]
        assert "127.0.0.1:1" in batch.requests[0].message
        assert a.metric("moongate_transfer_failures_total", grpc_code="UNAVAILABLE") == 1
        # `gone` is cached now; it goes away on B: the data plane says NOT_FOUND ...
        with h2c_channel(b) as chb:
            memory_pb2_grpc.MemoryStub(chb).UnregisterSegment(
                memory_pb2.UnregisterRequest(id=gone.id))
        stale = req(transfer_pb2.WRITE, src.id, b.h2c, gone.id, 100)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[stale])).batch_id
        r = wait_batch(t, bid).requests[0]
        assert r.code == grpc.StatusCode.NOT_FOUND.value[0], r
        # ... and the next Submit asks B again and refuses the batch up front.
        with pytest.raises(grpc.RpcError) as e:
            t.Submit(transfer_pb2.SubmitRequest(requests=[stale]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "has no segment %d" % gone.id in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            t.GetBatch(transfer_pb2.GetBatchRequest(id=99))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        m = memory_pb2_grpc.MemoryStub(ch)
        assert m.GetSegment(memory_pb2.GetSegmentRequest(id=src.id)).holders == 0


def test_json_routes_with_curl(make_daemon):
    import json
    from conftest import curl
    a, b = two_daemons(make_daemon)
    src = register(a, "src", 4096)
    dst = register(b, "dst", 4096, remote=True)
    body = json.dumps({"requests": [{"op": "WRITE", "localSegment": str(src.id), "peer": b.h2c,
                                     "remoteSegment": str(dst.id), "length": "4096"}]})
    rc, out, err = curl("--http2-prior-knowledge", "-H", "content-type: application/json",
                        "-d", body, "http://%s/v1/transfers" % a.h2c)
    assert rc == 0, err
    bid = json.loads(out)["batchId"]
    deadline = time.monotonic() + 10
    while True:
        rc, out, err = curl("--http2-prior-knowledge", "http://%s/v1/transfers/%s" % (a.h2c, bid))
        got = json.loads(out)
        if got["state"] != "RUNNING":
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert got["state"] == "DONE" and got["done"] == 1


def test_submit_with_wait_answers_at_the_end(make_daemon):
    """Submit(wait) answers once the batch has ended, with its status; its call's deadline
    ends only the call (the batch goes on, found again by request_id); JSON too."""
    import json
    import signal
    from conftest import curl
    a, b = two_daemons(make_daemon)
    src = register(a, "src", 64 * MiB)
    dst = register(b, "dst", 64 * MiB, remote=True)
    data = os.urandom(MiB)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:MiB] = data
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        resp = t.Submit(transfer_pb2.SubmitRequest(wait=True, requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, MiB)]), timeout=30)
        assert resp.batch_id and resp.batch.id == resp.batch_id
        assert resp.batch.state == transfer_pb2.DONE and resp.batch.requests[0].bytes_done == MiB
        with open(dst.path, "rb") as f:
            assert f.read(MiB) == data  # in place when the answer came
        resp = t.Submit(transfer_pb2.SubmitRequest(wait=True, requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, MiB),
            req(transfer_pb2.WRITE, src.id, "127.0.0.1:1", dst.id, MiB)]), timeout=30)
        assert resp.batch.state == transfer_pb2.FAILED and (resp.batch.done, resp.batch.failed) \
            == (1, 1)
        assert resp.batch.requests[1].code == grpc.StatusCode.UNAVAILABLE.value[0]
        without = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, MiB)]), timeout=30)
        assert without.batch_id and not without.HasField("batch")  # at once, as before
        b.signal(signal.SIGSTOP)
        try:
            with pytest.raises(grpc.RpcError) as e:
                t.Submit(transfer_pb2.SubmitRequest(wait=True, request_id="big", requests=[
                    req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 64 * MiB)]), timeout=1)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            b.signal(signal.SIGCONT)
        again = t.Submit(transfer_pb2.SubmitRequest(wait=True, request_id="big", requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 64 * MiB)]), timeout=30)
        assert again.batch.state == transfer_pb2.DONE and len(again.batch.requests) == 1
        assert again.batch.requests[0].bytes_done == 64 * MiB
    assert a.metric("moongate_transfer_requests_total", op="write", result="done") == 4
    body = json.dumps({"wait": True, "requests": [{
        "op": "WRITE", "localSegment": str(src.id), "peer": b.h2c,
        "remoteSegment": str(dst.id), "length": "4096"}]})
    rc, out, err = curl("--http2-prior-knowledge", "-H", "content-type: application/json",
                        "-d", body, "http://%s/v1/transfers" % a.h2c)
    got = json.loads(out)
    assert rc == 0 and got["batch"]["state"] == "DONE" and got["batch"]["id"] == got["batchId"]


def test_wait_streams_progress_until_the_batch_ends(make_daemon):
    a, b = two_daemons(make_daemon)
    src = register(a, "src", 4 * MiB)
    dst = register(b, "dst", 4 * MiB, remote=True)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, MiB, o, o)
            for o in range(0, 4 * MiB, MiB)])).batch_id
        seen = list(t.Wait(transfer_pb2.GetBatchRequest(id=bid), timeout=30))
        assert seen, "Wait sent nothing"
        assert seen[-1].state == transfer_pb2.DONE and seen[-1].done == 4
        assert [s.done for s in seen] == sorted(s.done for s in seen)  # progress only grows
        # Waiting on a finished batch answers at once.
        again = list(t.Wait(transfer_pb2.GetBatchRequest(id=bid), timeout=5))
        assert len(again) == 1 and again[0].state == transfer_pb2.DONE
        with pytest.raises(grpc.RpcError) as e:
            list(t.Wait(transfer_pb2.GetBatchRequest(id=7), timeout=5))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_cancel_fails_the_requests_not_started(make_daemon):
    """A peer that accepts connections but never answers keeps its requests waiting for a
    session; Cancel fails them at once and frees their local segments."""
    import socket
    a = make_daemon("--peer-tls=false")
    src = register(a, "src", MiB)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    peer = "127.0.0.1:%d" % silent.getsockname()[1]
    try:
        with h2c_channel(a) as ch:
            t = transfer_pb2_grpc.TransferStub(ch)
            bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
                req(transfer_pb2.WRITE, src.id, peer, 1, 100),
                req(transfer_pb2.WRITE, src.id, peer, 1, 100)])).batch_id
            assert t.GetBatch(transfer_pb2.GetBatchRequest(id=bid)).requests[0].state == \
                transfer_pb2.PENDING
            batch = t.Cancel(transfer_pb2.GetBatchRequest(id=bid))
            assert batch.state == transfer_pb2.FAILED and batch.failed == 2
            assert {r.code for r in batch.requests} == {grpc.StatusCode.CANCELLED.value[0]}
            m = memory_pb2_grpc.MemoryStub(ch)
            assert m.GetSegment(memory_pb2.GetSegmentRequest(id=src.id)).holders == 0
    finally:
        silent.close()


def warm_up(t, a_seg, peer, b_seg):
    """One small WRITE: the session is open and a data connection sits in A's pool."""
    bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
        req(transfer_pb2.WRITE, a_seg, peer, b_seg, 4096)])).batch_id
    assert wait_batch(t, bid).state == transfer_pb2.DONE


def wait_state(t, bid, index, state, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        r = t.GetBatch(transfer_pb2.GetBatchRequest(id=bid)).requests[index]
        if r.state == state:
            return r
        assert time.monotonic() < deadline, "request %d never reached %s: %s" % (index, state, r)
        time.sleep(0.02)


def test_cancel_stops_a_running_request(make_daemon):
    """B is frozen (SIGSTOP) so A's WRITE stalls mid-flight; Cancel ends it CANCELLED well
    before the data plane's 10 s I/O timeout, the segment is released, and both daemons serve
    on once B runs again."""
    import signal
    a, b = two_daemons(make_daemon)
    src = register(a, "src", 256 * MiB)
    dst = register(b, "dst", 256 * MiB, remote=True)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        warm_up(t, src.id, b.h2c, dst.id)
        b.signal(signal.SIGSTOP)
        try:
            bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
                req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 256 * MiB)])).batch_id
            wait_state(t, bid, 0, transfer_pb2.RUNNING)
            t0 = time.monotonic()
            t.Cancel(transfer_pb2.GetBatchRequest(id=bid))
            batch = wait_batch(t, bid, timeout=5)
            took = time.monotonic() - t0
        finally:
            b.signal(signal.SIGCONT)
        r = batch.requests[0]
        assert r.state == transfer_pb2.FAILED and r.code == grpc.StatusCode.CANCELLED.value[0], r
        assert "stopped (cancelled)" in r.message and r.bytes_done < 256 * MiB
        assert took < 5
        m = memory_pb2_grpc.MemoryStub(ch)
        assert m.GetSegment(memory_pb2.GetSegmentRequest(id=src.id)).holders == 0
        warm_up(t, src.id, b.h2c, dst.id)  # a new connection; B dropped the broken one
    assert a.metric("moongate_transfer_failures_total", grpc_code="CANCELLED") == 1


def test_transfers_run_on_the_transport_threads(make_daemon):
    """A transfer stalled on a frozen peer holds a transport thread (--io-threads), not the
    engine's only worker: a registration on A goes through meanwhile."""
    import signal
    a = make_daemon("--peer-tls=false", "--workers", "1", "--io-threads", "2")
    b = make_daemon("--peer-tls=false")
    src = register(a, "src", 64 * MiB)
    dst = register(b, "dst", 64 * MiB, remote=True)
    assert a.metric("moongate_transport_threads") == 2
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        warm_up(t, src.id, b.h2c, dst.id)
        b.signal(signal.SIGSTOP)
        try:
            bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
                req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 64 * MiB)])).batch_id
            wait_state(t, bid, 0, transfer_pb2.RUNNING)
            assert a.metric("moongate_transport_jobs_in_flight") == 1
            m = memory_pb2_grpc.MemoryStub(ch)
            m.RegisterSegment(memory_pb2.RegisterRequest(name="meanwhile", size=MiB),
                              timeout=5)  # the data-io-timeout is 10 s
            t.Cancel(transfer_pb2.GetBatchRequest(id=bid))
            batch = wait_batch(t, bid, timeout=5)
        finally:
            b.signal(signal.SIGCONT)
        assert batch.requests[0].code == grpc.StatusCode.CANCELLED.value[0], batch
    assert a.metric("moongate_transport_jobs_completed_total") >= 2


def test_batch_timeout_ends_running_and_connecting_requests(make_daemon):
    """With B frozen, requests stall mid-slice, in a new connection's HELLO or in line; the
    batch's timeout ends them all with DEADLINE_EXCEEDED."""
    import signal
    a, b = two_daemons(make_daemon)
    src = register(a, "src", 64 * MiB)
    dst = register(b, "dst", 64 * MiB, remote=True)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        warm_up(t, src.id, b.h2c, dst.id)
        b.signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            bid = t.Submit(transfer_pb2.SubmitRequest(timeout_ms=500, requests=[
                req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 32 * MiB),
                req(transfer_pb2.READ, src.id, b.h2c, dst.id, 32 * MiB, 32 * MiB)])).batch_id
            batch = wait_batch(t, bid, timeout=8)
            took = time.monotonic() - t0
        finally:
            b.signal(signal.SIGCONT)
        assert [r.code for r in batch.requests] == [grpc.StatusCode.DEADLINE_EXCEEDED.value[0]] * 2
        # The first runs (as two parts: one on the pooled connection, one waiting for B's
        # answer to a new connection's HELLO); the second waits for B's share of the workers.
        assert "stopped (deadline exceeded)" in batch.requests[0].message, batch
        assert batch.requests[1].message in (
            "the batch's timeout of 500 ms passed before it started",) or \
            "stopped (deadline exceeded)" in batch.requests[1].message, batch
        assert 0.5 <= took < 5
        m = memory_pb2_grpc.MemoryStub(ch)
        assert m.GetSegment(memory_pb2.GetSegmentRequest(id=src.id)).holders == 0


def test_batch_timeout_ends_requests_waiting_for_a_session(make_daemon):
    import socket
    a = make_daemon("--peer-tls=false")
    src = register(a, "src", MiB)
    silent = socket.socket()  # accepts, never answers OpenSession
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    peer = "127.0.0.1:%d" % silent.getsockname()[1]
    try:
        with h2c_channel(a) as ch:
            t = transfer_pb2_grpc.TransferStub(ch)
            bid = t.Submit(transfer_pb2.SubmitRequest(timeout_ms=300, requests=[
                req(transfer_pb2.WRITE, src.id, peer, 1, 100)])).batch_id
            batch = wait_batch(t, bid, timeout=5)
            r = batch.requests[0]
            assert r.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], r
            assert "timeout of 300 ms passed before it started" in r.message
    finally:
        silent.close()


def test_kill_9_of_a_peer_mid_batch(make_daemon):
    """A batch spans peers B and C. B is frozen mid-WRITE, then killed with SIGKILL: its
    request fails UNAVAILABLE naming B, C's requests complete, A keeps serving, and nothing
    stays held."""
    import signal
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    c = make_daemon("--peer-tls=false")
    src = register(a, "src", 128 * MiB)
    on_b = register(b, "on-b", 128 * MiB, remote=True)
    on_c = register(c, "on-c", 8 * MiB, remote=True)
    data, theirs = os.urandom(4 * MiB), os.urandom(4 * MiB)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[64 * MiB:68 * MiB] = data
    with open(on_c.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[4 * MiB:] = theirs
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        warm_up(t, src.id, b.h2c, on_b.id)
        b.signal(signal.SIGSTOP)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, on_b.id, 64 * MiB),
            req(transfer_pb2.WRITE, src.id, c.h2c, on_c.id, 4 * MiB, 64 * MiB, 0),
            req(transfer_pb2.READ, src.id, c.h2c, on_c.id, 4 * MiB, 96 * MiB, 4 * MiB),
        ])).batch_id
        wait_state(t, bid, 1, transfer_pb2.DONE)
        wait_state(t, bid, 2, transfer_pb2.DONE)
        assert wait_state(t, bid, 0, transfer_pb2.RUNNING).state == transfer_pb2.RUNNING
        b.kill()
        batch = wait_batch(t, bid, timeout=10)
        r = batch.requests[0]
        assert r.code == grpc.StatusCode.UNAVAILABLE.value[0], r
        assert b.h2c in r.message, r.message
        assert (batch.done, batch.failed) == (2, 1)
        peers = {p.address: p for p in t.ListPeers(transfer_pb2.ListPeersRequest()).peers}
        assert peers[b.h2c].state == transfer_pb2.PEER_FAILED and peers[b.h2c].last_error
        assert peers[c.h2c].state == transfer_pb2.PEER_OPEN and peers[c.h2c].jobs == 0
        with open(on_c.path, "rb") as f:
            assert f.read(4 * MiB) == data
        with open(src.path, "rb") as f:
            f.seek(96 * MiB)
            assert f.read(4 * MiB) == theirs  # READ from C
        m = memory_pb2_grpc.MemoryStub(ch)
        assert m.GetSegment(memory_pb2.GetSegmentRequest(id=src.id)).holders == 0
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=src.id))
    assert a.alive()
    assert a.metric("moongate_transfer_requests_in_flight") == 0


def test_peer_restart_is_handled_without_restarting_this_daemon(make_daemon):
    """B restarts (new epoch, new data port, new segment ids). A's pooled connection and its
    session token are stale; the next transfer notices, opens a new session and succeeds."""
    a, b = two_daemons(make_daemon)
    src = register(a, "src", MiB)
    data = os.urandom(MiB)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = data
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        warm_up(t, src.id, b.h2c, register(b, "dst", MiB, remote=True).id)
        b.stop()
        b.start()
        dst = register(b, "dst", MiB, remote=True)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, MiB)])).batch_id
        batch = wait_batch(t, bid)
        assert batch.state == transfer_pb2.DONE, batch
        with open(dst.path, "rb") as f:
            assert f.read() == data
    epochs = {line.split("epoch=")[1].split()[0] for line in a.read_log().splitlines()
              if "event=peer_session " in line}
    assert len(epochs) == 2, epochs
    # The peers list shows it: open, one restart seen, its data plane, and curl sees the same.
    with h2c_channel(a) as ch:
        peers = transfer_pb2_grpc.TransferStub(ch).ListPeers(transfer_pb2.ListPeersRequest()).peers
    assert [(p.address, p.state, p.restarts_seen) for p in peers] == \
        [(b.h2c, transfer_pb2.PEER_OPEN, 1)]
    assert peers[0].data_endpoint.startswith("127.0.0.1:") and list(peers[0].transports) == ["tcp"]
    assert "%016x" % peers[0].epoch in epochs and peers[0].session_expires_in_ms > 0
    import json
    from conftest import curl
    rc, out, err = curl("--http2-prior-knowledge", "http://%s/v1/peers" % a.h2c)
    assert rc == 0 and json.loads(out)["peers"][0]["state"] == "PEER_OPEN", out


def test_leases_on_either_side(make_daemon):
    """A's lease WRITEs into a remote-accessible lease on B and READs it back into A's
    segment; a lease's bounds are its requested length; a lease that is not
    remote-accessible, or released, is not found by peers; nothing stays held."""
    from moongate.v1 import pool_pb2, pool_pb2_grpc
    a = make_daemon("--peer-tls=false", "--pool-bytes", "16M")
    b = make_daemon("--peer-tls=false", "--pool-bytes", "16M")
    n = 3 * MiB + 17
    data = os.urandom(n)
    with h2c_channel(a) as ca, h2c_channel(b) as cb:
        pa, pb = pool_pb2_grpc.PoolStub(ca), pool_pb2_grpc.PoolStub(cb)
        mine = pa.AcquireLease(pool_pb2.AcquireLeaseRequest(size=n))
        theirs = pb.AcquireLease(pool_pb2.AcquireLeaseRequest(size=n, remote_accessible=True))
        private = pb.AcquireLease(pool_pb2.AcquireLeaseRequest(size=4096))
        with open(mine.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
            v[mine.offset:mine.offset + n] = data
        back = register(a, "back", n)
        t = transfer_pb2_grpc.TransferStub(ca)

        def lreq(op, length, **kw):
            return transfer_pb2.TransferRequest(op=op, peer=b.h2c, length=length, **kw)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            lreq(transfer_pb2.WRITE, n, local_lease=mine.id, remote_lease=theirs.id)])).batch_id
        assert wait_batch(t, bid).state == transfer_pb2.DONE
        with open(theirs.path, "rb") as f:
            f.seek(theirs.offset)
            assert f.read(n) == data  # in B's pool, where the lease is
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            lreq(transfer_pb2.READ, n - 5, local_segment=back.id, remote_lease=theirs.id,
                 local_offset=5, remote_offset=5)])).batch_id
        assert wait_batch(t, bid).state == transfer_pb2.DONE
        # B's descriptors refuse these before anything moves.
        for bad, needle in [
                (lreq(transfer_pb2.WRITE, 2, local_lease=mine.id, remote_lease=theirs.id,
                      remote_offset=n - 1), "outside lease %d" % theirs.id),   # 1 byte past it
                (lreq(transfer_pb2.WRITE, 1, local_lease=mine.id, remote_lease=private.id),
                 "has no remote-accessible lease %d" % private.id),
                (lreq(transfer_pb2.WRITE, 1, local_lease=mine.id, remote_segment=theirs.id),
                 "has no segment %d" % theirs.id)]:                       # a lease id
            with pytest.raises(grpc.RpcError) as e:
                t.Submit(transfer_pb2.SubmitRequest(requests=[bad]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert needle in e.value.details(), e.value.details()
        with open(back.path, "rb") as f:
            f.seek(5)
            assert f.read(n - 5) == data[5:]
        # Bad local leases are refused with the whole batch.
        for kw, needle in [(dict(local_lease=999, remote_lease=theirs.id), "no such local lease"),
                           (dict(local_lease=mine.id, remote_lease=theirs.id, local_offset=1),
                            "outside the local lease"),
                           (dict(local_lease=mine.id, local_segment=back.id,
                                 remote_lease=theirs.id), "local_segment or local_lease")]:
            with pytest.raises(grpc.RpcError) as e:
                t.Submit(transfer_pb2.SubmitRequest(requests=[lreq(transfer_pb2.WRITE, n, **kw)]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert needle in e.value.details()
        from moongate.v1 import peer_pb2, peer_pb2_grpc
        peer = peer_pb2_grpc.PeerStub(cb)
        d = peer.DescribeTarget(peer_pb2.DescribeTargetRequest(id=theirs.id, is_lease=True))
        assert (d.size, d.is_lease, d.remote_accessible, list(d.transports)) == \
            (n, True, True, ["tcp"])
        with pytest.raises(grpc.RpcError) as e:
            peer.DescribeTarget(peer_pb2.DescribeTargetRequest(id=private.id, is_lease=True))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        # Released on B: peers no longer find it (the cached descriptor is contradicted by the
        # data plane), and its range is free again.
        pb.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=theirs.id))
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            lreq(transfer_pb2.WRITE, 1, local_lease=mine.id, remote_lease=theirs.id)])).batch_id
        assert wait_batch(t, bid).requests[0].code == grpc.StatusCode.NOT_FOUND.value[0]
        stats = pb.PoolStats(pool_pb2.PoolStatsRequest()).pools[0]
        assert (stats.leases, stats.in_use) == (1, 4096)  # `private` alone
        # Expired on B: the same.
        brief = pb.AcquireLease(pool_pb2.AcquireLeaseRequest(size=MiB, remote_accessible=True,
                                                              ttl_ms=300))
        time.sleep(1)
        with pytest.raises(grpc.RpcError) as e:
            t.Submit(transfer_pb2.SubmitRequest(requests=[
                lreq(transfer_pb2.WRITE, 1, local_lease=mine.id, remote_lease=brief.id)]))
        assert "has no remote-accessible lease %d" % brief.id in e.value.details()
        stats = pb.PoolStats(pool_pb2.PoolStatsRequest()).pools[0]
        assert (stats.leases, stats.in_use, stats.expired_total) == (1, 4096, 1)
        assert pa.GetLease(pool_pb2.GetLeaseRequest(id=mine.id)).users == 0
        pa.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=mine.id))


def test_notification_arrives_only_after_the_data(make_daemon):
    """A reader on B watches a topic; A's batch WRITEs 64 MiB to B and carries a notification.
    When the notification reaches the reader, every byte is already in B's segment."""
    import threading
    from moongate.v1 import notify_pb2, notify_pb2_grpc
    a, b = two_daemons(make_daemon)
    n = 64 * MiB
    src = register(a, "src", n)
    dst = register(b, "dst", n, remote=True)
    data = os.urandom(n)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = data
    seen = {}

    def reader():
        with h2c_channel(b) as ch:
            for note in notify_pb2_grpc.NotifyStub(ch).Watch(
                    notify_pb2.WatchRequest(topic="kv/layer0"), timeout=30):
                with open(dst.path, "rb") as f:
                    seen["in_place"] = f.read() == data
                seen["note"] = note
                return
    th = threading.Thread(target=reader)
    th.start()
    time.sleep(0.3)  # the Watch is open
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(
            requests=[req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, n // 2, o, o)
                      for o in (0, n // 2)],
            notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic="kv/layer0",
                                            payload=b"blocks 0-63 ready")])).batch_id
        final = list(t.Wait(transfer_pb2.GetBatchRequest(id=bid), timeout=30))[-1]
    th.join(30)
    assert final.state == transfer_pb2.DONE, final
    assert [(s.state, s.topic) for s in final.notify] == [(transfer_pb2.NOTIFY_SENT, "kv/layer0")]
    assert seen["in_place"], "the notification came before the data"
    note = seen["note"]
    assert (note.payload, note.batch_id, note.topic) == (b"blocks 0-63 ready", bid, "kv/layer0")
    assert getattr(note, "from").startswith("127.0.0.1:")
    assert a.metric("moongate_transfer_notifications_total", result="sent") == 1
    assert b.metric("moongate_notifications_received_total", result="queued") == 1


def test_a_reads_notification_arrives_only_after_its_bytes_landed(make_daemon):
    """A batch of READs from B carrying a notification for B (as a NIXL decode side tells the
    prefill side it may free the blocks it read): when the notification reaches B's reader,
    A's batch is over and every byte read is in A's segment."""
    import threading
    from moongate.v1 import notify_pb2, notify_pb2_grpc
    a, b = two_daemons(make_daemon)
    n = 256 * MiB
    dst = register(a, "dst", n)
    src = register(b, "src", n, remote=True)
    data = os.urandom(n)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = data
    seen, bid = {}, []

    def reader():
        with h2c_channel(b) as ch:
            for note in notify_pb2_grpc.NotifyStub(ch).Watch(
                    notify_pb2.WatchRequest(topic="kv/read"), timeout=60):
                with h2c_channel(a) as ach:
                    seen["batch"] = transfer_pb2_grpc.TransferStub(ach).GetBatch(
                        transfer_pb2.GetBatchRequest(id=note.batch_id, brief=True))
                with open(dst.path, "rb") as f:
                    seen["in_place"] = f.read() == data
                seen["note"] = note
                return
    th = threading.Thread(target=reader)
    th.start()
    time.sleep(0.3)  # the Watch is open
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(
            requests=[req(transfer_pb2.READ, dst.id, b.h2c, src.id, n // 4, o, o)
                      for o in range(0, n, n // 4)],
            notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic="kv/read",
                                            payload=b"req-7:1")])).batch_id
        final = list(t.Wait(transfer_pb2.GetBatchRequest(id=bid), timeout=60))[-1]
    th.join(60)
    assert final.state == transfer_pb2.DONE, final
    assert [(s.state, s.topic) for s in final.notify] == [(transfer_pb2.NOTIFY_SENT, "kv/read")]
    assert seen["note"].payload == b"req-7:1" and seen["note"].batch_id == bid
    assert (seen["batch"].done, seen["batch"].failed) == (4, 0), seen["batch"]  # READs ended
    assert seen["in_place"], "the notification came before the bytes were read"


def test_notification_not_sent_when_a_write_fails_and_bounded_queues(make_daemon):
    import json
    from conftest import curl
    from moongate.v1 import notify_pb2, notify_pb2_grpc
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false", "--notify-queue", "2")
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    private = register(b, "soon-gone", MiB, remote=True)
    with h2c_channel(a) as ch, h2c_channel(b) as chb:
        t = transfer_pb2_grpc.TransferStub(ch)
        nb = notify_pb2_grpc.NotifyStub(chb)

        def submit(remote, payload):
            return t.Submit(transfer_pb2.SubmitRequest(
                requests=[req(transfer_pb2.WRITE, src.id, b.h2c, remote, 4096)],
                notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic="t", payload=payload)]
            )).batch_id
        # A WRITE that fails when it runs: its target went away after A cached it.
        assert wait_batch(t, submit(private.id, b"one")).state == transfer_pb2.DONE
        nb.Poll(notify_pb2.PollRequest(topic="t"))
        memory_pb2_grpc.MemoryStub(chb).UnregisterSegment(
            memory_pb2.UnregisterRequest(id=private.id))
        batch = wait_batch(t, submit(private.id, b"never"))
        assert batch.state == transfer_pb2.FAILED
        st = batch.notify[0]
        assert st.state == transfer_pb2.NOTIFY_FAILED
        assert st.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert "not sent: request 0 to this peer failed" in st.message
        assert "the peer's topic got a failure notice" in st.message
        # The receiver hears of it: a failure notice instead of the notification.
        [notice] = nb.Poll(notify_pb2.PollRequest(topic="t")).notifications
        assert notice.outcome == notify_pb2.OUTCOME_FAILED, notice
        assert notice.batch_id == batch.id and notice.payload == b"never"
        assert notice.code == grpc.StatusCode.NOT_FOUND.value[0]
        assert "request 0:" in notice.message and "not found" in notice.message
        assert list(notice.failed_requests) == [0] and notice.failed_count == 1
        assert b.metric("moongate_notification_notices_total") == 1
        # Nobody reads topic t: it holds 2 (--notify-queue), the third is refused, by name.
        for p in (b"one", b"two"):
            assert wait_batch(t, submit(dst.id, p)).state == transfer_pb2.DONE
        batch = wait_batch(t, submit(dst.id, b"three"))
        st = batch.notify[0]
        assert batch.state == transfer_pb2.FAILED and batch.done == 1
        assert st.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], st
        assert 'topic "t"' in st.message and "--notify-queue" in st.message
        assert b.metric("moongate_notifications_refused_total") is None
        assert b.metric("moongate_notifications_received_total", result="refused") == 1
        assert b.metric("moongate_notifications_queued") == 2
        # curl takes them, oldest first; then the topic is empty.
        rc, out, err = curl("--http2-prior-knowledge",
                            "http://%s/v1/notifications?topic=t&max=1" % b.h2c)
        got = json.loads(out)["notifications"]
        assert rc == 0 and len(got) == 1 and got[0]["topic"] == "t"
        rest = nb.Poll(notify_pb2.PollRequest(topic="t")).notifications
        assert [x.payload for x in rest] == [b"two"]
        assert b.metric("moongate_notifications_queued") == 0
        # Bad notifications are refused with the batch.
        for np, needle in [(dict(peer="b_example:1", topic="t"), "host:port"),
                           (dict(peer=b.h2c, topic=""), "topic"),
                           (dict(peer=b.h2c, topic="t", payload=b"x" * 65537), "65536")]:
            with pytest.raises(grpc.RpcError) as e:
                t.Submit(transfer_pb2.SubmitRequest(
                    requests=[req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 1)],
                    notify=[transfer_pb2.NotifyPeer(**np)]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "notification 0" in e.value.details() and needle in e.value.details()


def test_blocks_the_compact_form(make_daemon):
    """A batch given as `requests` plus packed `blocks`: every block lands; statuses number the
    blocks after the requests; a group whose arrays differ in length is refused whole."""
    a, b = two_daemons(make_daemon)
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    data = os.urandom(MiB)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = data
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        offsets = list(range(4096, MiB, 4096))  # 255 blocks of 4 KiB
        bid = t.Submit(transfer_pb2.SubmitRequest(
            requests=[req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096)],
            blocks=[transfer_pb2.Blocks(op=transfer_pb2.WRITE, local_segment=src.id,
                                        peer=b.h2c, remote_segment=dst.id,
                                        local_offsets=offsets, remote_offsets=offsets,
                                        lengths=[4096] * len(offsets))])).batch_id
        batch = wait_batch(t, bid)
        assert batch.state == transfer_pb2.DONE and batch.done == 256, batch.state
        with open(dst.path, "rb") as f:
            assert f.read() == data
        # Index 2 is the second block: past the end of the remote segment.
        with pytest.raises(grpc.RpcError) as e:
            t.Submit(transfer_pb2.SubmitRequest(
                requests=[req(transfer_pb2.READ, src.id, b.h2c, dst.id, 10)],
                blocks=[transfer_pb2.Blocks(op=transfer_pb2.READ, local_segment=src.id,
                                            peer=b.h2c, remote_segment=dst.id,
                                            remote_offsets=[0, MiB - 5], lengths=[10, 10])]))
        assert "request 2: remote offset + length is outside" in e.value.details()
        for blocks, needle in [
                (dict(local_offsets=[0, 1], lengths=[1]), "differ in count (2, 0, 1)"),
                (dict(local_offsets=[MiB], lengths=[1]), "request 0: local offset + length")]:
            with pytest.raises(grpc.RpcError) as e:
                t.Submit(transfer_pb2.SubmitRequest(blocks=[transfer_pb2.Blocks(
                    op=transfer_pb2.WRITE, local_segment=src.id, peer=b.h2c,
                    remote_segment=dst.id, **blocks)]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert needle in e.value.details(), e.value.details()
        m = memory_pb2_grpc.MemoryStub(ch)
        assert m.GetSegment(memory_pb2.GetSegmentRequest(id=src.id)).holders == 0


def test_local_copies_on_this_daemon(make_daemon):
    """peer "": the other side is a segment or lease of the same daemon; the bytes are copied
    on the workers, overlapping ranges included, with the usual checks."""
    from moongate.v1 import pool_pb2, pool_pb2_grpc
    a = make_daemon("--pool-bytes", "16M")
    one, two = register(a, "one", 4 * MiB), register(a, "two", 4 * MiB)
    data = os.urandom(4 * MiB)
    with open(one.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = data
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        lease = pool_pb2_grpc.PoolStub(ch).AcquireLease(pool_pb2.AcquireLeaseRequest(size=MiB))
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, one.id, "", two.id, 4 * MiB),                 # one -> two
            transfer_pb2.TransferRequest(op=transfer_pb2.READ, local_lease=lease.id, peer="",
                                         remote_segment=one.id, remote_offset=MiB,
                                         length=MiB),                            # one -> lease
        ])).batch_id
        assert wait_batch(t, bid).state == transfer_pb2.DONE
        with open(two.path, "rb") as f:
            assert f.read() == data
        with open(lease.path, "rb") as f:
            f.seek(lease.offset)
            assert f.read(MiB) == data[MiB:2 * MiB]
        # Overlapping ranges of one segment: a move, as memmove does it.
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, two.id, "", two.id, 3 * MiB, 0, 4096)])).batch_id
        assert wait_batch(t, bid).state == transfer_pb2.DONE
        with open(two.path, "rb") as f:
            f.seek(4096)
            assert f.read(3 * MiB) == data[:3 * MiB]
        for r, needle in [(req(transfer_pb2.WRITE, one.id, "", 999, 1), "no such segment on this"),
                          (req(transfer_pb2.WRITE, one.id, "", two.id, 2, 0, 4 * MiB - 1),
                           "outside the target on this daemon")]:
            with pytest.raises(grpc.RpcError) as e:
                t.Submit(transfer_pb2.SubmitRequest(requests=[r]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert needle in e.value.details(), e.value.details()
        m = memory_pb2_grpc.MemoryStub(ch)
        assert [m.GetSegment(memory_pb2.GetSegmentRequest(id=s.id)).holders
                for s in (one, two)] == [0, 0]
        assert len(t.ListPeers(transfer_pb2.ListPeersRequest()).peers) == 0


def test_a_local_copy_from_a_shrunk_file_fails_and_the_daemon_stays(make_daemon):
    """A local copy whose source file a client truncated: the request fails with DATA_LOSS
    naming the cause instead of the worker dying of SIGBUS."""
    a = make_daemon()
    one, two = register(a, "one", 4 * MiB), register(a, "two", 4 * MiB)
    os.truncate(one.path, MiB)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, one.id, "", two.id, 4 * MiB)])).batch_id
        b = wait_batch(t, bid)
        assert b.state == transfer_pb2.FAILED
        r = b.requests[0]
        assert r.code == grpc.StatusCode.DATA_LOSS.value[0], r
        assert "truncated" in r.message, r.message
    assert a.alive()


def test_writes_into_a_shrunk_remote_file_are_data_loss_and_the_connection_stays(make_daemon):
    """The receiving daemon copies small slices out of its read-ahead (the CPU's copy, guarded)
    and reads large ones straight into place (the kernel's, EFAULT): a WRITE into a remote
    segment whose file a client truncated fails DATA_LOSS either way, the bytes are taken off
    the stream, and the next slices on the same connections land."""
    a, b = two_daemons(make_daemon)
    src = register(a, "src", 8 * MiB)
    dst = register(b, "dst", 8 * MiB, remote=True)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = os.urandom(8 * MiB)
        data = bytes(v[:MiB])
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        # The session first (requests that wait for it start as they come, one job each).
        batch = wait_batch(t, t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096)])).batch_id)
        assert batch.state == transfer_pb2.DONE, batch
        os.truncate(dst.path, MiB)  # the first MiB stays
        small = [req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096, i * 4096, 2 * MiB + i * 4096)
                 for i in range(8)]
        for reqs in (small, [req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4 * MiB, 0,
                                 4 * MiB)]):
            batch = wait_batch(t, t.Submit(transfer_pb2.SubmitRequest(requests=reqs)).batch_id)
            assert batch.state == transfer_pb2.FAILED, batch
            for r in batch.requests:
                assert r.code == grpc.StatusCode.DATA_LOSS.value[0], r
        # What is still there still takes writes, small and large, on the same connections.
        reqs = [req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096, i * 4096, i * 4096)
                for i in range(8)] + [req(transfer_pb2.WRITE, src.id, b.h2c, dst.id,
                                          MiB - 32768, 32768, 32768)]
        batch = wait_batch(t, t.Submit(transfer_pb2.SubmitRequest(requests=reqs)).batch_id)
        assert batch.state == transfer_pb2.DONE, batch
    with open(dst.path, "rb") as f:
        assert f.read() == data
    assert b.alive() and a.alive()
    # One connection carried it all: none was closed for the refused bytes.
    assert b.metric("moongate_data_conns_total", result="accepted") == 1


@pytest.mark.parametrize("digest", [False, True])
def test_reads_from_a_shrunk_remote_file_are_data_loss_and_the_connection_stays(make_daemon,
                                                                              digest):
    """The serving daemon sends a plain READ's bytes straight from its mapping (the kernel's
    copy: a page past the file's end is EFAULT, after the answer's header went) and sums a
    checksummed one into its stage first (the CPU's copy, guarded): a READ from a remote
    segment whose file a client truncated fails DATA_LOSS naming the segment either way, not
    UNAVAILABLE (a connection closed, which callers retry for ever), and the next slices on the
    same connection are served."""
    a, b = two_daemons(make_daemon)
    back = register(a, "back", 8 * MiB)
    src = register(b, "src", 8 * MiB, remote=True)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = os.urandom(8 * MiB)
        data = bytes(v[:MiB])

    def read(reqs):
        return wait_batch(t, t.Submit(transfer_pb2.SubmitRequest(
            requests=reqs, digest=digest)).batch_id)

    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        assert read([req(transfer_pb2.READ, back.id, b.h2c, src.id, 4096)]).state == \
            transfer_pb2.DONE  # the session and its connection first
        os.truncate(src.path, MiB)  # the first MiB stays
        small = [req(transfer_pb2.READ, back.id, b.h2c, src.id, 4096, i * 4096, 2 * MiB + i * 4096)
                 for i in range(8)]
        for reqs in (small, [req(transfer_pb2.READ, back.id, b.h2c, src.id, 4 * MiB, 0, 4 * MiB)],
                     [req(transfer_pb2.READ, back.id, b.h2c, src.id, 2 * MiB, 0, 0)]):
            batch = read(reqs)
            assert batch.state == transfer_pb2.FAILED, batch
            for r in batch.requests:
                assert r.code == grpc.StatusCode.DATA_LOSS.value[0], r
                assert "segment %d" % src.id in r.message, r.message
                assert "shorter than registered" in r.message, r.message
        # What is still there is still served, small and large, on the same connection.
        reqs = [req(transfer_pb2.READ, back.id, b.h2c, src.id, 4096, i * 4096, i * 4096)
                for i in range(8)] + [req(transfer_pb2.READ, back.id, b.h2c, src.id,
                                          MiB - 32768, 32768, 32768)]
        batch = read(reqs)
        assert batch.state == transfer_pb2.DONE, batch
    with open(back.path, "rb") as f:
        assert f.read(MiB) == data
    assert b.alive() and a.alive()
    assert b.metric("moongate_data_conns_total", result="accepted") == 1


def test_finished_batches_are_forgotten_after_the_retention(make_daemon):
    a = make_daemon("--batch-retention", "1")
    one, two = register(a, "one", MiB), register(a, "two", MiB)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, one.id, "", two.id, MiB)])).batch_id
        assert wait_batch(t, bid).state == transfer_pb2.DONE
        deadline = time.monotonic() + 10
        while True:
            try:
                t.GetBatch(transfer_pb2.GetBatchRequest(id=bid))
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND
                break
            assert time.monotonic() < deadline, "the batch outlived --batch-retention 1"
            time.sleep(0.2)


def test_drain_ends_wait_calls_and_stops_running_transfers(make_daemon):
    """SIGTERM while a transfer to a frozen peer runs and a client waits on it: the Wait call
    ends UNAVAILABLE (draining), and the daemon still exits 0 well within --grace: the stalled
    transfer is stopped at shutdown instead of holding a worker until the I/O timeout."""
    import signal
    import threading
    a = make_daemon("--peer-tls=false", "--grace", "5", "--data-io-timeout", "60")
    b = make_daemon("--peer-tls=false")
    src = register(a, "src", 64 * MiB)
    dst = register(b, "dst", 64 * MiB, remote=True)
    got = {}
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        warm_up(t, src.id, b.h2c, dst.id)
        b.signal(signal.SIGSTOP)
        try:
            bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
                req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 64 * MiB)])).batch_id
            wait_state(t, bid, 0, transfer_pb2.RUNNING)

            def waiter():
                try:
                    for batch in t.Wait(transfer_pb2.GetBatchRequest(id=bid), timeout=30):
                        got["last"] = batch
                except grpc.RpcError as e:
                    got["code"], got["details"] = e.code(), e.details()
            th = threading.Thread(target=waiter)
            th.start()
            time.sleep(0.3)
            t0 = time.monotonic()
            a.signal(signal.SIGTERM)
            th.join(10)
            rc = a.proc.wait(20)
            took = time.monotonic() - t0
        finally:
            b.signal(signal.SIGCONT)
    assert got.get("code") == grpc.StatusCode.UNAVAILABLE, got
    assert "draining" in got["details"]
    assert got["last"].requests[0].state == transfer_pb2.RUNNING
    assert rc == 0 and took < 15, (rc, took)


def test_a_retried_submit_moves_nothing_twice(make_daemon):
    a, b = two_daemons(make_daemon)
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        sub = transfer_pb2.SubmitRequest(request_id="kv-layer-7",
                                         requests=[req(transfer_pb2.WRITE, src.id, b.h2c,
                                                       dst.id, MiB)])
        first = t.Submit(sub).batch_id
        assert wait_batch(t, first).state == transfer_pb2.DONE
        assert t.Submit(sub).batch_id == first  # the same batch, not a second one
        other = t.Submit(transfer_pb2.SubmitRequest(request_id="kv-layer-8",
                                                    requests=sub.requests)).batch_id
        assert other != first and wait_batch(t, other).state == transfer_pb2.DONE
        with pytest.raises(grpc.RpcError) as e:
            t.Submit(transfer_pb2.SubmitRequest(request_id="x" * 129, requests=sub.requests))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert b.metric("moongate_data_bytes_total", dir="in") == 2 * MiB
    assert a.metric("moongate_transfer_slices_in_flight") == 0


def test_notify_refuses_bad_topics_and_payloads(daemon):
    """Every Notify call checks its topic, and Deliver its payload size; the daemon serves on."""
    from moongate.v1 import notify_pb2, notify_pb2_grpc
    with h2c_channel(daemon) as ch:
        nb = notify_pb2_grpc.NotifyStub(ch)
        for topic in ("", "x" * 129, "tab\there"):
            for call in (lambda: nb.Poll(notify_pb2.PollRequest(topic=topic), timeout=5),
                         lambda: nb.Deliver(notify_pb2.Notification(topic=topic), timeout=5),
                         lambda: list(nb.Watch(notify_pb2.WatchRequest(topic=topic), timeout=5))):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "1..128 printable characters" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            nb.Deliver(notify_pb2.Notification(topic="t", payload=b"x" * 65537), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "at most 65536 bytes, not 65537" in e.value.details()
        nb.Deliver(notify_pb2.Notification(topic="t", payload=b"ok"), timeout=5)
        got = nb.Poll(notify_pb2.PollRequest(topic="t"), timeout=5).notifications
        assert [n.payload for n in got] == [b"ok"]


def test_a_submit_whose_answer_is_over_the_message_limit_fails_alone(make_daemon):
    """Submit with `wait` answers with the batch's status at its end; when that answer is over
    --max-message-bytes (long failure messages), the call ends RESOURCE_EXHAUSTED and the daemon
    goes on: the call's end must not free the record the batch's loop still walks."""
    a = make_daemon("--max-message-bytes", "1024")
    one, two = register(a, "one", MiB), register(a, "two", MiB)
    os.truncate(one.path, 0)  # every copy from it fails DATA_LOSS with a long message
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        reqs = [req(transfer_pb2.WRITE, one.id, "", two.id, 4096, i * 4096, i * 4096)
                for i in range(16)]
        with pytest.raises(grpc.RpcError) as e:
            t.Submit(transfer_pb2.SubmitRequest(requests=reqs, wait=True), timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=reqs[:1])).batch_id
        assert wait_batch(t, bid).state == transfer_pb2.FAILED
    assert a.alive()


def test_brief_answers_list_only_the_failed_requests(make_daemon):
    """GetBatch, Wait, Cancel and Submit(wait) with brief: the batch's state and counts, and of
    its requests only those that failed, each with its index; none for a batch that went well.
    JSON: ?brief=true."""
    import json
    from conftest import curl
    a = make_daemon()
    one, two = register(a, "one", MiB), register(a, "two", MiB)
    os.truncate(one.path, MiB // 2)  # copies from its second half fail DATA_LOSS
    reqs = [req(transfer_pb2.WRITE, one.id, "", two.id, 4096, i * MiB // 8, i * 4096)
            for i in range(8)]
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        resp = t.Submit(transfer_pb2.SubmitRequest(requests=reqs, wait=True, brief=True),
                        timeout=30)
        b = resp.batch
        assert (b.state, b.done, b.failed) == (transfer_pb2.FAILED, 4, 4), b
        assert [r.index for r in b.requests] == [4, 5, 6, 7]
        assert {(r.state, r.code) for r in b.requests} == \
            {(transfer_pb2.FAILED, grpc.StatusCode.DATA_LOSS.value[0])}
        full = t.GetBatch(transfer_pb2.GetBatchRequest(id=resp.batch_id))
        assert [r.state for r in full.requests] == [transfer_pb2.DONE] * 4 + \
            [transfer_pb2.FAILED] * 4 and {r.index for r in full.requests} == {0}
        assert [r.message for r in full.requests[4:]] == [r.message for r in b.requests]
        assert t.GetBatch(transfer_pb2.GetBatchRequest(id=resp.batch_id, brief=True)) == b
        assert list(t.Wait(transfer_pb2.GetBatchRequest(id=resp.batch_id, brief=True),
                           timeout=10)) == [b]
        assert t.Cancel(transfer_pb2.GetBatchRequest(id=resp.batch_id, brief=True)) == b
        ok = t.Submit(transfer_pb2.SubmitRequest(requests=reqs[:4])).batch_id
        seen = list(t.Wait(transfer_pb2.GetBatchRequest(id=ok, brief=True), timeout=30))
        assert seen[-1].state == transfer_pb2.DONE and seen[-1].done == 4
        assert [len(s.requests) for s in seen] == [0] * len(seen)
    rc, out, err = curl("--http2-prior-knowledge",
                        "http://%s/v1/transfers/%d?brief=true" % (a.h2c, resp.batch_id))
    got = json.loads(out)
    assert rc == 0 and [r["index"] for r in got.get("requests", ())] == [4, 5, 6, 7], out


def data_conns(port):
    """(congestion control, send buffer in bytes) of each established TCP socket with `port` at
    either end."""
    out = subprocess.run(["ss", "-tinmH", "state", "established", "( sport = :%d or dport = :%d )"
                          % (port, port)], capture_output=True, text=True, timeout=10).stdout
    lines = out.splitlines()
    names = ("reno", "cubic", "bbr", "bbr2", "dctcp", "vegas", "westwood", "htcp")
    return [(next((w for w in info.split() if w in names), "?"),
             int(info.split(",tb")[1].split(",")[0]))
            for head, info in zip(lines[::2], lines[1::2])]


def moved_both_ways(a, b):
    """One WRITE and one READ of 1 MiB from a to b; the port of b's data plane."""
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        for op in (transfer_pb2.WRITE, transfer_pb2.READ):
            r = t.Submit(transfer_pb2.SubmitRequest(requests=[req(op, src.id, b.h2c, dst.id, MiB)],
                                                    wait=True), timeout=30)
            assert r.batch.state == transfer_pb2.DONE, r.batch
    return int([l for l in b.read_log().splitlines() if "kind=data" in l][0]
               .split(" port=")[1].split()[0])


def test_tcp_congestion_is_set_on_both_ends_of_the_data_plane(make_daemon):
    """--tcp-congestion reno: the connection A opens to B's data plane and the one B accepts
    both use it (the system's is bbr or cubic here), whichever way the bytes go."""
    a = make_daemon("--peer-tls=false", "--tcp-congestion", "reno")
    b = make_daemon("--peer-tls=false", "--tcp-congestion", "reno")
    conns = data_conns(moved_both_ways(a, b))
    assert len(conns) >= 2 and {cc for cc, _ in conns} == {"reno"}, conns  # A's end and B's
    assert "congestion=reno" in b.read_log() and "congestion=reno" in a.read_log()


@pytest.mark.xdist_group("wmem_max")  # reads or lowers net.core.wmem_max: one at a time
def test_tcp_send_buffer_bounds_both_ends_of_the_data_plane(make_daemon):
    """--tcp-send-buffer 1M: the connection A opens and the one B accepts may each hold 1 MiB
    queued to send (as root, past net.core.wmem_max), where autotuning would have chosen."""
    a = make_daemon("--peer-tls=false", "--tcp-send-buffer", "1M")
    b = make_daemon("--peer-tls=false", "--tcp-send-buffer", "1M")
    conns = data_conns(moved_both_ways(a, b))
    with open("/proc/sys/net/core/wmem_max") as f:
        want = MiB if os.geteuid() == 0 else min(MiB, 2 * int(f.read()))
    assert len(conns) >= 2 and {tb for _, tb in conns} == {want}, conns
    assert "send_buffer=1048576" in b.read_log()


@pytest.mark.xdist_group("wmem_max")  # reads or lowers net.core.wmem_max: one at a time
def test_tcp_send_buffer_auto_bounds_only_paced_connections(make_daemon):
    """auto (the default): a BBR connection's queue is bounded, to at least 512 KiB and within
    autotuning's ceiling, on both ends; a reno connection keeps autotuning."""
    with open("/proc/sys/net/ipv4/tcp_wmem") as f:
        ceiling = int(f.read().split()[2])
    a = make_daemon("--peer-tls=false", "--tcp-congestion", "reno", "--log-level", "debug")
    b = make_daemon("--peer-tls=false", "--tcp-congestion", "reno", "--log-level", "debug")
    moved_both_ways(a, b)
    assert "send_buffer=auto" in b.read_log()
    assert "event=send_buffer" not in a.read_log() + b.read_log()
    try:
        c = make_daemon("--peer-tls=false", "--tcp-congestion", "bbr", "--log-level", "debug")
        d = make_daemon("--peer-tls=false", "--tcp-congestion", "bbr", "--log-level", "debug")
    except Exception as e:  # (a kernel without tcp_bbr)
        pytest.skip("no BBR here: %s" % e)
    conns = data_conns(moved_both_ways(c, d))
    assert len(conns) >= 2 and {cc for cc, _ in conns} == {"bbr"}, conns
    assert all(512 * 1024 <= tb <= max(ceiling, 512 * 1024) for _, tb in conns), conns
    for end in (c, d):  # each end's choice, logged, is what the socket has
        said = [l for l in end.read_log().splitlines() if "event=send_buffer" in l]
        assert said and all("congestion=bbr" in l for l in said), said
        assert {int(l.split(" bytes=")[1].split()[0]) for l in said} <= {tb for _, tb in conns}


@pytest.mark.xdist_group("wmem_max")  # reads or lowers net.core.wmem_max: one at a time
def test_tcp_send_buffer_without_cap_net_admin(make_daemon):
    """Without CAP_NET_ADMIN the kernel holds a send buffer at twice net.core.wmem_max (lowered
    to 128 KiB for the test): a size asked for is held there, and auto keeps autotuning rather
    than a queue shorter than the 512 KiB it wants."""
    if os.geteuid() != 0:
        pytest.skip("lowering net.core.wmem_max needs root")
    no_admin = ["setpriv", "--bounding-set", "-net_admin"]
    path = "/proc/sys/net/core/wmem_max"
    with open(path) as f:
        saved = f.read()
    try:
        with open(path, "w") as f:
            f.write("131072")
        a, b = (make_daemon("--peer-tls=false", "--tcp-send-buffer", "1M", "--log-level",
                            "debug", wrap=no_admin) for _ in range(2))
        conns = data_conns(moved_both_ways(a, b))
        assert len(conns) >= 2 and {tb for _, tb in conns} == {262144}, conns
        assert "event=send_buffer" in b.read_log() and "bytes=262144" in b.read_log()
        try:
            c, d = (make_daemon("--peer-tls=false", "--tcp-congestion", "bbr", "--log-level",
                                "debug", wrap=no_admin) for _ in range(2))
        except Exception as e:  # (no BBR, or not one this process may choose)
            pytest.skip("no BBR here for a process without CAP_NET_ADMIN: %s" % e)
        conns = data_conns(moved_both_ways(c, d))
        assert len(conns) >= 2 and {cc for cc, _ in conns} == {"bbr"}, conns
        assert "event=send_buffer" not in c.read_log() + d.read_log()
        assert 262144 not in {tb for _, tb in conns}, conns
    finally:
        with open(path, "w") as f:
            f.write(saved)


@pytest.mark.parametrize("data_listen", ["127.0.0.1:0", ""])
def test_tcp_congestion_the_kernel_lacks_is_a_clear_error_at_start(tmp_path, data_listen):
    """With a data listener or without one (the connections this daemon opens use it too)."""
    p = subprocess.run([MOONGATE, "--unix-socket", str(tmp_path / "s.sock"), "--ops-listen", "",
                        "--listen", "127.0.0.1:0", "--data-listen", data_listen, "--shm-dir",
                        str(tmp_path), "--tcp-congestion", "no-such-cc"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "TCP congestion control no-such-cc" in p.stderr and "this kernel has:" in p.stderr, \
        p.stderr
