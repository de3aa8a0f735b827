"""Memory the client already has, registered by descriptor: a memfd or a tmpfs file passed on the
daemon's fd socket (SOCK_SEQPACKET, SCM_RIGHTS) from Python (socket.send_fds) and from C
(mg_fd_pass, client/example_register_fd.c), then registered by the one-time handle. Bytes the
client writes through its own mapping move to a peer daemon and back into the same mapping,
with no copy through the pool. Every bad input gets its gRPC code and reason, and the daemon
keeps serving: descriptors of a pipe, socket, directory, O_PATH or write-only file; a handle
used twice, by another process, after its ttl or over TCP; a range past the file; a file shrunk
after registration (DATA_LOSS); the socket's protocol errors and limits; an unsealed memfd for
a remote-accessible region of a daemon with RDMA devices."""
import ctypes
import fcntl
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest

import conftest
from conftest import BUILD, h2c_channel, register, req

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402
from mgstd import health_pb2, health_pb2_grpc  # noqa: E402
from moongate.v1 import memory_pb2, memory_pb2_grpc, transfer_pb2  # noqa: E402

MiB = 1 << 20
CLIENT_DIR = os.path.join(conftest.ROOT, "clients", "python")  # where moongate_client is
EMU = os.path.join(BUILD, "libmgverbs_emu.so")


def memfd(size, flags=0):
    fd = os.memfd_create("mgtest", flags)
    os.ftruncate(fd, size)
    return fd


def client(d, **kw):
    return mg.Client("unix:" + d.sock, **kw)


def read_segment(d, seg_id, length, offset=0):
    with h2c_channel(d) as ch:
        return b"".join(c.data for c in memory_pb2_grpc.MemoryStub(ch).ReadSegment(
            memory_pb2.ReadSegmentRequest(id=seg_id, offset=offset, length=length), timeout=20))


def serving(d):
    with h2c_channel(d) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                   timeout=10).status == 1


