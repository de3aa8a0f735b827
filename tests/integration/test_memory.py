"""moongate.v1.Memory with real clients: register anon and shm segments, map the returned file
from the test, list, get, unregister; every bad input answered with the right code and nothing
left behind (segment count, registered bytes and files return to zero)."""
import json
import mmap
import os
import stat

import grpc
import pytest

from conftest import curl, h2c_channel, unix_channel
from moongate.v1 import memory_pb2, memory_pb2_grpc

ANON = memory_pb2.ANON
SHM = memory_pb2.SHM


def stub(d):
    ch = h2c_channel(d)
    return ch, memory_pb2_grpc.MemoryStub(ch)


def nothing_left(d):
    assert d.metric("moongate_segments", state="ready") == 0
    assert d.metric("moongate_segments", state="registering") == 0
    assert d.metric("moongate_registered_bytes") == 0
    assert [f for f in os.listdir(d.shm) if f.startswith("moongate-seg-")] == []


def wait_held(dbg, n, debug_pb2, after_map=False):
    """Waits until n jobs are held on their workers (Debug/HoldRegistrations)."""
    import time
    deadline = time.monotonic() + 10
    while dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=True, after_map=after_map)).held < n:
        assert time.monotonic() < deadline, "registrations did not reach their workers"
        time.sleep(0.01)


def test_anon_segment_is_shared_memory(make_daemon):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="kv-blocks", size=3 * 4096 + 7, prefault=True), timeout=10).segment
        assert seg.id != 0 and seg.state == memory_pb2.READY
        assert (seg.name, seg.tenant, seg.size, seg.location) == ("kv-blocks", "default",
                                                                   3 * 4096 + 7, "cpu:0")
        assert list(seg.transports) == []  # not remote-accessible: no transport record
        assert os.path.dirname(seg.path) == d.shm
        st = os.stat(seg.path)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == seg.size
        # A local client maps the returned file: those are the segment's bytes.
        with open(seg.path, "r+b") as f, mmap.mmap(f.fileno(), seg.size) as view:
            view[4096:4101] = b"hello"
            assert view[4096:4101] == b"hello"
        assert m.GetSegment(memory_pb2.GetSegmentRequest(id=seg.id)).name == "kv-blocks"
        assert d.metric("moongate_registered_bytes") == seg.size
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id), timeout=10)
        assert not os.path.exists(seg.path)
        with pytest.raises(grpc.RpcError) as e:
            m.GetSegment(memory_pb2.GetSegmentRequest(id=seg.id))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    nothing_left(d)


def test_remote_accessible_segment_has_a_tcp_record(make_daemon):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="shared", size=4096, remote_accessible=True), timeout=10).segment
        assert seg.remote_accessible and list(seg.transports) == ["tcp"]
        assert list(m.GetSegment(memory_pb2.GetSegmentRequest(id=seg.id)).transports) == ["tcp"]
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    nothing_left(d)


def test_shm_segment_from_a_client_file(make_daemon):
    """A local client registers its own file by name over the Unix socket (the daemon knows its
    uid there); over TCP the same call is PERMISSION_DENIED: nothing proves who owns the file."""
    d = make_daemon()
    path = os.path.join(d.shm, "client.buf")
    with open(path, "wb") as f:
        f.write(b"x" * 8192)
    ch, m = stub(d)
    with ch:
        with pytest.raises(grpc.RpcError) as e:
            m.RegisterSegment(memory_pb2.RegisterRequest(
                name="client", source=SHM, shm_file="client.buf"), timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "only for its owner" in e.value.details()
    ch = unix_channel(d)
    m = memory_pb2_grpc.MemoryStub(ch)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="client", source=SHM, shm_file="client.buf"), timeout=10).segment
        assert seg.size == 8192 and seg.path == path and seg.source == SHM
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id), timeout=10)
    assert os.path.exists(path)  # the client's file is the client's
    nothing_left(d)


