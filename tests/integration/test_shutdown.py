"""Graceful shutdown on SIGTERM/SIGINT: readiness goes false, Watch streams see NOT_SERVING and
then UNAVAILABLE, in-flight calls finish, new connections are refused, the exit status is 0."""
import signal
import time

import grpc
import pytest

from conftest import h2c_channel
from mgstd import health_pb2, health_pb2_grpc
from moongate.v1 import debug_pb2, debug_pb2_grpc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_drain_finishes_in_flight_calls_and_exits_zero(make_daemon, sig):
    d = make_daemon()
    ch = h2c_channel(d)
    watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=20)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    inflight = debug_pb2_grpc.DebugStub(ch).Sleep.future(
        debug_pb2.SleepRequest(duration_ms=1800), timeout=20)
    time.sleep(0.2)
    d.signal(sig)

    # Readiness goes false while the daemon drains (the ops port stays up until exit).
    deadline = time.monotonic() + 5
    while d.ops_get("/readyz")[0] != 503:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    # New connections are refused.
    with h2c_channel(d) as fresh:
        with pytest.raises(grpc.RpcError) as e:
            health_pb2_grpc.HealthStub(fresh).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    # The watch is ended by the server so that the client reconnects elsewhere.
    with pytest.raises(grpc.RpcError) as e:
        next(watch)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    # The call in flight completes normally.
    assert inflight.result(timeout=20).slept_ms == 1800
    ch.close()
    d.proc.wait(timeout=15)
    assert d.proc.returncode == 0
    log = d.read_log()
    assert "event=draining" in log and "event=drained result=clean" in log


def test_grace_period_bounds_the_drain(make_daemon):
    d = make_daemon("--grace", "1")
    ch = h2c_channel(d)
    fut = debug_pb2_grpc.DebugStub(ch).Sleep.future(debug_pb2.SleepRequest(duration_ms=5000),
                                                    timeout=20)
    time.sleep(0.2)
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    with pytest.raises(grpc.RpcError) as e:
        fut.result(timeout=20)
    assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                              grpc.StatusCode.INTERNAL)
    d.proc.wait(timeout=15)
    assert d.proc.returncode == 0
    assert "event=drain_timeout" in d.read_log()
    # The grace ends the drain; the worker's job then finishes before exit.
    assert time.monotonic() - t0 < 10
    ch.close()


def test_drain_sends_goaway_twice(make_daemon):
    """HTTP/2's graceful shutdown: a GOAWAY notice with the largest stream id, then, about one
    round trip later, the last stream the daemon processed."""
    import socket
    import h2.config
    import h2.connection
    import h2.events
    d = make_daemon()
    s = socket.create_connection(("127.0.0.1", d.h2c_port), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                          (":path", "/grpc.health.v1.Health/Check"),
                          ("content-type", "application/grpc"), ("te", "trailers")])
    conn.send_data(1, b"\0\0\0\0\0", end_stream=True)
    s.sendall(conn.data_to_send())
    goaways, answered, closed = [], False, False
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not closed:
        data = s.recv(65536)
        if not data:
            closed = True
            break
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.StreamEnded) and ev.stream_id == 1 and not answered:
                answered = True
                d.signal(signal.SIGTERM)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                goaways.append((ev.last_stream_id, ev.error_code))
        s.sendall(conn.data_to_send())
    s.close()
    assert answered and closed
    assert goaways == [(2**31 - 1, 0), (1, 0)]
    d.proc.wait(timeout=15)
    assert d.proc.returncode == 0
