"""Who may call, and whose resources they reach.

The daemons here run without --allow-anonymous, with an --auth-file that maps bearer tokens,
client certificates (from --client-ca) and Unix-socket user ids to tenants. Every check is made
with a real client against the real daemon: a caller without credentials, with an unknown
token or with a certificate from another CA gets UNAUTHENTICATED; a known certificate without
a tenant gets PERMISSION_DENIED; one tenant's segments, leases, batches and notification topics
do not exist for another (NOT_FOUND, never a hint); an admin lists and revokes everything;
across daemons a transfer carries its tenant and the peer serves only that tenant's targets.
The auth file and the TLS certificate are re-read when they change."""
import hashlib
import mmap
import os
import shutil
import socket
import ssl
import subprocess
import time

import grpc
import pytest

from conftest import Daemon, free_port, h2c_channel, tls_channel, unix_channel
from mgstd import health_pb2, health_pb2_grpc
from moongate.v1 import (memory_pb2, memory_pb2_grpc, notify_pb2, notify_pb2_grpc, peer_pb2,
                         peer_pb2_grpc, pool_pb2, pool_pb2_grpc, transfer_pb2,
                         transfer_pb2_grpc)

MiB = 1 << 20
TOKENS = {"team-a": "tok-a-0123456789", "team-b": "tok-b-0123456789", "ops": "tok-ops-012345",
          "team-c": "tok-c-0123456789"}


def sha(tok):
    return "sha256:" + hashlib.sha256(tok.encode()).hexdigest()


def auth_text(extra=""):
    return ("# moongate principals\n"
            "token %s team-a\n"
            "token %s team-b user\n"
            "token %s ops admin\n"
            "token %s team-c\n"
            "cert  dev-client team-a\n"
            "uid   %d team-u\n%s") % (sha(TOKENS["team-a"]), sha(TOKENS["team-b"]),
                                      sha(TOKENS["ops"]), sha(TOKENS["team-c"]), os.getuid(), extra)


def write_atomic(path, text):
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def start(certs, workdir, *extra):
    auth = os.path.join(workdir, "auth-%d" % free_port())
    write_atomic(auth, auth_text())
    d = Daemon(certs, workdir, ("--allow-anonymous=false", "--auth-file", auth,
                                "--client-ca", os.path.join(certs, "ca.pem"),
                                "--pool-bytes", "16M", "--reload-interval", "1") + extra).start()
    d.auth = auth
    return d


@pytest.fixture(scope="module")
def d(certs, tmp_path_factory):
    dm = start(certs, str(tmp_path_factory.mktemp("auth")))
    yield dm
    assert dm.stop() == 0, dm.read_log()


class As:
    """Stubs that call as a tenant: with its bearer token over h2c."""

    def __init__(self, d, tenant=None, token=None, channel=None):
        self.ch = channel or h2c_channel(d)
        tok = token if token is not None else (TOKENS[tenant] if tenant else None)
        self.md = [("authorization", "Bearer " + tok)] if tok else []
        self.mem = memory_pb2_grpc.MemoryStub(self.ch)
        self.pool = pool_pb2_grpc.PoolStub(self.ch)
        self.xfer = transfer_pb2_grpc.TransferStub(self.ch)
        self.notify = notify_pb2_grpc.NotifyStub(self.ch)

    def call(self, stub, method, request, **kw):
        """A unary call, e.g. call("mem", "GetSegment", request), with the credentials."""
        return getattr(getattr(self, stub), method)(request, metadata=self.md, timeout=10, **kw)

    def code(self, stub, method, request):
        """The status code of a unary call (OK when it succeeds) and its message."""
        try:
            self.call(stub, method, request)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details()

    def close(self):
        self.ch.close()


def register(c, name, size=MiB, remote=False):
    return c.call("mem", "RegisterSegment", memory_pb2.RegisterRequest(
        name=name, size=size, remote_accessible=remote)).segment


# ---- authentication ----

def test_no_credentials_is_unauthenticated_and_health_stays_open(d):
    c = As(d)
    code, msg = c.code("mem", "ListSegments", memory_pb2.ListSegmentsRequest())
    assert code == grpc.StatusCode.UNAUTHENTICATED and "no credentials" in msg, msg
    # health checks need no credentials: probes call them
    with h2c_channel(d) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    c.close()
    assert d.metric("moongate_auth_refused_total", reason="unauthenticated") >= 1


@pytest.mark.parametrize("header", ["Bearer not-a-known-token", "Basic dXNlcjpwYXNz",
                                    "Bearer"])
