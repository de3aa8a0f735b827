"""Integration test harness: starts real moongate daemons on loopback and gives the tests real
clients (python3-grpcio stubs generated from our protos, curl, mgctl).

Environment:
  MG_BUILD_DIR   build tree with the moongate and mgctl binaries (default: <repo>/build)
  MG_CERTS       directory made by certs/make-dev-certs.sh (default: made under the build tree)
  TSAN_OPTIONS   for a ThreadSanitizer build (MG_TSAN): default TSAN_DEFAULTS below; log_path is
                 always the harness's own, see tsan_reports
"""
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("MG_BUILD_DIR", os.path.join(ROOT, "build")))
MOONGATE = os.path.join(BUILD, "moongate")
MGCTL = os.path.join(BUILD, "mgctl")
GEN = os.path.join(BUILD, "pygen")


sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from gen_stubs import generate  # noqa: E402

sys.path.insert(0, generate(GEN))


def _cache_has(entry):
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            return entry in f.read()
    except FileNotFoundError:  # no build there: the tests that need one say so
        return False


# ThreadSanitizer: every process the tests start (daemons, C clients, harnesses) writes its
# reports to a file of its own under TSAN_LOG, and tsan_reports fails the test during which
# one appeared — whatever the process's exit status, even when a test kills it or expects it to
# fail. exitcode=86 fails the daemon fixtures as well, as under ASan. tests/run.sh exports the
# same options (tests/tsan.supp: what is suppressed and why).
TSAN_DEFAULTS = ("exitcode=86:halt_on_error=0:second_deadlock_stack=1:suppressions="
                 + os.path.join(ROOT, "tests", "tsan.supp"))
TSAN_LOG = None
if _cache_has("MG_TSAN:BOOL=ON"):
    TSAN_LOG = tempfile.mkdtemp(prefix="moongate-tsan-")
    os.environ["TSAN_OPTIONS"] = "%s:log_path=%s/report" % (
        os.environ.get("TSAN_OPTIONS") or TSAN_DEFAULTS, TSAN_LOG)


def _tsan_new_reports(seen):
    """The text of report files not in `seen` (added to it), or ""."""
    out = []
    for name in sorted(os.listdir(TSAN_LOG)):
        if name not in seen:
            seen.add(name)
            with open(os.path.join(TSAN_LOG, name), errors="replace") as f:
                out.append("--- %s\n%s" % (name, f.read()))
    return "\n".join(out)


@pytest.fixture(scope="session", autouse=True)
def tsan_session_reports():
    """Reports written after the last test's own check (a module's daemon stopping)."""
    seen = set()
    yield seen
    if TSAN_LOG:
        text = _tsan_new_reports(seen)
        assert not text, "ThreadSanitizer reported:\n" + text
        if not seen:  # kept where there were reports
            shutil.rmtree(TSAN_LOG, ignore_errors=True)


@pytest.fixture(autouse=True)
def tsan_reports(tsan_session_reports):
    """Fails a test during which a process wrote a ThreadSanitizer report. First of the test's
    fixtures, so it looks after the daemons it started have stopped."""
    yield
    if TSAN_LOG:
        text = _tsan_new_reports(tsan_session_reports)
        if text:
            # also on stderr: shown even where another fixture's failure is the one reported
            sys.stderr.write("ThreadSanitizer reported:\n" + text)
            pytest.fail("ThreadSanitizer reported:\n" + text, pytrace=False)


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port():
    """A port that binds now, chosen below the kernel's ephemeral range so that outgoing
    connections of other tests cannot take it before the daemon binds it, and below 20000:
    20000-29999 are agents' ports (the daemon's --agent-ports, and the ports tests give agents
    by number), which must never be one of a daemon's own."""
    lo, _ = _ephemeral_range()
    top = min(max(lo, 12000), 20000)
    # each pytest-xdist worker draws from a slice of its own: a port one worker tried and let go
    # could otherwise be bound by another worker's daemon before this worker's daemon binds it
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    width = (top - 10000) // max(workers, 1)
    first = 10000 + worker * width
    for _ in range(200):
        port = random.randrange(first, first + width)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def free_ports(n):
    """n different free ports of this worker's slice (each free_port alone may repeat one: none
    of them is bound until the daemon starts)."""
    ports = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


def two_free_ports():
    """Two different free ports of this worker's slice, as "A,B" (for scripts that start their
    own daemons, such as tests/gpu/check.sh --ports)."""
    return "%d,%d" % tuple(free_ports(2))


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    d = os.environ.get("MG_CERTS")
    if not d:
        d = str(tmp_path_factory.mktemp("certs"))
        subprocess.run([os.path.join(ROOT, "certs", "make-dev-certs.sh"), d], check=True,
                       stdout=subprocess.DEVNULL)
    return d


