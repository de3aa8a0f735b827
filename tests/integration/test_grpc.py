"""gRPC conformance of the control port, driven by python3-grpcio over TLS, h2c and the Unix
socket: health, deadlines, unknown methods, message limits, cancellation, every streaming shape,
reflection, and the engine hand-off (the loop keeps answering while workers are busy)."""
import threading
import time

import grpc
import pytest
from google.protobuf import descriptor_pb2

from conftest import curl, h2c_channel, tls_channel, unix_channel
from mgstd import health_pb2, health_pb2_grpc
from mgstd import reflection_v1_pb2, reflection_v1_pb2_grpc
from mgstd import reflection_v1alpha_pb2, reflection_v1alpha_pb2_grpc
from moongate.v1 import daemon_pb2, daemon_pb2_grpc, debug_pb2, debug_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("make_channel", [tls_channel, h2c_channel, unix_channel],
                         ids=["tls", "h2c", "unix"])
def test_health_check_on_every_listener(daemon, make_channel):
    with make_channel(daemon) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == SERVING
        r = stub.Check(health_pb2.HealthCheckRequest(service="moongate.v1.Daemon"), timeout=5)
        assert r.status == SERVING


def test_health_check_unknown_service_is_not_found(daemon):
    with h2c_channel(daemon) as ch:
        with pytest.raises(grpc.RpcError) as e:
            health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no.such.Service" in e.value.details()


def test_health_watch_sends_current_status_and_stays_open(daemon):
    with h2c_channel(daemon) as ch:
        stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(),
                                                      timeout=1.0)
        first = next(stream)
        assert first.status == SERVING
        # Nothing changes, so the stream stays open until our deadline ends it.
        with pytest.raises(grpc.RpcError) as e:
            next(stream)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_health_watch_unknown_service_reports_service_unknown(daemon):
    with h2c_channel(daemon) as ch:
        stream = health_pb2_grpc.HealthStub(ch).Watch(
            health_pb2.HealthCheckRequest(service="nope"), timeout=1.0)
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        stream.cancel()


def test_info_over_tls(daemon):
    with tls_channel(daemon) as ch:
        info = daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest(), timeout=5)
    assert info.version
    assert info.state == "serving"
    assert info.epoch != 0
    assert "tls" in info.features and "reflection" in info.features
    assert {t.name for t in info.transports} >= {"tcp", "rdma"}
    for t in info.transports:
        assert t.available or t.reason, "an unavailable transport must say why"


def test_epoch_changes_on_restart(make_daemon):
    epochs = []
    for _ in range(2):
        d = make_daemon()
        with h2c_channel(d) as ch:
            epochs.append(daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest()).epoch)
        assert d.stop() == 0
    assert epochs[0] != epochs[1]


def test_unknown_method_and_service_are_unimplemented(daemon):
    with h2c_channel(daemon) as ch:
        for path in ("/moongate.v1.Daemon/NoSuchMethod", "/no.such.Service/Method"):
            call = ch.unary_unary(path, request_serializer=lambda x: x,
                                  response_deserializer=lambda x: x)
            with pytest.raises(grpc.RpcError) as e:
                call(b"", timeout=5)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert path.split("/")[1] in e.value.details() or "method" in e.value.details()


def test_deadline_exceeded_for_a_grpcio_client(daemon):
    with h2c_channel(daemon) as ch:
        stub = debug_pb2_grpc.DebugStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Sleep(debug_pb2.SleepRequest(duration_ms=3000), timeout=0.3)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The daemon keeps serving.
        assert stub.Echo(debug_pb2.EchoMessage(payload=b"x")).payload == b"x"


