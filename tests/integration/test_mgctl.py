"""mgctl against the real daemon: health, info and call, over TLS, h2c and the Unix socket, human
and JSON output, and exit codes that follow the gRPC status."""
import json
import os
import subprocess
import time

from conftest import MGCTL, free_port, register


def mgctl(*args, input=None):
    p = subprocess.run([MGCTL] + list(args), capture_output=True, input=input, timeout=30)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def test_health_over_each_transport(daemon):
    for target in (["--target", "unix:" + daemon.sock],
                   ["--target", daemon.h2c, "--plaintext"],
                   ["--target", daemon.tls, "--ca", daemon.ca]):
        rc, out, err = mgctl(*target, "health")
        assert (rc, out) == (0, "SERVING\n"), err


def test_a_refused_connection_says_so(daemon):
    """Over TLS as over h2c: the system call's reason, not OpenSSL's code for it."""
    port = free_port()  # nothing listens there
    for target in (["--target", "127.0.0.1:%d" % port, "--ca", daemon.ca],
                   ["--target", "127.0.0.1:%d" % port, "--plaintext"]):
        rc, out, err = mgctl(*target, "health")
        assert rc == 14 and "127.0.0.1:%d: Connection refused" % port in err, err


def test_a_tls_failure_names_its_reason(daemon):
    other = os.path.join(daemon.certs, "peer-ca.pem")  # did not sign the daemon's certificate
    rc, out, err = mgctl("--target", daemon.tls, "--ca", other, "health")
    assert rc == 14 and "TLS: certificate verify failed" in err, err


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
    # ids read the same in both forms: the epoch in decimal, as JSON has it
    rc, human, err = mgctl("--target", daemon.tls, "--ca", daemon.ca, "info")
    assert "epoch       %s\n" % body["epoch"] in human, human


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


def test_resources_tables_json_and_exit_codes(make_daemon, tmp_path):
    """Every resource subcommand against a real daemon: segments, leases, pools, peers,
    transfers (get, wait with its end state, cancel), watch, status and doctor; tables by
    default, --json parsed, exit codes that follow the gRPC status."""
    b = make_daemon()
    d = make_daemon("--pool-bytes", "8M", "--peer-tls=false")
    t = ["--target", d.h2c, "--plaintext"]
    rc, out, err = mgctl(*t, "--json", "segments", "register", "kv0", "1M", "--remote")
    assert rc == 0, err
    seg = json.loads(out)["segment"]
    assert seg["size"] == str(1 << 20) and seg["remoteAccessible"] is True
    rc, out, err = mgctl(*t, "segments")
    assert rc == 0 and out.splitlines()[0].split()[:3] == ["ID", "NAME", "TENANT"], out
    assert seg["id"] in out and "1.0 MiB" in out and "kv0" in out
    rc, out, err = mgctl(*t, "segments", "get", seg["id"])
    assert rc == 0 and "NAME         kv0" in out, out
    rc, out, err = mgctl(*t, "segments", "register", "bad", "12Q")
    assert rc == 64 and "register NAME SIZE" in err
    rc, out, err = mgctl(*t, "segments", "get", "12345")
    assert rc == 5 and "NOT_FOUND" in err
    rc, out, err = mgctl(*t, "--json", "leases", "acquire", "64K", "--ttl", "60000")
    assert rc == 0, err
    lease = json.loads(out)
    assert lease["requested"] == str(64 << 10)
    rc, out, err = mgctl(*t, "--json", "leases")
    assert rc == 0 and [x["id"] for x in json.loads(out)] == [lease["id"]], out
    rc, out, err = mgctl(*t, "pools")
    assert rc == 0 and "default" in out and "64.0 KiB" in out, out
    rc, out, err = mgctl(*t, "leases", "release", lease["id"])
    assert rc == 0 and "released" in out
    rc, out, err = mgctl(*t, "leases", "release", lease["id"])
    assert rc == 5
    # a transfer to a peer, then the batch through transfers get and wait
    dst = register(b, "dst", 1 << 20, remote=True)
    from moongate.v1 import transfer_pb2, transfer_pb2_grpc
    from conftest import h2c_channel, req
    with h2c_channel(d) as ch:
        bid = transfer_pb2_grpc.TransferStub(ch).Submit(transfer_pb2.SubmitRequest(
            requests=[req(transfer_pb2.WRITE, int(seg["id"]), b.h2c, dst.id, 1 << 20)],
            notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic="t", payload=b"hi")]),
            timeout=10).batch_id
    rc, out, err = mgctl(*t, "transfers", "wait", str(bid))
    assert rc == 0 and ("batch %d: DONE" % bid) in out and "1.0 MiB" in out, (out, err)
    rc, out, err = mgctl(*t, "--json", "transfers", "get", str(bid))
    assert rc == 0 and json.loads(out)["state"] == "DONE"
    rc, out, err = mgctl(*t, "transfers", "cancel", str(bid))
    assert rc == 0
    rc, out, err = mgctl(*t, "transfers", "get", "77")
    assert rc == 5
    rc, out, err = mgctl(*t, "peers")
    assert rc == 0 and b.h2c in out and "PEER_OPEN" in out, out
    # the notification waits on b: watch prints it, then its --timeout ends the watch
    rc, out, err = mgctl("--target", b.h2c, "--plaintext", "--timeout", "1000", "watch", "t")
    assert rc == 0 and "payload aGk=" in out, (out, err)
    rc, out, err = mgctl(*t, "status")
    assert rc == 0 and "state serving" in out and "segments  1" in out, out
    human = out
    rc, out, err = mgctl(*t, "--json", "status")
    assert rc == 0 and json.loads(out)["info"]["state"] == "serving"
    assert "epoch %s\n" % json.loads(out)["info"]["epoch"] in human, human
    rc, out, err = mgctl(*t, "peers")
    rc, peers, err = mgctl(*t, "--json", "peers")
    for p in json.loads(peers)["peers"]:
        assert p["epoch"] in out, (out, peers)
    rc, out, err = mgctl(*t, "--json", "doctor", "--shm-dir", str(tmp_path))
    assert rc == 0, (out, err)
    checks = {c["check"]: c for c in json.loads(out)["checks"]}
    assert checks["daemon"]["result"] == "ok" and checks["peer"]["result"] == "ok"
    assert {"memlock", "shm-dir", "rdma", "rdma-device"} <= set(checks)
    rc, out, err = mgctl("--target", "127.0.0.1:1", "--plaintext", "doctor")
    assert rc == 9 and "FAIL  daemon" in out, (out, err)


