"""Configured limits, as a client meets them: SETTINGS the daemon advertises, idle and
handshake timeouts, a client that stops reading, the Watch limit."""
import socket
import time

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from conftest import h2c_channel
from mgstd import health_pb2, health_pb2_grpc
from moongate.v1 import debug_pb2


def _connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    return s, conn


def _events_until(s, conn, want, timeout=10):
    out = []
    deadline = time.monotonic() + timeout
    s.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        if not data:
            out.append("closed")
            break
        for ev in conn.receive_data(data):
            out.append(ev)
        s.sendall(conn.data_to_send())
        if any(isinstance(e, want) for e in out if e != "closed"):
            break
    return out


def test_advertised_settings(make_daemon):
    d = make_daemon("--max-concurrent-streams", "7", "--max-header-list-bytes", "9000",
                    "--stream-window-bytes", "256K")
    s, conn = _connect(d.h2c_port)
    evs = _events_until(s, conn, h2.events.RemoteSettingsChanged)
    s.close()
    (changed,) = [e for e in evs if isinstance(e, h2.events.RemoteSettingsChanged)]
    got = {k: v.new_value for k, v in changed.changed_settings.items()}
    assert got[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == 7
    assert got[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] == 9000
    assert got[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] == 256 * 1024


def test_idle_connection_gets_goaway_and_is_closed(make_daemon):
    d = make_daemon("--idle-timeout", "1")
    s, conn = _connect(d.h2c_port)
    t0 = time.monotonic()
    evs = _events_until(s, conn, h2.events.ConnectionTerminated, timeout=10)
    s.close()
    goaway = [e for e in evs if isinstance(e, h2.events.ConnectionTerminated)]
    assert goaway and goaway[0].error_code == 0 and goaway[0].additional_data == b"idle"
    assert time.monotonic() - t0 < 8


def test_silent_client_on_tls_port_is_dropped(make_daemon):
    d = make_daemon("--handshake-timeout", "1")
    with socket.create_connection(("127.0.0.1", d.tls_port), timeout=10) as s:
        t0 = time.monotonic()
        assert s.recv(100) == b""  # closed by the daemon, nothing sent
        assert time.monotonic() - t0 < 8
    assert "reason=handshake" in d.read_log()


def test_client_that_stops_reading_costs_only_itself(make_daemon):
    """A client asks for 64 MB and reads nothing: the daemon stops reading from it once its
    output buffer is full, keeps serving others, and its memory does not grow with the
    response."""
    d = make_daemon("--max-conn-output-bytes", "256K", "--stream-window-bytes", "64K",
                    "--conn-window-bytes", "64K")
    base_kb = _rss_kb(d)
    s, conn = _connect(d.h2c_port)
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    conn.increment_flow_control_window(2**31 - 1 - 65535)
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                          (":path", "/moongate.v1.Debug/Expand"),
                          ("content-type", "application/grpc"), ("te", "trailers")])
    req = debug_pb2.ExpandRequest(count=64, size=1024 * 1024).SerializeToString()
    conn.send_data(1, b"\0" + len(req).to_bytes(4, "big") + req, end_stream=True)
    s.sendall(conn.data_to_send())
    time.sleep(1.5)  # the daemon writes until the socket buffers and its own limit are full
    with h2c_channel(d) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    # The 64 MB response is produced as the client reads; unread, it does not pile up here:
    # what the daemon holds is bounded by the call's and the connection's output limits
    # (256 KiB each) plus one 1 MiB message.
    grown_kb = _rss_kb(d) - base_kb
    assert grown_kb < 16 * 1024, grown_kb
    s.close()


def _rss_kb(d):
    with open("/proc/%d/status" % d.proc.pid) as f:
        return int([line for line in f if line.startswith("VmRSS")][0].split()[1])


def test_watch_streams_are_bounded(make_daemon):
    d = make_daemon("--max-watchers", "2")
    with h2c_channel(d) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        w1 = stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        w2 = stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        assert next(w1).status == next(w2).status == health_pb2.HealthCheckResponse.SERVING
        w3 = stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            next(w3)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max-watchers" in e.value.details()
        w1.cancel()
        time.sleep(0.3)
        w4 = stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        assert next(w4).status == health_pb2.HealthCheckResponse.SERVING
        w2.cancel()
        w4.cancel()


def test_ops_port_closes_a_client_whose_request_trickles(make_daemon):
    """A request on the ops port must be whole within --ops-header-timeout of the accept,
    however steadily its bytes come (evhttp's own timeout starts again with each byte)."""
    import socket
    d = make_daemon("--ops-header-timeout", "2")
    s = socket.create_connection(("127.0.0.1", d.ops_port), timeout=5)
    t0 = time.monotonic()
    closed = False
    for c in b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
        try:
            s.send(bytes([c]))
        except OSError:  # reset: closed by the daemon
            closed = True
            break
        s.settimeout(0.3)
        try:
            if s.recv(100) == b"":
                closed = True
                break
        except socket.timeout:
            pass
        except OSError:
            closed = True
            break
        assert time.monotonic() - t0 < 30, "still open"
    s.close()
    assert closed and time.monotonic() - t0 >= 2
    assert d.metric("moongate_ops_header_timeouts_total") == 1
    assert d.ops_get("/livez") == (200, "ok\n")  # a whole request is served at once


def test_ops_port_connection_limit(make_daemon):
    import socket
    d = make_daemon("--ops-max-connections", "3", "--ops-header-timeout", "60")
    idle = [socket.create_connection(("127.0.0.1", d.ops_port), timeout=5) for _ in range(3)]
    extra = socket.create_connection(("127.0.0.1", d.ops_port), timeout=10)
    try:
        assert extra.recv(100) == b""  # closed at once: three are open
    except ConnectionResetError:
        pass
    extra.close()
    for s in idle:
        s.close()
    # once the daemon has seen them close (a Health answer on the control port comes after it
    # read their ends), there is room again at once: a closed connection counts no more, not
    # only after the next sweep
    with h2c_channel(d) as ch:
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                    timeout=10).status == 1
    assert d.ops_get("/livez") == (200, "ok\n")
    assert d.metric("moongate_ops_connections_refused_total") == 1