def test_list_pages(make_daemon):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        ids = {m.RegisterSegment(memory_pb2.RegisterRequest(name="s%d" % i, size=4096)).segment.id
               for i in range(5)}
        seen, token = [], ""
        while True:
            page = m.ListSegments(memory_pb2.ListSegmentsRequest(page_size=2, page_token=token))
            seen += [s.id for s in page.segments]
            assert len(page.segments) <= 2
            token = page.next_page_token
            if not token:
                break
        assert seen == sorted(ids)
        with pytest.raises(grpc.RpcError) as e:
            m.ListSegments(memory_pb2.ListSegmentsRequest(page_token="bogus"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for i in ids:
            m.UnregisterSegment(memory_pb2.UnregisterRequest(id=i))
    nothing_left(d)


@pytest.mark.parametrize("req,code,needle", [
    (dict(name="z", size=0), "INVALID_ARGUMENT", "size must be greater than 0"),
    (dict(name="bad name", size=4096), "INVALID_ARGUMENT", "name must be"),
    (dict(name="loc", size=4096, location="gpu:0"), "INVALID_ARGUMENT", "cpu:N"),
    (dict(name="m", source=SHM, shm_file="missing"), "INVALID_ARGUMENT", "cannot open missing"),
    (dict(name="m", source=SHM, shm_file="../../etc/passwd"), "INVALID_ARGUMENT", "shm file"),
    (dict(name="l", source=SHM, shm_file="link"), "PERMISSION_DENIED", "symbolic link"),
    (dict(name="s", source=SHM, shm_file="short", size=1 << 20), "INVALID_ARGUMENT",
     "fewer than"),
    (dict(name="big", size=1 << 40), "RESOURCE_EXHAUSTED", "registered-bytes limit"),
])
def test_bad_registrations(make_daemon, req, code, needle):
    d = make_daemon("--max-registered-bytes", "64M")
    os.symlink("/etc/hostname", os.path.join(d.shm, "link"))
    with open(os.path.join(d.shm, "short"), "wb") as f:
        f.write(b"y" * 100)
    ch = unix_channel(d)  # files are registered by name on the Unix socket only
    m = memory_pb2_grpc.MemoryStub(ch)
    with ch:
        with pytest.raises(grpc.RpcError) as e:
            m.RegisterSegment(memory_pb2.RegisterRequest(**req), timeout=10)
        assert e.value.code().name == code
        assert needle in e.value.details()
    nothing_left(d)


def test_duplicate_name_and_unknown_id(make_daemon):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="dup", size=4096)).segment
        with pytest.raises(grpc.RpcError) as e:
            m.RegisterSegment(memory_pb2.RegisterRequest(name="dup", size=4096))
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS and "dup" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id ^ 1))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
        with pytest.raises(grpc.RpcError) as e:
            m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    nothing_left(d)


def test_json_with_curl(make_daemon):
    d = make_daemon()

    def call(method, body):
        rc, out, err = curl("--http2-prior-knowledge", "-H", "content-type: application/json",
                            "-d", body, "-w", "\n%{http_code}",
                            "http://%s/moongate.v1.Memory/%s" % (d.h2c, method))
        text, _, code = out.decode().rpartition("\n")
        return int(code), json.loads(text)

    code, body = call("RegisterSegment", '{"name": "from-curl", "size": "65536"}')
    assert code == 200 and body["segment"]["size"] == "65536"
    assert body["segment"]["source"] == "ANON" and body["segment"]["state"] == "READY"
    sid = body["segment"]["id"]
    code, body = call("ListSegments", "{}")
    assert code == 200 and [s["id"] for s in body["segments"]] == [sid]
    code, body = call("UnregisterSegment", '{"id": "%s"}' % sid)
    assert code == 200
    code, body = call("GetSegment", '{"id": "%s"}' % sid)
    assert code == 404 and body["code"] == 5
    nothing_left(d)


def test_daemon_removes_its_files_on_exit_and_at_start(make_daemon):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="left", size=4096)).segment
    assert os.path.exists(seg.path)
    assert d.stop() == 0
    assert not os.path.exists(seg.path)  # a clean exit removes what the daemon created
    # A file an earlier daemon left (it crashed) is removed by the next one on the same dir.
    stale = os.path.join(d.shm, "moongate-seg-00000000deadbeef")
    with open(stale, "wb") as f:
        f.write(b"z" * 4096)
    d2 = make_daemon("--shm-dir", d.shm)
    assert not os.path.exists(stale)
    nothing_left(d2)


def test_held_registration_does_not_block_the_daemon(make_daemon):
    """The non-blocking guarantee, without timings: registrations are held on their workers
    (Debug/HoldRegistrations) while the test checks that health, listing and another
    registration are all answered; then they are released and complete."""
    from mgstd import health_pb2, health_pb2_grpc
    from moongate.v1 import debug_pb2, debug_pb2_grpc
    d = make_daemon("--workers", "2")
    ch, m = stub(d)
    with ch:
        dbg = debug_pb2_grpc.DebugStub(ch)
        health = health_pb2_grpc.HealthStub(ch)
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=True))
        first = m.RegisterSegment.future(memory_pb2.RegisterRequest(
            name="big", size=64 << 20, prefault=True), timeout=60)
        wait_held(dbg, 1, debug_pb2)
        # The first registration is on a worker, held. The daemon answers everything else.
        for _ in range(10):
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
                health_pb2.HealthCheckResponse.SERVING
        listed = m.ListSegments(memory_pb2.ListSegmentsRequest(), timeout=5).segments
        assert [(s.name, s.state) for s in listed] == [("big", memory_pb2.REGISTERING)]
        second = m.RegisterSegment.future(memory_pb2.RegisterRequest(name="small", size=4096),
                                          timeout=60)
        wait_held(dbg, 2, debug_pb2)
        assert not first.done() and not second.done()
        assert dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=False)).held == 2
        assert first.result(timeout=60).segment.state == memory_pb2.READY
        assert second.result(timeout=60).segment.size == 4096
        for s in m.ListSegments(memory_pb2.ListSegmentsRequest()).segments:
            m.UnregisterSegment(memory_pb2.UnregisterRequest(id=s.id))
    nothing_left(d)