def test_unknown_or_malformed_tokens_are_unauthenticated(d, certs, header):
    with h2c_channel(d) as ch:
        with pytest.raises(grpc.RpcError) as e:
            memory_pb2_grpc.MemoryStub(ch).ListSegments(
                memory_pb2.ListSegmentsRequest(), metadata=[("authorization", header)],
                timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value.details()
    assert "token" in e.value.details() or "authorization" in e.value.details()
    # wrong credentials never fall back to anonymous, nor leak the token into the log
    assert "not-a-known-token" not in d.read_log()


def test_curl_with_a_bearer_token_acts_for_its_tenant(d):
    from conftest import curl
    auth = ("-H", "authorization: Bearer " + TOKENS["team-b"])
    rc, out, err = curl("--http2-prior-knowledge", *auth, "-H", "content-type: application/json",
                        "-d", '{"name": "from-curl", "size": 4096}',
                        "http://%s/moongate.v1.Memory/RegisterSegment" % d.h2c)
    assert rc == 0 and b'"tenant":"team-b"' in out.replace(b" ", b""), (out, err)
    rc, out, err = curl("--http2-prior-knowledge", *auth, "http://%s/v1/segments" % d.h2c)
    assert rc == 0 and b"from-curl" in out, (out, err)
    rc, out, err = curl("--http2-prior-knowledge", "-i", "http://%s/v1/segments" % d.h2c)
    assert out.startswith(b"HTTP/2 401") and b'"code":16' in out, out
    seg = [s for s in As(d, "team-b").call("mem", "ListSegments",
                                           memory_pb2.ListSegmentsRequest()).segments
           if s.name == "from-curl"][0]
    As(d, "team-b").call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=seg.id))


def test_client_certificate_maps_to_its_tenant(d):
    c = As(d, channel=tls_channel(d, cert="client"))
    seg = register(c, "by-cert")
    assert seg.tenant == "team-a"
    # the same tenant reaches it with its token
    a = As(d, "team-a")
    assert a.call("mem", "GetSegment", memory_pb2.GetSegmentRequest(id=seg.id)).id == seg.id
    a.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=seg.id))
    a.close()
    c.close()


def test_certificate_without_a_tenant_is_permission_denied(d):
    c = As(d, channel=tls_channel(d, cert="client-b"))  # chains to --client-ca, not listed
    code, msg = c.code("mem", "ListSegments", memory_pb2.ListSegmentsRequest())
    assert code == grpc.StatusCode.PERMISSION_DENIED and "dev-client-b" in msg, msg
    c.close()


def test_certificate_from_another_ca_is_unauthenticated(d):
    c = As(d, channel=tls_channel(d, cert="peer-a"))  # a peer certificate: --peer-ca's
    code, msg = c.code("mem", "ListSegments", memory_pb2.ListSegmentsRequest())
    assert code == grpc.StatusCode.UNAUTHENTICATED and "--client-ca" in msg, msg
    c.close()


def test_client_certificates_never_open_the_peer_api(certs, tmp_path):
    dm = start(certs, str(tmp_path), "--peer-anonymous=false", "--peer-ca",
               os.path.join(certs, "peer-ca.pem"))
    try:
        with tls_channel(dm, cert="client") as ch:
            with pytest.raises(grpc.RpcError) as e:
                peer_pb2_grpc.PeerStub(ch).OpenSession(peer_pb2.OpenSessionRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value.details()
        # nor does a client's bearer token
        with h2c_channel(dm) as ch:
            with pytest.raises(grpc.RpcError) as e:
                peer_pb2_grpc.PeerStub(ch).OpenSession(
                    peer_pb2.OpenSessionRequest(),
                    metadata=[("authorization", "Bearer " + TOKENS["ops"])], timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        assert dm.stop() == 0, dm.read_log()


def test_unix_socket_user_id_maps_to_its_tenant(d):
    c = As(d, channel=unix_channel(d))
    seg = register(c, "by-uid")
    assert seg.tenant == "team-u"
    c.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=seg.id))
    c.close()


# ---- authorization: one tenant's resources do not exist for another ----

OTHER_UID = 4242  # a second local user, for the file-ownership checks


