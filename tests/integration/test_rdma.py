"""The RDMA seam: libibverbs is opened at run time, never linked. With the software verbs
emulator (build/libmgverbs_emu.so, loaded through --ibverbs-lib like the real library) the
daemon finds its devices, reports them, and registers every segment with them (remote access
only for remote-accessible ones), deregistering on unregistration; a registration the device
refuses fails the segment with the reason and leaves nothing. Without the library, kernel
support or a device, TCP serves and the reason is reported; --require-rdma makes that a start-up
error. Between two daemons with devices, transfers move over RDMA queue pairs (the emulator runs
RDMA WRITE and READ between the processes): data checked in the mapped files, not a byte over
TCP; a mixed pair uses TCP and says why; a stale key, a killed peer and a restarted one."""
import json
import os
import subprocess

import grpc
import pytest

from conftest import BUILD, MGCTL, MOONGATE, h2c_channel, register, req
from moongate.v1 import (daemon_pb2, daemon_pb2_grpc, memory_pb2, memory_pb2_grpc, peer_pb2,
                         peer_pb2_grpc)

EMU = os.path.join(BUILD, "libmgverbs_emu.so")
MiB = 1 << 20


def rdma_info(d):
    with h2c_channel(d) as ch:
        info = daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest(), timeout=10)
    return [t for t in info.transports if t.name == "rdma"][0]


def test_the_daemon_does_not_link_libibverbs():
    out = subprocess.run(["readelf", "-d", MOONGATE], capture_output=True, text=True,
                         check=True).stdout
    needed = [line for line in out.splitlines() if "(NEEDED)" in line]
    assert needed and not [line for line in needed if "ibverbs" in line], needed


def test_devices_found_and_segments_registered_through_the_emulator(make_daemon):
    d = make_daemon("--ibverbs-lib", EMU)
    t = rdma_info(d)
    assert list(t.devices) == ["emu0 port 1 mtu 4096 roce gid ::ffff:127.0.0.1"]
    assert t.available and t.reason == ""
    assert d.metric("moongate_rdma_devices") == 1
    assert d.metric("moongate_rdma_device", device="emu0", port="1", link="roce",
                    mtu="4096") == 1
    assert "event=rdma_device lib=%s device=emu0" % EMU in d.read_log()
    assert "[+] transport rdma: 1 device (emu0)" in d.ops_get("/readyz?verbose")[1]
    assert json.loads(d.ops_get("/status.json")[1])["transports"]["rdma"] == "1 device (emu0)"
    p = subprocess.run([MGCTL, "--target", "unix:" + d.sock, "info"], capture_output=True,
                       text=True, timeout=30)
    rc, out = p.returncode, p.stdout
    assert rc == 0 and "device emu0 port 1 mtu 4096 roce gid ::ffff:127.0.0.1" in out, out
    with h2c_channel(d) as ch:
        m = memory_pb2_grpc.MemoryStub(ch)
        shared = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="shared", size=8 * MiB, remote_accessible=True), timeout=10).segment
        private = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="private", size=MiB), timeout=10).segment
        assert list(shared.transports) == ["tcp", "rdma"]
        assert list(private.transports) == []  # registered, but no remote access
        assert d.metric("moongate_rdma_memory_regions") == 2
        assert d.metric("moongate_rdma_registered_bytes") == 9 * MiB
        desc = peer_pb2_grpc.PeerStub(ch).DescribeTarget(
            peer_pb2.DescribeTargetRequest(id=shared.id), timeout=10)
        assert list(desc.transports) == ["tcp", "rdma"]
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=shared.id), timeout=10)
        assert d.metric("moongate_rdma_memory_regions") == 1
        assert d.metric("moongate_rdma_registered_bytes") == MiB