def wait_log(d, needle):
    import time
    deadline = time.monotonic() + 10
    while needle not in d.read_log():
        assert time.monotonic() < deadline, "no %r in the log" % needle
        time.sleep(0.02)


def wait_metric(d, value, name, **labels):
    import time
    deadline = time.monotonic() + 10
    while d.metric(name, **labels) != value:
        assert time.monotonic() < deadline, "%s%r is %r, not %r" % (
            name, labels, d.metric(name, **labels), value)
        time.sleep(0.02)


def test_registration_of_a_caller_gone_is_cancelled(make_daemon):
    """A caller that leaves while its registration waits on a worker: the job stops before
    mapping (CANCELLED), and nothing is left."""
    from moongate.v1 import debug_pb2, debug_pb2_grpc
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        dbg = debug_pb2_grpc.DebugStub(ch)
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=True))
        fut = m.RegisterSegment.future(memory_pb2.RegisterRequest(name="gone", size=1 << 20))
        wait_held(dbg, 1, debug_pb2)
        fut.cancel()
        wait_log(d, "path=/moongate.v1.Memory/RegisterSegment")  # the daemon saw it go
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=False))
        wait_metric(d, 1, "moongate_segment_registration_failures_total", grpc_code="CANCELLED")
        wait_metric(d, 0, "moongate_registered_bytes")
        assert list(m.ListSegments(memory_pb2.ListSegmentsRequest()).segments) == []
        assert "segment_rolled_back" not in d.read_log()  # it never got mapped
        # A batch whose caller leaves: every held item stops.
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=True))
        fut = m.RegisterSegments.future(memory_pb2.RegisterSegmentsRequest(items=[
            memory_pb2.RegisterRequest(name="b%d" % i, size=1 << 20) for i in range(3)]))
        wait_held(dbg, 3, debug_pb2)
        fut.cancel()
        wait_log(d, "path=/moongate.v1.Memory/RegisterSegments")
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=False))
        wait_metric(d, 4, "moongate_segment_registration_failures_total", grpc_code="CANCELLED")
    nothing_left(d)


def test_registration_that_finished_for_a_caller_gone_is_undone(make_daemon):
    """The caller leaves after its segment was mapped, before the answer: the segment is
    unregistered again, nothing is left."""
    from moongate.v1 import debug_pb2, debug_pb2_grpc
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        dbg = debug_pb2_grpc.DebugStub(ch)
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=True, after_map=True))
        fut = m.RegisterSegment.future(memory_pb2.RegisterRequest(name="late", size=1 << 20))
        wait_held(dbg, 1, debug_pb2, after_map=True)
        fut.cancel()
        wait_log(d, "path=/moongate.v1.Memory/RegisterSegment")
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=False))
        wait_log(d, "segment_rolled_back")
        wait_metric(d, 0, "moongate_registered_bytes")
        assert list(m.ListSegments(memory_pb2.ListSegmentsRequest()).segments) == []
    nothing_left(d)


def test_batch_register_and_unregister(make_daemon):
    d = make_daemon("--max-batch", "8")
    ch, m = stub(d)
    with ch:
        items = [memory_pb2.RegisterRequest(name="b%d" % i, size=4096 * (i + 1), prefault=True)
                 for i in range(5)]
        items.insert(2, memory_pb2.RegisterRequest(name="bad", size=0))        # fails alone
        items.insert(4, memory_pb2.RegisterRequest(name="b0", size=4096))      # name taken
        r = m.RegisterSegments(memory_pb2.RegisterSegmentsRequest(items=items), timeout=30)
        codes = [x.status.code for x in r.results]
        assert codes == [0, 0, 3, 0, 6, 0, 0]
        assert "size must be greater than 0" in r.results[2].status.message
        assert not r.results[2].HasField("segment")
        ok = [x.segment for x in r.results if x.status.code == 0]
        assert [s.name for s in ok] == ["b0", "b1", "b2", "b3", "b4"]
        assert all(os.path.exists(s.path) for s in ok)
        assert d.metric("moongate_segments", state="ready") == 5
        assert d.metric("moongate_registered_bytes") == sum(s.size for s in ok)
        ids = [s.id for s in ok] + [12345]
        u = m.UnregisterSegments(memory_pb2.UnregisterSegmentsRequest(ids=ids), timeout=30)
        assert [x.code for x in u.results] == [0, 0, 0, 0, 0, 5]
        assert not any(os.path.exists(s.path) for s in ok)
        # Over --max-batch: refused whole, nothing registered.
        with pytest.raises(grpc.RpcError) as e:
            m.RegisterSegments(memory_pb2.RegisterSegmentsRequest(
                items=[memory_pb2.RegisterRequest(name="x%d" % i, size=4096)
                       for i in range(9)]))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max-batch 8" in e.value.details()
    nothing_left(d)