def as_other_uid_json(d, method, body):
    """A JSON call on the Unix socket from a process of OTHER_UID (curl under setpriv):
    returns the parsed answer."""
    import json
    p = subprocess.run(["setpriv", "--reuid=%d" % OTHER_UID, "--regid=%d" % OTHER_UID,
                        "--clear-groups", "curl", "-sS", "--max-time", "20",
                        "--http2-prior-knowledge", "--unix-socket", d.sock, "-H",
                        "content-type: application/json", "-d", json.dumps(body),
                        "http://localhost/moongate.v1.Memory/" + method],
                       capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.skipif(os.getuid() != 0, reason="acting as a second uid needs root")
def test_one_tenants_file_is_never_another_tenants_segment(certs, tmp_path):
    """Tenant team-u (this process's uid, on the Unix socket) registers its 0600 file by name.
    No other tenant reaches those bytes by naming the file, however it is named: token and
    certificate callers may not register files by name at all (over TLS or on the socket),
    another uid is not the file's owner, a symbolic or hard link is refused, and once the file
    is given to the other uid, or renamed, the inode is still team-u's segment."""
    import tempfile
    auth = str(tmp_path / "auth")
    write_atomic(auth, auth_text("uid %d team-x\n" % OTHER_UID))
    work = tempfile.mkdtemp(prefix="mg-uid-")  # the other uid reaches the socket here
    os.chmod(work, 0o755)
    d = Daemon(certs, work, ("--allow-anonymous=false", "--auth-file", auth,
                             "--client-ca", os.path.join(certs, "ca.pem"),
                             "--unix-socket-mode", "0666")).start()
    path = os.path.join(d.shm, "a.buf")
    secret = b"team-u's bytes " * 100
    with open(path, "wb") as f:
        f.write(secret)
    os.chmod(path, 0o600)
    owner = As(d, channel=unix_channel(d))
    seg = owner.call("mem", "RegisterSegment", memory_pb2.RegisterRequest(
        name="mine", source=memory_pb2.SHM, shm_file="a.buf")).segment
    assert seg.tenant == "team-u"
    shm = dict(source=memory_pb2.SHM, shm_file="a.buf")
    # token callers over TLS and on the socket, and a certificate caller: never by name
    for c in (As(d, "team-a", channel=tls_channel(d)), As(d, "team-a", channel=unix_channel(d)),
              As(d, channel=tls_channel(d, cert="client"))):
        code, msg = c.code("mem", "RegisterSegment", memory_pb2.RegisterRequest(name="b", **shm))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "only for its owner" in msg, msg
        c.close()
    # another uid (tenant team-x): not the owner of the file ...
    r = as_other_uid_json(d, "RegisterSegment", {"name": "x", "source": "SHM",
                                                 "shmFile": "a.buf"})
    assert r["code"] == 7 and "belongs to uid %d" % os.getuid() in r["message"], r
    # ... nor by a path that climbs out of the shm directory and back in ...
    r = as_other_uid_json(d, "RegisterSegment", {
        "name": "x", "source": "SHM", "shmFile": "../%s/a.buf" % os.path.basename(d.shm)})
    assert r["code"] == 3 and "shm file must be a file name" in r["message"], r
    # ... nor through a symbolic link or a hard link to it ...
    os.symlink("a.buf", os.path.join(d.shm, "x.link"))
    os.link(path, os.path.join(d.shm, "x.hard"))
    for name, why in (("x.link", "symbolic link"), ("x.hard", "2 hard links")):
        os.lchown(os.path.join(d.shm, name), OTHER_UID, OTHER_UID)
        r = as_other_uid_json(d, "RegisterSegment", {"name": "x", "source": "SHM",
                                                     "shmFile": name})
        assert r["code"] == 7 and why in r["message"], r
    os.unlink(os.path.join(d.shm, "x.hard"))
    # ... nor once the file is given to it, by the same name or another (the same inode)
    os.chown(path, OTHER_UID, OTHER_UID)
    for name in ("a.buf", "b.buf"):
        if name == "b.buf":
            os.rename(path, os.path.join(d.shm, name))
        r = as_other_uid_json(d, "RegisterSegment", {"name": "x", "source": "SHM",
                                                     "shmFile": name})
        assert r["code"] == 7 and "another tenant's segment" in r["message"], r
    assert as_other_uid_json(d, "ListSegments", {}).get("segments", []) == []
    got = b"".join(c.data for c in owner.mem.ReadSegment(
        memory_pb2.ReadSegmentRequest(id=seg.id, length=len(secret)), timeout=10))
    assert got == secret  # nobody wrote into it
    owner.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=seg.id))
    # team-u's segment is gone: the file's owner now registers it
    r = as_other_uid_json(d, "RegisterSegment", {"name": "x", "source": "SHM",
                                                 "shmFile": "b.buf"})
    assert r["segment"]["tenant"] == "team-x", r
    owner.close()
    assert d.stop() == 0
    shutil.rmtree(work)