def test_a_registration_the_device_refuses_fails_whole(make_daemon, monkeypatch):
    monkeypatch.setenv("MG_VERBS_EMU_MEMLOCK", str(4 * MiB))  # pinning past it fails
    d = make_daemon("--ibverbs-lib", EMU)
    with h2c_channel(d) as ch:
        m = memory_pb2_grpc.MemoryStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            m.RegisterSegment(memory_pb2.RegisterRequest(name="big", size=8 * MiB), timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "RDMA registration: device emu0: ibv_reg_mr of 8388608 bytes" in \
            e.value.details() and "memlock" in e.value.details()
        assert list(m.ListSegments(memory_pb2.ListSegmentsRequest(), timeout=10).segments) == []
        assert os.listdir(d.shm) == [".moongate.lock"]  # nothing left behind but the dir's lock
        assert d.metric("moongate_rdma_registrations_failed_total") == 1
        assert d.metric("moongate_rdma_memory_regions") == 0
        small = m.RegisterSegment(memory_pb2.RegisterRequest(name="small", size=MiB),
                                  timeout=10).segment  # the daemon serves on
        assert small.id


@pytest.mark.parametrize("env,args,reason", [
    ({}, ["--ibverbs-lib", "/nonexistent/libibverbs.so.1"],
     "cannot load /nonexistent/libibverbs.so.1"),
    ({"MG_VERBS_EMU_DEVICES": ""}, ["--ibverbs-lib", EMU], "no RDMA devices"),
    ({"MG_VERBS_EMU_PORT_DOWN": "emu0"}, ["--ibverbs-lib", EMU],
     "no usable RDMA device: device emu0: no active port (of 1)"),
    ({"MG_VERBS_EMU_DEVICES": "emu0,emu1"}, ["--ibverbs-lib", EMU, "--rdma-devices", "emu7"],
     "device emu7 (--rdma-devices) not found"),
    ({}, ["--ibverbs-lib", EMU, "--rdma-gid-index", "9"],
     "device emu0: no GID at index 9 (--rdma-gid-index; the port has 4)"),
    ({}, ["--ibverbs-lib", ""], "RDMA is off"),
])
def test_without_rdma_tcp_serves_and_says_why(make_daemon, monkeypatch, env, args, reason):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    d = make_daemon(*args)
    t = rdma_info(d)
    assert not t.available and list(t.devices) == [] and reason in t.reason, t
    assert d.metric("moongate_rdma_devices") == 0
    assert "[-] transport rdma: unavailable (" in d.ops_get("/readyz?verbose")[1]
    said = [line for line in d.read_log().splitlines() if "event=rdma_unavailable" in line]
    assert len(said) == 1 and reason in said[0] and said[0].endswith("transport=tcp"), said
    with h2c_channel(d) as ch:  # segments work, over TCP only
        seg = memory_pb2_grpc.MemoryStub(ch).RegisterSegment(memory_pb2.RegisterRequest(
            name="s", size=MiB, remote_accessible=True), timeout=10).segment
        assert list(seg.transports) == ["tcp"]


def test_pinned_devices(make_daemon, monkeypatch):
    monkeypatch.setenv("MG_VERBS_EMU_DEVICES", "emu0,emu1,emu2")
    d = make_daemon("--ibverbs-lib", EMU, "--rdma-devices", "emu2,emu0")
    assert [x.split()[0] for x in rdma_info(d).devices] == ["emu0", "emu2"]
    with h2c_channel(d) as ch:
        memory_pb2_grpc.MemoryStub(ch).RegisterSegment(memory_pb2.RegisterRequest(
            name="s", size=MiB), timeout=10)
    assert d.metric("moongate_rdma_memory_regions") == 1  # one registration, on both devices


def test_require_rdma(make_daemon, tmp_path):
    args = [MOONGATE, "--listen", "", "--h2c-listen", "127.0.0.1:0", "--ops-listen", "",
            "--unix-socket", "", "--shm-dir", str(tmp_path / "shm"), "--pool-bytes", "0",
            "--require-rdma", "--ibverbs-lib", "/nonexistent/libibverbs.so.1"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=20)
    assert p.returncode == 1
    assert 'event=rdma_required reason="cannot load /nonexistent/libibverbs.so.1' in \
        p.stdout + p.stderr
    d = make_daemon("--require-rdma", "--ibverbs-lib", EMU)  # with a device it starts
    assert rdma_info(d).devices


# ---- transfers over RDMA (through the emulator: RDMA WRITE/READ between the two processes) ----

from moongate.v1 import transfer_pb2, transfer_pb2_grpc  # noqa: E402


def submit_wait(d, *requests, timeout=30):
    with h2c_channel(d) as ch:
        return transfer_pb2_grpc.TransferStub(ch).Submit(transfer_pb2.SubmitRequest(
            wait=True, requests=list(requests)), timeout=timeout).batch


def list_peers(d):
    with h2c_channel(d) as ch:
        return transfer_pb2_grpc.TransferStub(ch).ListPeers(transfer_pb2.ListPeersRequest(),
                                                             timeout=10).peers


def test_write_and_read_over_rdma(make_daemon):
    a = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    b = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    n = 9 * MiB + 5
    src, back = register(a, "src", n), register(a, "back", n)
    dst = register(b, "dst", n, remote=True)
    data = os.urandom(n)
    with open(src.path, "r+b") as f:
        f.write(data)
    batch = submit_wait(a, req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, n))
    assert batch.state == transfer_pb2.DONE, batch
    assert batch.requests[0].transport == "rdma"
    with open(dst.path, "rb") as f:
        assert f.read() == data
    batch = submit_wait(a, req(transfer_pb2.READ, back.id, b.h2c, dst.id, n - 11, 3, 11))
    assert batch.state == transfer_pb2.DONE and batch.requests[0].transport == "rdma", batch
    with open(back.path, "rb") as f:
        assert f.read()[3:n - 8] == data[11:]
    p = list_peers(a)[0]
    assert p.rdma == "ready (1 device)" and list(p.transports) == ["tcp", "rdma"]
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write", transport="rdma") == n
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="read", transport="rdma") == n - 11
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write", transport="tcp") == 0
    assert b.metric("moongate_data_bytes_total", dir="in") == 0  # not one byte over TCP
    assert b.metric("moongate_data_bytes_total", dir="out") == 0
    assert "event=rdma_connected" in b.read_log() and "event=rdma_ready" in a.read_log()