def test_batch_items_run_in_parallel_on_the_workers(make_daemon):
    """With two workers, two items of one batch are on workers at the same time."""
    from moongate.v1 import debug_pb2, debug_pb2_grpc
    d = make_daemon("--workers", "2")
    ch, m = stub(d)
    with ch:
        dbg = debug_pb2_grpc.DebugStub(ch)
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=True))
        fut = m.RegisterSegments.future(memory_pb2.RegisterSegmentsRequest(items=[
            memory_pb2.RegisterRequest(name="p%d" % i, size=1 << 20) for i in range(4)]),
            timeout=60)
        wait_held(dbg, 2, debug_pb2)
        assert dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=False)).held == 2
        r = fut.result(timeout=60)
        assert [x.status.code for x in r.results] == [0, 0, 0, 0]
        m.UnregisterSegments(memory_pb2.UnregisterSegmentsRequest(
            ids=[x.segment.id for x in r.results]))
    nothing_left(d)


def test_concurrent_batches(make_daemon):
    """Six clients register overlapping batches at once: every name is won by exactly one
    item, the others get ALREADY_EXISTS, the registry agrees, and unregistering all of it from
    six clients at once leaves nothing."""
    from concurrent.futures import ThreadPoolExecutor
    d = make_daemon("--workers", "2")

    def register(k):
        ch, m = stub(d)
        with ch:
            items = [memory_pb2.RegisterRequest(name="n%d" % ((k * 5 + i) % 20),
                                                size=4096 * (1 + i), prefault=True)
                     for i in range(10)]
            return m.RegisterSegments(memory_pb2.RegisterSegmentsRequest(items=items),
                                      timeout=60).results

    with ThreadPoolExecutor(6) as pool:
        results = [r for rs in pool.map(register, range(6)) for r in rs]
    won = [r.segment for r in results if r.status.code == 0]
    lost = [r for r in results if r.status.code != 0]
    assert sorted(s.name for s in won) == sorted("n%d" % i for i in range(20))
    assert all(r.status.code == grpc.StatusCode.ALREADY_EXISTS.value[0] for r in lost)
    assert len(won) + len(lost) == 60
    ch, m = stub(d)
    with ch:
        listed = m.ListSegments(memory_pb2.ListSegmentsRequest(page_size=100)).segments
        assert sorted(s.id for s in listed) == sorted(s.id for s in won)
    assert d.metric("moongate_registered_bytes") == sum(s.size for s in won)

    def unregister(k):
        ch, m = stub(d)
        with ch:
            ids = [s.id for s in won[k::6]]
            return m.UnregisterSegments(memory_pb2.UnregisterSegmentsRequest(ids=ids),
                                        timeout=60).results

    with ThreadPoolExecutor(6) as pool:
        codes = [r.code for rs in pool.map(unregister, range(6)) for r in rs]
    assert codes == [0] * 20
    nothing_left(d)


def test_retry_with_the_same_request_id_returns_the_first_segment(make_daemon):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        req = memory_pb2.RegisterRequest(name="idem", size=8192, request_id="c1-0001")
        first = m.RegisterSegment(req, timeout=10).segment
        again = m.RegisterSegment(req, timeout=10).segment
        assert again.id == first.id and again.path == first.path
        assert d.metric("moongate_segments", state="ready") == 1
        with pytest.raises(grpc.RpcError) as e:
            m.RegisterSegment(memory_pb2.RegisterRequest(name="other", size=8192,
                                                         request_id="c1-0001"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=first.id))
    nothing_left(d)


def test_registration_metrics(make_daemon):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="m1", size=4096)).segment
        for bad in (dict(name="m2", size=0), dict(name="m1", size=4096)):
            with pytest.raises(grpc.RpcError):
                m.RegisterSegment(memory_pb2.RegisterRequest(**bad))
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    assert d.metric("moongate_segment_registrations_total") == 1
    assert d.metric("moongate_segment_unregistrations_total") == 1
    assert d.metric("moongate_segment_registrations_in_flight") == 0
    assert d.metric("moongate_segment_registration_failures_total",
                    grpc_code="INVALID_ARGUMENT") == 1
    assert d.metric("moongate_segment_registration_failures_total",
                    grpc_code="ALREADY_EXISTS") == 1
    assert d.metric("moongate_segment_registration_seconds_count") == 1
    nothing_left(d)