def test_cross_tenant_access_fails_closed(d):
    a, b = As(d, "team-a"), As(d, "team-b")
    seg = register(a, "a-secret", remote=True)
    with open(seg.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
        v[:6] = b"secret"
    lease = a.call("pool", "AcquireLease", pool_pb2.AcquireLeaseRequest(size=4096))
    bseg = register(b, "b-own")
    batch = a.call("xfer", "Submit", transfer_pb2.SubmitRequest(requests=[
        transfer_pb2.TransferRequest(op=transfer_pb2.WRITE, local_segment=seg.id, peer="",
                                     remote_segment=seg.id, remote_offset=4096, length=6)],
        wait=True))
    assert batch.batch.state == transfer_pb2.DONE, batch
    NF = grpc.StatusCode.NOT_FOUND
    tried = {
        "GetSegment": b.code("mem", "GetSegment", memory_pb2.GetSegmentRequest(id=seg.id)),
        "UnregisterSegment": b.code("mem", "UnregisterSegment",
                                    memory_pb2.UnregisterRequest(id=seg.id)),
        "GetLease": b.code("pool", "GetLease", pool_pb2.GetLeaseRequest(id=lease.id)),
        "RenewLease": b.code("pool", "RenewLease", pool_pb2.RenewLeaseRequest(id=lease.id)),
        "ReleaseLease": b.code("pool", "ReleaseLease", pool_pb2.ReleaseLeaseRequest(id=lease.id)),
        "GetBatch": b.code("xfer", "GetBatch", transfer_pb2.GetBatchRequest(id=batch.batch_id)),
        "Cancel": b.code("xfer", "Cancel", transfer_pb2.GetBatchRequest(id=batch.batch_id)),
    }
    for what, (code, msg) in tried.items():
        assert code == NF, (what, code, msg)
        assert "team-a" not in msg, (what, msg)  # nothing about the owner leaks
    # forged ids look the same as another tenant's
    assert b.code("mem", "GetSegment", memory_pb2.GetSegmentRequest(id=seg.id ^ 1))[0] == NF
    assert b.code("pool", "GetLease", pool_pb2.GetLeaseRequest(id=lease.id + 1))[0] == NF
    # bytes: reading or writing another tenant's segment or lease
    with pytest.raises(grpc.RpcError) as e:
        list(b.mem.ReadSegment(memory_pb2.ReadSegmentRequest(id=seg.id), metadata=b.md,
                               timeout=10))
    assert e.value.code() == NF
    with pytest.raises(grpc.RpcError) as e:
        list(b.mem.ReadSegment(memory_pb2.ReadSegmentRequest(lease_id=lease.id), metadata=b.md,
                               timeout=10))
    assert e.value.code() == NF
    with pytest.raises(grpc.RpcError) as e:
        b.mem.WriteSegment(iter([memory_pb2.WriteSegmentRequest(id=seg.id, data=b"evil")]),
                           metadata=b.md, timeout=10)
    assert e.value.code() == NF
    # transfers: another tenant's segment or lease as local memory or as this daemon's target
    for t in (transfer_pb2.TransferRequest(op=transfer_pb2.READ, local_segment=bseg.id, peer="",
                                           remote_segment=seg.id, length=6),
              transfer_pb2.TransferRequest(op=transfer_pb2.WRITE, local_segment=seg.id, peer="",
                                           remote_segment=bseg.id, length=6),
              transfer_pb2.TransferRequest(op=transfer_pb2.READ, local_lease=lease.id, peer="",
                                           remote_segment=bseg.id, length=6),
              transfer_pb2.TransferRequest(op=transfer_pb2.WRITE, local_segment=bseg.id, peer="",
                                           remote_lease=lease.id, length=6)):
        code, msg = b.code("xfer", "Submit", transfer_pb2.SubmitRequest(requests=[t], wait=True))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "no such" in msg, (t, code, msg)
    # lists show each tenant its own
    ids_b = [s.id for s in b.call("mem", "ListSegments", memory_pb2.ListSegmentsRequest()).segments]
    assert seg.id not in ids_b and bseg.id in ids_b
    assert lease.id not in [x.id for x in b.call("pool", "ListLeases",
                                                 pool_pb2.ListLeasesRequest()).leases]
    # and nothing was touched: the owner still has everything, bytes intact
    with open(seg.path, "rb") as f:
        data = f.read(4096 + 6)
    assert data[:6] == b"secret" and data[4096:] == b"secret"
    assert a.call("pool", "GetLease", pool_pb2.GetLeaseRequest(id=lease.id)).id == lease.id
    assert a.call("xfer", "GetBatch", transfer_pb2.GetBatchRequest(id=batch.batch_id)).id
    a.call("pool", "ReleaseLease", pool_pb2.ReleaseLeaseRequest(id=lease.id))
    a.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=seg.id))
    b.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=bseg.id))
    a.close()
    b.close()


def test_same_names_and_request_ids_are_per_tenant(d):
    a, b = As(d, "team-a"), As(d, "team-b")
    sa = register(a, "shared-name")
    sb = register(b, "shared-name")  # no clash: names are unique per tenant
    assert sa.id != sb.id and sa.tenant == "team-a" and sb.tenant == "team-b"
    la = a.call("pool", "AcquireLease", pool_pb2.AcquireLeaseRequest(size=4096, request_id="r1"))
    lb = b.call("pool", "AcquireLease", pool_pb2.AcquireLeaseRequest(size=4096, request_id="r1"))
    assert la.id != lb.id  # a retry id of one tenant never answers another's lease
    for c, s, l in ((a, sa, la), (b, sb, lb)):
        c.call("pool", "ReleaseLease", pool_pb2.ReleaseLeaseRequest(id=l.id))
        c.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=s.id))
    a.close()
    b.close()


