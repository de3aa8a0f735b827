"""Every string that enters is whole, or refused naming its field: a NUL byte or invalid UTF-8
in any string field of any request type of any service (at any depth) is INVALID_ARGUMENT
before protobuf-c could cut it short; the same in JSON bodies and in every readable route's
query string; and in header values, which nghttp2 refuses itself (its behaviour, tested here
as the daemon's)."""
import json
import socket

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from conftest import curl, h2c_channel
from mgstd import health_pb2, health_pb2_grpc, reflection_v1_pb2, reflection_v1alpha_pb2
from moongate.v1 import (daemon_pb2, debug_pb2, memory_pb2, notify_pb2, peer_pb2, pool_pb2,
                         transfer_pb2)

MODULES = (daemon_pb2, debug_pb2, memory_pb2, notify_pb2, peer_pb2, pool_pb2, transfer_pb2,
           health_pb2, reflection_v1_pb2, reflection_v1alpha_pb2)
MARK = b"Zq7x9W"  # stands where the bad bytes go: same length, so no length prefix changes
BAD = {"nul": (b"Zq\x007x9", "holds a NUL byte"), "utf8": (b"Zq\xc0\xaf9W", "is not valid UTF-8")}


def methods():
    for mod in MODULES:
        for svc in mod.DESCRIPTOR.services_by_name.values():
            for m in svc.methods:
                yield "/%s/%s" % (svc.full_name, m.name), m


def string_paths(desc, prefix=(), seen=()):
    """Every way down to a string field: tuples of field descriptors (maps left out)."""
    for f in desc.fields:
        if f.type == f.TYPE_STRING:
            yield prefix + (f,)
        elif (f.type == f.TYPE_MESSAGE and not f.message_type.GetOptions().map_entry and
              f.message_type.full_name not in seen and len(prefix) < 3):
            yield from string_paths(f.message_type, prefix + (f,), seen + (desc.full_name,))


def field_path(path):
    return ".".join(f.name + ("[0]" if f.label == f.LABEL_REPEATED else "") for f in path)


def message_with_mark(cls, path):
    msg = cls()
    cur = msg
    for f in path[:-1]:
        cur = getattr(cur, f.name).add() if f.label == f.LABEL_REPEATED else getattr(cur, f.name)
    last = path[-1]
    if last.label == last.LABEL_REPEATED:
        getattr(cur, last.name).append(MARK.decode())
    else:
        setattr(cur, last.name, MARK.decode())
    return msg


def cases():
    from google.protobuf import symbol_database
    db = symbol_database.Default()
    for rpc, m in methods():
        cls = db.GetSymbol(m.input_type.full_name)
        for path in string_paths(m.input_type):
            yield rpc, m, cls, path


CASES = list(cases())


def test_every_service_has_string_fields_to_try():
    services = {rpc.split("/")[1] for rpc, _, _, _ in CASES}
    assert {"moongate.v1.Memory", "moongate.v1.Pool", "moongate.v1.Transfer",
            "moongate.v1.Notify", "moongate.v1.Peer", "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection"} <= services, services
    assert len(CASES) >= 40


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_strings_in_every_field_of_every_request_are_refused(daemon, kind):
    bad, why = BAD[kind]
    refused = []
    with h2c_channel(daemon) as ch:
        for rpc, m, cls, path in CASES:
            raw = message_with_mark(cls, path).SerializeToString()
            assert raw.count(MARK) == 1, (rpc, field_path(path))
            raw = raw.replace(MARK, bad)
            kw = dict(request_serializer=None, response_deserializer=None)
            try:
                if m.client_streaming and m.server_streaming:
                    list(ch.stream_stream(rpc, **kw)(iter([raw]), timeout=10))
                elif m.client_streaming:
                    ch.stream_unary(rpc, **kw)(iter([raw]), timeout=10)
                elif m.server_streaming:
                    list(ch.unary_stream(rpc, **kw)(raw, timeout=10))
                else:
                    ch.unary_unary(rpc, **kw)(raw, timeout=10)
                refused.append((rpc, field_path(path), "OK"))
                continue
            except grpc.RpcError as e:
                want = 'field "%s": %s' % (field_path(path), why)
                if e.code() != grpc.StatusCode.INVALID_ARGUMENT or want not in e.details():
                    refused.append((rpc, field_path(path), e.code().name, e.details()))
    assert refused == [], refused  # each one refused, naming its field
    with h2c_channel(daemon) as ch:  # and the daemon keeps serving
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                    timeout=5).status == 1


def test_nul_in_every_string_of_json_bodies_is_refused(daemon):
    """JSON: a NUL (\\u0000) in any string field of any unary request names the field."""
    wrong = []
    for rpc, m, cls, path in CASES:
        if m.client_streaming or m.server_streaming:
            continue
        body = {}
        cur = body
        for f in path[:-1]:
            nxt = {}
            cur[f.name] = [nxt] if f.label == f.LABEL_REPEATED else nxt
            cur = nxt
        last = path[-1]
        cur[last.name] = ["a\u0000b"] if last.label == last.LABEL_REPEATED else "a\u0000b"
        rc, out, err = curl("--http2-prior-knowledge", "-H", "content-type: application/json",
                            "-d", json.dumps(body), "http://%s%s" % (daemon.h2c, rpc))
        got = json.loads(out) if rc == 0 and out.startswith(b"{") else {"raw": out}
        if got.get("code") != 3 or 'field "%s": holds a NUL byte' % field_path(path) not in \
                got.get("message", ""):
            wrong.append((rpc, field_path(path), got))
    assert wrong == [], wrong[:5]
    # invalid UTF-8 is not JSON at all: refused where it stands
    rc, out, err = curl("--http2-prior-knowledge", "-H", "content-type: application/json",
                        "--data-binary", b'{"name": "a\xffb", "size": "4096"}',
                        "http://%s/moongate.v1.Memory/RegisterSegment" % daemon.h2c)
    got = json.loads(out)
    assert got["code"] == 3 and "invalid JSON at line 1 column" in got["message"], got