def test_readable_routes_with_curl(make_daemon):
    d = make_daemon()
    base = "http://%s/v1/segments" % d.h2c

    def req(*args):
        rc, out, err = curl("--http2-prior-knowledge", "-w", "\n%{http_code}", *args)
        assert rc == 0, err
        text, _, code = out.decode().rpartition("\n")
        return int(code), json.loads(text) if text.strip().startswith("{") else text

    code, body = req("-d", '{"name": "via-route", "size": "4096"}', base)
    assert code == 200 and body["segment"]["name"] == "via-route"
    sid = body["segment"]["id"]
    req("-d", '{"name": "second", "size": "4096"}', base)
    code, body = req(base + "?page_size=1")
    assert code == 200 and len(body["segments"]) == 1 and body["nextPageToken"]
    code, body = req(base + "?page_size=1&page_token=" + body["nextPageToken"])
    assert code == 200 and len(body["segments"]) == 1 and body["nextPageToken"] == ""
    code, body = req(base + "/" + sid)
    assert code == 200 and body["name"] == "via-route"
    code, body = req("-X", "DELETE", base + "/" + sid)
    assert code == 200
    code, body = req(base + "/" + sid)
    assert code == 404 and body["code"] == 5
    code, body = req("-X", "PUT", base)
    assert code == 501 and body["code"] == 12
    code, body = req(base + "?page_size=lots")
    assert code == 400 and "page_size" in body["message"]
    code, body = req(base + "/not-a-number")
    assert code == 400 and body["code"] == 3
    code, _ = req("-X", "DELETE", base)  # deleting the collection is not a route
    assert code == 501
    for s in req(base)[1]["segments"]:
        req("-X", "DELETE", base + "/" + s["id"])
    nothing_left(d)


def test_read_segment_inline(make_daemon):
    # the daemon queues at most 64 KiB of a call's answer, so a read the client does not take
    # stays open (see the held read below)
    d = make_daemon("--max-conn-output-bytes", "64K")
    ch, m = stub(d)
    size = 3 * (1 << 20) + 123
    pattern = bytes((i * 7 + 3) & 0xff for i in range(size))
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="rd", size=size)).segment
        with open(seg.path, "r+b") as f, mmap.mmap(f.fileno(), size) as view:
            view[:] = pattern
        chunks = list(m.ReadSegment(memory_pb2.ReadSegmentRequest(id=seg.id), timeout=30))
        assert b"".join(c.data for c in chunks) == pattern
        assert [c.offset for c in chunks] == [i << 20 for i in range(4)]  # 1 MiB chunks
        part = list(m.ReadSegment(memory_pb2.ReadSegmentRequest(
            id=seg.id, offset=1000, length=5000, chunk_bytes=2048), timeout=30))
        assert [len(c.data) for c in part] == [2048, 2048, 904]
        assert b"".join(c.data for c in part) == pattern[1000:6000]
        # A read in progress holds the segment. The reader's channel keeps a small window and
        # does not grow it, and the daemon queues 64 KiB: the 800-chunk stream stays open
        # however fast the daemon is.
        slow = grpc.insecure_channel(d.h2c, options=[("grpc.http2.bdp_probe", 0),
                                                     ("grpc.http2.lookahead_bytes", 16384)])
        stream = memory_pb2_grpc.MemoryStub(slow).ReadSegment(
            memory_pb2.ReadSegmentRequest(id=seg.id, chunk_bytes=4096), timeout=30)
        next(stream)
        with pytest.raises(grpc.RpcError) as e:
            m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "held by 1" in e.value.details()
        assert "the latest: ReadSegment by 127.0.0.1:" in e.value.details()
        stream.cancel()
        slow.close()
        import time
        deadline = time.monotonic() + 10
        while True:  # the cancelled read lets go of the segment
            try:
                m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert time.monotonic() < deadline
                time.sleep(0.02)
    nothing_left(d)


@pytest.mark.parametrize("req,code", [
    (dict(offset=8193), "OUT_OF_RANGE"),
    (dict(offset=1, length=2**64 - 1), "OUT_OF_RANGE"),   # offset + length would wrap
    (dict(offset=8000, length=193), "OUT_OF_RANGE"),
    (dict(chunk_bytes=2**31), "INVALID_ARGUMENT"),
    (dict(id=1), "NOT_FOUND"),
])
def test_read_segment_bad_requests(make_daemon, req, code):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="rb", size=8192)).segment
        args = dict(id=seg.id)
        args.update(req)
        with pytest.raises(grpc.RpcError) as e:
            list(m.ReadSegment(memory_pb2.ReadSegmentRequest(**args), timeout=10))
        assert e.value.code().name == code
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    nothing_left(d)


def write_msgs(seg_id, offset, data, chunk=1 << 20):
    """WriteSegmentRequests for `data` at `offset`, `chunk` bytes each; only the first names
    the segment."""
    for i in range(0, max(len(data), 1), chunk):
        yield memory_pb2.WriteSegmentRequest(id=seg_id if i == 0 else 0, offset=offset + i,
                                             data=data[i:i + chunk])


