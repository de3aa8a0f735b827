"""The peer side of transfers with real clients: Peer/OpenSession and DescribeTarget over gRPC,
then the TCP data plane spoken from Python frame by frame — HELLO with the session token,
WRITE slices that land in the segment a test maps, READ slices back, refusals that keep the
stream, a token from another daemon life refused."""
import mmap
import os
import socket
import struct
import time

import grpc
import pytest

from conftest import h2c_channel
from moongate.v1 import (daemon_pb2, daemon_pb2_grpc, memory_pb2, memory_pb2_grpc, peer_pb2,
                         peer_pb2_grpc)

MAGIC, VERSION = 0x5044474d, 1
HELLO, HELLO_OK, WRITE, WRITE_ACK, READ, READ_DATA, ERROR = range(1, 8)

_table = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82f63b78 if _c & 1 else _c >> 1
    _table.append(_c)


def crc32c(data):
    crc = 0xffffffff
    for b in data:
        crc = _table[(crc ^ b) & 0xff] ^ (crc >> 8)
    return crc ^ 0xffffffff


def frame(ftype, slice_=0, target=0, offset=0, length=0, flags=0, status=0, pcrc=0):
    h = struct.pack("<IBBHQQQIII", MAGIC, VERSION, ftype, flags, slice_, target, offset, length,
                    status, pcrc)
    return h + struct.pack("<I", crc32c(h))


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "the daemon closed the data-plane connection"
        buf += chunk
    return buf


def read_frame(s):
    h = recv_exact(s, 48)
    magic, version, ftype, flags, slice_, target, offset, length, status, pcrc, hcrc = \
        struct.unpack("<IBBHQQQIIII", h)
    assert (magic, version) == (MAGIC, VERSION) and hcrc == crc32c(h[:44])
    return dict(type=ftype, slice=slice_, target=target, offset=offset, length=length,
                status=status)


def session(d):
    with h2c_channel(d) as ch:
        return peer_pb2_grpc.PeerStub(ch).OpenSession(peer_pb2.OpenSessionRequest(
            protocol_version=1), timeout=10)


def dial(sess, token=None):
    s = socket.create_connection(("127.0.0.1", sess.data_port), timeout=10)
    s.sendall(frame(HELLO, length=32) + (token or sess.token))
    return s, read_frame(s)


