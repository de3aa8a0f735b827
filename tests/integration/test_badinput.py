"""Bad input gets a clear error and the daemon keeps serving: wrong framing, undecodable
messages, missing headers, malformed timeouts, a plaintext client on the TLS port, HTTP/2
garbage, a client that disconnects mid-call."""
import socket
import time

import h2.config
import h2.connection
import h2.events
import pytest

from conftest import curl, h2c_channel
from mgstd import health_pb2, health_pb2_grpc

CHECK = "/grpc.health.v1.Health/Check"


def grpc_curl(d, path, body, headers=("content-type: application/grpc", "te: trailers")):
    args = ["--http2-prior-knowledge", "-D", "-", "-o", "/dev/null"]
    for h in headers:
        args += ["-H", h]
    rc, out, err = curl(*args, "--data-binary", "@-", "http://%s%s" % (d.h2c, path), input=body)
    assert rc == 0, err
    fields = {}
    for line in out.decode().splitlines():
        k, sep, v = line.partition(":")
        if sep:
            fields[k.strip().lower()] = v.strip()
    return fields


def still_serving(d):
    with h2c_channel(d) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return r.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("body,code,needle", [
    (b"\0\0\0\0\x64abc", "13", "ended inside a message"),        # truncated message
    (b"\0\0\0\0\x03\xff\xff\xff", "13", "could not decode"),        # not a protobuf
    (b"\x07\0\0\0\0", "13", "flag byte"),                           # bad flag byte
    (b"\x01\0\0\0\x01\0", "12", "compressed"),                      # compression not offered
    (b"", "12", "exactly one request message, got none"),          # no message
    (b"\0\0\0\0\0\0\0\0\0\0", "12", "exactly one"),                 # two messages for unary
    (b"\0\x7f\xff\xff\xff", "8", "max-message-bytes"),             # declared 2 GiB
])
def test_bad_grpc_framing(daemon, body, code, needle):
    f = grpc_curl(daemon, CHECK, body)
    assert f.get("grpc-status") == code, f
    assert needle in f.get("grpc-message", ""), f
    assert still_serving(daemon)


def test_missing_te_and_bad_timeout(daemon):
    f = grpc_curl(daemon, CHECK, b"\0\0\0\0\0", headers=("content-type: application/grpc",))
    assert f.get("grpc-status") == "13" and "te: trailers" in f["grpc-message"]
    f = grpc_curl(daemon, CHECK, b"\0\0\0\0\0", headers=(
        "content-type: application/grpc", "te: trailers", "grpc-timeout: 1x"))
    assert f.get("grpc-status") == "13" and "grpc-timeout" in f["grpc-message"]
    f = grpc_curl(daemon, CHECK, b"\0\0\0\0\0", headers=(
        "content-type: application/grpc", "te: trailers", "grpc-timeout: 5S"))
    assert f.get("grpc-status") == "0"


def test_oversized_headers_are_refused(daemon):
    f = grpc_curl(daemon, CHECK, b"\0\0\0\0\0", headers=(
        "content-type: application/grpc", "te: trailers", "x-big: " + "a" * 20000))
    assert f.get("grpc-status") == "8" and "max-header-list-bytes" in f["grpc-message"]
    assert still_serving(daemon)


def test_plaintext_client_on_tls_port(daemon):
    before = daemon.metric("moongate_tls_handshake_errors_total") or 0
    with socket.create_connection(("127.0.0.1", daemon.tls_port), timeout=5) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0" * 64)
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass
        except (ConnectionResetError, socket.timeout):
            pass
    deadline = time.monotonic() + 5
    while (daemon.metric("moongate_tls_handshake_errors_total") or 0) == before:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert still_serving(daemon)