def test_write_segment_inline(make_daemon):
    d = make_daemon()
    ch, m = stub(d)
    size = 5 * (1 << 20) + 4097
    pattern = bytes((i * 13 + 5) & 0xff for i in range(size))
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="wr", size=size)).segment
        resp = m.WriteSegment(write_msgs(seg.id, 0, pattern), timeout=30)
        assert (resp.bytes_written, resp.chunks) == (size, 6)
        # The bytes are in the segment's memory, as a local client mapping it sees them ...
        with open(seg.path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as v:
            assert v[:] == pattern
        # ... and as ReadSegment returns them.
        got = b"".join(c.data for c in m.ReadSegment(
            memory_pb2.ReadSegmentRequest(id=seg.id), timeout=30))
        assert got == pattern
        # Chunks may go anywhere, in any order; each names its offset. Every message may
        # repeat the id.
        msgs = [memory_pb2.WriteSegmentRequest(id=seg.id, offset=size - 3, data=b"END"),
                memory_pb2.WriteSegmentRequest(id=seg.id, offset=10, data=b"ten"),
                memory_pb2.WriteSegmentRequest(offset=20, data=b"")]
        resp = m.WriteSegment(iter(msgs), timeout=10)
        assert (resp.bytes_written, resp.chunks) == (6, 3)
        part = list(m.ReadSegment(memory_pb2.ReadSegmentRequest(id=seg.id, offset=10,
                                                                length=3)))
        assert part[0].data == b"ten"
        tail = list(m.ReadSegment(memory_pb2.ReadSegmentRequest(id=seg.id, offset=size - 3)))
        assert tail[0].data == b"END"
        assert d.metric("moongate_segment_inline_bytes_total", op="write") == size + 6
        assert d.metric("moongate_segment_write_queued_bytes") == 0
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    nothing_left(d)


@pytest.mark.parametrize("msgs,code,needle,written", [
    # the first message must name the segment
    ([dict(offset=0, data=b"a")], "INVALID_ARGUMENT", "must name the segment", 0),
    ([dict(id=999999, data=b"a")], "NOT_FOUND", "no segment 999999", 0),
    # bounds, without overflow: offset + length past the end, or wrapping around 2^64
    ([dict(id="S", offset=8190, data=b"abc")], "OUT_OF_RANGE", "outside the segment", 0),
    ([dict(id="S", offset=2**64 - 2, data=b"abc")], "OUT_OF_RANGE", "outside the segment", 0),
    ([dict(id="S", offset=8193, data=b"")], "OUT_OF_RANGE", "outside the segment", 0),
    # a later message naming another segment; the chunk before it stays written
    ([dict(id="S", offset=0, data=b"keep"), dict(id=12345, offset=4, data=b"x")],
     "INVALID_ARGUMENT", "message 2 names segment 12345", 4),
    ([dict(id="S", offset=0, data=b"keep"), dict(offset=9000, data=b"x")],
     "OUT_OF_RANGE", "message 2", 4),
    ([], "INVALID_ARGUMENT", "at least one message", 0),
])
def test_write_segment_bad_requests(make_daemon, msgs, code, needle, written):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="wb", size=8192)).segment
        reqs = [memory_pb2.WriteSegmentRequest(**dict(x, id=seg.id) if x.get("id") == "S"
                                               else x) for x in msgs]
        with pytest.raises(grpc.RpcError) as e:
            m.WriteSegment(iter(reqs), timeout=10)
        assert e.value.code().name == code
        assert needle in e.value.details()
        with open(seg.path, "rb") as f:
            assert f.read(4) == (b"keep" if written else b"\0" * 4)
        # The daemon still serves, and the failed write let go of the segment.
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    nothing_left(d)
    assert d.metric("moongate_segment_write_queued_bytes") == 0


def test_write_segment_undecodable_message(make_daemon):
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="wu", size=4096)).segment
        raw = ch.stream_unary("/moongate.v1.Memory/WriteSegment",
                              request_serializer=lambda b: b,
                              response_deserializer=memory_pb2.WriteSegmentResponse.FromString)
        with pytest.raises(grpc.RpcError) as e:
            raw(iter([b"\x0a\xff\xff"]), timeout=10)  # field 1 as a truncated length
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a WriteSegmentRequest" in e.value.details()
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    nothing_left(d)


def test_write_in_progress_holds_the_segment(make_daemon):
    import threading
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="wh", size=4096)).segment
        go_on = threading.Event()

        def msgs():
            yield memory_pb2.WriteSegmentRequest(id=seg.id, offset=0, data=b"first")
            go_on.wait(10)
            yield memory_pb2.WriteSegmentRequest(offset=5, data=b"second")

        fut = m.WriteSegment.future(msgs(), timeout=30)
        import time
        deadline = time.monotonic() + 10
        # Once the first message is applied, the write holds the segment.
        while m.GetSegment(memory_pb2.GetSegmentRequest(id=seg.id)).holders != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(grpc.RpcError) as e:
            m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "held by 1" in e.value.details()
        assert "the latest: WriteSegment by 127.0.0.1:" in e.value.details()
        go_on.set()
        assert fut.result().bytes_written == 11
        with open(seg.path, "rb") as f:
            assert f.read(11) == b"firstsecond"
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    nothing_left(d)


