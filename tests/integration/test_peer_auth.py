"""Who may call the peer API, and with which protocol version. Daemons that move bytes between
them authenticate each other with mutual TLS against --peer-ca (peer-a.pem and peer-b.pem here,
from their own CA): a transfer works between them; a daemon presenting no certificate, one from
another CA (a client certificate) or one outside --peer-allow is refused, and the request says
so. A stand-in peer (a python3-grpcio server speaking Peer/OpenSession) answering a protocol
version this daemon does not speak fails the request UNIMPLEMENTED, naming the versions."""
import mmap
import os
import re
import time
from concurrent import futures

import grpc
import pytest

from conftest import curl, free_port, h2c_channel, register, tls_channel
from moongate.v1 import (daemon_pb2, daemon_pb2_grpc, notify_pb2, notify_pb2_grpc, peer_pb2,
                         peer_pb2_grpc, transfer_pb2, transfer_pb2_grpc)

MiB = 1 << 20
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED.value[0]


def cert_args(d_certs, name):
    """--tls-cert/--tls-key of a certificate in the certs directory."""
    return ("--tls-cert", os.path.join(d_certs, name + ".pem"),
            "--tls-key", os.path.join(d_certs, name + ".key"))


def peer_b(make_daemon, certs, *extra):
    """The target daemon: its control port serves peer-b.pem; callers of its peer API must
    present a certificate from the peer CA."""
    return make_daemon("--peer-anonymous=false", *cert_args(certs, "peer-b"),
                       "--peer-ca", os.path.join(certs, "peer-ca.pem"), *extra)


def peer_a(make_daemon, certs, *extra):
    """The initiating daemon: it checks peers' server certificates against the peer CA."""
    return make_daemon("--peer-anonymous=false", "--peer-ca",
                       os.path.join(certs, "peer-ca.pem"), *extra)


def run_write(a, peer, dst_id, src_id, length):
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[transfer_pb2.TransferRequest(
            op=transfer_pb2.WRITE, local_segment=src_id, peer=peer, remote_segment=dst_id,
            length=length)]), timeout=10).batch_id
        deadline = time.monotonic() + 30
        while True:
            b = t.GetBatch(transfer_pb2.GetBatchRequest(id=bid), timeout=10)
            if b.state != transfer_pb2.RUNNING:
                return b
            assert time.monotonic() < deadline, "batch still running"
            time.sleep(0.02)


def test_transfer_between_daemons_over_mutual_tls(make_daemon, certs):
    b = peer_b(make_daemon, certs)
    a = peer_a(make_daemon, certs, "--peer-cert", os.path.join(certs, "peer-a.pem"),
               "--peer-key", os.path.join(certs, "peer-a.key"))
    src = register(a, "src", 3 * MiB + 7)
    dst = register(b, "dst", 3 * MiB + 7, remote=True)
    data = os.urandom(3 * MiB + 7)
    with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = data
    batch = run_write(a, "127.0.0.1:%d" % b.tls_port, dst.id, src.id, len(data))
    assert batch.state == transfer_pb2.DONE, batch
    with open(dst.path, "rb") as f:
        assert f.read() == data
    assert re.search(r'event=peer_session_opened .*identity="peer-a"', b.read_log())


@pytest.mark.parametrize("how", ["no-peer-cert", "client-cert", "not-allowed"])
def test_daemons_the_peer_does_not_trust_are_refused(make_daemon, certs, how):
    extra_b, extra_a = (), ()
    if how == "client-cert":  # chains to the client CA, not to the peer CA
        extra_a = ("--peer-cert", os.path.join(certs, "client.pem"),
                   "--peer-key", os.path.join(certs, "client.key"))
    elif how == "not-allowed":
        extra_b = ("--peer-allow", "peer-c,spiffe://other")
        extra_a = ("--peer-cert", os.path.join(certs, "peer-a.pem"),
                   "--peer-key", os.path.join(certs, "peer-a.key"))
    # no-peer-cert: A presents its server certificate (the development CA's, serverAuth only)
    b = peer_b(make_daemon, certs, *extra_b)
    a = peer_a(make_daemon, certs, *extra_a)
    src = register(a, "src", 4096)
    dst = register(b, "dst", 4096, remote=True)
    with open(dst.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:] = b"\x5a" * 4096
    batch = run_write(a, "127.0.0.1:%d" % b.tls_port, dst.id, src.id, 4096)
    r = batch.requests[0]
    assert batch.state == transfer_pb2.FAILED and r.code == PERMISSION_DENIED, batch
    assert "127.0.0.1:%d" % b.tls_port in r.message
    if how == "not-allowed":
        assert 'peer "peer-a" is not in --peer-allow' in r.message
    else:
        assert "does not chain to --peer-ca" in r.message
    with open(dst.path, "rb") as f:
        assert f.read() == b"\x5a" * 4096  # nothing written
    with h2c_channel(a) as ch:  # A keeps serving
        daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest(), timeout=10)