@pytest.mark.parametrize("a_lib,b_lib,why", [
    (EMU, "", "the peer has no RDMA device"),
    ("", EMU, "this daemon has no RDMA device: RDMA is off"),
])
def test_a_mixed_pair_moves_over_tcp_and_says_why(make_daemon, a_lib, b_lib, why):
    a = make_daemon("--peer-tls=false", "--ibverbs-lib", a_lib)
    b = make_daemon("--peer-tls=false", "--ibverbs-lib", b_lib)
    src, dst = register(a, "src", MiB), register(b, "dst", MiB, remote=True)
    batch = submit_wait(a, req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, MiB))
    assert batch.state == transfer_pb2.DONE and batch.requests[0].transport == "tcp", batch
    p = list_peers(a)[0]
    assert why in p.rdma and list(p.transports) == ["tcp"], p
    assert b.metric("moongate_data_bytes_total", dir="in") == MiB


def test_a_digest_over_rdma_is_checked_by_both_daemons(make_daemon, monkeypatch, tmp_path):
    """SubmitRequest.digest over RDMA: once a request moved, A takes the CRC32C of its range and
    asks B for B's (Peer/Checksum). The emulator's corruption switch flips a byte of the next
    transfer: a WRITE or READ with a digest fails DATA_LOSS naming both CRCs; one without a
    digest lands corrupted and says DONE — what the digest is for."""
    switch = tmp_path / "corrupt"
    monkeypatch.setenv("MG_VERBS_EMU_CORRUPT", str(switch))
    a = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    b = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    n = 2 * MiB + 3
    src, back = register(a, "src", n), register(a, "back", n)
    dst = register(b, "dst", n, remote=True)
    data = os.urandom(n)
    with open(src.path, "r+b") as f:
        f.write(data)

    def submit(op, local, digest=True):
        with h2c_channel(a) as ch:
            return transfer_pb2_grpc.TransferStub(ch).Submit(transfer_pb2.SubmitRequest(
                wait=True, digest=digest, requests=[req(op, local, b.h2c, dst.id, n)]),
                timeout=30).batch
    batch = submit(transfer_pb2.WRITE, src.id)
    assert batch.state == transfer_pb2.DONE and batch.requests[0].transport == "rdma", batch
    with open(dst.path, "rb") as f:
        assert f.read() == data
    for op, local, where in ((transfer_pb2.WRITE, src.id, "on the peer"),
                             (transfer_pb2.READ, back.id, "here")):
        switch.write_text("")
        r = submit(op, local).requests[0]
        assert not switch.exists()  # the emulator took it
        assert r.state == transfer_pb2.FAILED and r.code == grpc.StatusCode.DATA_LOSS.value[0], r
        assert "the CRC32C of the bytes that landed %s" % where in r.message, r.message
    switch.write_text("")
    assert submit(transfer_pb2.WRITE, src.id, digest=False).state == transfer_pb2.DONE
    with open(dst.path, "rb") as f:
        assert f.read() != data  # landed corrupted, unnoticed
    assert b.metric("moongate_data_bytes_total", dir="in") == 0  # never over TCP