def test_doctor_on_a_daemon_with_process_memory_off(make_daemon, tmp_path):
    """Process memory turned off (the helm chart's default) is the operator's choice: doctor
    says so and passes; it fails only for what is wrong."""
    d = make_daemon("--process-memory=false")
    rc, out, err = mgctl("--target", "unix:" + d.sock, "--json", "doctor", "--shm-dir",
                         str(tmp_path))
    checks = {c["check"]: c for c in json.loads(out)["checks"]}
    assert checks["process_vm"]["result"] == "ok", checks
    assert "--process-memory=false" in checks["process_vm"]["detail"], checks
    assert rc == 0, (out, err)


def test_doctor_names_an_expired_certificate(make_daemon, tmp_path):
    d = make_daemon()
    import time
    key, csr, pem = (str(tmp_path / n) for n in ("k.pem", "c.csr", "c.pem"))
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=old", "-keyout", key,
                    "-out", csr], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-signkey", key, "-days", "0",
                    "-out", pem], check=True, capture_output=True)  # valid until now
    time.sleep(1.1)
    rc, out, err = mgctl("--target", d.h2c, "--plaintext", "--ca", pem, "doctor")
    assert rc == 9 and "expired" in out and pem in out, (out, err)


def test_register_file_passes_the_descriptor(make_daemon, tmp_path):
    """segments register-file: a file opened by mgctl, passed on the fd socket and registered
    where it lies; refusals keep their gRPC code as the exit code."""
    d = make_daemon()
    path = "/dev/shm/mgctl-fd-%d" % os.getpid()
    with open(path, "wb") as f:
        f.write(b"from mgctl" + bytes(4096 - 10))
    try:
        t = ["--target", "unix:" + d.sock]
        rc, out, err = mgctl(*t, "--json", "segments", "register-file", "tmpfs", path)
        assert rc == 0, err
        seg = json.loads(out)["segment"]
        assert seg["source"] == "FD" and seg["size"] == "4096" and seg.get("path", "") == ""
        rc, out, err = mgctl(*t, "segments", "register-file", "again", path)
        assert rc == 0, err  # the same tenant may register its file again
        rc, out, err = mgctl(*t, "segments", "register-file", "dir", str(tmp_path))
        assert rc == 1 and "cannot open" in err
        rc, out, err = mgctl("--target", d.h2c, "--plaintext", "segments", "register-file",
                             "tcp", path)
        assert rc == 64 and "unix:PATH target" in err
    finally:
        os.unlink(path)


def test_agents(make_daemon):
    """agents: the tenant's agents here, and one described with its regions."""
    import conftest
    os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
    import moongate_client as mg
    d = make_daemon()
    t = ["--target", "unix:" + d.sock]
    with mg.Client("unix:" + d.sock) as c:
        c.register_agent("decode-0", port=22222)
        buf = c.allocate_buffer(1 << 20, remote_accessible=True)
        rc, out, err = mgctl(*t, "agents")
        assert rc == 0, err
        assert "decode-0" in out and "22222" in out
        rc, out, err = mgctl(*t, "agents", "describe", "decode-0")
        assert rc == 0, err
        assert str(buf.address) in out and "1.0 MiB" in out, out
        rc, out, err = mgctl(*t, "--json", "agents", "describe", "decode-0")
        assert rc == 0 and json.loads(out)["firstAddress"] == str(buf.address), err
        rc, out, err = mgctl(*t, "agents", "describe", "nobody")
        assert rc == 5 and "no agent" in err, (rc, err)
    deadline = time.monotonic() + 20  # the client's connection closed: the agent ends
    while "decode-0" in mgctl(*t, "agents")[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    rc, out, err = mgctl(*t, "agents")
    assert rc == 0 and "decode-0" not in out


def test_expectations(make_daemon):
    """expectations: what receivers here wait for, and one taken back."""
    import conftest
    os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
    import moongate_client as mg
    d = make_daemon()
    t = ["--target", "unix:" + d.sock]
    with mg.Client("unix:" + d.sock) as c:
        e = c.expect("kv/layer-3", 120000, peer="127.0.0.1:9")
        rc, out, err = mgctl(*t, "expectations")
        assert rc == 0, err
        assert "kv/layer-3" in out and "127.0.0.1:9" in out and str(e.id) in out, out
        rc, out, err = mgctl(*t, "--json", "expectations")
        [got] = json.loads(out)["expectations"]
        assert got["topic"] == "kv/layer-3" and 0 < got["deadlineLeftMs"] <= 120000, got
        rc, out, err = mgctl(*t, "expectations", "cancel", str(e.id))
        assert rc == 0 and "taken back" in out, err
        assert "kv/layer-3" not in mgctl(*t, "expectations")[1]
        rc, out, err = mgctl(*t, "expectations", "cancel", str(e.id))
        assert rc == 5, (rc, err)
        assert mgctl(*t, "expectations", "cancel", "x")[0] == 64
