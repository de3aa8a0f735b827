"""moongate.v1.Pool with real clients: the buffer pool registered at start-up, leases acquired,
renewed, released and expired; exhaustion answered clearly; blocking acquires served first come,
first served; bytes written through a lease seen in the pool file a client maps."""
import mmap
import os
import signal
import threading
import time

import grpc
import pytest

from conftest import curl, h2c_channel
from moongate.v1 import memory_pb2, memory_pb2_grpc, pool_pb2, pool_pb2_grpc

MiB = 1 << 20


def stubs(d):
    ch = h2c_channel(d)
    return ch, pool_pb2_grpc.PoolStub(ch), memory_pb2_grpc.MemoryStub(ch)


def pool_daemon(make_daemon, *extra, size="8M"):
    return make_daemon("--pool-bytes", size, "--pool-reserve-bytes", "1M", *extra)


def stat(p):
    return p.PoolStats(pool_pb2.PoolStatsRequest()).pools[0]


def code_of(fn):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def test_lease_lifecycle_and_the_pool_file(make_daemon):
    d = pool_daemon(make_daemon)
    ch, p, m = stubs(d)
    with ch:
        st = stat(p)
        assert (st.capacity, st.reserve, st.free, st.leases) == (8 * MiB, 1 * MiB, 8 * MiB, 0)
        assert st.largest_free == st.largest_lease == 8 * MiB
        a0 = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=4096))
        st = stat(p)  # one range of 8 MiB - 4 KiB; sizes round up, so less can be leased
        assert st.largest_free == 8 * MiB - 4096 and st.largest_lease == 7 * MiB + MiB // 2
        assert st.fragmentation == 0.0
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=a0.id))
        # The default pool is a segment of no caller's: mapped once by the client through the
        # leases' path, but not reachable as a segment (its bytes hold every tenant's leases).
        for call in (lambda: m.GetSegment(memory_pb2.GetSegmentRequest(id=st.segment_id)),
                     lambda: m.UnregisterSegment(memory_pb2.UnregisterRequest(id=st.segment_id)),
                     lambda: list(m.ReadSegment(memory_pb2.ReadSegmentRequest(
                         id=st.segment_id, length=16)))):
            assert code_of(call)[0] == grpc.StatusCode.NOT_FOUND
        assert st.segment_id not in [s.id for s in m.ListSegments(
            memory_pb2.ListSegmentsRequest()).segments]

        a = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=100000, ttl_ms=60000))
        assert (a.requested, a.reserved) == (100000, 104 * 1024)  # class round-up <= 12.5%
        assert a.path == st.path and a.offset % 4096 == 0 and 0 < a.expires_in_ms <= 60000
        b = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=MiB, alignment=2 * MiB))
        assert b.offset % (2 * MiB) == 0
        assert stat(p).in_use == a.reserved + b.reserved

        # Bytes written through a lease land in the pool file at the lease's offset ...
        data = bytes(range(256)) * 390 + b"tail"
        w = m.WriteSegment(iter([memory_pb2.WriteSegmentRequest(lease_id=a.id, offset=0,
                                                                data=data)]), timeout=10)
        assert w.bytes_written == len(data)
        with open(st.path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as v:
            assert v[a.offset:a.offset + len(data)] == data
        # ... read back through the lease, bounded by its requested length.
        got = b"".join(c.data for c in m.ReadSegment(
            memory_pb2.ReadSegmentRequest(lease_id=a.id, offset=0, length=len(data))))
        assert got == data
        code, msg = code_of(lambda: m.WriteSegment(iter([memory_pb2.WriteSegmentRequest(
            lease_id=a.id, offset=99999, data=b"xy")])))
        assert code == grpc.StatusCode.OUT_OF_RANGE and "lease's 100000 bytes" in msg
        code, _ = code_of(lambda: list(m.ReadSegment(memory_pb2.ReadSegmentRequest(
            lease_id=a.id, offset=100000, length=1))))
        assert code == grpc.StatusCode.OUT_OF_RANGE

        r = p.RenewLease(pool_pb2.RenewLeaseRequest(id=a.id, ttl_ms=120000))
        assert 60000 < r.expires_in_ms <= 120000
        assert [x.id for x in p.ListLeases(pool_pb2.ListLeasesRequest()).leases] == \
            sorted([a.id, b.id])
        assert p.GetLease(pool_pb2.GetLeaseRequest(id=b.id)).requested == MiB
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=a.id))
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=b.id))
        for bad in (a.id, 12345):  # already released, unknown
            code, msg = code_of(lambda: p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=bad)))
            assert code == grpc.StatusCode.NOT_FOUND and "no lease" in msg
        st = stat(p)
        assert (st.free, st.leases, st.acquired_total, st.released_total) == (8 * MiB, 0, 3, 3)