def test_server_enforces_grpc_timeout(daemon):
    """curl sends grpc-timeout but never cancels by itself: the answer must come from the
    daemon's own timer, long before the 3 s sleep would end."""
    t0 = time.monotonic()
    rc, out, err = curl("--http2-prior-knowledge", "-D", "-", "-o", "/dev/null",
                        "-H", "content-type: application/grpc", "-H", "te: trailers",
                        "-H", "grpc-timeout: 300m", "--data-binary", "@-",
                        "http://%s/moongate.v1.Debug/Sleep" % daemon.h2c,
                        input=b"\0\0\0\0\x03\x08\xb8\x17")  # duration_ms = 3000
    assert rc == 0, err
    assert "grpc-status: 4" in out.decode()
    assert "deadline" in out.decode()
    assert time.monotonic() - t0 < 2.5


def test_large_messages_both_ways(daemon):
    payload = bytes(range(256)) * (3 * 1024 * 1024 // 256)  # 3 MiB: beyond every window
    with h2c_channel(daemon) as ch:
        r = debug_pb2_grpc.DebugStub(ch).Echo(debug_pb2.EchoMessage(payload=payload, seq=9),
                                              timeout=20)
    assert r.payload == payload and r.seq == 9


def test_oversize_message_is_resource_exhausted(daemon):
    with h2c_channel(daemon) as ch:
        stub = debug_pb2_grpc.DebugStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Echo(debug_pb2.EchoMessage(payload=b"\0" * (5 * 1024 * 1024)), timeout=20)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max-message-bytes" in e.value.details()
        assert stub.Echo(debug_pb2.EchoMessage(payload=b"ok"), timeout=5).payload == b"ok"


def test_cancelled_call_is_seen_by_the_server(daemon):
    before = daemon.metric("moongate_grpc_handled_total", grpc_service="moongate.v1.Debug",
                           grpc_method="Sleep", grpc_code="CANCELLED") or 0
    with h2c_channel(daemon) as ch:
        fut = debug_pb2_grpc.DebugStub(ch).Sleep.future(debug_pb2.SleepRequest(duration_ms=2000))
        time.sleep(0.2)
        assert fut.cancel()
        deadline = time.monotonic() + 5
        after = before
        while time.monotonic() < deadline and after == before:
            after = daemon.metric("moongate_grpc_handled_total",
                                  grpc_service="moongate.v1.Debug", grpc_method="Sleep",
                                  grpc_code="CANCELLED") or 0
            time.sleep(0.05)
        assert after == before + 1
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest()).status \
            == SERVING


def test_client_streaming(daemon):
    msgs = [debug_pb2.EchoMessage(payload=b"a" * n, seq=i) for i, n in enumerate(
        [27182, 8, 1828, 45904] * 25)]
    with h2c_channel(daemon) as ch:
        r = debug_pb2_grpc.DebugStub(ch).Collect(iter(msgs), timeout=20)
    assert r.messages == 100
    assert r.bytes == sum(len(m.payload) for m in msgs)


def test_client_streaming_with_no_messages(daemon):
    with h2c_channel(daemon) as ch:
        r = debug_pb2_grpc.DebugStub(ch).Collect(iter([]), timeout=5)
    assert r.messages == 0 and r.bytes == 0


def test_server_streaming_in_order(daemon):
    with h2c_channel(daemon) as ch:
        got = list(debug_pb2_grpc.DebugStub(ch).Expand(
            debug_pb2.ExpandRequest(count=64, size=100000), timeout=30))
    assert [m.seq for m in got] == list(range(64))
    assert all(len(m.payload) == 100000 for m in got)


def test_bidi_ping_pong_answers_each_message_as_it_arrives(daemon):
    """The client sends the next message only after it got the answer to the previous one: a
    server that waited for half-close would deadlock here (and hit the deadline)."""
    answers = []
    cond = threading.Condition()

    def requests():
        for i in range(20):
            yield debug_pb2.EchoMessage(payload=b"p%d" % i, seq=i)
            with cond:
                assert cond.wait_for(lambda: len(answers) > i, timeout=5), "no answer to %d" % i

    with h2c_channel(daemon) as ch:
        for r in debug_pb2_grpc.DebugStub(ch).Chat(requests(), timeout=20):
            with cond:
                answers.append(r.seq)
                cond.notify_all()
    assert answers == list(range(20))