class Daemon:
    """A moongate process with TLS, h2c, Unix-socket and ops listeners on free ports."""

    def __init__(self, certs, workdir, extra=(), wrap=(), host="127.0.0.1"):
        self.host = host  # where its TCP listeners are (another network namespace's address)
        self.certs = certs
        self.workdir = workdir
        self.extra = list(extra)
        self.wrap = list(wrap)  # a command the daemon runs under, e.g. setpriv
        self.proc = None
        self.killed = False
        self._pick_ports()

    def _pick_ports(self):
        certs, workdir, extra = self.certs, self.workdir, self.extra
        # three different ports: a daemon once drew the same one for TLS and h2c, and failed
        self.tls_port, self.h2c_port, self.ops_port = free_ports(3)
        # "{h2c_port}" in an argument is this daemon's h2c port (--advertise 127.0.0.1:{h2c_port})
        extra = [a.replace("{h2c_port}", str(self.h2c_port)) for a in extra]
        self.sock = os.path.join(workdir, "moongate-%d.sock" % self.tls_port)
        self.shm = os.path.join(workdir, "shm-%d" % self.tls_port)  # one per daemon
        if "--shm-dir" in extra:  # the flag given last wins, in the daemon as here
            self.shm = extra[len(extra) - 1 - extra[::-1].index("--shm-dir") + 1]
        self.log_path = os.path.join(workdir, "moongate-%d.log" % self.tls_port)
        self.args = self.wrap + [
            MOONGATE,
            "--listen", "%s:%d" % (self.host, self.tls_port),
            "--h2c-listen", "%s:%d" % (self.host, self.h2c_port),
            "--unix-socket", self.sock,
            "--ops-listen", "%s:%d" % (self.host, self.ops_port),
            "--tls-cert", os.path.join(certs, "server.pem"),
            "--tls-key", os.path.join(certs, "server.key"),
            "--debug-service",
            "--grace", "10",
            "--shm-dir", self.shm,
            "--pool-bytes", "0",  # tests of the pool give it a size
            "--data-listen", "%s:0" % self.host,  # a free port; OpenSession tells which
            "--peer-anonymous",  # peers call over h2c here; test_peer_auth.py turns it off
            "--allow-anonymous",  # clients without credentials are tenant "default"; test_auth.py
                                  # turns it off
        ] + list(extra)

    @property
    def ca(self):
        return os.path.join(self.certs, "ca.pem")

    @property
    def h2c(self):
        return "%s:%d" % (self.host, self.h2c_port)

    @property
    def tls(self):
        return "localhost:%d" % self.tls_port

    def start(self, attempts=5):
        """Starts the daemon; a port taken in the meantime means new ports and a new try."""
        for attempt in range(attempts):
            try:
                return self._start_once()
            except RuntimeError as e:
                if "listen_failed" not in str(e) or attempt + 1 == attempts:
                    raise
                self._pick_ports()

    def _start_once(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.close()
                raise RuntimeError("moongate exited with %d:\n%s" % (self.proc.returncode,
                                                                      self.read_log()))
            try:
                if self.ops_get("/readyz")[0] == 200:
                    return self
            except (OSError, http.client.HTTPException):
                pass  # not listening yet, or another program's port it is about to fail on
            time.sleep(0.05)
        raise RuntimeError("moongate did not become ready:\n" + self.read_log())

    def read_log(self):
        """Its log, and the ThreadSanitizer reports it wrote (in a file of their own)."""
        with open(self.log_path) as f:
            text = f.read()
        if TSAN_LOG and self.proc:
            try:
                with open(os.path.join(TSAN_LOG, "report.%d" % self.proc.pid)) as f:
                    text += "\nThreadSanitizer:\n" + f.read()
            except FileNotFoundError:
                pass
        return text

    def ops_get(self, path):
        try:
            with urllib.request.urlopen("http://%s:%d%s" % (self.host, self.ops_port, path),
                                        timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self):
        return self.ops_get("/metrics")[1]

    def metric(self, name, **labels):
        """The value of one sample, or None."""
        want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
        for line in self.metrics().splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            if "{" in key:
                n, _, rest = key.partition("{")
                got = ",".join(sorted(rest.rstrip("}").split(",")))
            else:
                n, got = key, ""
            if n == name and got == want:
                return float(value)
        return None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        """SIGKILL, on purpose: the fixture then expects no clean exit."""
        self.killed = True
        self.proc.kill()
        self.proc.wait()

    def stop(self, timeout=20):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a test may have left it frozen
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log.close()
        return self.proc.returncode if self.proc else None

    def alive(self):
        return self.proc.poll() is None


@pytest.fixture
def make_daemon(certs, tmp_path):
    made = []

    def make(*extra, wrap=(), host="127.0.0.1"):
        d = Daemon(certs, str(tmp_path), extra, wrap, host).start()
        made.append(d)
        return d

    yield make
    codes = [(d, d.stop()) for d in made]  # every daemon stops, even when one failed
    for d, rc in codes:
        assert rc == 0 or d.killed, "moongate exited with %s\n%s" % (rc, d.read_log())


@pytest.fixture(scope="module")
def daemon(certs, tmp_path_factory):
    d = Daemon(certs, str(tmp_path_factory.mktemp("daemon"))).start()
    yield d
    rc = d.stop()
    assert rc == 0, "moongate exited with %s\n%s" % (rc, d.read_log())


def h2c_channel(d):
    import grpc
    return grpc.insecure_channel(d.h2c, options=[("grpc.max_send_message_length", -1),
                                                 ("grpc.max_receive_message_length", -1)])


def unix_channel(d):
    import grpc
    return grpc.insecure_channel("unix:" + d.sock)


def tls_channel(d, ca=None, cert=None):
    """TLS to d's control port, trusting `ca` (default: the development CA), presenting the
    certificate `cert` (a name in the certs directory: "peer-a" uses peer-a.pem/.key)."""
    import grpc

    def read(name):
        with open(os.path.join(d.certs, name), "rb") as f:
            return f.read()
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(ca or "ca.pem"),
        private_key=read(cert + ".key") if cert else None,
        certificate_chain=read(cert + ".pem") if cert else None)
    return grpc.secure_channel(d.tls, creds)