def test_a_fast_writer_waits_for_the_workers(make_daemon):
    """Flow control: while the workers are held, the daemon takes in at most about one stream
    window beyond the message on the worker, and the writer waits; released, all of it lands."""
    import time
    from moongate.v1 import debug_pb2, debug_pb2_grpc
    d = make_daemon("--debug-service", "--stream-window-bytes", "1M")
    ch, m = stub(d)
    dbg = debug_pb2_grpc.DebugStub(ch)
    chunk, total = 256 << 10, 32 << 20
    data = bytes((i * 31) & 0xff for i in range(total))
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="wf", size=total)).segment
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=True))
        sent = [0]

        def msgs():
            for r in write_msgs(seg.id, 0, data, chunk):
                yield r
                sent[0] += 1

        fut = m.WriteSegment.future(msgs(), timeout=60)
        wait_held(dbg, 1, debug_pb2)
        # Let the client push as much as the daemon takes, until the queue stops growing.
        last, stable_since = -1, time.monotonic()
        while time.monotonic() - stable_since < 0.5:
            q = d.metric("moongate_segment_write_queued_bytes")
            if q != last:
                last, stable_since = q, time.monotonic()
            time.sleep(0.05)
        assert 0 < last <= chunk + (1 << 20) + chunk  # on the worker + one window (+ framing)
        assert sent[0] < total // chunk  # the writer is waiting
        assert not fut.done()
        dbg.HoldRegistrations(debug_pb2.HoldRequest(hold=False))
        assert fut.result().bytes_written == total
        with open(seg.path, "rb") as f:
            assert f.read() == data
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    nothing_left(d)
    assert d.metric("moongate_segment_write_queued_bytes") == 0


def test_memlock_beyond_the_limit_is_a_clear_error(make_daemon):
    """Root bypasses RLIMIT_MEMLOCK through CAP_IPC_LOCK: the daemon runs without it, under a
    1 MiB limit, and --memlock require as its default."""
    from moongate.v1 import daemon_pb2, daemon_pb2_grpc
    d = make_daemon("--memlock", "require",
                    wrap=["prlimit", "--memlock=1048576", "setpriv", "--bounding-set=-ipc_lock",
                          "--inh-caps=-ipc_lock", "--"])
    ch, m = stub(d)
    with ch:
        info = daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest())
        if "asan" in info.features or "tsan" in info.features:
            pytest.skip("the sanitizers make mlock() a no-op; the release build runs this")
        for how in (memory_pb2.MEMLOCK_REQUIRE, memory_pb2.MEMLOCK_DEFAULT):
            with pytest.raises(grpc.RpcError) as e:
                m.RegisterSegment(memory_pb2.RegisterRequest(name="big", size=4 << 20,
                                                             memlock=how), timeout=10)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "RLIMIT_MEMLOCK is 1048576 bytes" in e.value.details()
        nothing_left(d)
        tried = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="try", size=4 << 20, memlock=memory_pb2.MEMLOCK_TRY), timeout=10).segment
        assert not tried.locked  # registered, unlocked
        small = m.RegisterSegment(memory_pb2.RegisterRequest(name="small", size=256 << 10),
                                  timeout=10).segment
        assert small.locked
        assert d.metric("moongate_locked_bytes") == 256 << 10
        off = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="off", size=4096, memlock=memory_pb2.MEMLOCK_OFF), timeout=10).segment
        assert not off.locked
        for s in (tried, small, off):
            m.UnregisterSegment(memory_pb2.UnregisterRequest(id=s.id))
        assert d.metric("moongate_locked_bytes") == 0
    nothing_left(d)