def test_a_stale_remote_key_fails_its_request_and_the_connection_is_remade(make_daemon):
    """B unregisters a segment A has described: A's RDMA WRITE with the old key is a remote
    access error (NOT_FOUND, nothing written anywhere), the broken queue pairs are replaced,
    and the next request moves over RDMA again."""
    a = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    b = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    src = register(a, "src", MiB)
    with open(src.path, "r+b") as f:
        f.write(b"\x77" * MiB)
    old = register(b, "old", MiB, remote=True)
    assert submit_wait(a, req(transfer_pb2.WRITE, src.id, b.h2c, old.id, 4096)).state == \
        transfer_pb2.DONE
    with h2c_channel(b) as ch:
        memory_pb2_grpc.MemoryStub(ch).UnregisterSegment(memory_pb2.UnregisterRequest(id=old.id))
    new = register(b, "new", MiB, remote=True)
    batch = submit_wait(a, req(transfer_pb2.WRITE, src.id, b.h2c, old.id, MiB))
    r = batch.requests[0]
    assert r.code == grpc.StatusCode.NOT_FOUND.value[0] and r.transport == "rdma", batch
    assert "RDMA WRITE on device emu0: remote access error" in r.message
    with open(new.path, "rb") as f:
        assert f.read() == bytes(MiB)  # the new segment was not touched
    batch = submit_wait(a, req(transfer_pb2.WRITE, src.id, b.h2c, new.id, MiB))
    assert batch.state == transfer_pb2.DONE and batch.requests[0].transport == "rdma", batch
    with open(new.path, "rb") as f:
        assert f.read() == b"\x77" * MiB
    assert "event=rdma_conn_retired" in a.read_log()
    assert a.read_log().count("event=rdma_ready") == 2


def test_kill_9_of_a_peer_mid_rdma_batch(make_daemon):
    """B dies while A's RDMA WRITEs run: the requests not done fail UNAVAILABLE naming B (the
    queue pairs' retries run out, a new session cannot be had), A keeps serving, and another
    peer is reached over RDMA afterwards."""
    import time
    a = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    b = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    src = register(a, "src", 8 * MiB)
    dst = register(b, "dst", 8 * MiB, remote=True)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 8 * MiB)] * 400), timeout=10).batch_id
        deadline = time.monotonic() + 20
        while t.GetBatch(transfer_pb2.GetBatchRequest(id=bid)).done == 0:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        b.kill()
        while True:
            batch = t.GetBatch(transfer_pb2.GetBatchRequest(id=bid))
            if batch.state != transfer_pb2.RUNNING:
                break
            assert time.monotonic() < deadline + 20, "batch still running"
            time.sleep(0.05)
    failed = [r for r in batch.requests if r.state == transfer_pb2.FAILED]
    assert failed and batch.done + batch.failed == 400, (batch.done, batch.failed)
    assert {r.code for r in failed} == {grpc.StatusCode.UNAVAILABLE.value[0]}
    assert all(b.h2c in r.message for r in failed), failed[0].message
    c = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    on_c = register(c, "on-c", MiB, remote=True)
    batch = submit_wait(a, req(transfer_pb2.WRITE, src.id, c.h2c, on_c.id, MiB))
    assert batch.state == transfer_pb2.DONE and batch.requests[0].transport == "rdma", batch
    assert a.metric("moongate_transfer_requests_in_flight") == 0
    with h2c_channel(a) as ch:
        assert memory_pb2_grpc.MemoryStub(ch).GetSegment(
            memory_pb2.GetSegmentRequest(id=src.id)).holders == 0


