"""mgctl against the real daemon: health, info and call, over TLS, h2c and the Unix socket, human
and JSON output, and exit codes that follow the gRPC status."""
import json
import subprocess

from conftest import MGCTL, free_port


def mgctl(*args, input=None):
    p = subprocess.run([MGCTL] + list(args), capture_output=True, input=input, timeout=30)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def test_health_over_each_transport(daemon):
    for target in (["--target", "unix:" + daemon.sock],
                   ["--target", daemon.h2c, "--plaintext"],
                   ["--target", daemon.tls, "--ca", daemon.ca]):
        rc, out, err = mgctl(*target, "health")
        assert (rc, out) == (0, "SERVING\n"), err


def test_health_of_unknown_service_exits_not_found(daemon):
    rc, out, err = mgctl("--target", daemon.h2c, "--plaintext", "health", "no.Such")
    assert rc == 5 and "NOT_FOUND" in err and "no.Such" in err


def test_health_watch_until_deadline(daemon):
    rc, out, err = mgctl("--target", daemon.h2c, "--plaintext", "--timeout", "500", "health",
                         "--watch")
    assert rc == 0 and out == "SERVING\n", err


def test_info_human_and_json(daemon):
    rc, out, err = mgctl("--target", daemon.tls, "--ca", daemon.ca, "info")
    assert rc == 0, err
    assert "state       serving" in out and "transport   rdma" in out
    assert "transport   tcp   available at 127.0.0.1:" in out
    rc, out, err = mgctl("--target", daemon.tls, "--ca", daemon.ca, "--json", "info")
    assert rc == 0, err
    body = json.loads(out)
    assert body["state"] == "serving" and "reflection" in body["features"]


def test_call_any_unary_method_with_json(daemon):
    rc, out, err = mgctl("--target", daemon.h2c, "--plaintext", "call", "Debug/Echo",
                         '{"payload": "aGk=", "seq": "42"}')
    assert rc == 0, err
    assert json.loads(out) == {"payload": "aGk=", "seq": "42"}
    rc, out, err = mgctl("--target", "unix:" + daemon.sock, "call",
                         "/grpc.health.v1.Health/Check", "-", input=b'{"service": ""}')
    assert rc == 0 and json.loads(out) == {"status": "SERVING"}, err


def test_call_errors_and_exit_codes(daemon):
    rc, _, err = mgctl("--target", daemon.h2c, "--plaintext", "call", "Debug/Nope", "{}")
    assert rc == 64 and "unknown method" in err
    rc, _, err = mgctl("--target", daemon.h2c, "--plaintext", "call", "Debug/Sleep",
                       '{"durationMs": "soon"}')
    assert rc == 64 and "durationMs" in err
    rc, _, err = mgctl("--target", daemon.h2c, "--plaintext", "--timeout", "200", "call",
                       "Debug/Sleep", '{"durationMs": 3000}')
    assert rc == 4 and "DEADLINE_EXCEEDED" in err
    rc, out, _ = mgctl("--target", daemon.h2c, "--plaintext", "--json", "--timeout", "200",
                       "call", "Debug/Sleep", '{"durationMs": 3000}')
    assert rc == 4 and json.loads(out)["status"] == "DEADLINE_EXCEEDED"


def test_unreachable_daemon_is_unavailable():
    rc, _, err = mgctl("--target", "127.0.0.1:%d" % free_port(), "--plaintext", "health")
    assert rc == 14 and "UNAVAILABLE" in err


def test_tls_with_the_wrong_ca_fails_verification(daemon, certs):
    import os
    rc, _, err = mgctl("--target", daemon.tls, "--ca", os.path.join(certs, "peer-ca.pem"),
                       "health")
    assert rc == 14 and "certificate" in err.lower()