def test_peer_api_is_closed_to_clients(make_daemon, certs):
    b = peer_b(make_daemon, certs)
    ask = peer_pb2.OpenSessionRequest(protocol_version=1)
    cases = [
        (h2c_channel(b), "call it over TLS with a certificate from --peer-ca"),
        (tls_channel(b, ca="peer-ca.pem"), "no client certificate"),
        (tls_channel(b, ca="peer-ca.pem", cert="client"), "does not chain to --peer-ca"),
    ]
    for ch, why in cases:
        with ch:
            for call in (lambda: peer_pb2_grpc.PeerStub(ch).OpenSession(ask, timeout=10),
                         lambda: peer_pb2_grpc.PeerStub(ch).DescribeTarget(
                             peer_pb2.DescribeTargetRequest(id=1), timeout=10),
                         lambda: notify_pb2_grpc.NotifyStub(ch).Deliver(
                             notify_pb2.Notification(topic="t", payload=b"x"), timeout=10)):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value
                assert why in e.value.details()
            # The client API is the same for them.
            daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest(), timeout=10)
    with tls_channel(b, ca="peer-ca.pem", cert="peer-a") as ch:
        s = peer_pb2_grpc.PeerStub(ch).OpenSession(ask, timeout=10)
        assert len(s.token) == 32 and s.protocol_version == 1
    # JSON to the same method is refused the same way.
    rc, out, _ = curl("--http2-prior-knowledge", "-H", "content-type: application/json",
                      "-d", "{}", "http://%s/moongate.v1.Peer/OpenSession" % b.h2c)
    assert rc == 0 and b"is for peer daemons" in out, out


class OtherVersionPeer(peer_pb2_grpc.PeerServicer):
    """A peer that answers OpenSession with a data-plane version of its own."""

    def __init__(self, version):
        self.version = version
        self.asked = []

    def OpenSession(self, request, context):
        self.asked.append((request.protocol_version, request.min_protocol_version))
        return peer_pb2.OpenSessionResponse(token=b"\x01" * 32, data_host="127.0.0.1",
                                            data_port=1, epoch=7,
                                            protocol_version=self.version, expires_in_ms=60000)

    def DescribeTarget(self, request, context):
        return peer_pb2.TargetDescriptor(id=request.id, size=1 << 20, remote_accessible=True,
                                         transports=["tcp"], epoch=7)


def test_a_peer_of_another_protocol_version_is_a_clear_error(make_daemon):
    a = make_daemon("--peer-tls=false")
    peer = OtherVersionPeer(9)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    peer_pb2_grpc.add_PeerServicer_to_server(peer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        src = register(a, "src", 4096)
        batch = run_write(a, "127.0.0.1:%d" % port, 1, src.id, 4096)
    finally:
        server.stop(0)
    r = batch.requests[0]
    assert r.code == grpc.StatusCode.UNIMPLEMENTED.value[0], batch
    assert "answered data-plane protocol version 9; this daemon speaks 1..1" in r.message
    assert peer.asked == [(1, 1)]  # it said which versions it speaks


def test_an_unreachable_peer_is_named_with_the_system_calls_reason(make_daemon, certs):
    """A peer whose port refuses the connection: over TLS the request says "Connection
    refused", not OpenSSL's code for a failed system call (error:00000005:lib(0)...)."""
    a = peer_a(make_daemon, certs)
    src = register(a, "src", 4096)
    port = free_port()  # nothing listens there
    batch = run_write(a, "127.0.0.1:%d" % port, 1, src.id, 100)
    r = batch.requests[0]
    assert r.code == grpc.StatusCode.UNAVAILABLE.value[0], batch
    assert "127.0.0.1:%d" % port in r.message and "Connection refused" in r.message, r.message
    assert "lib(0)" not in r.message