def test_peer_restart_over_rdma(make_daemon):
    a = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    b = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    src = register(a, "src", MiB)
    data = os.urandom(MiB)
    with open(src.path, "r+b") as f:
        f.write(data)
    dst = register(b, "dst", MiB, remote=True)
    assert submit_wait(a, req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, MiB)).state == \
        transfer_pb2.DONE
    b.stop()
    b.start()
    dst = register(b, "dst", MiB, remote=True)
    batch = submit_wait(a, req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, MiB))
    assert batch.state == transfer_pb2.DONE and batch.requests[0].transport == "rdma", batch
    with open(dst.path, "rb") as f:
        assert f.read() == data
    assert a.read_log().count("event=rdma_ready") == 2
    assert list_peers(a)[0].restarts_seen == 1


@pytest.mark.parametrize("a_devs,b_devs,used", [("emu0,emu1", "emu0,emu1", 2),
                                                ("emu0,emu1", "emu0", 1)])
def test_transfers_spread_over_the_devices(make_daemon, monkeypatch, a_devs, b_devs, used):
    """A connection per device pair (ours k with the peer's k), slices taking turns between
    them, each with that device's keys."""
    monkeypatch.setenv("MG_VERBS_EMU_DEVICES", a_devs)
    a = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    monkeypatch.setenv("MG_VERBS_EMU_DEVICES", b_devs)
    b = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    n = 6 * MiB + 3
    src, dst = register(a, "src", n), register(b, "dst", n, remote=True)
    data = os.urandom(n)
    with open(src.path, "r+b") as f:
        f.write(data)
    batch = submit_wait(a, req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, n))
    assert batch.state == transfer_pb2.DONE and batch.requests[0].transport == "rdma", batch
    with open(dst.path, "rb") as f:
        assert f.read() == data
    p = list_peers(a)[0]
    assert p.rdma == "ready (%d device%s)" % (used, "s" if used > 1 else ""), p
    connected = [line for line in b.read_log().splitlines() if "event=rdma_connected" in line]
    assert sorted(line.split("device=")[1].split()[0] for line in connected) == \
        [str(k) for k in range(used)]