def raw_put(path, fds, text=b"PUT"):
    """One request on the fd socket with `fds` attached; the reply's text (or "" if closed)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(path)
        socket.send_fds(s, [text], fds)
        return s.recv(1024).decode()


def test_memfd_bytes_move_where_they_lie(make_daemon):
    a = make_daemon("--peer-tls=false", "--pool-bytes", "8M")
    b = make_daemon("--peer-tls=false")
    fd = memfd(MiB, os.MFD_ALLOW_SEALING)
    mine = mmap.mmap(fd, MiB)
    pattern = os.urandom(64 * 1024)
    mine[:len(pattern)] = pattern  # written through the client's own mapping
    dst = register(b, "dst", MiB, remote=True)
    leases_before = a.metric("moongate_pool_lease_events_total", pool="default", event="acquired")
    with client(a) as c:
        seg = c.register_fd("kv", fd)  # size 0: the whole file
        assert seg.source == memory_pb2.FD and seg.size == MiB and seg.path == ""
        # one batch each: the requests of a batch run in parallel
        c.transfer([req(transfer_pb2.WRITE, seg.id, b.h2c, dst.id, len(pattern))])
        c.transfer([req(transfer_pb2.READ, seg.id, b.h2c, dst.id, len(pattern),
                        local_offset=512 * 1024)])
        # the peer has the bytes, and the READ landed in the client's mapping, where it lies
        assert read_segment(b, dst.id, len(pattern)) == pattern
        assert mine[512 * 1024:512 * 1024 + len(pattern)] == pattern
        c.unregister(seg.id)
    # nothing went through the pool or an inline copy
    assert a.metric("moongate_pool_lease_events_total", pool="default",
                    event="acquired") == leases_before
    assert not a.metric("moongate_segment_inline_bytes_total", op="read")
    assert not a.metric("moongate_segment_inline_bytes_total", op="write")
    mine.close()
    os.close(fd)
    assert a.metric("moongate_fd_handles", state="held") == 0
    # claimed, not expired: once, or once more if the client took a channel state change for a
    # broken connection and replayed its table (the same daemon refuses it ALREADY_EXISTS)
    assert a.metric("moongate_fd_handles_total", event="claimed") >= 1
    assert not a.metric("moongate_fd_handles_total", event="expired")


def test_tmpfs_file_from_an_unaligned_offset(make_daemon):
    d = make_daemon()
    path = "/dev/shm/mgtest-fd-%d" % os.getpid()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, 3 * 4096)
        os.pwrite(fd, b"tmpfs bytes", 4096 + 7)
        with client(d) as c:
            seg = c.register_fd("tmp", fd, offset=4096 + 7, size=100)
            assert seg.offset == 4096 + 7 and seg.size == 100
            assert read_segment(d, seg.id, 11) == b"tmpfs bytes"
            # the daemon's writes are the file's bytes too
            c.memory.WriteSegment(iter([memory_pb2.WriteSegmentRequest(
                id=seg.id, offset=90, data=b"0123456789")]), timeout=10)
            assert os.pread(fd, 10, 4096 + 7 + 90) == b"0123456789"
            with pytest.raises(grpc.RpcError) as e:  # the range is the segment: not past it
                read_segment(d, seg.id, 10, offset=95)
            assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE
            c.unregister(seg.id)
    finally:
        os.close(fd)
        os.unlink(path)


def test_from_c(make_daemon):
    d = make_daemon()
    out = subprocess.run([os.path.join(BUILD, "example_register_fd"), "unix:" + d.sock],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    seg_id = int(out.stdout.split()[1])
    # the program exited; the daemon holds the memfd: its bytes are the segment's
    assert read_segment(d, seg_id, 12) == b"hello from C"


def test_bad_descriptors_are_refused_by_name(make_daemon, tmp_path):
    d = make_daemon()
    plain = tmp_path / "plain"
    plain.write_bytes(b"x" * 8192)
    r, w = os.pipe()
    s1, s2 = socket.socketpair()
    cases = [
        (r, "is a pipe"),
        (s1.fileno(), "is a socket"),
        (os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY), "is a directory"),
        (os.open(str(plain), os.O_PATH), "O_PATH"),
        (os.open(str(plain), os.O_WRONLY), "write-only"),
        (os.open(str(plain), os.O_RDONLY), "read-only"),
    ]
    with client(d) as c:
        for i, (fd, reason) in enumerate(cases):
            with pytest.raises(mg.Error) as e:
                c.register_fd("bad%d" % i, fd)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, (reason, e.value)
            assert reason in e.value.message
        fd = os.open(str(plain), os.O_RDWR)
        with pytest.raises(mg.Error) as e:
            c.register_fd("past", fd, offset=4096, size=4097)
        assert e.value.code == grpc.StatusCode.OUT_OF_RANGE
        assert "run past the end of the file (8192 bytes)" in e.value.message
        assert c.register_fd("ok", fd, offset=4096).size == 4096
    for f, _ in cases[2:]:
        os.close(f)
    for f in (r, w, fd):
        os.close(f)
    s1.close()
    s2.close()
    assert serving(d)
    assert d.metric("moongate_fd_handles", state="held") == 0  # every one taken and closed


def test_handles_go_once_to_the_process_that_passed_them(make_daemon):
    d = make_daemon()
    fd = memfd(MiB)
    with client(d) as c:
        handle, ttl = mg.pass_fd(c.fd_socket, fd)
        assert ttl == 10000
        req_ = memory_pb2.RegisterRequest(name="once", source=memory_pb2.FD, fd_handle=handle)
        # over TCP: not the process that passed it, as far as the daemon can tell
        with h2c_channel(d) as ch, pytest.raises(grpc.RpcError) as e:
            memory_pb2_grpc.MemoryStub(ch).RegisterSegment(req_, timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "came over the network" in e.value.details()
        c.memory.RegisterSegment(req_, timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            c.memory.RegisterSegment(req_, timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "was used already" in e.value.details()
        # another process passes a descriptor; this one may not use its handle
        code = ("import os, sys; sys.path.insert(0, %r); import moongate_client as mg; "
                "fd = os.memfd_create('x'); os.ftruncate(fd, 4096); "
                "print(mg.pass_fd(%r, fd)[0])") % (CLIENT_DIR, c.fd_socket)
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60, env=dict(os.environ))
        assert other.returncode == 0, other.stderr
        req_ = memory_pb2.RegisterRequest(name="theirs", source=memory_pb2.FD,
                                          fd_handle=int(other.stdout))
        with pytest.raises(grpc.RpcError) as e:
            c.memory.RegisterSegment(req_, timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "only that process may register it" in e.value.details()
        req_ = memory_pb2.RegisterRequest(name="none", source=memory_pb2.FD, fd_handle=12345)
        with pytest.raises(grpc.RpcError) as e:
            c.memory.RegisterSegment(req_, timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no fd handle 12345" in e.value.details()
    os.close(fd)


def test_handles_expire_and_their_descriptors_close(make_daemon):
    d = make_daemon("--fd-handle-ttl", "50")
    fd = memfd(4096)
    with client(d) as c:
        handle, ttl = mg.pass_fd(c.fd_socket, fd)
        assert ttl == 50
        deadline = time.monotonic() + 30  # the expiry tick closes it, however busy the machine
        while d.metric("moongate_fd_handles", state="held") != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert d.metric("moongate_fd_handles", state="held") == 0
        assert d.metric("moongate_fd_handles_total", event="expired") == 1
        with pytest.raises(grpc.RpcError) as e:
            c.memory.RegisterSegment(memory_pb2.RegisterRequest(
                name="late", source=memory_pb2.FD, fd_handle=handle), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "expired" in e.value.details() and "50 ms" in e.value.details()
    os.close(fd)


def test_the_fd_socket_protocol_and_limits(make_daemon):
    d = make_daemon("--max-unclaimed-fds", "2")
    path = d.sock + ".fd"
    fd = memfd(4096)
    assert raw_put(path, [fd], b"HELLO").startswith("ERR INVALID_ARGUMENT the request is")
    assert raw_put(path, []).startswith("ERR INVALID_ARGUMENT 0 descriptors")
    assert raw_put(path, [fd, fd]).startswith("ERR INVALID_ARGUMENT 2 descriptors")
    assert raw_put(path, [fd], b"PUT not-a-token").startswith("ERR UNAUTHENTICATED")
    # more descriptors than a request may bring: MSG_CTRUNC, a protocol error that ends it
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(path)
        socket.send_fds(s, [b"PUT"], [fd] * 12)
        assert s.recv(1024).decode().startswith(
            "ERR INVALID_ARGUMENT the descriptors did not fit (MSG_CTRUNC)")
        assert s.recv(1024) == b""  # closed
    # at most --max-unclaimed-fds descriptors per connection wait for a registration
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(path)
        for want in ("OK ", "OK ", "ERR RESOURCE_EXHAUSTED this connection passed 2"):
            socket.send_fds(s, [b"PUT"], [fd])
            assert s.recv(1024).decode().startswith(want)
    assert d.metric("moongate_fd_handles", state="held") == 2
    assert d.metric("moongate_fd_handles_total", event="refused") == 1
    os.close(fd)
    assert serving(d)


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def test_every_descriptor_of_a_broken_or_refused_message_is_closed(make_daemon):
    """1,000 descriptor-carrying messages of every broken shape — empty, longer than a request,
    more descriptors than fit, refused (bad text, two descriptors, a bad token), and served ones
    whose client closed at once — and the daemon's open descriptors come back to their count
    before them: nothing the kernel installed is kept."""
    d = make_daemon("--fd-handle-ttl", "50")
    path = d.sock + ".fd"
    fd = memfd(4096)
    assert serving(d)
    base = open_fds(d.proc.pid)
    n = 1000

    def each_alone(text, fds, read=True):
        """A message per connection; with read, the daemon's reply or close is waited for (so
        that connections do not pile up past the daemon's limit, where it closes new ones)."""
        sent = 0
        while sent < n:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                s.connect(path)
                try:
                    socket.send_fds(s, [text], fds)
                except (BrokenPipeError, ConnectionResetError):
                    time.sleep(0.05)  # at its connection limit the daemon closed this one
                    continue
                sent += 1
                if read:
                    s.settimeout(60)
                    try:
                        s.recv(1024)  # the reply, or the end of the connection
                    except ConnectionResetError:
                        pass  # closed with our message unread: as much an end

    def many_on_one(text, fds, read):
        """Up to 50 messages a connection; with read, each reply is read. Left unread, the
        replies pile up until the daemon closes the connection, and at its connection limit
        (the closing connections of the shapes before still count) it closes new ones at once:
        the rest go on a new connection."""
        sent = 0
        while sent < n:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                s.connect(path)
                for _ in range(min(50, n - sent)):
                    try:
                        socket.send_fds(s, [text], fds)
                        sent += 1
                        if read:
                            assert s.recv(1024).startswith(b"ERR INVALID_ARGUMENT")
                    except (BrokenPipeError, ConnectionResetError):
                        time.sleep(0.05)  # at its connection limit the daemon closed this one
                        break

    began = time.monotonic()
    each_alone(b"", [fd])                 # empty: no request, the end of the connection
    each_alone(b"PUT " + b"x" * 2000, [fd])  # longer than a request (MSG_TRUNC)
    each_alone(b"PUT", [fd] * 12)         # more than fit (MSG_CTRUNC)
    each_alone(b"PUT", [fd], read=False)  # served, then the client is gone (handles expire)
    many_on_one(b"HELLO", [fd], True)     # refused: not a request
    many_on_one(b"PUT", [fd, fd], True)   # refused: two descriptors
    many_on_one(b"HELLO", [fd], False)    # refused, replies never read
    each_alone(b"PUT not-a-token", [fd], read=False)  # refused: UNAUTHENTICATED, unread
    os.close(fd)
    deadline = time.monotonic() + 60
    while open_fds(d.proc.pid) > base and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_fds(d.proc.pid) <= base, "descriptors kept: %d over %d before" % (
        open_fds(d.proc.pid) - base, base)
    # every descriptor of the refused and broken messages was counted as it was closed
    assert d.metric("moongate_fd_handles_total", event="discarded") >= 5 * n
    assert d.metric("moongate_fd_handles", state="held") == 0
    assert serving(d)
    # thousands of broken messages, at most one log line a second about them
    said = d.read_log().count("event=fd_socket_protocol")
    assert 1 <= said <= time.monotonic() - began + 1, said