def test_admin_lists_and_revokes_every_tenant(d):
    a, b, ops = As(d, "team-a"), As(d, "team-b"), As(d, "ops")
    sa, sb = register(a, "adm-a"), register(b, "adm-b")
    la = a.call("pool", "AcquireLease", pool_pb2.AcquireLeaseRequest(size=4096))
    seen = {s.id: s.tenant for s in ops.call("mem", "ListSegments",
                                             memory_pb2.ListSegmentsRequest()).segments}
    assert seen.get(sa.id) == "team-a" and seen.get(sb.id) == "team-b"
    leases = {x.id: x.tenant for x in ops.call("pool", "ListLeases",
                                               pool_pb2.ListLeasesRequest()).leases}
    assert leases.get(la.id) == "team-a"
    assert ops.call("mem", "GetSegment", memory_pb2.GetSegmentRequest(id=sa.id)).tenant == "team-a"
    ops.call("pool", "ReleaseLease", pool_pb2.ReleaseLeaseRequest(id=la.id))
    ops.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=sa.id))
    assert a.code("pool", "GetLease", pool_pb2.GetLeaseRequest(id=la.id))[0] == \
        grpc.StatusCode.NOT_FOUND
    assert a.code("mem", "GetSegment", memory_pb2.GetSegmentRequest(id=sa.id))[0] == \
        grpc.StatusCode.NOT_FOUND
    assert "event=lease_revoked" in d.read_log()
    # a user is no admin: team-b still sees only its own
    assert [s.id for s in b.call("mem", "ListSegments",
                                 memory_pb2.ListSegmentsRequest()).segments] == [sb.id]
    b.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=sb.id))
    for c in (a, b, ops):
        c.close()


def test_notification_topics_are_per_tenant(certs, tmp_path):
    """Across two daemons: team-a's batch on A writes into team-a's segment on B, its
    notification lands in team-a's topic on B (team-b polling the same topic name gets
    nothing), and a WRITE into team-b's segment on B fails closed."""
    wd = str(tmp_path)
    pem = lambda n: os.path.join(certs, n)  # noqa: E731
    b = start(certs, wd, "--peer-anonymous=false", "--peer-ca", pem("peer-ca.pem"),
              "--tls-cert", pem("peer-b.pem"), "--tls-key", pem("peer-b.key"))
    a = start(certs, wd, "--peer-ca", pem("peer-ca.pem"), "--peer-cert", pem("peer-a.pem"),
              "--peer-key", pem("peer-a.key"))
    peer = "127.0.0.1:%d" % b.tls_port  # mutual TLS between the daemons
    try:
        on_a, on_b_a, on_b_b = As(a, "team-a"), As(b, "team-a"), As(b, "team-b")
        src = register(on_a, "src", MiB)
        with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
            v[:5] = b"hello"
        dst = register(on_b_a, "dst", MiB, remote=True)
        other = register(on_b_b, "not-yours", MiB, remote=True)
        r = on_a.call("xfer", "Submit", transfer_pb2.SubmitRequest(
            requests=[transfer_pb2.TransferRequest(op=transfer_pb2.WRITE, local_segment=src.id,
                                                   peer=peer, remote_segment=dst.id, length=5)],
            notify=[transfer_pb2.NotifyPeer(peer=peer, topic="kv", payload=b"ready")],
            wait=True))
        assert r.batch.state == transfer_pb2.DONE, r.batch
        with open(dst.path, "rb") as f:
            assert f.read(5) == b"hello"
        got_b = on_b_b.call("notify", "Poll", notify_pb2.PollRequest(topic="kv"))
        assert list(got_b.notifications) == []
        got_a = on_b_a.call("notify", "Poll", notify_pb2.PollRequest(topic="kv"))
        assert [n.payload for n in got_a.notifications] == [b"ready"]
        for t in (transfer_pb2.TransferRequest(op=transfer_pb2.WRITE, local_segment=src.id,
                                               peer=peer, remote_segment=other.id, length=5),
                  transfer_pb2.TransferRequest(op=transfer_pb2.READ, local_segment=src.id,
                                               peer=peer, remote_segment=other.id, length=5)):
            # the peer answers as for an id it never had: the batch is refused whole
            code, msg = on_a.code("xfer", "Submit", transfer_pb2.SubmitRequest(requests=[t],
                                                                               wait=True))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, msg)
            assert "has no segment %d; nothing was moved" % other.id in msg, msg
        with open(other.path, "rb") as f:
            assert f.read(5) == b"\0" * 5  # untouched
        assert "tenant=team-a" in b.read_log()  # the session was opened for team-a
        for c in (on_a, on_b_a, on_b_b):
            c.close()
    finally:
        for x in (a, b):
            assert x.stop() == 0, x.read_log()