def test_remote_leases_over_rdma_with_their_own_key(make_daemon):
    """A remote-accessible lease on B gets its own registration: its key reaches the lease's
    bytes only. A WRITEs and READs it over RDMA; B's descriptor gives that key, not the pool's;
    once released the key is dead before the range is free again: A's next WRITE fails
    NOT_FOUND and the pool's bytes there stay as they were."""
    import time
    from moongate.v1 import peer_pb2, peer_pb2_grpc, pool_pb2, pool_pb2_grpc
    a = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU, "--pool-bytes", "16M")
    b = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU, "--pool-bytes", "16M")
    n = 2 * MiB + 9
    data = os.urandom(n)
    regions = b.metric("moongate_rdma_memory_regions")  # B's pool, registered at start
    with h2c_channel(a) as ca, h2c_channel(b) as cb:
        pa, pb = pool_pb2_grpc.PoolStub(ca), pool_pb2_grpc.PoolStub(cb)
        mine = pa.AcquireLease(pool_pb2.AcquireLeaseRequest(size=n))
        theirs = pb.AcquireLease(pool_pb2.AcquireLeaseRequest(size=n, remote_accessible=True))
        with open(mine.path, "r+b") as f:
            f.seek(mine.offset)
            f.write(data)
        deadline = time.monotonic() + 10  # registered on a worker, just after the acquire
        while b.metric("moongate_rdma_memory_regions") != regions + 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        d = peer_pb2_grpc.PeerStub(cb).DescribeTarget(
            peer_pb2.DescribeTargetRequest(id=theirs.id, is_lease=True))
        assert list(d.transports) == ["tcp", "rdma"] and d.rdma_rkeys and d.size == n
        batch = submit_wait(a, transfer_pb2.TransferRequest(
            op=transfer_pb2.WRITE, peer=b.h2c, length=n, local_lease=mine.id,
            remote_lease=theirs.id))
        assert batch.state == transfer_pb2.DONE and batch.requests[0].transport == "rdma", batch
        with open(theirs.path, "rb") as f:
            f.seek(theirs.offset)
            assert f.read(n) == data
        back = register(a, "back", n)
        batch = submit_wait(a, transfer_pb2.TransferRequest(
            op=transfer_pb2.READ, peer=b.h2c, length=n, local_segment=back.id,
            remote_lease=theirs.id))
        assert batch.state == transfer_pb2.DONE and batch.requests[0].transport == "rdma", batch
        with open(back.path, "rb") as f:
            assert f.read() == data
        pb.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=theirs.id))
        while b.metric("moongate_rdma_memory_regions") != regions:  # its key died
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with open(theirs.path, "r+b") as f:
            f.seek(theirs.offset)
            f.write(b"\x00" * n)
        batch = submit_wait(a, transfer_pb2.TransferRequest(
            op=transfer_pb2.WRITE, peer=b.h2c, length=n, local_lease=mine.id,
            remote_lease=theirs.id))
        r = batch.requests[0]
        assert r.code == grpc.StatusCode.NOT_FOUND.value[0] and r.transport == "rdma", batch
        assert "remote access error" in r.message
        with open(theirs.path, "rb") as f:
            f.seek(theirs.offset)
            assert f.read(n) == b"\x00" * n  # nothing landed in the freed range


def test_notification_after_the_rdma_writes_and_bounds_checked_first(make_daemon):
    """A batch's notification reaches B's readers only after every RDMA WRITE of the batch to
    B completed (the reader finds the bytes in place); a request past the target is refused
    with the whole batch before anything moves, as over TCP."""
    import threading
    import time
    from moongate.v1 import notify_pb2, notify_pb2_grpc
    a = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    b = make_daemon("--peer-tls=false", "--ibverbs-lib", EMU)
    n = 32 * MiB
    src, dst = register(a, "src", n), register(b, "dst", n, remote=True)
    data = os.urandom(n)
    with open(src.path, "r+b") as f:
        f.write(data)
    seen = {}

    def reader():
        with h2c_channel(b) as ch:
            for note in notify_pb2_grpc.NotifyStub(ch).Watch(
                    notify_pb2.WatchRequest(topic="kv"), timeout=30):
                with open(dst.path, "rb") as f:
                    seen["in_place"] = f.read() == data
                seen["payload"] = note.payload
                return
    th = threading.Thread(target=reader)
    th.start()
    time.sleep(0.3)  # the Watch is open
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        batch = t.Submit(transfer_pb2.SubmitRequest(
            wait=True,
            requests=[req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, n // 4, o, o)
                      for o in range(0, n, n // 4)],
            notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic="kv", payload=b"ready")]),
            timeout=30).batch
        with pytest.raises(grpc.RpcError) as e:
            t.Submit(transfer_pb2.SubmitRequest(requests=[
                req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 2, 0, n - 1)]), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    th.join(30)
    assert batch.state == transfer_pb2.DONE, batch
    assert {r.transport for r in batch.requests} == {"rdma"}
    assert [s.state for s in batch.notify] == [transfer_pb2.NOTIFY_SENT]
    assert seen["in_place"] and seen["payload"] == b"ready", seen
