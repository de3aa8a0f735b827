"""HTTP/2 abuse, frame by frame from a raw socket: a CONTINUATION flood, a rapid-reset flood
and a PING flood from a client that does not read. Each costs only its own connection: the
daemon closes it (GOAWAY where it can) and keeps serving everyone else."""
import socket
import struct
import time

import grpc
import hpack

from conftest import h2c_channel
from mgstd import health_pb2, health_pb2_grpc

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0, 1, 3, 4, 6, 7, 9
END_STREAM, END_HEADERS = 0x1, 0x4


def frame(ftype, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", ftype, flags, stream) + payload


def connect(d):
    s = socket.create_connection(("127.0.0.1", d.h2c_port), timeout=5)
    s.sendall(PREFACE + frame(SETTINGS, 0, 0))
    return s


def request_headers(path="/grpc.health.v1.Health/Check"):
    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                   (":authority", "localhost"), (":path", path),
                                   ("content-type", "application/grpc"), ("te", "trailers")])


def read_until_closed(s, timeout=15):
    """Reads frames until the daemon closes the connection; returns the GOAWAY error codes
    seen. Fails when the connection stays open."""
    buf, codes = b"", []
    deadline = time.monotonic() + timeout
    s.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(1 << 20)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return codes
        if not chunk:
            return codes
        buf += chunk
        while len(buf) >= 9:
            n = struct.unpack(">I", b"\0" + buf[:3])[0]
            if len(buf) < 9 + n:
                break
            if buf[3] == GOAWAY:
                codes.append(struct.unpack(">I", buf[13:17])[0])
            buf = buf[9 + n:]
    raise AssertionError("the daemon kept the abusive connection open")


def still_serving(d):
    with h2c_channel(d) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_continuation_flood_closes_the_connection(make_daemon):
    d = make_daemon("--max-continuations", "8")
    s = connect(d)
    block = request_headers()
    out = frame(HEADERS, 0, 1, block[:4])
    for _ in range(200):  # never END_HEADERS: a header block that does not end
        out += frame(CONTINUATION, 0, 1, b"\x40\x01a\x01b")
    try:
        s.sendall(out)
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed while we were still sending: what we want
    codes = read_until_closed(s)
    s.close()
    assert codes and codes[-1] != 0, codes  # a GOAWAY with an error
    still_serving(d)
    assert d.metric("moongate_goaway_sent_total") >= 1


def test_rapid_reset_is_cut_off(make_daemon):
    d = make_daemon("--reset-burst", "20", "--reset-rate", "1")
    s = connect(d)
    block = request_headers()
    out = b""
    for i in range(200):
        sid = 1 + 2 * i
        out += frame(HEADERS, END_HEADERS, sid, block) + frame(RST_STREAM, 0, sid,
                                                                 struct.pack(">I", 8))
    try:
        s.sendall(out)
    except (BrokenPipeError, ConnectionResetError):
        pass
    codes = read_until_closed(s)
    s.close()
    assert codes and codes[-1] != 0, codes  # GOAWAY with an error: the budget ran out
    assert d.metric("moongate_rst_stream_received_total") <= 200
    still_serving(d)
    # the operator reads why the connection ended
    log = d.read_log()
    assert "level=warn event=conn_goaway" in log and "error=INTERNAL_ERROR" in log, log[-2000:]


def test_ping_flood_from_a_client_that_does_not_read(make_daemon):
    """The daemon stops reading a client whose answers pile up (--max-conn-output-bytes), and
    closes it once nothing moved for --write-timeout."""
    d = make_daemon("--write-timeout", "2")
    s = connect(d)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # its answers pile up in the daemon
    ping = frame(PING, 0, 0, b"12345678")
    s.settimeout(2)
    sent = 0
    try:
        for _ in range(200):
            s.sendall(ping * 2000)
            sent += 2000
    except (socket.timeout, BrokenPipeError, ConnectionResetError):
        pass  # the daemon stopped reading us, or closed
    # while this one floods, others are served
    still_serving(d)
    deadline = time.monotonic() + 20
    while not d.metric("moongate_write_timeouts_total"):
        assert time.monotonic() < deadline, "the flooding connection is still open"
        time.sleep(0.2)
    # the daemon let go of it (what it had queued is the kernel's to discard now)
    assert d.metric("moongate_connections_active") == 0
    s.close()
    assert sent > 1000, "the daemon should have read at least the first pings"
    assert "reason=write" in d.read_log()
    still_serving(d)


def test_streams_beyond_the_limit_are_refused(make_daemon):
    """--max-concurrent-streams 4: a client that opens ten gets the extra ones reset with
    REFUSED_STREAM (safe to retry) and the four it may have keep working."""
    d = make_daemon("--max-concurrent-streams", "4")
    s = connect(d)
    block = request_headers()
    # ten requests whose bodies never come: the streams stay open
    s.sendall(b"".join(frame(HEADERS, END_HEADERS, 1 + 2 * i, block) for i in range(10)))
    buf, resets = b"", {}
    s.settimeout(0.5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(resets) < 6:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        assert chunk, "the daemon closed the connection"
        buf += chunk
        while len(buf) >= 9:
            n = struct.unpack(">I", b"\0" + buf[:3])[0]
            if len(buf) < 9 + n:
                break
            if buf[3] == RST_STREAM:
                sid = struct.unpack(">I", buf[5:9])[0] & 0x7FFFFFFF
                resets[sid] = struct.unpack(">I", buf[9:13])[0]
            buf = buf[9 + n:]
    s.close()
    assert len(resets) == 6 and set(resets.values()) == {7}, resets  # REFUSED_STREAM
    assert all(sid > 7 for sid in resets)  # the first four were taken
    still_serving(d)


def test_settings_flood_and_oversized_settings(make_daemon):
    """A SETTINGS frame of more entries than the daemon takes ends the connection with an
    error. A flood of small ones from a client that does not read the acknowledgements costs the
    daemon nothing it holds: the acknowledgements sit in the kernel's socket buffer (bounded by
    the kernel), and the connection, idle of streams, gets GOAWAY after --idle-timeout, then is
    closed by --write-timeout since the client reads nothing."""
    d = make_daemon("--write-timeout", "2", "--idle-timeout", "2")
    s = connect(d)
    many = b"".join(struct.pack(">HI", 3, 100 + i) for i in range(40))  # 40 entries
    s.sendall(frame(SETTINGS, 0, 0, many))
    codes = read_until_closed(s)
    s.close()
    assert codes and codes[-1] != 0, codes
    s = connect(d)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    one = frame(SETTINGS, 0, 0, struct.pack(">HI", 3, 100))
    s.settimeout(2)
    try:
        for _ in range(200):
            s.sendall(one * 2000)
    except (socket.timeout, BrokenPipeError, ConnectionResetError):
        pass
    still_serving(d)
    deadline = time.monotonic() + 20
    while d.metric("moongate_connections_active"):
        assert time.monotonic() < deadline, "the flooding connection is still open"
        time.sleep(0.2)
    s.close()
    still_serving(d)