@pytest.mark.parametrize("req,code,needle", [
    (dict(size=0), "INVALID_ARGUMENT", "size 0 must be 1.."),
    (dict(size=8 * MiB + 1), "INVALID_ARGUMENT", "the pool's lease area"),
    (dict(size=4096, alignment=3000), "INVALID_ARGUMENT", "not a power of two"),
    (dict(size=4096, ttl_ms=4000000), "INVALID_ARGUMENT", "--max-lease-ttl"),
])
def test_bad_acquires(make_daemon, req, code, needle):
    d = pool_daemon(make_daemon)
    ch, p, _ = stubs(d)
    with ch:
        c, msg = code_of(lambda: p.AcquireLease(pool_pb2.AcquireLeaseRequest(**req)))
        assert c.name == code and needle in msg
        assert stat(p).leases == 0


def test_exhaustion_names_the_numbers_and_batches_are_all_or_nothing(make_daemon):
    d = pool_daemon(make_daemon)
    ch, p, _ = stubs(d)
    with ch:
        big = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=6 * MiB))
        code, msg = code_of(lambda: p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=3 * MiB)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("cannot serve 3145728 bytes: 2097152 free, largest free range 2097152, "
                "largest lease now 2097152") in msg
        assert stat(p).exhausted_total == 1
        # A batch that does not fit takes nothing.
        code, msg = code_of(lambda: p.AcquireLeases(pool_pb2.AcquireLeasesRequest(items=[
            pool_pb2.AcquireLeaseRequest(size=MiB), pool_pb2.AcquireLeaseRequest(size=MiB),
            pool_pb2.AcquireLeaseRequest(size=MiB)])))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "item 2" in msg
        assert stat(p).leases == 1 and stat(p).free == 2 * MiB
        two = p.AcquireLeases(pool_pb2.AcquireLeasesRequest(items=[
            pool_pb2.AcquireLeaseRequest(size=MiB), pool_pb2.AcquireLeaseRequest(size=MiB)]))
        assert len(two.leases) == 2 and stat(p).free == 0
        for l in list(two.leases) + [big]:
            p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=l.id))
        assert stat(p).free == 8 * MiB
    assert d.metric("moongate_pool_lease_events_total", pool="default", event="exhausted") == 2


def wait_for(pred, what):
    deadline = time.monotonic() + 10
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_blocking_acquires_are_served_first_come_first_served(make_daemon):
    d = pool_daemon(make_daemon)
    ch, p, _ = stubs(d)
    with ch:
        held = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=7 * MiB))
        # A large request waits; a small one that would fit now must not overtake it.
        large = p.AcquireLease.future(pool_pb2.AcquireLeaseRequest(size=4 * MiB, block=True),
                                      timeout=30)
        wait_for(lambda: stat(p).waiters == 1, "the large acquire did not wait")
        small = p.AcquireLease.future(pool_pb2.AcquireLeaseRequest(size=MiB // 2, block=True),
                                      timeout=30)
        wait_for(lambda: stat(p).waiters == 2, "the small acquire did not queue")
        assert not large.done() and not small.done()
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=held.id))  # room for both, in order
        got_large = large.result(timeout=10)
        got_small = small.result(timeout=10)
        assert got_large.requested == 4 * MiB and got_small.requested == MiB // 2
        assert stat(p).waiters == 0
        for l in (got_large, got_small):
            p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=l.id))
    assert d.metric("moongate_pool_wait_seconds_count") == 2


