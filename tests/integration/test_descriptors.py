"""Descriptors: the daemon raises its open-files limit to the hard limit and says so; a
segment keeps no descriptor once mapped; and when descriptors run out, every listener pauses
instead of spinning on accept() — one log line, a counter — the connections already open are
served, and accepting resumes when descriptors free. Under `prlimit --nofile=256:256`."""
import json
import os
import socket
import time


from conftest import MGCTL, curl, h2c_channel, register, req
from mgstd import health_pb2, health_pb2_grpc
from moongate.v1 import daemon_pb2, daemon_pb2_grpc, memory_pb2, memory_pb2_grpc, transfer_pb2
from moongate.v1 import transfer_pb2_grpc

LIMIT = ["prlimit", "--nofile=256:256"]


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def info(d):
    with h2c_channel(d) as ch:
        return daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest(), timeout=10)


def test_open_files_limit_is_raised_to_the_hard_limit_and_shown(make_daemon):
    d = make_daemon(wrap=["prlimit", "--nofile=256:4096"])
    assert info(d).open_files_limit == 4096
    assert d.metric("moongate_open_files_limit") == 4096
    assert "event=open_files_limit raised_from=256 to=4096" in d.read_log()
    p = __import__("subprocess").run([MGCTL, "--target", d.h2c, "--plaintext", "--json",
                                      "doctor"], capture_output=True, timeout=30)
    checks = {c["check"]: c for c in json.loads(p.stdout)["checks"]}
    assert checks["open-files"]["result"] == "warn", checks  # 4096 is few for a node
    assert "4096 descriptors" in checks["open-files"]["detail"]


def test_segments_are_not_bounded_by_descriptors(make_daemon):
    """300 segments under a limit of 256 descriptors: --max-segments is the bound."""
    d = make_daemon("--max-segments", "400", wrap=LIMIT)
    with h2c_channel(d) as ch:
        m = memory_pb2_grpc.MemoryStub(ch)
        ids = [m.RegisterSegment(memory_pb2.RegisterRequest(name="s%d" % i, size=4096),
                                 timeout=10).segment.id for i in range(300)]
        assert len(os.listdir("/proc/%d/fd" % d.proc.pid)) < 100
        for i in ids:
            m.UnregisterSegment(memory_pb2.UnregisterRequest(id=i), timeout=10)


def test_descriptor_exhaustion_pauses_accepting_and_recovers(make_daemon):
    b = make_daemon("--peer-tls=false", wrap=LIMIT)
    a = make_daemon("--peer-tls=false")
    t_start = time.monotonic()
    data_port = [t.endpoint for t in info(b).transports if t.name == "tcp"][0].rsplit(":", 1)[1]
    held = h2c_channel(b)  # a client connected before the descriptors run out
    health = health_pb2_grpc.HealthStub(held)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1
    log_before = os.path.getsize(b.log_path)
    socks = []

    def connect(port=None):
        s = socket.socket(socket.AF_UNIX if port is None else socket.AF_INET)
        s.setblocking(False)
        s.connect_ex(b.sock if port is None else ("127.0.0.1", port))
        socks.append(s)

    def wait_log(needle):
        deadline = time.monotonic() + 30
        while needle not in b.read_log():
            assert time.monotonic() < deadline, "no %s in the log" % needle
            time.sleep(0.1)

    try:
        for i in range(400):  # far more than the daemon has descriptors for
            connect(b.h2c_port if i % 2 else b.ops_port)
        wait_log("event=accept_paused")
        # then the other listeners meet the same want: the Unix socket, and the data plane
        # (its own thread: it takes connections while a descriptor is free, so more come
        # until one finds none)
        connect()
        deadline = time.monotonic() + 30
        while "event=accept_paused listener=data" not in b.read_log():
            assert time.monotonic() < deadline and len(socks) < 1000, "the data plane"
            connect(int(data_port))
            time.sleep(0.05)
        # the daemon does not spin: 2 s of wall time cost it far less than a core
        cpu0, t0 = cpu_seconds(b.proc.pid), time.monotonic()
        time.sleep(2)
        used = cpu_seconds(b.proc.pid) - cpu0
        assert used < 0.5 * (time.monotonic() - t0), used
        # the connection opened before is served all along
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1
        log = b.read_log()
        assert os.path.getsize(b.log_path) - log_before < 20000
        assert "Too many open files" not in log.replace('error="Too many open files"', "")
        assert all(line.startswith("ts=") for line in log.splitlines())  # logfmt only
    finally:
        for s in socks:
            s.close()
    # descriptors free: every listener accepts again
    deadline = time.monotonic() + 30
    while True:
        try:
            if b.ops_get("/livez")[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the ops port never accepted again"
        time.sleep(0.1)
    with h2c_channel(b) as ch:
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                    timeout=10).status == 1
    rc, out, err = curl("--http2-prior-knowledge", "--unix-socket", b.sock,
                        "http://localhost/livez")
    assert rc == 0 and out == b"ok\n", (out, err)
    # the data plane too: a transfer into B
    src = register(a, "src", 65536)
    dst = register(b, "dst", 65536, remote=True)
    with h2c_channel(a) as ch:
        r = transfer_pb2_grpc.TransferStub(ch).Submit(transfer_pb2.SubmitRequest(
            requests=[req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 65536)], wait=True),
            timeout=30)
        assert r.batch.state == transfer_pb2.DONE, r.batch
    held.close()
    assert b.metric("moongate_accept_paused_total") >= 1
    assert b.metric("moongate_accept_paused") == 0
    assert b.metric("moongate_data_accept_paused_total") >= 1
    log = b.read_log()
    assert "event=accept_resumed" in log
    # a line a second at most for the gateway's listeners and the data plane's, whatever the
    # number of attempts (before: a line an attempt, megabytes a second)
    assert log.count("event=accept_paused") <= 2 * (time.monotonic() - t_start + 1)