def test_a_segment_shared_with_another_tenant(certs, tmp_path):
    """team-a shares a segment with team-b: team-b reads and writes its bytes, here and from
    another daemon's transfer; it cannot get, list or unregister it; team-c reaches nothing."""
    wd = str(tmp_path)
    pem = lambda n: os.path.join(certs, n)  # noqa: E731
    b = start(certs, wd, "--peer-anonymous=false", "--peer-ca", pem("peer-ca.pem"),
              "--tls-cert", pem("peer-b.pem"), "--tls-key", pem("peer-b.key"))
    a = start(certs, wd, "--peer-ca", pem("peer-ca.pem"), "--peer-cert", pem("peer-a.pem"),
              "--peer-key", pem("peer-a.key"))
    peer = "127.0.0.1:%d" % b.tls_port
    try:
        owner, sharee, other = As(b, "team-a"), As(b, "team-b"), As(b, "team-c")
        seg = owner.call("mem", "RegisterSegment", memory_pb2.RegisterRequest(
            name="kv", size=MiB, remote_accessible=True, share_with=["team-b"])).segment
        assert list(seg.shared_with) == ["team-b"]
        for bad, why in ((["team-a"], "owns the segment"), (["x", "y", "z", "w", "v"], "at most"),
                         (["a b"], "share"), ([""], "share_with[0]")):
            code, msg = owner.code("mem", "RegisterSegment", memory_pb2.RegisterRequest(
                name="bad", size=4096, share_with=bad))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and why in msg, (bad, msg)
        # the sharee writes and reads its bytes inline
        w = sharee.mem.WriteSegment(iter([memory_pb2.WriteSegmentRequest(id=seg.id, data=b"hi")]),
                                    metadata=sharee.md, timeout=10)
        assert w.bytes_written == 2
        got = b"".join(c.data for c in sharee.mem.ReadSegment(
            memory_pb2.ReadSegmentRequest(id=seg.id, length=2), metadata=sharee.md, timeout=10))
        assert got == b"hi"
        # but does not own it
        for method, req_ in (("GetSegment", memory_pb2.GetSegmentRequest(id=seg.id)),
                             ("UnregisterSegment", memory_pb2.UnregisterRequest(id=seg.id))):
            assert sharee.code("mem", method, req_)[0] == grpc.StatusCode.NOT_FOUND
        assert seg.id not in [x.id for x in sharee.call(
            "mem", "ListSegments", memory_pb2.ListSegmentsRequest()).segments]
        # a transfer of team-b on daemon A writes into it over mutual TLS
        on_a = As(a, "team-b")
        src = register(on_a, "src", MiB)
        with open(src.path, "r+b") as f, mmap.mmap(f.fileno(), 0) as v:
            v[100:105] = b"hello"
        r = on_a.call("xfer", "Submit", transfer_pb2.SubmitRequest(requests=[
            transfer_pb2.TransferRequest(op=transfer_pb2.WRITE, local_segment=src.id,
                                         local_offset=100, peer=peer, remote_segment=seg.id,
                                         remote_offset=100, length=5)], wait=True))
        assert r.batch.state == transfer_pb2.DONE, r.batch
        with open(seg.path, "rb") as f:
            data = f.read(105)
        assert data[:2] == b"hi" and data[100:105] == b"hello"
        # team-c, here and from A, reaches nothing
        with pytest.raises(grpc.RpcError) as e:
            list(other.mem.ReadSegment(memory_pb2.ReadSegmentRequest(id=seg.id, length=2),
                                       metadata=other.md, timeout=10))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        c_on_a = As(a, "team-c")
        src_c = register(c_on_a, "src", MiB)
        code, msg = c_on_a.code("xfer", "Submit", transfer_pb2.SubmitRequest(requests=[
            transfer_pb2.TransferRequest(op=transfer_pb2.READ, local_segment=src_c.id,
                                         peer=peer, remote_segment=seg.id, length=5)],
            wait=True))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "has no segment" in msg, msg
        for c in (owner, sharee, other, on_a, c_on_a):
            c.close()
    finally:
        for x in (a, b):
            assert x.stop() == 0, x.read_log()


# ---- reloading ----