def test_blocking_acquire_ends_at_its_deadline_or_max_wait(make_daemon):
    d = pool_daemon(make_daemon, "--max-wait", "1")
    ch, p, _ = stubs(d)
    with ch:
        held = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=8 * MiB))
        t0 = time.monotonic()
        code, _ = code_of(lambda: p.AcquireLease(
            pool_pb2.AcquireLeaseRequest(size=MiB, block=True), timeout=0.3))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 1
        code, msg = code_of(lambda: p.AcquireLease(
            pool_pb2.AcquireLeaseRequest(size=MiB, block=True)))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "--max-wait" in msg
        wait_for(lambda: stat(p).waiters == 0, "waiters left in line")
        # A waiter whose caller left never gets a lease.
        fut = p.AcquireLease.future(pool_pb2.AcquireLeaseRequest(size=MiB, block=True))
        wait_for(lambda: stat(p).waiters == 1, "no waiter")
        fut.cancel()
        wait_for(lambda: stat(p).waiters == 0, "the cancelled waiter stayed in line")
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=held.id))
        assert stat(p).leases == 0


def test_expired_leases_are_reclaimed(make_daemon):
    """A client that disappears without releasing: its lease's TTL gives the bytes back."""
    d = pool_daemon(make_daemon)
    ch, p, m = stubs(d)
    with ch:
        gone = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=2 * MiB, ttl_ms=300))
        kept = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=MiB, ttl_ms=300))
        p.RenewLease(pool_pb2.RenewLeaseRequest(id=kept.id, ttl_ms=60000))
        wait_for(lambda: stat(p).leases == 1, "the lease did not expire")
        code, _ = code_of(lambda: p.GetLease(pool_pb2.GetLeaseRequest(id=gone.id)))
        assert code == grpc.StatusCode.NOT_FOUND
        assert stat(p).expired_total == 1 and stat(p).in_use == MiB
        # A lease in use when it expires returns to the pool when that use ends.
        short = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=MiB, ttl_ms=400))
        go_on = threading.Event()

        def msgs():
            yield memory_pb2.WriteSegmentRequest(lease_id=short.id, offset=0, data=b"a")
            go_on.wait(10)
            yield memory_pb2.WriteSegmentRequest(offset=1, data=b"b")

        fut = m.WriteSegment.future(msgs(), timeout=30)
        wait_for(lambda: p.GetLease(pool_pb2.GetLeaseRequest(id=short.id)).users == 1,
                 "the write did not start using the lease")
        wait_for(lambda: stat(p).expired_total == 2, "the lease in use did not expire")
        assert stat(p).in_use == 2 * MiB  # expired, but in use: not free yet
        go_on.set()
        assert fut.result().bytes_written == 2
        wait_for(lambda: stat(p).in_use == MiB, "the expired lease was not freed after use")
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=kept.id))


def test_readable_routes_with_curl(make_daemon):
    import json
    d = pool_daemon(make_daemon)

    def req(*args):
        rc, out, err = curl("--http2-prior-knowledge", "-w", "\n%{http_code}", *args)
        assert rc == 0, err
        body, _, status = out.decode().rpartition("\n")
        return int(status), json.loads(body) if body.strip() else None

    base = "http://%s" % d.h2c
    status, got = req("-H", "content-type: application/json", "-d", '{"size": "65536"}',
                      base + "/v1/leases")
    assert status == 200 and got["reserved"] == "65536"
    status, pools = req(base + "/v1/pool")
    assert status == 200 and pools["pools"][0]["leases"] == "1"
    status, one = req(base + "/v1/leases/" + got["id"])
    assert status == 200 and one["offset"] == got["offset"]
    status, _ = req("-X", "DELETE", base + "/v1/leases/" + got["id"])
    assert status == 200
    status, err = req("-X", "DELETE", base + "/v1/leases/" + got["id"])
    assert status == 404 and "no lease" in err["message"]