def test_http2_garbage_closes_only_that_connection(daemon):
    before = daemon.metric("moongate_http2_protocol_errors_total") or 0
    with socket.create_connection(("127.0.0.1", daemon.h2c_port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
        s.settimeout(5)
        data = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    # The server answered with its SETTINGS and a GOAWAY, then closed.
    assert b"\x07" in data[9:] or data == b""
    deadline = time.monotonic() + 5
    while (daemon.metric("moongate_http2_protocol_errors_total") or 0) == before:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert still_serving(daemon)


def _raw_h2(d):
    s = socket.create_connection(("127.0.0.1", d.h2c_port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    return s, conn


def _headers(path):
    return [(":method", "POST"), (":scheme", "http"), (":authority", "localhost"),
            (":path", path), ("content-type", "application/grpc"), ("te", "trailers")]


def test_oversized_headers_answer_waits_for_the_declared_body(daemon):
    """Refused for its headers, a request that declared a body (content-length after the big
    header) is answered once the body is in, as curl needs; the answer then arrives."""
    s, conn = _raw_h2(daemon)
    conn.send_headers(1, _headers(CHECK) + [("x-big", "a" * 20000), ("content-length", "5")])
    s.sendall(conn.data_to_send())
    s.settimeout(0.5)
    early = []
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            early += [e for e in conn.receive_data(data)
                      if isinstance(e, h2.events.ResponseReceived)]
            s.sendall(conn.data_to_send())
    except socket.timeout:
        pass
    assert early == []  # no answer while the declared body is still to come
    conn.send_data(1, b"\0\0\0\0\0", end_stream=True)
    s.sendall(conn.data_to_send())
    s.settimeout(5)
    status = None
    while status is None:
        data = s.recv(65536)
        assert data, "connection closed without an answer"
        for e in conn.receive_data(data):
            if isinstance(e, h2.events.ResponseReceived):
                status = dict(e.headers).get(b"grpc-status")
    s.close()
    assert status == b"8"


def test_client_disconnects_mid_call(daemon):
    before = daemon.metric("moongate_grpc_handled_total", grpc_service="moongate.v1.Debug",
                           grpc_method="Sleep", grpc_code="CANCELLED") or 0
    s, conn = _raw_h2(daemon)
    conn.send_headers(1, _headers("/moongate.v1.Debug/Sleep"))
    conn.send_data(1, b"\0\0\0\0\x03\x08\xf4\x03", end_stream=True)  # duration_ms = 500
    s.sendall(conn.data_to_send())
    time.sleep(0.1)
    s.close()
    deadline = time.monotonic() + 5
    while (daemon.metric("moongate_grpc_handled_total", grpc_service="moongate.v1.Debug",
                         grpc_method="Sleep", grpc_code="CANCELLED") or 0) == before:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert still_serving(daemon)


def test_client_disconnects_inside_a_frame(daemon):
    s, conn = _raw_h2(daemon)
    conn.send_headers(1, _headers("/moongate.v1.Debug/Echo"))
    conn.send_data(1, b"\0\0\0\x10\0" + b"x" * 100)
    data = conn.data_to_send()
    s.sendall(data[:-37])  # stop in the middle of the DATA frame
    s.close()
    assert still_serving(daemon)


def test_rst_stream_cancels_the_call(daemon):
    s, conn = _raw_h2(daemon)
    conn.send_headers(1, _headers("/moongate.v1.Debug/Sleep"))
    conn.send_data(1, b"\0\0\0\0\x03\x08\xe8\x07", end_stream=True)  # 1000 ms
    conn.reset_stream(1)
    conn.send_headers(3, _headers(CHECK))
    conn.send_data(3, b"\0\0\0\0\0", end_stream=True)
    s.sendall(conn.data_to_send())
    status = None
    deadline = time.monotonic() + 5
    while status is None and time.monotonic() < deadline:
        for ev in conn.receive_data(s.recv(65536)):
            if isinstance(ev, h2.events.TrailersReceived) and ev.stream_id == 3:
                status = dict(ev.headers).get(b"grpc-status")
            if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == 3:
                status = dict(ev.headers).get(b"grpc-status", status)
        s.sendall(conn.data_to_send())
    s.close()
    assert status == b"0"


def test_client_that_keeps_sending_after_the_answer_is_reset(daemon):
    """The daemon refuses an oversized message at once; a client that keeps sending its body
    is then asked to stop with RST_STREAM(NO_ERROR), after the trailers."""
    s, conn = _raw_h2(daemon)
    conn.send_headers(1, _headers("/moongate.v1.Debug/Echo"))
    conn.send_data(1, b"\0\x10\0\0\0" + b"x" * 1000)  # declares 256 MiB
    s.sendall(conn.data_to_send())
    events = []
    deadline = time.monotonic() + 5
    sent_more = False
    while time.monotonic() < deadline and not any(
            isinstance(e, h2.events.StreamReset) for e in events):
        for ev in conn.receive_data(s.recv(65536)):
            events.append(ev)
            if isinstance(ev, h2.events.TrailersReceived) or (
                    isinstance(ev, h2.events.ResponseReceived) and
                    dict(ev.headers).get(b"grpc-status")):
                if not sent_more:
                    for _ in range(5):  # beyond the 64 KiB a finished gRPC call may still get
                        conn.send_data(1, b"y" * 16000)
                    sent_more = True
        s.sendall(conn.data_to_send())
    s.close()
    status = [dict(e.headers).get(b"grpc-status") for e in events
              if isinstance(e, (h2.events.ResponseReceived, h2.events.TrailersReceived))]
    assert b"8" in status
    resets = [e for e in events if isinstance(e, h2.events.StreamReset)]
    assert resets and resets[0].error_code == 0