def test_bad_memlock_flag_is_a_configuration_error(tmp_path):
    from conftest import MOONGATE
    import subprocess
    r = subprocess.run([MOONGATE, "--memlock", "always"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 2 and "--memlock takes off, try or require" in r.stderr


def test_tenant_segment_limit(make_daemon):
    d = make_daemon("--max-tenant-segments", "2")
    ch, m = stub(d)
    with ch:
        ids = [m.RegisterSegment(memory_pb2.RegisterRequest(name="s%d" % i, size=4096)).segment.id
               for i in range(2)]
        with pytest.raises(grpc.RpcError) as e:
            m.RegisterSegment(memory_pb2.RegisterRequest(name="s2", size=4096))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert e.value.details().startswith('quota exceeded: tenant "default" has 2 segments, '
                                            'the limit per tenant (--max-tenant-segments)')
        r = m.RegisterSegments(memory_pb2.RegisterSegmentsRequest(items=[
            memory_pb2.RegisterRequest(name="b%d" % i, size=4096) for i in range(2)]))
        assert [x.status.code for x in r.results] == [grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]] * 2
        m.UnregisterSegments(memory_pb2.UnregisterSegmentsRequest(ids=ids))
    nothing_left(d)


def test_shm_group_shares_the_directory_and_files(make_daemon, tmp_path):
    import grp
    gid = grp.getgrnam("nogroup").gr_gid
    shm = str(tmp_path / "shm-grp")
    d = make_daemon("--shm-dir", shm, "--shm-group", "nogroup", "--shm-mode", "0660")
    st = os.stat(shm)
    assert st.st_gid == gid and stat.S_IMODE(st.st_mode) == 0o2770
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="g", size=4096)).segment
        st = os.stat(seg.path)
        assert st.st_gid == gid and stat.S_IMODE(st.st_mode) == 0o660
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    nothing_left(d)


def test_unknown_shm_group_fails_at_start(tmp_path):
    from conftest import MOONGATE
    import subprocess
    r = subprocess.run([MOONGATE, "--shm-dir", str(tmp_path / "x"), "--shm-group",
                        "no-such-group-here", "--ops-listen", "", "--unix-socket", "",
                        "--listen", "127.0.0.1:1"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "no such group" in r.stdout + r.stderr


def test_a_second_daemon_on_one_shm_dir_refuses_to_start(make_daemon):
    """The shm directory is held by a lock for the daemon's life: a second daemon started on it
    refuses, naming the holder's pid, and removes none of the first one's files (the first one
    keeps serving its leases from them); once the first is gone its leftovers are cleaned."""
    from conftest import MOONGATE
    import subprocess
    d = make_daemon("--pool-bytes", "4M")
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="mine", size=4096)).segment
    files = sorted(os.listdir(d.shm))
    r = subprocess.run([MOONGATE, "--shm-dir", d.shm, "--ops-listen", "", "--unix-socket", "",
                        "--data-listen", "", "--listen", "127.0.0.1:1"], capture_output=True,
                       text=True, timeout=30)
    last = (r.stdout + r.stderr).strip().splitlines()[-1]
    assert r.returncode == 1
    assert "another daemon holds this shm directory (pid=%d " % d.proc.pid in last, last
    assert sorted(os.listdir(d.shm)) == files and os.path.exists(seg.path)
    ch, m = stub(d)
    with ch:
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    assert d.metric("moongate_segments", state="ready") == 1  # the pool, its file in place


def test_a_start_up_failure_names_its_cause_in_the_last_line(make_daemon, tmp_path):
    from conftest import MOONGATE
    import subprocess
    d = make_daemon()
    r = subprocess.run([MOONGATE, "--shm-dir", str(tmp_path / "other"), "--ops-listen", "",
                        "--unix-socket", "", "--data-listen", "",
                        "--listen", "127.0.0.1:%d" % d.tls_port], capture_output=True, text=True,
                       timeout=30)
    last = (r.stdout + r.stderr).strip().splitlines()[-1]
    assert r.returncode == 1
    assert "exit_code=1" in last and "127.0.0.1:%d" % d.tls_port in last, last
    assert "Address already in use" in last, last


def test_a_client_shrinking_a_segment_file_does_not_crash_the_daemon(make_daemon):
    """A client that maps a segment may also truncate its file; the daemon's mapping then has
    pages past the file's end, and touching one raises SIGBUS. Inline writes and reads into it
    fail with DATA_LOSS naming the cause; the daemon keeps serving and unregisters it."""
    from mgstd import health_pb2, health_pb2_grpc
    d = make_daemon()
    ch, m = stub(d)
    with ch:
        seg = m.RegisterSegment(memory_pb2.RegisterRequest(name="shrunk", size=1 << 20)).segment
        m.WriteSegment(write_msgs(seg.id, 0, b"x" * 8192), timeout=10)
        os.truncate(seg.path, 4096)  # the first page stays, the rest is gone
        with pytest.raises(grpc.RpcError) as e:
            m.WriteSegment(write_msgs(seg.id, 8192, b"y" * 4096), timeout=10)
        assert e.value.code() == grpc.StatusCode.DATA_LOSS
        assert "truncated" in e.value.details(), e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            list(m.ReadSegment(memory_pb2.ReadSegmentRequest(id=seg.id), timeout=10))
        assert e.value.code() == grpc.StatusCode.DATA_LOSS
        assert "truncated" in e.value.details(), e.value.details()
        # What is still there still works.
        got = b"".join(c.data for c in m.ReadSegment(
            memory_pb2.ReadSegmentRequest(id=seg.id, length=4096), timeout=10))
        assert got == b"x" * 4096
        assert health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=seg.id))
    assert d.alive()
    nothing_left(d)