def test_loop_answers_while_workers_are_busy(make_daemon):
    """Two workers, both sleeping in a job: health checks are still answered at once."""
    d = make_daemon("--workers", "2")
    with h2c_channel(d) as ch:
        dbg = debug_pb2_grpc.DebugStub(ch)
        futs = [dbg.Sleep.future(debug_pb2.SleepRequest(duration_ms=1500)) for _ in range(2)]
        time.sleep(0.1)
        health = health_pb2_grpc.HealthStub(ch)
        for _ in range(20):
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == SERVING
        assert not any(f.done() for f in futs), "the checks waited for the workers"
        assert [f.result(timeout=10).slept_ms for f in futs] == [1500, 1500]


def test_full_engine_queue_is_resource_exhausted(make_daemon):
    d = make_daemon("--workers", "1", "--queue-depth", "1")
    with h2c_channel(d) as ch:
        dbg = debug_pb2_grpc.DebugStub(ch)
        busy = dbg.Sleep.future(debug_pb2.SleepRequest(duration_ms=1000))
        time.sleep(0.2)
        with pytest.raises(grpc.RpcError) as e:
            dbg.Sleep(debug_pb2.SleepRequest(duration_ms=10), timeout=5)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue-depth" in e.value.details()
        assert busy.result(timeout=10).slept_ms == 1000


def _reflect(ch, pb2, pb2_grpc, **req):
    stub = pb2_grpc.ServerReflectionStub(ch)
    return list(stub.ServerReflectionInfo(iter([pb2.ServerReflectionRequest(**req)]), timeout=5))


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_lists_our_services(daemon, version):
    pb2, pb2_grpc = {"v1": (reflection_v1_pb2, reflection_v1_pb2_grpc),
                     "v1alpha": (reflection_v1alpha_pb2, reflection_v1alpha_pb2_grpc)}[version]
    with h2c_channel(daemon) as ch:
        (resp,) = _reflect(ch, pb2, pb2_grpc, list_services="*")
    names = {s.name for s in resp.list_services_response.service}
    assert {"grpc.health.v1.Health", "moongate.v1.Daemon", "moongate.v1.Debug",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"} <= names


def test_reflection_file_containing_symbol(daemon):
    with h2c_channel(daemon) as ch:
        (resp,) = _reflect(ch, reflection_v1_pb2, reflection_v1_pb2_grpc,
                           file_containing_symbol="moongate.v1.Daemon.Info")
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in resp.file_descriptor_response.file_descriptor_proto]
        fd = {f.name: f for f in files}["moongate/v1/daemon.proto"]
        assert [s.name for s in fd.service] == ["Daemon"]
        assert fd.service[0].method[0].input_type == ".moongate.v1.InfoRequest"
        (err,) = _reflect(ch, reflection_v1_pb2, reflection_v1_pb2_grpc,
                          file_containing_symbol="no.such.Symbol")
        assert err.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
        (byname,) = _reflect(ch, reflection_v1_pb2, reflection_v1_pb2_grpc,
                             file_by_filename="grpc/health/v1/health.proto")
        assert len(byname.file_descriptor_response.file_descriptor_proto) == 1


def test_reflection_answers_each_request_on_one_stream(daemon):
    reqs = [reflection_v1_pb2.ServerReflectionRequest(list_services=""),
            reflection_v1_pb2.ServerReflectionRequest(
                file_containing_symbol="grpc.health.v1.HealthCheckRequest")]
    with h2c_channel(daemon) as ch:
        out = list(reflection_v1_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter(reqs), timeout=5))
    assert len(out) == 2
    assert out[0].HasField("list_services_response")
    assert out[1].HasField("file_descriptor_response")
