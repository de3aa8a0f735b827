"""Peers by DNS name. The sending daemon runs in a mount namespace of its own whose /etc/hosts
and /etc/resolv.conf are files the test writes (a private hosts file: no resolver to install);
its peers listen on other loopback addresses (127.0.0.2, 127.0.0.3) on the same port, so a
name can move from one to the other. Covered: transfers, lookups and agents' one-string forms
by name (ListPeers and /metrics name the peer and say where it led); a peer moving to another
address behind the same name; a name that does not resolve, reported per request and to a
Send as this daemon's failure (not the peer's refusal); a resolver that never answers while
Health and other peers keep being served; the peer's certificate checked against the name (SNI
and hostname), a Send told that this daemon refused it. Skipped, saying why, where a mount
namespace cannot be made (no root)."""
import os
import random
import socket
import subprocess
import threading

import grpc
import pytest

import conftest
from conftest import h2c_channel, register

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402
from mgstd import health_pb2, health_pb2_grpc  # noqa: E402
from moongate.v1 import transfer_pb2, transfer_pb2_grpc  # noqa: E402

MiB = 1 << 20
# /etc/hosts and /etc/resolv.conf bound over with the test's files, then the daemon.
BIND = 'mount --bind "$MG_HOSTS" /etc/hosts && mount --bind "$MG_RESOLV" /etc/resolv.conf && ' \
       'exec "$0" "$@"'


@pytest.fixture
def names(tmp_path):
    """(hosts file, resolv.conf file, wrap): a daemon started with `wrap` resolves through them."""
    hosts, resolv = tmp_path / "hosts", tmp_path / "resolv.conf"
    hosts.write_text("127.0.0.1 localhost\n")
    resolv.write_text("nameserver 127.0.0.9\noptions timeout:1 attempts:1\n")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind %s /etc/hosts" % hosts],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("cannot make a mount namespace here: %s" % probe.stderr.strip())
    os.environ["MG_HOSTS"], os.environ["MG_RESOLV"] = str(hosts), str(resolv)
    yield hosts, resolv, ["unshare", "-m", "--propagation", "private", "sh", "-c", BIND]


def at(make_daemon, host, h2c_port=None, *extra):
    """A daemon listening on `host`; its h2c port is h2c_port when given (names move)."""
    d = make_daemon(*extra, host=host)
    if h2c_port and d.h2c_port != h2c_port:
        d.stop()
        d.h2c_port = h2c_port
        i = d.args.index("--h2c-listen")
        d.args[i + 1] = "%s:%d" % (host, h2c_port)
        d.start(attempts=1)
    return d


def write(a, peer, dst, src, n=4096, timeout_ms=0):
    with h2c_channel(a) as ch:
        return transfer_pb2_grpc.TransferStub(ch).Submit(transfer_pb2.SubmitRequest(
            requests=[transfer_pb2.TransferRequest(op=transfer_pb2.WRITE, local_segment=src,
                                                   peer=peer, remote_segment=dst, length=n)],
            wait=True, timeout_ms=timeout_ms), timeout=60).batch


def peers(a):
    with h2c_channel(a) as ch:
        return {p.address: p for p in transfer_pb2_grpc.TransferStub(ch).ListPeers(
            transfer_pb2.ListPeersRequest(), timeout=10).peers}


def test_a_peer_by_name_and_moving_to_another_address(make_daemon, names):
    hosts, _, wrap = names
    b = at(make_daemon, "127.0.0.2", None, "--peer-tls=false")
    c = at(make_daemon, "127.0.0.3", b.h2c_port, "--peer-tls=false")
    hosts.write_text("127.0.0.1 localhost\n127.0.0.2 node-b.test\n")
    a = make_daemon("--peer-tls=false", "--peer-port", str(b.h2c_port), wrap=wrap)
    name = "node-b.test:%d" % b.h2c_port
    src = register(a, "src", MiB)
    on_b, on_c = register(b, "dst", MiB, remote=True), register(c, "dst", MiB, remote=True)
    batch = write(a, name, on_b.id, src.id)
    assert batch.state == transfer_pb2.DONE, batch
    p = peers(a)[name]
    assert (p.resolved, p.lookups, p.lookup_failures) == ("127.0.0.2:%d" % b.h2c_port, 1, 0)
    assert a.metric("moongate_peer_lookups_total", peer=name, tenant="default", result="ok") == 1
    assert a.metric("moongate_peer_requests_total", peer=name, tenant="default", op="write",
                    result="done") == 1
    # an agent's one-string form by name, and a notification by name
    with mg.Client("unix:" + b.sock) as cb, mg.Client("unix:" + a.sock) as ca:
        cb.register_agent("decode-0", port=21000)
        buf = cb.allocate_buffer(MiB, remote_accessible=True)
        mine = ca.allocate_buffer(MiB)
        ca.transfer([mg.write(address=mine.address, agent="node-b.test:21000",
                              remote_address=buf.address, length=64)],
                    notify=[mg.notify(name, "t", b"n")])
        assert ca.describe_agent("node-b.test:21000").first_address == buf.address
        ca.send("t", b"s", agent="node-b.test:21000")
        assert [n.payload for n in cb.poll("t")] == [b"n", b"s"]
    # the name moves: b goes, the name leads to c
    hosts.write_text("127.0.0.1 localhost\n127.0.0.3 node-b.test\n")
    b.stop()
    batch = write(a, name, on_c.id, src.id)
    assert batch.state == transfer_pb2.DONE, batch
    p = peers(a)[name]
    assert p.resolved == "127.0.0.3:%d" % c.h2c_port and p.lookups >= 2
    assert p.restarts_seen >= 1  # another daemon behind the name: another epoch