def test_busy_poll_serves_calls_then_goes_quiet(make_daemon):
    """--busy-poll-us: while calls come back to back the loop polls instead of sleeping; they
    are answered as before (gRPC over the Unix socket and h2c, JSON with curl), the loop sleeps
    again once they stop, and SIGTERM still drains it."""
    import json
    from conftest import unix_channel
    d = pool_daemon(make_daemon, "--busy-poll-us", "5000")

    def cpu_seconds():
        with open("/proc/%d/stat" % d.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    for ch in (unix_channel(d), h2c_channel(d)):
        with ch:
            p = pool_pb2_grpc.PoolStub(ch)
            for i in range(300):
                a = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=4096 + i))
                assert a.requested == 4096 + i
                p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=a.id))
            assert stat(p).leases == 0
    rc, out, err = curl("--http2-prior-knowledge", "-H", "content-type: application/json",
                        "-d", '{"size": "65536"}', "http://%s/v1/leases" % d.h2c)
    assert rc == 0 and json.loads(out)["reserved"] == "65536", err
    time.sleep(0.2)
    before = cpu_seconds()
    time.sleep(2)
    # A loop that kept polling with nothing to do would have spent about 2 s of CPU here.
    assert cpu_seconds() - before < 0.5
    assert d.stop() == 0
    assert "event=drained result=clean" in d.read_log()


def test_drain_refuses_new_leases_and_revokes_the_rest(make_daemon):
    d = pool_daemon(make_daemon, "--grace", "5")
    ch, p, _ = stubs(d)
    with ch:
        p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=8 * MiB))
        waiting = p.AcquireLease.future(pool_pb2.AcquireLeaseRequest(size=MiB, block=True))
        wait_for(lambda: stat(p).waiters == 1, "no waiter")
        d.proc.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as e:
            waiting.result(timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "draining" in e.value.details()
    assert d.proc.wait(20) == 0
    log = d.read_log()
    assert "leases_revoked pool=default count=1" in log


def test_no_pool_and_a_pool_that_cannot_be_registered(make_daemon, tmp_path):
    import subprocess
    from conftest import MOONGATE
    d = make_daemon()  # the tests' default: --pool-bytes 0
    ch, p, _ = stubs(d)
    with ch:
        code, msg = code_of(lambda: p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=4096)))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "--pool-bytes 0" in msg
    r = subprocess.run([MOONGATE, "--pool-bytes", "64M", "--max-registered-bytes", "32M",
                        "--shm-dir", str(tmp_path / "shm"), "--listen", "127.0.0.1:0",
                        "--ops-listen", "", "--unix-socket", "", "--data-listen", ""],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "start_failed pool=default" in r.stderr and "registered-bytes limit" in r.stderr


def test_overflow_register_is_bounded_counted_and_logged(make_daemon):
    """--pool-overflow register: a lease the pool cannot serve gets its own region — never
    silently: counted, bounded by --pool-overflow-max-bytes, logged — and the region goes when
    the lease does."""
    d = make_daemon("--pool-bytes", "4M", "--pool-reserve-bytes", "0", "--pool-overflow",
                    "register", "--pool-overflow-max-bytes", "8M")
    ch, p, m = stubs(d)
    with ch:
        inside = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=3 * MiB))
        over = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=3 * MiB + 1))
        pool_seg = stat(p).segment_id
        assert over.segment_id != pool_seg and over.offset == 0
        assert over.requested == 3 * MiB + 1 and over.reserved == 3 * MiB + 4096
        assert os.path.exists(over.path) and over.path != inside.path
        st = stat(p)
        assert (st.overflow_total, st.overflow_bytes, st.leases) == (1, 3 * MiB + 4096, 2)
        assert st.exhausted_total == 1
        # Usable like any lease.
        m.WriteSegment(iter([memory_pb2.WriteSegmentRequest(lease_id=over.id, offset=3 * MiB,
                                                            data=b"x")]))
        with open(over.path, "rb") as f:
            f.seek(3 * MiB)
            assert f.read(1) == b"x"
        # Beyond the overflow budget: refused, saying so.
        code, msg = code_of(lambda: p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=5 * MiB)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--pool-overflow-max-bytes 8388608" in msg
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=over.id))
        wait_for(lambda: not os.path.exists(over.path), "the overflow region stayed")
        assert stat(p).overflow_bytes == 0
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=inside.id))
    assert d.metric("moongate_pool_lease_events_total", pool="default", event="overflow") == 1
    assert d.read_log().count("event=pool_overflow") == 1
    assert d.metric("moongate_segments", state="ready") == 1  # the pool alone