def test_auth_file_is_reloaded_and_a_bad_one_is_kept_out(d):
    newtok = "tok-new-0123456789"
    write_atomic(d.auth, auth_text("token %s team-new\n" % sha(newtok)))
    deadline = time.monotonic() + 15
    c = As(d, token=newtok)
    while c.code("mem", "ListSegments", memory_pb2.ListSegmentsRequest())[0] != grpc.StatusCode.OK:
        assert time.monotonic() < deadline, d.read_log()[-3000:]
        time.sleep(0.2)
    before = d.metric("moongate_reload_errors_total", file="auth")
    write_atomic(d.auth, "token sha256:nothex team-x\n")  # broken: the table stays
    deadline = time.monotonic() + 15
    while d.metric("moongate_reload_errors_total", file="auth") == before:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert c.code("mem", "ListSegments", memory_pb2.ListSegmentsRequest())[0] == grpc.StatusCode.OK
    assert "event=auth_reload_failed" in d.read_log() and "line 1" in d.read_log()
    write_atomic(d.auth, auth_text())  # the new token is gone again
    deadline = time.monotonic() + 15
    while c.code("mem", "ListSegments", memory_pb2.ListSegmentsRequest())[0] == grpc.StatusCode.OK:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert c.code("mem", "ListSegments", memory_pb2.ListSegmentsRequest())[0] == \
        grpc.StatusCode.UNAUTHENTICATED
    c.close()


@pytest.mark.parametrize("text,why", [
    ("token abc team-a\n", "line 1: a token is given as sha256"),
    ("# ok\ncert x team a b\n", "line 2: unexpected"),
    ("uid 12x t\n", "line 1: uid"),
    ("cert x bad/tenant\n", "line 1: tenant"),
    ("token %s t1\ntoken %s t2\n" % (sha("x"), sha("x")), "line 2: the same credential"),
])
def test_bad_auth_file_stops_start_up_naming_the_line(certs, tmp_path, text, why):
    auth = str(tmp_path / "auth")
    with open(auth, "w") as f:
        f.write(text)
    dm = Daemon(certs, str(tmp_path), ("--auth-file", auth))
    with pytest.raises(RuntimeError) as e:
        dm.start(attempts=1)
    assert why in str(e.value), str(e.value)


def server_cert(port):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            der = t.getpeercert(binary_form=True)
    return hashlib.sha256(der).hexdigest()


def test_tls_certificate_is_reloaded_when_its_files_change(certs, tmp_path):
    """Kubernetes swaps a Secret's files through a symlink: the daemon serves the new
    certificate to new connections without a restart; a broken pair keeps the old one."""
    wd = str(tmp_path)
    live = os.path.join(wd, "live")
    os.makedirs(os.path.join(wd, "v1"))
    for f in ("server.pem", "server.key"):
        shutil.copy(os.path.join(certs, f), os.path.join(wd, "v1", f))
    os.symlink("v1", live)
    dm = start(certs, wd, "--tls-cert", os.path.join(live, "server.pem"),
               "--tls-key", os.path.join(live, "server.key"))
    try:
        first = server_cert(dm.tls_port)
        # a new key and certificate for the same names, from the same CA
        v2 = os.path.join(wd, "v2")
        os.makedirs(v2)
        subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=localhost",
                        "-keyout", os.path.join(v2, "server.key"),
                        "-out", os.path.join(v2, "server.csr")], check=True,
                       capture_output=True)
        ext = os.path.join(v2, "ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
        subprocess.run(["openssl", "x509", "-req", "-in", os.path.join(v2, "server.csr"),
                        "-CA", os.path.join(certs, "ca.pem"), "-CAkey",
                        os.path.join(certs, "ca.key"), "-CAcreateserial", "-days", "2",
                        "-extfile", ext, "-out", os.path.join(v2, "server.pem")], check=True,
                       capture_output=True)
        os.symlink("v2", os.path.join(wd, "live.tmp"))
        os.replace(os.path.join(wd, "live.tmp"), live)
        deadline = time.monotonic() + 15
        while server_cert(dm.tls_port) == first:
            assert time.monotonic() < deadline, dm.read_log()[-2000:]
            time.sleep(0.2)
        assert "event=tls_reloaded" in dm.read_log()
        # the new certificate serves real calls
        with tls_channel(dm, cert="client") as ch:
            memory_pb2_grpc.MemoryStub(ch).ListSegments(memory_pb2.ListSegmentsRequest(),
                                                        timeout=10)
        # a key that does not match its certificate: logged, counted, the old pair stays
        second = server_cert(dm.tls_port)
        v3 = os.path.join(wd, "v3")
        os.makedirs(v3)
        shutil.copy(os.path.join(v2, "server.pem"), os.path.join(v3, "server.pem"))
        shutil.copy(os.path.join(certs, "client.key"), os.path.join(v3, "server.key"))
        os.symlink("v3", os.path.join(wd, "live.tmp"))
        os.replace(os.path.join(wd, "live.tmp"), live)
        deadline = time.monotonic() + 15
        while not dm.metric("moongate_reload_errors_total", file="tls"):
            assert time.monotonic() < deadline, dm.read_log()[-2000:]
            time.sleep(0.2)
        assert server_cert(dm.tls_port) == second
        assert "does not match" in dm.read_log()
    finally:
        assert dm.stop() == 0, dm.read_log()


# ---- quotas: per tenant, RESOURCE_EXHAUSTED naming the quota, other tenants unaffected ----

def exhausted(c, stub, method, request, flag):
    code, msg = c.code(stub, method, request)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and flag in msg, (code, msg)
    return msg


def test_registered_bytes_and_lease_quotas(certs, tmp_path):
    dm = start(certs, str(tmp_path), "--max-tenant-bytes", "2M", "--max-tenant-leases", "2")
    try:
        a, b = As(dm, "team-a"), As(dm, "team-b")
        s1, s2 = register(a, "q1", MiB), register(a, "q2", MiB)
        exhausted(a, "mem", "RegisterSegment", memory_pb2.RegisterRequest(name="q3", size=4096),
                  "--max-tenant-bytes")
        sb = register(b, "q1", MiB)  # another tenant's quota is its own
        a.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=s2.id))
        s3 = register(a, "q3", MiB)  # room again
        leases = [a.call("pool", "AcquireLease", pool_pb2.AcquireLeaseRequest(size=4096))
                  for _ in range(2)]
        # a blocking acquire does not wait on a quota: waiting would not help
        msg = exhausted(a, "pool", "AcquireLease",
                        pool_pb2.AcquireLeaseRequest(size=4096, block=True), "--max-tenant-leases")
        assert "team-a" in msg
        lb = b.call("pool", "AcquireLease", pool_pb2.AcquireLeaseRequest(size=4096))
        a.call("pool", "ReleaseLease", pool_pb2.ReleaseLeaseRequest(id=leases[0].id))
        l3 = a.call("pool", "AcquireLease", pool_pb2.AcquireLeaseRequest(size=4096))
        for c, ids in ((a, [leases[1].id, l3.id]), (b, [lb.id])):
            for i in ids:
                c.call("pool", "ReleaseLease", pool_pb2.ReleaseLeaseRequest(id=i))
        for c, s in ((a, s1), (a, s3), (b, sb)):
            c.call("mem", "UnregisterSegment", memory_pb2.UnregisterRequest(id=s.id))
        a.close()
        b.close()
    finally:
        assert dm.stop() == 0, dm.read_log()