def register(d, name, size, remote=False):
    """A segment registered on d (remote-accessible when asked), over h2c."""
    from moongate.v1 import memory_pb2, memory_pb2_grpc
    with h2c_channel(d) as ch:
        return memory_pb2_grpc.MemoryStub(ch).RegisterSegment(memory_pb2.RegisterRequest(
            name=name, size=size, remote_accessible=remote), timeout=10).segment


def req(op, local, peer, remote, length, local_offset=0, remote_offset=0):
    """One TransferRequest between a local segment and a peer's segment."""
    from moongate.v1 import transfer_pb2
    return transfer_pb2.TransferRequest(op=op, local_segment=local, local_offset=local_offset,
                                        peer=peer, remote_segment=remote,
                                        remote_offset=remote_offset, length=length)


def wait_batch(t, batch_id, timeout=30):
    """The batch once it is over (GetBatch every 20 ms), failing after `timeout` seconds."""
    from moongate.v1 import transfer_pb2
    deadline = time.monotonic() + timeout
    while True:
        b = t.GetBatch(transfer_pb2.GetBatchRequest(id=batch_id))
        if b.state != transfer_pb2.RUNNING:
            return b
        assert time.monotonic() < deadline, "batch still running: %s" % b
        time.sleep(0.02)


def curl(*args, input=None):
    """Runs curl; returns (exit code, stdout, stderr)."""
    p = subprocess.run(["curl", "-sS", "--max-time", "20"] + list(args), input=input,
                       capture_output=True)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def sanitized():
    """Whether the build under test has ASan and UBSan (MG_SANITIZE)."""
    return _cache_has("MG_SANITIZE:BOOL=ON")


def tsan():
    """Whether the build under test has ThreadSanitizer (MG_TSAN)."""
    return TSAN_LOG is not None


def sanitizer_preload():
    """The environment a program that is not sanitized (python3) needs to load the build's
    sanitized shared libraries with ctypes: the runtimes first, leaks of the interpreter not
    reported. {} for a build without sanitizers."""
    if not sanitized():
        return {}
    libs = [subprocess.run(["gcc", "-print-file-name=" + n], capture_output=True, text=True,
                           check=True).stdout.strip() for n in ("libasan.so", "libubsan.so")]
    opts = os.environ.get("ASAN_OPTIONS", "")
    return {"LD_PRELOAD": " ".join(libs),
            "ASAN_OPTIONS": (opts + ":" if opts else "") + "detect_leaks=0"}


class CProgram:
    """tests/client/mgc_harness.c: a program on the C client (mg_client_open), a command a
    line; each answers one line."""

    def __init__(self, d, env=None, sock=None):
        self.p = subprocess.Popen([os.path.join(BUILD, "mgc_harness"),
                                   "unix:" + (sock or d.sock)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, **(env or {})))

    def __call__(self, *words):
        self.p.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        assert line, "mgc_harness ended: " + self.p.stderr.read()
        return line.split()

    def close(self):
        self.p.stdin.close()
        assert self.p.wait(30) == 0, self.p.stderr.read()
        self.p.stderr.close()
        self.p.stdout.close()


class Child:
    """A helper process the tests drive by lines (agent_proc.py, mooncake/target.py,
    gpu_proc.py, the C harness): it says where it is in one JSON line (its fields become
    attributes), then answers one line per command on stdin."""

    def __init__(self, argv, env=None):
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.where()

    def line(self, why):
        out = self.p.stdout.readline()
        if not out:
            raise RuntimeError(why + self.p.stderr.read())
        return out.strip()

    def where(self):
        self.__dict__.update(json.loads(self.line("%s failed: " % type(self).__name__)))

    def ask(self, text):
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()
        return self.line("%s ended: " % type(self).__name__)

    def close(self):
        """Ends the process ("quit"); returns what it said on stderr."""
        if self.p.poll() is None:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
        self.p.wait(timeout=20)
        return self.p.stderr.read()


@pytest.fixture
def children():
    """make(cls, *args) starts a Child of class cls; every one still running is killed after."""
    made = []

    def make(cls, *a, **kw):
        made.append(cls(*a, **kw))
        return made[-1]
    yield make
    for c in made:
        if c.p.poll() is None:
            c.p.kill()
        c.p.wait()
