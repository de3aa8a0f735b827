"""What an operator sees with curl: JSON calls over TLS HTTP/2 (proto3 JSON mapping, errors as
{"code", "message"} with the matching HTTP status), health and metrics on the control port and
over plain HTTP/1.1 on the ops port."""
import json

import pytest

from conftest import curl


def json_call(d, path, body, tls=True, extra=()):
    if tls:
        url = "https://localhost:%d%s" % (d.tls_port, path)
        args = ["--http2", "--cacert", d.ca]
    else:
        url = "http://%s%s" % (d.h2c, path)
        args = ["--http2-prior-knowledge"]
    rc, out, err = curl(*args, *extra, "-X", "POST", "-H", "content-type: application/json",
                        "-d", body, "-w", "\n%{http_code} %{http_version}", url)
    assert rc == 0, err
    text, _, status = out.decode().rpartition("\n")
    code, version = status.split()
    return int(code), version, (json.loads(text) if text.strip() else None)


def test_json_info_over_tls_http2(daemon):
    status, version, body = json_call(daemon, "/moongate.v1.Daemon/Info", "{}")
    assert (status, version) == (200, "2")
    assert body["state"] == "serving"
    assert isinstance(body["epoch"], str) and int(body["epoch"]) > 0  # 64-bit as string
    assert isinstance(body["uptimeMs"], str)                           # lowerCamelCase
    assert {"name": "rdma", "available": False} .items() <= body["transports"][1].items()


def test_json_enums_bytes_and_64bit_values_round_trip(daemon):
    status, _, body = json_call(daemon, "/grpc.health.v1.Health/Check", '{"service": ""}')
    assert status == 200 and body == {"status": "SERVING"}
    status, _, body = json_call(daemon, "/moongate.v1.Debug/Echo",
                                '{"payload": "aGVsbG8=", "seq": "18446744073709551615"}')
    assert status == 200
    assert body == {"payload": "aGVsbG8=", "seq": "18446744073709551615"}
    # Field names as declared are accepted too; numbers for 64-bit fields as well.
    status, _, body = json_call(daemon, "/moongate.v1.Debug/Sleep", '{"duration_ms": 1}')
    assert status == 200 and body == {"sleptMs": 1}


def test_json_errors_name_the_problem_with_the_right_status(daemon):
    cases = [
        ("/moongate.v1.Daemon/Info", "{not json", 400, 3, "invalid JSON"),
        ("/grpc.health.v1.Health/Check", '{"bogus": 1}', 400, 3, '"bogus"'),
        ("/moongate.v1.Debug/Sleep", '{"durationMs": -1}', 400, 3, "durationMs"),
        ("/moongate.v1.Debug/Sleep", '{"durationMs": "x"}', 400, 3, "durationMs"),
        ("/moongate.v1.Debug/Echo", '{"payload": "***"}', 400, 3, "base64"),
        ("/moongate.v1.Debug/Sleep", '[1, 2]', 400, 3, "JSON object"),
        ("/grpc.health.v1.Health/Check", '{"service": "nope"}', 404, 5, "nope"),
        ("/moongate.v1.Daemon/Nope", "{}", 501, 12, "unknown method"),
        ("/moongate.v1.Debug/Expand", "{}", 501, 12, "streaming"),
        ("/moongate.v1.Debug/Sleep", '{"durationMs": 70000}', 400, 3, "maximum"),
    ]
    for path, body, http, code, needle in cases:
        status, _, err = json_call(daemon, path, body)
        assert (status, err["code"]) == (http, code), (path, body, err)
        assert needle in err["message"], (path, body, err)
    # The daemon keeps serving.
    assert json_call(daemon, "/moongate.v1.Daemon/Info", "{}")[0] == 200


def test_json_over_h2c(daemon):
    status, _, body = json_call(daemon, "/grpc.health.v1.Health/Check", "{}", tls=False)
    assert status == 200 and body["status"] == "SERVING"


def test_health_and_metrics_on_the_control_port(daemon):
    for path, want in (("/livez", "ok"), ("/readyz", "ok"), ("/healthz", "ok")):
        rc, out, err = curl("--http2", "--cacert", daemon.ca,
                            "https://localhost:%d%s" % (daemon.tls_port, path))
        assert rc == 0 and out.decode().strip() == want, err
    json_call(daemon, "/moongate.v1.Daemon/Info", "{}")
    rc, out, _ = curl("--http2", "--cacert", daemon.ca,
                      "https://localhost:%d/metrics" % daemon.tls_port)
    text = out.decode()
    assert 'moongate_grpc_handled_total{grpc_service="moongate.v1.Daemon",grpc_method="Info",' \
           'grpc_code="OK"}' in text
    assert "# TYPE moongate_grpc_handling_seconds histogram" in text
    assert 'moongate_connections_total{kind="tls"}' in text


def test_ops_port_speaks_http1(daemon):
    for path, code in (("/livez", 200), ("/readyz", 200), ("/metrics", 200), ("/", 200),
                       ("/nope", 404)):
        rc, out, err = curl("--http1.1", "-o", "/dev/null", "-w", "%{http_code} %{http_version}",
                            "http://127.0.0.1:%d%s" % (daemon.ops_port, path))
        assert rc == 0, err
        assert out.decode() == "%d 1.1" % code, path
    rc, out, _ = curl("http://127.0.0.1:%d/readyz?verbose" % daemon.ops_port)
    assert "state: serving" in out.decode()
    rc, out, _ = curl("http://127.0.0.1:%d/metrics" % daemon.ops_port)
    assert "moongate_engine_workers 4" in out.decode()
    rc, out, _ = curl("-X", "POST", "-o", "/dev/null", "-w", "%{http_code}",
                      "http://127.0.0.1:%d/readyz" % daemon.ops_port)
    assert out.decode() == "405"