def test_running_batch_quota(certs, tmp_path):
    wd = str(tmp_path)
    peer = start(certs, wd)
    dm = start(certs, wd, "--max-tenant-batches", "1", "--peer-tls=false")
    try:
        a, b = As(dm, "team-a"), As(dm, "team-b")
        sa, sb = register(a, "src", 4096), register(b, "src", 4096)

        def request(s):
            return transfer_pb2.SubmitRequest(requests=[transfer_pb2.TransferRequest(
                op=transfer_pb2.WRITE, local_segment=s.id, peer=peer.h2c, remote_segment=1,
                length=16)])

        def entered(c):
            """The Submit reached the daemon: its peer entry for this tenant exists."""
            deadline = time.monotonic() + 10
            while not c.call("xfer", "ListPeers", transfer_pb2.ListPeersRequest()).peers:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        peer.signal(19)  # SIGSTOP: the target check hangs, the batch stays in flight
        first = a.xfer.Submit.future(request(sa), metadata=a.md, timeout=30)
        entered(a)
        msg = exhausted(a, "xfer", "Submit", request(sa), "--max-tenant-batches")
        assert "team-a" in msg and "nothing was moved" in msg, msg
        other = b.xfer.Submit.future(request(sb), metadata=b.md, timeout=30)
        entered(b)  # another tenant's batch is not held back
        peer.signal(18)  # SIGCONT
        for f in (first, other):
            try:
                f.result()
            except grpc.RpcError as e:  # the peer has no segment 1: refused, not a quota
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
        a.close()
        b.close()
    finally:
        peer.signal(18)
        assert dm.stop() == 0, dm.read_log()
        assert peer.stop() == 0, peer.read_log()


def test_request_rate_quota(certs, tmp_path):
    dm = start(certs, str(tmp_path), "--tenant-rate", "5")
    try:
        a, b = As(dm, "team-a"), As(dm, "team-b")
        codes = [a.code("mem", "ListSegments", memory_pb2.ListSegmentsRequest()) for _ in range(30)]
        refused = [m for c, m in codes if c == grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert refused and "--tenant-rate" in refused[0] and "team-a" in refused[0], codes
        assert len(refused) < 30  # the first second's worth went through
        assert b.code("mem", "ListSegments", memory_pb2.ListSegmentsRequest())[0] == \
            grpc.StatusCode.OK
        assert dm.metric("moongate_rate_refused_total") == len(refused)
        # health checks are not counted against anyone
        with h2c_channel(dm) as ch:
            for _ in range(20):
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        a.close()
        b.close()
    finally:
        assert dm.stop() == 0, dm.read_log()
