#!/usr/bin/python3
"""What a daemon restart costs a serving process: a Mooncake target (Python, `mooncake.engine`
on moongate) holding 1 GiB registered (a managed buffer: a memfd, no memlock) on daemon B, and a
Mooncake initiator on daemon A looping 4 KiB WRITEs into it (tests/integration/mooncake/loop.py).
Each round SIGKILLs B and starts it again at once; the target's library reconnects (back-off
capped at 100 ms: MOONGATE_RECONNECT_BACKOFF_MS=100) and registers its agent and its 1 GiB
again. Printed beside each other, medians of --rounds (5) with min and max:

  start-up     B's own time from exec to ready (/readyz answers 200)
  to transfer  from B's exec to the initiator's first WRITE that succeeded after it
  restore      the difference: what the restart costs beyond the daemon's start-up

and, for the daemon alone, start-up to ready with no pool and with a 1 GiB pool (--pool-bytes).

Usage: bench_restart.py --moongate BIN [--rounds 5] [--size 1G]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
CLIENT = os.path.join(ROOT, "clients", "python")
SHIM = os.path.join(CLIENT, "moongate", "compat", "shim")
sys.path.insert(0, HERE)
from bench_memory import free_port  # noqa: E402

TARGET = """
import json, sys
from mooncake.engine import TransferEngine
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
addr = e.allocate_managed_buffer(int(sys.argv[1]))
assert addr
print(json.dumps({"session": "127.0.0.1:%d" % e.get_rpc_port(), "address": addr}), flush=True)
sys.stdin.read()
"""


class Daemon:
    def __init__(self, moongate, work, name, extra=()):
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.sock = os.path.join(self.dir, "moongate.sock")
        self.h2c, self.ops = free_port(), free_port()
        self.args = [moongate, "--allow-anonymous", "--listen", "",
                     "--ops-listen", "127.0.0.1:%d" % self.ops,
                     "--h2c-listen", "127.0.0.1:%d" % self.h2c, "--peer-tls=false",
                     "--peer-anonymous", "--data-listen", "127.0.0.1:0", "--unix-socket",
                     self.sock, "--shm-dir", self.dir, "--pool-bytes", "0",
                     "--access-log=false", "--max-registered-bytes", "64G"] + list(extra)
        self.p = None

    def ready(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % self.ops, timeout=1) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def start(self):
        """Starts it; returns (when it was started, seconds to ready), monotonic clock."""
        log = open(os.path.join(self.dir, "moongate.log"), "a")
        t0 = time.monotonic()
        self.p = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        while not self.ready():
            if self.p.poll() is not None:
                raise SystemExit("moongate exited; see " + os.path.join(self.dir, "moongate.log"))
            if time.monotonic() - t0 > 60:
                raise SystemExit("moongate was not ready in 60 s")
            time.sleep(0.002)
        return t0, time.monotonic() - t0

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(30)


def env_for(d):
    env = dict(os.environ, MOONGATE_SOCKET=d.sock, PYTHONPATH=os.pathsep.join([SHIM, CLIENT]),
               MOONGATE_RECONNECT_BACKOFF_MS="100")
    env.pop("MOONGATE_TOKEN", None)
    return env


class Loop:
    """loop.py's lines as they come: the monotonic times of the WRITEs that succeeded."""

    def __init__(self, d, session, address):
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "integration", "mooncake", "loop.py"),
             session, str(address), "16"], env=env_for(d), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.oks, self.cv = [], threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            x = line.split()
            if x and x[0] == "ok":
                with self.cv:
                    self.oks.append(float(x[2]))
                    self.cv.notify_all()

    def first_after(self, t, timeout=120):
        with self.cv:
            ok = self.cv.wait_for(lambda: self.oks and self.oks[-1] > t, timeout)
            if not ok:
                raise SystemExit("no WRITE succeeded within %d s of the restart" % timeout)
            return min(x for x in self.oks if x > t)

    def stop(self):
        self.p.stdin.write("stop\n")
        self.p.stdin.flush()
        self.p.wait(60)


def spread(xs):
    return "%7.0f ms  (%.0f-%.0f)" % (statistics.median(xs) * 1000, min(xs) * 1000,
                                       max(xs) * 1000)


def size_of(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1].upper()] if text[-1].upper() in mult else int(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", default="1G")
    a = ap.parse_args()
    size = size_of(a.size)
    work = tempfile.mkdtemp(prefix="mgbench-restart-")
    b = Daemon(a.moongate, work, "b")
    b.start()
    d = Daemon(a.moongate, work, "a", ["--peer-port", str(b.h2c)])
    d.start()
    target = subprocess.Popen([sys.executable, "-c", TARGET, str(size)], env=env_for(b),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    where = json.loads(target.stdout.readline())
    loop = Loop(d, where["session"], where["address"])
    loop.first_after(0)
    ups, tos = [], []
    try:
        for _ in range(a.rounds):
            b.kill()
            t0, up = b.start()
            tos.append(loop.first_after(t0) - t0)
            ups.append(up)
            time.sleep(0.5)  # the loop runs on the restored daemon a while
        loop.stop()
    finally:
        if loop.p.poll() is None:
            loop.p.kill()
        target.stdin.close()
        target.wait(30)
        d.stop()
        b.stop()
    alone = {}
    for pool in ("0", "1G"):
        c = Daemon(a.moongate, work, "c" + pool, ["--pool-bytes", pool])
        times = []
        for _ in range(a.rounds):
            times.append(c.start()[1])
            c.stop()
        alone[pool] = times
    print("daemon restart under a Mooncake target holding %s registered (TCP, %d rounds; "
          "medians, min-max)" % (a.size, a.rounds))
    print("  start-up (exec to ready)             %s" % spread(ups))
    print("  to transfer (exec to first WRITE)    %s" % spread(tos))
    print("  restore (to transfer - start-up)     %s" % spread(
        [t - u for t, u in zip(tos, ups)]))
    print("daemon alone, exec to ready")
    print("  no pool                              %s" % spread(alone["0"]))
    print("  1 GiB pool (--pool-bytes 1G)         %s" % spread(alone["1G"]))


if __name__ == "__main__":
    main()