def test_without_an_fd_socket(make_daemon):
    d = make_daemon("--fd-socket", "")
    assert not os.path.exists(d.sock + ".fd")
    with client(d) as c:
        c.fd_socket = None
        with pytest.raises(grpc.RpcError) as e:
            c.memory.RegisterSegment(memory_pb2.RegisterRequest(
                name="x", source=memory_pb2.FD, fd_handle=1), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "--fd-socket" in e.value.details()


def test_a_file_shrunk_after_registration_is_data_loss(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    fd = memfd(MiB)
    dst = register(b, "dst", MiB, remote=True)
    with client(a) as c:
        seg = c.register_fd("shrinks", fd)
        os.ftruncate(fd, 0)  # the client takes the pages back
        with pytest.raises(grpc.RpcError) as e:
            read_segment(a, seg.id, 4096)
        assert e.value.code() == grpc.StatusCode.DATA_LOSS
        batch = c.transfer([req(transfer_pb2.WRITE, seg.id, b.h2c, dst.id, 64 * 1024)],
                           check=False)
        assert batch.state == transfer_pb2.FAILED
        assert batch.requests[0].code == grpc.StatusCode.DATA_LOSS.value[0], batch
        c.unregister(seg.id)
    os.close(fd)
    assert serving(a) and serving(b)


def test_rdma_regions_need_a_shrink_seal(make_daemon):
    d = make_daemon("--ibverbs-lib", EMU)
    with client(d) as c:
        fd = memfd(MiB, os.MFD_ALLOW_SEALING)
        with pytest.raises(mg.Error) as e:
            c.register_fd("unsealed", fd, remote_accessible=True)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "F_SEAL_SHRINK" in e.value.message
        assert c.register_fd("local-only", fd).transports == []  # no remote access: no seal
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        seg = c.register_fd("sealed", fd, remote_accessible=True)
        assert list(seg.transports) == ["tcp", "rdma"]
    os.close(fd)


# ---- buffers the client allocates, and local memory named by address ----

def test_buffers_move_by_address_into_the_clients_mapping(make_daemon):
    a = make_daemon("--peer-tls=false", "--pool-bytes", "8M")
    b = make_daemon("--peer-tls=false")
    dst = register(b, "dst", MiB, remote=True)
    pattern = os.urandom(64 * 1024)
    with client(a) as c:
        src, land = c.allocate_buffer(MiB), c.allocate_buffer(MiB)
        assert src.segment.client_address == src.address != 0
        assert src.segment.source == memory_pb2.FD and src.segment.size == MiB
        src.view[4096:4096 + len(pattern)] = pattern  # the client's own memory
        c.transfer([mg.write(address=src.address + 4096, peer=b.h2c, remote_segment=dst.id,
                             length=len(pattern))])
        assert read_segment(b, dst.id, len(pattern)) == pattern
        c.transfer([mg.read(address=land.address, offset=128 * 1024, peer=b.h2c,
                            remote_segment=dst.id, length=len(pattern))])
        assert bytes(land.view[128 * 1024:128 * 1024 + len(pattern)]) == pattern
        # many blocks by address: Blocks.local_address + local_offsets
        blocks = transfer_pb2.Blocks(op=transfer_pb2.WRITE, local_address=src.address,
                                     peer=b.h2c, remote_segment=dst.id,
                                     local_offsets=[4096 + k * 4096 for k in range(16)],
                                     remote_offsets=[512 * 1024 + k * 4096 for k in range(16)],
                                     lengths=[4096] * 16)
        resp = c.transfers.Submit(transfer_pb2.SubmitRequest(blocks=[blocks], wait=True),
                                  timeout=30)
        assert resp.batch.state == transfer_pb2.DONE, resp
        assert read_segment(b, dst.id, len(pattern), offset=512 * 1024) == pattern
        gone = src.address
        src.free()
        land.free()
        # the address went with its region
        with pytest.raises(mg.Error) as e:
            c.transfer([mg.write(address=gone, peer=b.h2c, remote_segment=dst.id, length=8)])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "no region this process registered holds address 0x%x" % gone in e.value.message
    assert not a.metric("moongate_pool_lease_events_total", pool="default", event="acquired")
    assert not a.metric("moongate_segment_inline_bytes_total", op="write")
    assert a.metric("moongate_segments", state="ready") == 1  # the pool: free() unregistered both


def test_from_c_buffers(make_daemon):
    d = make_daemon()
    out = subprocess.run([os.path.join(BUILD, "example_buffer"), "unix:" + d.sock],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok 65536 bytes from 0x")
    assert d.metric("moongate_segments", state="ready") == 0


def test_addresses_resolve_within_one_region_of_the_calling_process(make_daemon):
    d = make_daemon()
    fd = memfd(MiB)
    base = 0x7f0000000000  # the daemon takes the client's word for where it has its memory
    with client(d) as c:
        one = c.register_fd("one", fd, size=64 * 1024, client_address=base)
        c.register_fd("two", fd, offset=64 * 1024, size=64 * 1024,
                      client_address=base + 64 * 1024)
        with pytest.raises(mg.Error) as e:  # overlapping ranges of one process
            c.register_fd("three", fd, size=4096, client_address=base + 60 * 1024)
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
        assert 'overlaps segment %d ("one"' % one.id in e.value.message
        with pytest.raises(mg.Error) as e:  # an address needs a size
            c.register_fd("nosize", fd, client_address=base + MiB)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "needs its size" in e.value.message
        other = c.register("other", 64 * 1024)
        with pytest.raises(mg.Error) as e:  # a range crossing two regions
            c.transfer([mg.write(address=base + 60 * 1024, peer="", remote_segment=other.id,
                                 length=8192)])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert 'crosses from segment %d ("one") into segment' % one.id in e.value.message
        with pytest.raises(mg.Error) as e:  # both an address and a segment
            c.transfer([transfer_pb2.TransferRequest(
                op=transfer_pb2.WRITE, local_address=base, local_segment=other.id,
                remote_segment=other.id, length=8)])
        assert "name the local memory one way" in e.value.message
        # re-registered elsewhere: the old address is stale
        c.unregister(one.id)
        c.register_fd("one-again", fd, size=64 * 1024, client_address=base + MiB)
        with pytest.raises(mg.Error) as e:
            c.transfer([mg.write(address=base, peer="", remote_segment=other.id, length=8)])
        assert "no region this process registered holds address" in e.value.message
        c.transfer([mg.write(address=base + MiB, peer="", remote_segment=other.id, length=8)])
    # another process of the same tenant: the addresses are not its own
    with h2c_channel(d) as ch, pytest.raises(grpc.RpcError) as e:
        from moongate.v1 import transfer_pb2_grpc
        transfer_pb2_grpc.TransferStub(ch).Submit(transfer_pb2.SubmitRequest(requests=[
            mg.write(address=base + MiB, peer="", remote_segment=other.id, length=8)]), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "submit on the Unix socket" in e.value.details()
    code = ("import os, sys; sys.path.insert(0, %r); import moongate_client as mg; "
            "c = mg.Client('unix:%s'); "
            "c.transfer([mg.write(address=%d, peer='', remote_segment=%d, length=8)])") % (
        CLIENT_DIR, d.sock, base + MiB, other.id)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "no region this process registered holds address" in p.stderr
    os.close(fd)
    assert serving(d)


def test_async_buffers(make_daemon):
    import asyncio
    d = make_daemon()

    async def run():
        async with mg.AsyncClient("unix:" + d.sock) as c:
            async with await c.allocate_buffer(MiB) as buf:
                buf.view[:5] = b"async"
                assert read_segment(d, buf.segment.id, 5) == b"async"
    asyncio.run(run())
    assert d.metric("moongate_segments", state="ready") == 0


# ---- memory a process allocated itself: process_vm ----

def test_malloced_memory_moves_with_process_vm(make_daemon):
    a = make_daemon("--peer-tls=false", "--pool-bytes", "8M")
    b = make_daemon("--peer-tls=false")
    dst = register(b, "dst", MiB, remote=True)
    mine = bytearray(os.urandom(256 * 1024))  # malloc'd by Python, no file behind it
    addr, size = mg.address_of(mine)
    with client(a) as c:
        seg = c.register_memory("heap", addr, size)
        assert seg.source == memory_pb2.PROCESS and seg.client_address == addr
        assert list(seg.transports) == [] and seg.path == ""
        # WRITE from it and READ into it, over TCP
        batch = c.transfer([mg.write(address=addr, peer=b.h2c, remote_segment=dst.id,
                                     length=size)])
        assert batch.requests[0].transport == "process_vm"
        assert read_segment(b, dst.id, size) == bytes(mine)
        expect = bytes(mine[:4096])
        mine[:] = bytes(size)
        c.transfer([mg.read(segment=seg.id, offset=8192, peer=b.h2c, remote_segment=dst.id,
                            length=4096)])
        assert bytes(mine[8192:8192 + 4096]) == expect
        # the copy path: to and from a segment of this daemon
        here = c.register("here", MiB)
        c.transfer([mg.write(address=addr + 8192, peer="", remote_segment=here.id,
                             length=4096)])
        assert read_segment(a, here.id, 4096) == expect
        mine[:4096] = bytes(4096)
        c.transfer([mg.read(address=addr, peer="", remote_segment=here.id, length=4096)])
        assert bytes(mine[:4096]) == expect
        # not inline, not a target, not remote-accessible
        with pytest.raises(grpc.RpcError) as e:
            read_segment(a, seg.id, 16)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "process_vm" in e.value.details()
        with pytest.raises(mg.Error) as e:
            c.transfer([mg.write(segment=here.id, peer="", remote_segment=seg.id, length=8)])
        assert "a copy on this daemon (peer \"\") cannot land in it" in e.value.message
        with pytest.raises(mg.Error) as e:
            c.register_memory("shared", addr, size, share_with=["other-tenant"])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "never shared" in e.value.message
        c.unregister(seg.id)
    assert a.metric("moongate_process_vm_bytes_total", op="read") >= size + 4096
    assert a.metric("moongate_process_vm_bytes_total", op="write") >= 2 * 4096
    assert not a.metric("moongate_pool_lease_events_total", pool="default", event="acquired")
    status = json.loads(a.ops_get("/status.json")[1])
    assert status["transports"]["process_vm"] == "available"  # root, no Yama here


def test_process_memory_is_a_peers_target(make_daemon):
    """Registered remote-accessible, memory this process allocated is a peer's target over TCP:
    the daemon holding it lands a peer's WRITE with process_vm_writev and answers its READ with
    process_vm_readv, at any offset, in slices larger than its bounce buffer."""
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    size = 3 * MiB + 123
    theirs = bytearray(size + 5)  # the target: this process's heap, registered with b
    ours = bytearray(os.urandom(size))  # the source: registered with a
    t_addr, t_size = mg.address_of(theirs)
    o_addr, _ = mg.address_of(ours)
    with client(b) as cb, client(a) as ca:
        target = cb.register_memory("kv", t_addr, t_size, remote_accessible=True)
        assert target.source == memory_pb2.PROCESS and list(target.transports) == ["tcp"]
        ca.register_memory("src", o_addr, size)
        batch = ca.transfer([mg.write(address=o_addr, peer=b.h2c, remote_segment=target.id,
                                      remote_offset=5, length=size)])
        assert batch.requests[0].transport == "process_vm"  # this end: from process memory
        assert bytes(theirs[5:]) == bytes(ours) and bytes(theirs[:5]) == bytes(5)
        # back: a READ from it into a segment of a, and into a's process memory
        here = ca.register("here", 4 * MiB)
        batch = ca.transfer([mg.read(segment=here.id, peer=b.h2c, remote_segment=target.id,
                                     remote_offset=5, length=size)])
        assert batch.requests[0].transport == "tcp"
        assert read_segment(a, here.id, size) == bytes(ours)
        ours[:] = bytes(size)
        ca.transfer([mg.read(address=o_addr + 1, peer=b.h2c, remote_segment=target.id,
                             remote_offset=6, length=size - 1)])
        assert bytes(ours[1:]) == bytes(theirs[6:])
        # not shared, not read inline, not the target of a copy on its own daemon
        with pytest.raises(grpc.RpcError) as e:
            read_segment(b, target.id, 16)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        cb.unregister(target.id)
    assert b.metric("moongate_process_vm_bytes_total", op="write") >= size
    assert b.metric("moongate_process_vm_bytes_total", op="read") >= 2 * size - 1
    assert serving(a) and serving(b)


def test_process_memory_is_a_target_only_where_a_path_serves_it(make_daemon):
    """A registration no path can serve fails at registration, naming why: process memory off
    on the daemon (the chart's setting), or remote access with the TCP data plane off."""
    heap = bytearray(4096)
    addr, size = mg.address_of(heap)
    off = make_daemon("--process-memory=false")
    with client(off) as c:
        for kw in ({}, {"remote_accessible": True}):
            with pytest.raises(mg.Error) as e:
                c.register_memory("heap", addr, size, **kw)
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "--process-memory=false" in e.value.message
            assert "processMemory.enabled" in e.value.message
        pvm = [t for t in c.info().transports if t.name == "process_vm"][0]
        assert not pvm.available and "--process-memory=false" in pvm.reason
    status = json.loads(off.ops_get("/status.json")[1])
    assert status["transports"]["process_vm"] == "off on this daemon (--process-memory=false)"
    no_tcp = make_daemon("--data-listen", "")
    with client(no_tcp) as c:
        with pytest.raises(mg.Error) as e:
            c.register_memory("heap", addr, size, remote_accessible=True)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert '--data-listen ""' in e.value.message
        seg = c.register_memory("heap", addr, size)  # the local side of requests: fine
        c.unregister(seg.id)
    assert serving(off) and serving(no_tcp)


def test_process_memory_is_checked_at_registration(make_daemon):
    d = make_daemon()
    with client(d) as c:
        gone = mmap.mmap(-1, 8192)
        addr, _ = mg.address_of(gone)
        gone.close()  # unmapped: not memory the daemon can reach there
        for bad in (addr, 0x1000):
            with pytest.raises(mg.Error) as e:
                c.register_memory("gpu-like", bad, 8192)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "is not memory the daemon can reach in process %d" % os.getpid() \
                in e.value.message
            assert "GPU" in e.value.message
        half = mmap.mmap(-1, 3 * 4096)
        addr, _ = mg.address_of(half)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        assert libc.munmap(addr + 8192, 4096) == 0  # a hole after two pages
        with pytest.raises(mg.Error) as e:  # runs into the hole
            c.register_memory("past", addr, 3 * 4096)
        assert "0x%x" % (addr + 8192) in e.value.message
        half.close()
    with h2c_channel(d) as ch, pytest.raises(grpc.RpcError) as e:  # over TCP: no process
        memory_pb2_grpc.MemoryStub(ch).RegisterSegment(memory_pb2.RegisterRequest(
            name="tcp", source=memory_pb2.PROCESS, client_address=0x10000, size=4096),
            timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert serving(d)


CHILD = """
import os, sys, time
sys.path.insert(0, %(path)r)
import moongate_client as mg
from moongate.v1 import transfer_pb2
c = mg.Client("unix:%(sock)s")
list(c.segments())  # the connection is made as root
mine = bytearray(%(size)d)
addr, size = mg.address_of(mine)
%(body)s
"""


def child(d, size, body, timeout=120):
    code = CHILD % dict(path=CLIENT_DIR, sock=d.sock, size=size, body=body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


def test_memory_of_another_uid_is_refused(make_daemon):
    d = make_daemon()
    # the process connected as root, then became nobody: its memory is not root's any more
    p = child(d, 4096, "os.setresuid(65534, 65534, 65534)\n"
                       "try:\n"
                       "    c.register_memory('theirs', addr, size)\n"
                       "except mg.Error as e:\n"
                       "    print(e.code.name, e.message)\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("PERMISSION_DENIED")
    assert "runs as uid 65534 (effective 65534, saved 65534), not as the caller's uid 0" \
        in p.stdout
    assert serving(d)


def test_a_process_that_exits_mid_transfer_fails_its_requests_only(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    size = 512 * MiB
    dst = register(b, "dst", size, remote=True)
    other = register(b, "other", MiB, remote=True)
    # the child registers its heap, submits a WRITE of all of it and exits at once
    p = child(a, size, "seg = c.register_memory('heap', addr, size)\n"
                       "bid = c.submit([mg.write(address=addr, peer=%r, remote_segment=%d, "
                       "length=size)])\n"
                       "print(bid, seg.id, flush=True)\n"
                       "os._exit(0)\n" % (b.h2c, dst.id))
    assert p.returncode == 0, p.stderr
    bid, seg_id = (int(x) for x in p.stdout.split())
    with client(a) as c:
        here = c.register("here", MiB)
        batch = c.wait(bid, check=False)
        assert batch.state == transfer_pb2.FAILED
        r = batch.requests[0]
        assert r.code == grpc.StatusCode.FAILED_PRECONDITION.value[0], batch
        assert "exited" in r.message and r.transport == "process_vm"
        # nothing else: the daemon serves, other transfers move, the segment can go
        done = c.transfer([mg.write(segment=here.id, peer=b.h2c, remote_segment=other.id,
                                    length=MiB)])
        assert done.state == transfer_pb2.DONE
        # its segment is released once the failed request let go of it
        assert wait_gone(c, seg_id)
    assert "event=segments_released pid=" in a.read_log()
    assert serving(a) and serving(b)


def test_a_target_process_that_exits_fails_the_peers_requests_only(make_daemon):
    """The process whose memory a peer writes into exits while the slices are on their way
    (its daemon frozen meanwhile, so they are): those requests fail by name, the batch's other
    request lands, and both daemons serve on."""
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    size = 64 * MiB
    src = register(a, "src", size)
    other = register(b, "other", MiB, remote=True)
    p = subprocess.Popen([sys.executable, "-c", CHILD % dict(
        path=CLIENT_DIR, sock=b.sock, size=size, body=(
            "seg = c.register_memory('kv', addr, size, remote_accessible=True)\n"
            "print(seg.id, flush=True)\n"
            "sys.stdin.read()\n"))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        seg_id = int(p.stdout.readline())
        with client(a) as c:
            # first WRITEs that land: a knows both targets (Submit asks b nothing more) and
            # has a connection to b
            c.transfer([mg.write(segment=src.id, peer=b.h2c, remote_segment=seg_id,
                                 length=MiB),
                        mg.write(segment=src.id, peer=b.h2c, remote_segment=other.id,
                                 length=MiB)])
            b.signal(signal.SIGSTOP)
            try:
                bid = c.submit([mg.write(segment=src.id, peer=b.h2c, remote_segment=seg_id,
                                         length=size),
                                mg.write(segment=src.id, peer=b.h2c, remote_segment=other.id,
                                         length=MiB)])
                p.kill()
                p.wait()
            finally:
                b.signal(signal.SIGCONT)
            batch = c.wait(bid, check=False)
            gone, fine = batch.requests
            assert fine.code == 0, batch
            # the daemon lands into it and finds it gone, or learns first that it exited
            assert gone.code in (grpc.StatusCode.FAILED_PRECONDITION.value[0],
                                 grpc.StatusCode.NOT_FOUND.value[0]), batch
            assert "segment %d" % seg_id in gone.message and "exited" in gone.message, batch
    finally:
        p.kill()
        p.wait()
    with client(b) as cb:
        assert wait_gone(cb, seg_id)
    assert serving(a) and serving(b)


def wait_gone(c, seg_id, timeout=30):
    deadline = time.monotonic() + timeout  # the daemon's pace does not matter, only its end
    while time.monotonic() < deadline:
        if seg_id not in [s.id for s in c.segments()]:
            return True
        time.sleep(0.05)
    return False


def test_process_segments_go_with_their_process(make_daemon):
    d = make_daemon()
    p = child(d, 4096, "a = c.register_memory('one', addr, 2048)\n"
                       "b = c.register_memory('two', addr + 2048, 2048)\n"
                       "print(a.id, b.id, flush=True)\n")
    assert p.returncode == 0, p.stderr
    ids = [int(x) for x in p.stdout.split()]
    with client(d) as c:
        assert all(wait_gone(c, i) for i in ids)
        # a living process keeps its segments, and unregistering them first is fine
        heap = bytearray(4096)
        addr, size = mg.address_of(heap)
        seg = c.register_memory("mine", addr, size)
        time.sleep(0.2)
        assert seg.id in [s.id for s in c.segments()]
        c.unregister(seg.id)
    assert "count=2 reason=\"its process exited\"" in d.read_log()
    assert d.metric("moongate_segments", state="ready") == 0
    assert serving(d)


def test_a_batch_registration_names_its_handles(make_daemon):
    d = make_daemon()
    fds = [memfd(MiB), memfd(MiB)]
    with client(d) as c:
        handles = [mg.pass_fd(c.fd_socket, fd)[0] for fd in fds]
        items = [memory_pb2.RegisterRequest(name="b%d" % i, source=memory_pb2.FD, fd_handle=h)
                 for i, h in enumerate(handles)]
        items.append(memory_pb2.RegisterRequest(name="b2", source=memory_pb2.FD,
                                                fd_handle=handles[0]))  # used by item 0
        resp = c.memory.RegisterSegments(memory_pb2.RegisterSegmentsRequest(items=items),
                                         timeout=30)
        codes = [r.status.code for r in resp.results]
        assert codes[:2] == [0, 0], resp
        assert codes[2] == grpc.StatusCode.NOT_FOUND.value[0]
        assert "was used already" in resp.results[2].status.message
        assert all(r.segment.size == MiB for r in resp.results[:2])
    for fd in fds:
        os.close(fd)
    assert d.metric("moongate_fd_handles", state="held") == 0


def test_a_caller_the_daemon_cannot_see_is_told_to_share_the_pid_namespace(make_daemon):
    """The daemon in a pid namespace of its own (as a pod without hostPID): a process outside it
    connects on the Unix socket with a pid of 0 there, and registering its memory is refused
    naming the pid namespace and hostPID, not the socket it is already on."""
    if subprocess.run(["unshare", "--pid", "--fork", "true"]).returncode != 0:
        pytest.skip("no pid namespaces here")
    d = make_daemon(wrap=["unshare", "--pid", "--fork", "--kill-child"])
    mine = bytearray(4096)
    addr, size = mg.address_of(mine)
    try:
        with client(d) as c:
            with pytest.raises(mg.Error) as e:
                c.register_memory("heap", addr, size)
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert "pid namespace" in e.value.message and "hostPID" in e.value.message, \
                e.value.message
            assert c.register("daemon-made", 4096).size == 4096  # the rest serves on
    finally:
        d.kill()  # unshare ends its child with itself