def _page(url, *args):
    """(HTTP status, content type, body) of one GET (or what args make of it)."""
    rc, out, err = curl(*args, "-w", "\n%{http_code} %{content_type}", url)
    assert rc == 0, err
    body, _, tail = out.decode().rpartition("\n")
    code, _, ctype = tail.partition(" ")
    return int(code), ctype, body


def test_pages_answer_alike_on_both_ports(daemon):
    """The pages are one table: the control port (HTTP/2) and the ops port (HTTP/1.1) give the
    same status, content type and body, and an unknown path the same 404 naming the pages."""
    text = "text/plain; charset=utf-8"
    nope = "not found: %s (try /livez /readyz /metrics /status.json /traces /)\n"
    want = {
        "/livez": (200, text, "ok\n"),
        "/readyz": (200, text, "ok\n"),
        "/healthz": (200, text, "ok\n"),
        "/readyz?verbose": (200, text, None),
        "/nope?x=1": (404, text, nope % "/nope"),
        "/v1/nope": (404, text, nope % "/v1/nope"),
        "/livez/x": (404, text, nope % "/livez/x"),
        "/": (200, "text/html; charset=utf-8", None),
        "/metrics": (200, "text/plain; version=0.0.4; charset=utf-8", None),
        "/status.json": (200, "application/json", None),
        "/traces": (200, "application/x-ndjson", None),
    }
    for path, (code, ctype, body) in want.items():
        h2 = _page("http://%s%s" % (daemon.h2c, path), "--http2-prior-knowledge")
        h1 = _page("http://127.0.0.1:%d%s" % (daemon.ops_port, path), "--http1.1")
        assert h2[:2] == h1[:2] == (code, ctype), path
        if body is not None:
            assert h2[2] == h1[2] == body, path
        elif path != "/traces":  # no spans yet: empty; the others' figures may move
            assert h2[2] and h1[2], path
    assert "[+] state: serving" in _page("http://%s/readyz?verbose" % daemon.h2c,
                                         "--http2-prior-knowledge")[2]
    # HEAD: the status and content type of GET, without a body.
    for path, code in (("/livez", 200), ("/metrics", 200), ("/nope", 404)):
        got = _page("http://%s%s" % (daemon.h2c, path), "--http2-prior-knowledge", "-X", "HEAD")
        assert got[:2] == (code, want.get(path, (0, text))[1]) and got[2] == "", path


def test_wrong_content_type_is_415_and_wrong_verb_405(daemon):
    base = "https://localhost:%d/grpc.health.v1.Health/Check" % daemon.tls_port
    rc, out, _ = curl("--http2", "--cacert", daemon.ca, "-H", "content-type: text/plain",
                      "-d", "x", "-o", "/dev/null", "-w", "%{http_code}", base)
    assert out.decode() == "415"
    rc, out, _ = curl("--http2", "--cacert", daemon.ca, "-X", "PUT", "-o", "/dev/null",
                      "-w", "%{http_code}", base)
    assert out.decode() == "405"


def test_grpc_over_curl_shows_trailers_only_errors(daemon):
    rc, out, err = curl("--http2", "--cacert", daemon.ca, "-D", "-", "-o", "/dev/null",
                        "-H", "content-type: application/grpc", "-H", "te: trailers",
                        "--data-binary", "@-",
                        "https://localhost:%d/x.Y/Z" % daemon.tls_port, input=b"\0\0\0\0\0")
    head = out.decode().lower()
    assert "grpc-status: 12" in head and "unknown service" in head


def test_tls_versions(daemon):
    url = "https://localhost:%d/livez" % daemon.tls_port
    for version, flags in (("1.2", ["--tlsv1.2", "--tls-max", "1.2"]),
                           ("1.3", ["--tlsv1.3", "--tls-max", "1.3"])):
        rc, out, err = curl("--http2", "--cacert", daemon.ca, *flags, "-w", " %{http_version}",
                            url)
        assert rc == 0 and out.decode() == "ok\n 2", (version, err)
    rc, out, err = curl("--http2", "--cacert", daemon.ca, "--tlsv1.1", "--tls-max", "1.1", url)
    assert rc != 0  # TLS 1.1 and older are refused


def test_access_log_names_the_caller(daemon):
    import os
    from conftest import unix_channel
    from mgstd import health_pb2, health_pb2_grpc
    import grpc
    with unix_channel(daemon) as ch:
        with pytest.raises(grpc.RpcError):  # NOT_FOUND: an unknown service name, on purpose
            health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="caller.Identity"), timeout=5)
    lines = [l for l in daemon.read_log().splitlines()
             if "event=access" in l and "caller.Identity" in l]
    assert lines, "no access log line for the call"
    # On the Unix socket the identity is the caller's uid and pid (SO_PEERCRED).
    assert 'peer="uid:%d pid:' % os.getuid() in lines[-1]
    assert "code=NOT_FOUND" in lines[-1] and "duration_ms=" in lines[-1]
