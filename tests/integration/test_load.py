"""Many multiplexed calls from h2load over h2c and TLS. h2load counts HTTP 200 as success, so
the check is the daemon's own count of calls answered with grpc-status 0."""
import re
import subprocess

import pytest

N = 3000


def ok_checks(d):
    return d.metric("moongate_grpc_handled_total", grpc_service="grpc.health.v1.Health",
                    grpc_method="Check", grpc_code="OK") or 0


@pytest.mark.parametrize("scheme", ["h2c", "tls"])
def test_h2load_many_streams(daemon, tmp_path, scheme):
    body = tmp_path / "check.bin"
    body.write_bytes(b"\0\0\0\0\0")
    url = ("http://%s" % daemon.h2c if scheme == "h2c" else "https://localhost:%d" %
           daemon.tls_port) + "/grpc.health.v1.Health/Check"
    before = ok_checks(daemon)
    p = subprocess.run(["h2load", "-n", str(N), "-c", "4", "-m", "64", "-d", str(body),
                        "-H", "content-type: application/grpc", "-H", "te: trailers", url],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert re.search(r"%d succeeded, 0 failed, 0 errored" % N, p.stdout), p.stdout
    assert ok_checks(daemon) - before == N
    # Nothing left open once the load is over.
    assert daemon.metric("moongate_streams_active") == 0


@pytest.mark.parametrize("target", ["unix", "h2c", "tls"])
def test_mgbench_many_calls_through_the_client_library(daemon, target):
    import os
    from conftest import BUILD
    args = {"unix": ["--target", "unix:" + daemon.sock],
            "h2c": ["--target", daemon.h2c, "--plaintext"],
            "tls": ["--target", daemon.tls, "--ca", daemon.ca]}[target]
    before = ok_checks(daemon)
    p = subprocess.run([os.path.join(BUILD, "mgbench"), *args, "--conns", "3", "--streams",
                        "150", "--requests", str(N), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    import json
    out = json.loads(p.stdout)
    assert out["requests"] == N and out["ok"] == N
    assert ok_checks(daemon) - before == N