def test_unresolvable_and_hung_names_block_nothing(make_daemon, names):
    hosts, resolv, wrap = names
    b = at(make_daemon, "127.0.0.2", None, "--peer-tls=false")
    hosts.write_text("127.0.0.1 localhost\n127.0.0.2 node-b.test\n")
    # a resolver that never answers: queries to it are read and dropped. Its address is one of
    # 127.0.9.0/24 nobody else holds (another run of the suite on this machine may have one).
    hole = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for n in random.sample(range(1, 255), 254):
        try:
            hole.bind(("127.0.9.%d" % n, 53))
            break
        except OSError:
            continue
    ns = hole.getsockname()[0]
    resolv.write_text("nameserver %s\noptions timeout:1 attempts:1\n" % ns)
    a = make_daemon("--peer-tls=false", wrap=wrap)
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    try:
        # not in the hosts file, and the resolver says nothing: each request says so
        for _ in range(2):
            batch = write(a, "nobody.test:%d" % b.h2c_port, dst.id, src.id)
            assert batch.state == transfer_pb2.FAILED
            r = batch.requests[0]
            assert r.code == grpc.StatusCode.UNAVAILABLE.value[0], r
            assert "cannot resolve \"nobody.test\"" in r.message, r.message
        # a Send too: it failed here, the peer refused nothing
        with mg.Client("unix:" + a.sock) as ca, pytest.raises(mg.Error) as e:
            ca.send("t", b"x", peer="nobody.test:%d" % b.h2c_port)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value.message
        assert "peer nobody.test:%d: cannot resolve \"nobody.test\"" % b.h2c_port in \
            e.value.message and "refused" not in e.value.message, e.value.message
        # while a lookup hangs on the resolver, the daemon serves others
        resolv.write_text("nameserver %s\noptions timeout:5 attempts:1\n" % ns)
        asked = threading.Event()

        def listen():  # reads the queries, answers none
            try:
                while True:
                    if b"hang" in hole.recvfrom(512)[0]:
                        asked.set()
            except OSError:
                pass
        threading.Thread(target=listen, daemon=True).start()
        out = {}
        t = threading.Thread(target=lambda: out.update(
            b=write(a, "hang.test:%d" % b.h2c_port, dst.id, src.id)))
        t.start()
        assert asked.wait(30)  # the lookup is waiting for the resolver now
        with h2c_channel(a) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
            assert write(a, "node-b.test:%d" % b.h2c_port, dst.id, src.id).state == \
                transfer_pb2.DONE
        assert t.is_alive()  # served while the lookup still waited (for up to 5 s)
        t.join(60)
        assert out["b"].state == transfer_pb2.FAILED
        assert "cannot resolve \"hang.test\"" in out["b"].requests[0].message
        assert a.metric("moongate_peer_lookups_total", peer="hang.test:%d" % b.h2c_port,
                        tenant="default", result="failed") >= 1
    finally:
        hole.close()
    # bad names are refused before anything is looked up
    for peer in ("bad_name:1", "-x.test:1", "x.test:0", "[x.test]:1"):
        with h2c_channel(a) as ch, pytest.raises(grpc.RpcError) as e:
            transfer_pb2_grpc.TransferStub(ch).Submit(transfer_pb2.SubmitRequest(
                requests=[transfer_pb2.TransferRequest(op=transfer_pb2.WRITE,
                                                       local_segment=src.id, peer=peer,
                                                       remote_segment=dst.id, length=8)]),
                timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, peer


def test_the_peers_certificate_must_carry_the_name(make_daemon, names, certs):
    hosts, _, wrap = names
    peer_ca = os.path.join(certs, "peer-ca.pem")
    b = make_daemon("--peer-anonymous=false", "--tls-cert", os.path.join(certs, "peer-b.pem"),
                    "--tls-key", os.path.join(certs, "peer-b.key"), "--peer-ca", peer_ca,
                    host="127.0.0.2")
    # its certificate names localhost, 127.0.0.1 and ::1; here both names lead to it
    hosts.write_text("127.0.0.2 localhost\n127.0.0.2 node-b.test\n")
    a = make_daemon("--peer-anonymous=false", "--peer-ca", peer_ca,
                    "--peer-cert", os.path.join(certs, "peer-a.pem"),
                    "--peer-key", os.path.join(certs, "peer-a.key"), wrap=wrap)
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    batch = write(a, "localhost:%d" % b.tls_port, dst.id, src.id)
    assert batch.state == transfer_pb2.DONE, batch
    batch = write(a, "node-b.test:%d" % b.tls_port, dst.id, src.id)
    assert batch.state == transfer_pb2.FAILED
    assert "certificate verify failed (hostname mismatch)" in batch.requests[0].message, \
        batch.requests[0].message
    # a Send: this daemon refused the peer's certificate; the peer refused nothing
    with mg.Client("unix:" + a.sock) as ca, pytest.raises(mg.Error) as e:
        ca.send("t", b"x", peer="node-b.test:%d" % b.tls_port)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value.message
    assert "certificate verify failed (hostname mismatch)" in e.value.message and \
        "refused it" not in e.value.message, e.value.message