ROUTES = [  # every readable route, with its method's input type
    ("GET", "/v1/segments", memory_pb2.ListSegmentsRequest),
    ("POST", "/v1/segments", memory_pb2.RegisterRequest),
    ("GET", "/v1/segments/1", memory_pb2.GetSegmentRequest),
    ("DELETE", "/v1/segments/1", memory_pb2.UnregisterRequest),
    ("GET", "/v1/notifications", notify_pb2.PollRequest),
    ("GET", "/v1/pool", pool_pb2.PoolStatsRequest),
    ("GET", "/v1/leases", pool_pb2.ListLeasesRequest),
    ("POST", "/v1/leases", pool_pb2.AcquireLeaseRequest),
    ("GET", "/v1/leases/1", pool_pb2.GetLeaseRequest),
    ("DELETE", "/v1/leases/1", pool_pb2.ReleaseLeaseRequest),
    ("POST", "/v1/transfers", transfer_pb2.SubmitRequest),
    ("GET", "/v1/transfers/1", transfer_pb2.GetBatchRequest),
    ("GET", "/v1/peers", transfer_pb2.ListPeersRequest),
]


def test_routes_are_the_documented_ones():
    import os
    from conftest import ROOT
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        api = f.read()
    for verb, route, _ in ROUTES:
        assert "%s %s" % (verb, route.replace("/1", "/{id}")) in api, route


@pytest.mark.parametrize("kind,pct,why", [("nul", "%00", "holds a NUL byte"),
                                          ("utf8", "%C0%AF", "is not valid UTF-8"),
                                          ("lone", "%FF", "is not valid UTF-8")])
def test_bad_bytes_in_every_routes_query_are_refused(daemon, kind, pct, why):
    """`page_token=%00abc` is not an empty token, nor `topic=kv%00x` the topic kv: every query
    parameter of every readable route, decoded, is refused with what it holds."""
    def refused(verb, route, query, needle):
        rc, out, err = curl("--http2-prior-knowledge", "-X", verb,
                            "http://%s%s?%s" % (daemon.h2c, route, query))
        got = json.loads(out) if out.startswith(b"{") else {"raw": out}
        return got.get("code") == 3 and needle in got.get("message", "")

    wrong = []
    for verb, route, cls in ROUTES:
        names = [f.name for f in cls.DESCRIPTOR.fields if f.type == f.TYPE_STRING] or ["x"]
        wrong += [(verb, route, name) for name in names
                  if not refused(verb, route, "%s=ab%scd" % (name, pct),
                                 'query parameter "%s": %s' % (name, why))]
        if not refused(verb, route, "a%s=1" % pct, "query parameter name"):
            wrong.append((verb, route, "a name"))
    assert wrong == [], wrong[:5]


def first_event(s, conn, kind):
    """Reads the raw connection until an event of `kind` arrives; no response may come first."""
    while True:
        data = s.recv(65536)
        assert data, "connection closed"
        for e in conn.receive_data(data):
            if isinstance(e, kind):
                return e
            assert not isinstance(e, h2.events.ResponseReceived) or kind is not \
                h2.events.StreamReset, e
        s.sendall(conn.data_to_send())


@pytest.mark.parametrize("value", [b"a\x00b", b"a\rb", b"a\nb"])
def test_nul_cr_lf_in_header_values_are_refused_by_nghttp2(daemon, value):
    """nghttp2 refuses NUL, CR and LF in a header value (RFC 9113 8.2.1): the stream is reset
    with PROTOCOL_ERROR and never reaches a handler; the connection goes on serving."""
    s = socket.create_connection(("127.0.0.1", daemon.h2c_port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False))
    conn.initiate_connection()
    conn.send_headers(1, [(b":method", b"POST"), (b":scheme", b"http"),
                          (b":authority", b"localhost"), (b":path", b"/grpc.health.v1.Health/Check"),
                          (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                          (b"authorization", b"Bearer " + value)], end_stream=False)
    s.sendall(conn.data_to_send())
    reset = first_event(s, conn, h2.events.StreamReset)
    assert reset.stream_id == 1 and reset.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    # the same connection still serves a good request
    conn.send_headers(3, [(":method", "POST"), (":scheme", "http"), (":authority", "localhost"),
                          (":path", "/grpc.health.v1.Health/Check"),
                          ("content-type", "application/grpc"), ("te", "trailers")])
    conn.send_data(3, b"\0\0\0\0\0", end_stream=True)
    s.sendall(conn.data_to_send())
    trailers = first_event(s, conn, h2.events.TrailersReceived)
    s.close()
    assert dict(trailers.headers).get(b"grpc-status") == b"0"