def test_bad_overflow_flag_is_a_configuration_error():
    import subprocess
    from conftest import MOONGATE
    r = subprocess.run([MOONGATE, "--pool-overflow", "sometimes"], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 2 and "--pool-overflow takes refuse or register" in r.stderr


def test_tenant_pools(make_daemon):
    """--tenant-pool: a tenant's leases come from its own pool (anonymous callers are tenant
    "default"), listed beside the default pool; other tenants' pools are not listed."""
    d = make_daemon("--pool-bytes", "8M", "--pool-reserve-bytes", "1M", "--tenant-pool",
                    "default=4M,team-b=1M")
    ch, p, m = stubs(d)
    with ch:
        pools = {x.name: x for x in p.PoolStats(pool_pb2.PoolStatsRequest()).pools}
        assert set(pools) == {"default", "tenant.default"}
        assert (pools["tenant.default"].capacity, pools["tenant.default"].reserve) == (4 * MiB, 0)
        own = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=MiB))
        assert own.pool == "tenant.default"
        assert own.segment_id == pools["tenant.default"].segment_id
        code, msg = code_of(lambda: p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=5 * MiB)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "lease area" in msg
        m.WriteSegment(iter([memory_pb2.WriteSegmentRequest(lease_id=own.id, data=b"mine")]))
        with open(own.path, "rb") as f:
            f.seek(own.offset)
            assert f.read(4) == b"mine"
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=own.id))
        names = sorted(s.name for s in m.ListSegments(memory_pb2.ListSegmentsRequest()).segments)
        assert names == ["pool.tenant.default"]  # team-b's is team-b's, the default pool no one's
    assert d.metric("moongate_pool_leases", pool="tenant.default") == 0
    assert d.metric("moongate_pool_lease_events_total", pool="tenant.default",
                    event="acquired") == 1


def test_fragmentation_metric_is_each_pools_own(make_daemon):
    """moongate_pool_fragmentation of each pool is made of that pool's figures, as PoolStats
    gives it: a hole in the default pool shows there, and not in a tenant's pool listed after."""
    d = make_daemon("--pool-bytes", "8M", "--tenant-pool", "team-b=4M")
    ch, p, _ = stubs(d)
    with ch:
        a, b, c = (p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=MiB)) for _ in range(3))
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=b.id))  # a hole between a and c
        st = stat(p)
        assert st.name == "default" and 0 < st.fragmentation < 1
        assert d.metric("moongate_pool_fragmentation", pool="default") == pytest.approx(
            st.fragmentation)
        assert d.metric("moongate_pool_fragmentation", pool="tenant.team-b") == 0
        for x in (a, c):
            p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=x.id))


def test_status_page_shows_no_tenant_pool(make_daemon):
    """The open ops port's /status.json shows the shared default pool only: a tenant pool's
    name, usage and leases are that tenant's (PoolStats shows them to it and to admins)."""
    import json
    d = make_daemon("--pool-bytes", "8M", "--tenant-pool", "default=4M,team-b=1M")
    ch, p, m = stubs(d)
    with ch:
        own = p.AcquireLease(pool_pb2.AcquireLeaseRequest(size=MiB))
        assert own.pool == "tenant.default"
        text = d.ops_get("/status.json")[1]
        status = json.loads(text)
        assert [x["name"] for x in status["pools"]] == ["default"]
        assert status["pools"][0]["in_use"] == 0 and status["leases"]["live"] == 0
        assert "tenant" not in text and "team-b" not in text, text
        p.ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=own.id))


@pytest.mark.parametrize("value,needle", [
    ("nobytes", "is not TENANT=BYTES"),
    ("a=1M,a=2M", "has two pools"),
    ("a b=1M", "is not [A-Za-z0-9._:-]"),
    ("a=1000", "multiple of 4096"),
])
def test_bad_tenant_pool_flags(value, needle):
    import subprocess
    from conftest import MOONGATE
    r = subprocess.run([MOONGATE, "--tenant-pool", value], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 2 and needle in r.stderr