def test_sessions_descriptors_and_info(make_daemon):
    d = make_daemon()
    ch = h2c_channel(d)
    with ch:
        info = daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest())
        tcp = [t for t in info.transports if t.name == "tcp"][0]
        s = session(d)
        assert tcp.available and tcp.endpoint == "127.0.0.1:%d" % s.data_port
        assert len(s.token) == 32 and s.epoch == info.epoch and s.protocol_version == 1
        assert s.data_port > 0 and s.expires_in_ms == 3600 * 1000
        assert session(d).token != s.token  # a new random token every time
        peer = peer_pb2_grpc.PeerStub(ch)
        # Versions: the newest both speak; a caller that names none speaks 1; no overlap is
        # refused naming both ranges.
        for newest, oldest in ((2, 1), (9, 1), (0, 0), (1, 0)):
            assert peer.OpenSession(peer_pb2.OpenSessionRequest(
                protocol_version=newest, min_protocol_version=oldest)).protocol_version == 1
        for newest, oldest in ((2, 0), (3, 2), (1, 2)):
            with pytest.raises(grpc.RpcError) as e:
                peer.OpenSession(peer_pb2.OpenSessionRequest(
                    protocol_version=newest, min_protocol_version=oldest))
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "versions %d..%d (the caller's) and 1..1 (this daemon's) do not overlap" % (
                oldest or newest, newest) in e.value.details()
        m = memory_pb2_grpc.MemoryStub(ch)
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="shared", size=1 << 20, remote_accessible=True)).segment
        t = peer.DescribeTarget(peer_pb2.DescribeTargetRequest(id=seg.id))
        assert (t.size, t.remote_accessible, list(t.transports), t.epoch) == \
            (1 << 20, True, ["tcp"], info.epoch)
        with pytest.raises(grpc.RpcError) as e:
            peer.DescribeTarget(peer_pb2.DescribeTargetRequest(id=12345))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_data_plane_write_and_read(make_daemon):
    d = make_daemon()
    with h2c_channel(d) as ch:
        m = memory_pb2_grpc.MemoryStub(ch)
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="dst", size=3 << 20, remote_accessible=True)).segment
        private = m.RegisterSegment(memory_pb2.RegisterRequest(name="private",
                                                               size=4096)).segment
    sess = session(d)
    s, answer = dial(sess)
    assert answer["type"] == HELLO_OK
    data = os.urandom(1 << 20) + b"tail"
    # Two slices in flight, acknowledged in order once in place.
    s.sendall(frame(WRITE, slice_=1, target=seg.id, offset=5, length=1 << 20) + data[:1 << 20] +
              frame(WRITE, slice_=2, target=seg.id, offset=5 + (1 << 20), length=4) + b"tail")
    for n in (1, 2):
        ack = read_frame(s)
        assert (ack["type"], ack["slice"], ack["status"]) == (WRITE_ACK, n, 0)
    with open(seg.path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as v:
        assert v[5:5 + len(data)] == data
    s.sendall(frame(READ, slice_=3, target=seg.id, offset=5, length=len(data)))
    got = read_frame(s)
    assert (got["type"], got["status"], got["length"]) == (READ_DATA, 0, len(data))
    assert recv_exact(s, len(data)) == data
    # Refusals name the reason and keep the stream: not remote-accessible, out of range,
    # unknown; the payload is consumed, nothing lands.
    s.sendall(frame(WRITE, slice_=4, target=private.id, offset=0, length=3) + b"bad")
    assert read_frame(s)["status"] == grpc.StatusCode.PERMISSION_DENIED.value[0]
    s.sendall(frame(WRITE, slice_=5, target=seg.id, offset=(3 << 20) - 1, length=2) + b"xx")
    assert read_frame(s)["status"] == grpc.StatusCode.OUT_OF_RANGE.value[0]
    s.sendall(frame(READ, slice_=6, target=999, offset=0, length=1))
    assert read_frame(s)["status"] == grpc.StatusCode.NOT_FOUND.value[0]
    with open(private.path, "rb") as f:
        assert f.read(3) == b"\0\0\0"
    s.sendall(frame(WRITE, slice_=7, target=seg.id, offset=0, length=2) + b"ok")
    assert read_frame(s)["status"] == 0
    # A malformed frame ends the connection (after an ERROR).
    s.sendall(b"\0" * 48)
    err = read_frame(s)
    assert err["type"] == ERROR
    assert recv_exact(s, err["length"]) == b"not a moongate data-plane stream"
    assert s.recv(1024) == b""  # closed
    s.close()
    assert d.metric("moongate_data_slices_total", op="write") == 3
    assert d.metric("moongate_data_slices_total", op="read") == 1
    assert d.metric("moongate_data_slices_total", op="refused") == 3
    assert d.metric("moongate_data_bytes_total", dir="in") == len(data) + 2


def test_tokens_of_another_daemon_life_are_refused(make_daemon):
    d = make_daemon()
    sess = session(d)
    s, answer = dial(sess, token=b"x" * 32)
    assert answer["type"] == ERROR and answer["status"] == grpc.StatusCode.UNAUTHENTICATED.value[0]
    s.close()
    d.stop()  # the same daemon restarted: a new epoch, its old sessions gone
    d.start()
    sess2 = session(d)
    assert sess2.epoch != sess.epoch
    s, answer = dial(sess2, token=sess.token)
    assert answer["type"] == ERROR and answer["status"] == grpc.StatusCode.UNAUTHENTICATED.value[0]
    s.close()
    s, answer = dial(sess2)
    assert answer["type"] == HELLO_OK
    s.close()
    d.stop()


def test_no_data_plane(make_daemon):
    d = make_daemon("--data-listen", "")
    with h2c_channel(d) as ch:
        info = daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest())
        tcp = [t for t in info.transports if t.name == "tcp"][0]
        assert not tcp.available and "--data-listen" in tcp.reason
        with pytest.raises(grpc.RpcError) as e:
            peer_pb2_grpc.PeerStub(ch).OpenSession(peer_pb2.OpenSessionRequest())
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_sessions_serve_only_their_tenant(make_daemon):
    """A session is opened for a tenant (the initiating batch's): on the data plane and in
    DescribeTarget it reaches that tenant's segments only; another's look like none."""
    d = make_daemon()
    with h2c_channel(d) as ch:  # anonymous here: tenant "default"
        seg = memory_pb2_grpc.MemoryStub(ch).RegisterSegment(memory_pb2.RegisterRequest(
            name="mine", size=4096, remote_accessible=True)).segment
        p = peer_pb2_grpc.PeerStub(ch)
        other = p.OpenSession(peer_pb2.OpenSessionRequest(protocol_version=1, tenant="team-x"),
                              timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            p.DescribeTarget(peer_pb2.DescribeTargetRequest(id=seg.id, tenant="team-x"),
                             timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert p.DescribeTarget(peer_pb2.DescribeTargetRequest(id=seg.id), timeout=10).size == 4096
        with pytest.raises(grpc.RpcError) as e:
            p.OpenSession(peer_pb2.OpenSessionRequest(protocol_version=1, tenant="bad/name"),
                          timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    s, answer = dial(other)
    assert answer["type"] == HELLO_OK
    s.sendall(frame(WRITE, slice_=1, target=seg.id, offset=0, length=4) + b"evil")
    assert read_frame(s)["status"] == grpc.StatusCode.NOT_FOUND.value[0]
    s.sendall(frame(READ, slice_=2, target=seg.id, offset=0, length=4))
    assert read_frame(s)["status"] == grpc.StatusCode.NOT_FOUND.value[0]
    s.close()
    with open(seg.path, "rb") as f:
        assert f.read(4) == b"\0" * 4
    s, answer = dial(session(d))  # the owner's session reaches it
    s.sendall(frame(WRITE, slice_=1, target=seg.id, offset=0, length=4) + b"good")
    assert read_frame(s)["status"] == 0
    s.close()


def test_expired_session_tokens_are_refused(make_daemon):
    d = make_daemon("--session-ttl", "1")
    sess = session(d)
    time.sleep(1.5)
    s, answer = dial(sess)
    assert answer["type"] == ERROR and answer["status"] == grpc.StatusCode.UNAUTHENTICATED.value[0]
    s.close()


def test_peer_checksum_reaches_only_what_peers_may(make_daemon):
    """Peer/Checksum sums what a peer may move — a remote-accessible segment or lease — and
    nothing else: a private segment is PERMISSION_DENIED, a private lease NOT_FOUND (as
    DescribeTarget and the data plane see it), a range past the end OUT_OF_RANGE."""
    from moongate.v1 import pool_pb2, pool_pb2_grpc
    daemon = make_daemon("--pool-bytes", "8M")
    with h2c_channel(daemon) as ch:
        m, peer = memory_pb2_grpc.MemoryStub(ch), peer_pb2_grpc.PeerStub(ch)
        pool = pool_pb2_grpc.PoolStub(ch)
        shared = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="shared", size=1 << 20, remote_accessible=True)).segment
        private = m.RegisterSegment(memory_pb2.RegisterRequest(name="private",
                                                               size=4096)).segment
        got = peer.Checksum(peer_pb2.PeerChecksumRequest(target=shared.id, offset=4096,
                                                         length=8192))
        assert got.crc32c == m.Checksum(memory_pb2.ReadSegmentRequest(
            id=shared.id, offset=4096, length=8192)).crc32c and got.length == 8192
        public = pool.AcquireLease(pool_pb2.AcquireLeaseRequest(size=65536,
                                                                remote_accessible=True))
        mine = pool.AcquireLease(pool_pb2.AcquireLeaseRequest(size=65536))
        assert peer.Checksum(peer_pb2.PeerChecksumRequest(target=public.id, lease=True,
                                                          length=65536)).length == 65536
        for fields, code, needle in (
                (dict(target=private.id, length=4096), "PERMISSION_DENIED", "remote-accessible"),
                (dict(target=mine.id, lease=True, length=4096), "NOT_FOUND",
                 "no remote-accessible lease"),
                (dict(target=shared.id, offset=1 << 20, length=1), "OUT_OF_RANGE", "outside")):
            with pytest.raises(grpc.RpcError) as e:
                peer.Checksum(peer_pb2.PeerChecksumRequest(**fields))
            assert e.value.code().name == code and needle in e.value.details(), e.value
