"""The Python module (clients/python/moongate_client.py) against real daemons: a lease as a
context manager whose buffer is the mapped pool file, segments mapped as memoryviews,
transfers submitted and waited for in one call, notifications iterated as they arrive, errors
as mg.Error with the gRPC code — synchronously and with asyncio."""
import asyncio
import os
import threading

import grpc
import pytest

import conftest

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402
from moongate.v1 import memory_pb2, transfer_pb2  # noqa: E402

MiB = 1 << 20


def client(d, **kw):
    return mg.Client(d.h2c, plaintext=True, **kw)


def test_lease_buffer_is_the_pool_file(make_daemon):
    d = make_daemon("--pool-bytes", "8M")
    with client(d) as c:
        with c.lease(100000) as lease:
            assert len(lease.buffer) == 100000 and lease.size == 100000
            lease.buffer[:5] = b"hello"
            lease.buffer[-5:] = b"world"
            # the daemon reads the same bytes through the lease
            got = b"".join(x.data for x in c.memory.ReadSegment(
                memory_pb2.ReadSegmentRequest(lease_id=lease.id, length=100000)))
            assert got[:5] == b"hello" and got[-5:] == b"world"
            lid = lease.id
        assert lease.buffer is None  # gone with the lease
        with pytest.raises(mg.Error) as e:
            c.release(lid)  # released already
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert d.metric("moongate_pool_leases", pool="default") == 0
        with pytest.raises(mg.Error) as e:
            c.lease(64 * MiB)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "lease area" in e.value.message


def test_threads_sharing_a_client_lease_at_once(make_daemon):
    """Threads of one Client leasing and releasing at once: each lease's buffer is its own,
    usable until its release, whatever the other threads' leases do to the pool file's one
    mapping (made by the first of them, closed by the last)."""
    d = make_daemon("--pool-bytes", "8M")
    for _ in range(3):  # a fresh client each round: the first leases race to map the file
        with client(d) as c:
            start, errors = threading.Barrier(8), []

            def run(i):
                try:
                    start.wait()
                    for _ in range(10):
                        with c.lease(4096) as lease:
                            lease.buffer[:8] = bytes([i]) * 8
                            assert bytes(lease.buffer[:8]) == bytes([i]) * 8
                except Exception as e:  # noqa: BLE001 (reported below, with the thread)
                    errors.append("thread %d: %r" % (i, e))
            threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            assert c._maps.files == {}  # the last release closed the mapping
    assert d.metric("moongate_pool_leases", pool="default") == 0


def test_segments_transfers_and_notifications(make_daemon):
    b = make_daemon()
    a = make_daemon("--peer-tls=false", "--pool-bytes", "8M")
    with client(a) as ca, client(b) as cb:
        src = ca.register("src", MiB)
        dst = cb.register("dst", MiB, remote_accessible=True)
        with ca.map(src) as buf:
            buf[:] = os.urandom(MiB)
            want = bytes(buf)
        batch = ca.transfer([mg.write(segment=src.id, peer=b.h2c, remote_segment=dst.id,
                                      length=MiB)],
                            notify=[mg.notify(b.h2c, "kv", b"ready")])
        assert batch.state == transfer_pb2.DONE and batch.requests[0].bytes_done == MiB
        # queued notifications come first on a Watch: it is there, after the data
        note = next(cb.notifications("kv", timeout=10))
        assert note.payload == b"ready" and note.batch_id == batch.id
        with cb.map(dst) as buf:
            assert bytes(buf) == want
        # READ back into a lease, followed with wait() and its progress reports
        with ca.lease(MiB) as lease:
            bid = ca.submit([mg.read(lease=lease.id, peer=b.h2c, remote_segment=dst.id,
                                     length=MiB)])
            seen = []
            final = ca.wait(bid, progress=seen.append)
            assert final.state == transfer_pb2.DONE and seen
            assert bytes(lease.buffer) == want
        # a failed transfer raises with the request's code and message
        with pytest.raises(mg.Error) as e:
            ca.transfer([mg.write(segment=src.id, peer=b.h2c, remote_segment=dst.id,
                                  remote_offset=MiB - 1, length=2)])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
        with pytest.raises(ValueError):
            mg.write(segment=1, lease=2, peer="", remote_segment=3, length=1)
        assert [s.name for s in ca.segments()] == ["src"]
        ca.unregister(src.id)
        cb.unregister(dst.id)


def test_asyncio_client(make_daemon):
    d = make_daemon("--pool-bytes", "8M")

    async def main():
        async with mg.AsyncClient(d.h2c, plaintext=True) as c:
            seg = await c.register("a", 4096)
            async with c.lease(4096) as lease:
                lease.buffer[:3] = b"abc"
                batch = await c.transfer([mg.write(lease=lease.id, peer="",
                                                   remote_segment=seg.id, length=3)])
                assert batch.state == transfer_pb2.DONE
            with c.map(seg) as buf:
                assert bytes(buf[:3]) == b"abc"
            notes = []
            async for n in c.notifications("nobody-writes", timeout=0.5):
                notes.append(n)  # none: the iteration just ends at the timeout
            assert notes == []
            await c.unregister(seg.id)
            with pytest.raises(mg.Error) as e:
                await c.unregister(seg.id)
            assert e.value.code == grpc.StatusCode.NOT_FOUND
    asyncio.run(main())


def test_digests_and_traces(make_daemon):
    """transfer(digest=True) is checked end to end (a corrupted slice raises DATA_LOSS), and a
    traceparent given to transfer() and send() is the trace both daemons carry on."""
    from test_digest import corrupt
    b = make_daemon()
    a = make_daemon("--peer-tls=false")
    tid = os.urandom(16).hex()
    tp = "00-%s-%s-01" % (tid, os.urandom(8).hex())
    with client(a) as ca, client(b) as cb:
        src = ca.register("src", MiB)
        dst = cb.register("dst", MiB, remote_accessible=True)
        w = mg.write(segment=src.id, peer=b.h2c, remote_segment=dst.id, length=MiB)
        batch = ca.transfer([w], notify=[mg.notify(b.h2c, "traced", b"")], digest=True,
                            traceparent=tp)
        assert batch.state == transfer_pb2.DONE
        assert next(cb.notifications("traced", timeout=10)).traceparent.startswith("00-" + tid)
        ca.send("sent", b"x", peer=b.h2c, traceparent=tp)
        assert cb.poll("sent")[0].traceparent.startswith("00-" + tid)
        corrupt(b, 1)
        with pytest.raises(mg.Error) as e:
            ca.wait(ca.submit([w], digest=True))
        assert e.value.code == grpc.StatusCode.DATA_LOSS, e.value
        corrupt(b, 1)  # the switch waits for a checksummed slice: this batch has none
        assert ca.transfer([w]).state == transfer_pb2.DONE
    assert "event=transfer_submitted" in a.read_log() and "trace=" + tid in a.read_log()


def test_tokens_reach_the_daemon(make_daemon, tmp_path):
    import hashlib
    auth = tmp_path / "auth"
    auth.write_text("token sha256:%s team-py\n" % hashlib.sha256(b"py-token-123").hexdigest())
    d = make_daemon("--allow-anonymous=false", "--auth-file", str(auth))
    with client(d, token="py-token-123") as c:
        assert c.register("mine", 4096).tenant == "team-py"
    with client(d) as c, pytest.raises(mg.Error) as e:
        c.register("anon", 4096)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_the_c_example(make_daemon):
    """docs/clients.md's C example, built with the project, registers a segment."""
    import subprocess
    d = make_daemon()
    r = subprocess.run([os.path.join(conftest.BUILD, "example_register"), "unix:" + d.sock],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("segment ") and d.shm in r.stdout, r.stdout
    r = subprocess.run([os.path.join(conftest.BUILD, "example_register"), "unix:" + d.sock],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == grpc.StatusCode.ALREADY_EXISTS.value[0], (r.returncode, r.stderr)
    assert "exists" in r.stderr


def test_strided_groups_of_a_layer_major_cache(make_daemon):
    """strided(): one group names block 5 of every layer of a layer-major cache (this process's
    memory by address) and lands them side by side in an agent's memory on a peer; the READ
    back with its own strides puts them at block 2 of each layer. Each block is a request:
    statuses number it after the batch's other requests, one past the end is refused naming
    it, a group whose last offset overflows 64 bits is refused naming the group, and a group of
    count 0 adds nothing."""
    layers, blocks, blk = 4, 8, 4096
    layer = blocks * blk
    a, b = [make_daemon("--peer-tls=false", "--advertise", "127.0.0.1:{h2c_port}")
            for _ in range(2)]
    cache, peer_mem = bytearray(os.urandom(layers * layer)), bytearray(layers * blk)
    (c, _), (p, _) = mg.address_of(cache), mg.address_of(peer_mem)
    with mg.Client("unix:" + a.sock) as ca, mg.Client("unix:" + b.sock) as cb:
        cb.register_agent("strided-b")
        cb.register_memory("peer", p, len(peer_mem), remote_accessible=True)
        ca.register_memory("cache", c, len(cache))
        W, R = transfer_pb2.WRITE, transfer_pb2.READ
        batch = ca.transfer([], strided=[mg.strided(
            W, layers, blk, layer, remote_stride=blk, address=c, offset=5 * blk, peer=b.h2c,
            agent="strided-b", remote_address=p)])
        assert batch.state == transfer_pb2.DONE and batch.done == layers
        for i in range(layers):
            assert peer_mem[i * blk:(i + 1) * blk] == \
                cache[i * layer + 5 * blk:i * layer + 6 * blk]
        batch = ca.transfer([mg.read(address=c, length=16, peer=b.h2c, agent="strided-b",
                                     remote_address=p)],
                            strided=[mg.strided(R, layers, blk, layer, remote_stride=blk,
                                                address=c, offset=2 * blk, peer=b.h2c,
                                                agent="strided-b", remote_address=p),
                                     mg.strided(R, 0, blk, layer, address=c, peer=b.h2c,
                                                agent="strided-b", remote_address=p)])
        assert batch.done == 1 + layers
        for i in range(layers):
            assert cache[i * layer + 2 * blk:i * layer + 3 * blk] == \
                cache[i * layer + 5 * blk:i * layer + 6 * blk]
        # block 4 (request 5, after the read) is past the end of the cache
        with pytest.raises(mg.Error, match="request 5: ") as e:
            ca.transfer([mg.read(address=c, length=16, peer=b.h2c, agent="strided-b",
                                 remote_address=p)],
                        strided=[mg.strided(W, layers + 1, blk, layer, remote_stride=0,
                                            address=c, peer=b.h2c, agent="strided-b",
                                            remote_address=p)])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(mg.Error, match=r"strided 1: remote_offset \+ \(count - 1\) \* "
                                           r"remote_stride overflows \(count 3\)") as e:
            ca.transfer([], strided=[
                mg.strided(W, 1, blk, 0, address=c, peer=b.h2c, agent="strided-b",
                           remote_address=p),
                mg.strided(W, 3, blk, 0, remote_stride=1 << 63, address=c, peer=b.h2c,
                           agent="strided-b", remote_address=p, remote_offset=1)])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert ca.transfer([], strided=[mg.strided(W, 1, blk, 0, address=c, peer=b.h2c,
                                                   agent="strided-b",
                                                   remote_address=p)]).done == 1
