#!/usr/bin/python3
"""How soon a waiting receiver hears that its notification will not come, for each cause,
beside what bounds it in the same run.

  refused      a WRITE daemon B refuses (its segment unregistered after A cached it): time from
               Submit to the failure notice on B's topic, against Submit to the notification of
               the same WRITE that lands (the reference)
  agent_gone   the sender's agent process SIGKILLed: kill to notice, against the probe interval
  restarted    the sender's daemon stopped and started again on its port: its ready line to the
               notice, against the probe interval
  unreachable  the sender's daemon SIGSTOPped: stop to notice, against --peer-liveness-timeout
  deadline     an expectation of 500 ms with no sender: declaration to notice, against 500 ms

Each expectation has a 120 s deadline (but the last), so only detection can end the wait.
Medians of --rounds (5) with min and max; every cause in the same run, in turn.

Usage: bench_receiver.py --moongate BIN [--rounds 5] [--liveness-ms 2000]
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moongate_client as mg  # noqa: E402
from bench_memory import free_port, start  # noqa: E402
from moongate.v1 import notify_pb2, transfer_pb2  # noqa: E402

LONG = 120000
AGENT = """
import sys, time
sys.path.insert(0, sys.argv[2])
import moongate_client as mg
c = mg.Client("unix:" + sys.argv[1])
c.register_agent("bench-sender", 0)
print("ready", flush=True)
time.sleep(3600)
"""


def first(c, topic):
    """(seconds on the monotonic clock when it came, the notification)."""
    for n in c.notifications(topic, timeout=LONG / 1000):
        return time.monotonic(), n
    raise SystemExit("no notification on " + topic)


def known(c, eid):
    while True:
        e = [x for x in c.expectations() if x.id == eid]
        if not e:
            raise SystemExit("expectation %d ended before its sender answered" % eid)
        if e[0].epoch:
            return
        time.sleep(0.005)


def check(n, outcome):
    if n.outcome != outcome:
        raise SystemExit("expected %s, got %s: %s" % (notify_pb2.Outcome.Name(outcome),
                                                      notify_pb2.Outcome.Name(n.outcome),
                                                      n.message))


class Pair:
    def __init__(self, args, work):
        self.args, self.work, self.k = args, work, 0
        self.a_port, self.b_port = free_port(), free_port()
        self.a, self.a_sock = start(args.moongate, work, "a", "127.0.0.1:%d" % self.a_port)
        self.b, b_sock = start(args.moongate, work, "b", "127.0.0.1:%d" % self.b_port,
                               ["--peer-liveness-timeout", str(args.liveness_ms)])
        self.ca, self.cb = mg.Client("unix:" + self.a_sock), mg.Client("unix:" + b_sock)
        self.a_peer, self.b_peer = "127.0.0.1:%d" % self.a_port, "127.0.0.1:%d" % self.b_port
        self.src = self.ca.register("src", 1 << 20)

    def topic(self):
        self.k += 1
        return "bench/%d" % self.k

    def refused(self, land):
        """Submit to notification (land) or to failure notice (a refused WRITE)."""
        dst = self.cb.register("dst%d" % self.k, 1 << 20, remote_accessible=True)
        w = mg.write(self.src.id, peer=self.b_peer, remote_segment=dst.id, length=4096)
        self.ca.transfer([w])  # A knows dst now
        if not land:
            self.cb.unregister(dst.id)
        t = self.topic()
        self.cb.expect(t, LONG, peer=self.a_peer)
        t0 = time.monotonic()
        self.ca.submit([w], notify=[transfer_pb2.NotifyPeer(peer=self.b_peer, topic=t)])
        t1, n = first(self.cb, t)
        check(n, notify_pb2.OUTCOME_LANDED if land else notify_pb2.OUTCOME_FAILED)
        if land:
            self.cb.unregister(dst.id)
        return t1 - t0

    def agent_gone(self):
        p = subprocess.Popen([sys.executable, "-c", AGENT, self.a_sock,
                              os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                           "..", "clients", "python")],
                             stdout=subprocess.PIPE, text=True)
        p.stdout.readline()
        t = self.topic()
        known(self.cb, self.cb.expect(t, LONG, peer=self.a_peer, agent="bench-sender").id)
        t0 = time.monotonic()
        p.kill()
        p.wait()
        t1, n = first(self.cb, t)
        check(n, notify_pb2.OUTCOME_SENDER_AGENT_GONE)
        return t1 - t0

    def restarted(self):
        t = self.topic()
        known(self.cb, self.cb.expect(t, LONG, peer=self.a_peer).id)
        self.ca.close()
        self.a.terminate()
        self.a.wait(30)
        os.rename(os.path.join(self.work, "a"), os.path.join(self.work, "a-%d" % self.k))
        self.a, self.a_sock = start(self.args.moongate, self.work, "a", self.a_peer)
        t0 = time.monotonic()  # ready (its socket is there)
        self.ca = mg.Client("unix:" + self.a_sock)
        self.src = self.ca.register("src", 1 << 20)
        t1, n = first(self.cb, t)
        check(n, notify_pb2.OUTCOME_SENDER_RESTARTED)
        return max(t1 - t0, 0.0)

    def unreachable(self):
        t = self.topic()
        known(self.cb, self.cb.expect(t, LONG, peer=self.a_peer).id)
        t0 = time.monotonic()
        self.a.send_signal(signal.SIGSTOP)
        try:
            t1, n = first(self.cb, t)
        finally:
            self.a.send_signal(signal.SIGCONT)
        check(n, notify_pb2.OUTCOME_SENDER_UNREACHABLE)
        return t1 - t0

    def deadline(self):
        t = self.topic()
        t0 = time.monotonic()
        self.cb.expect(t, 500)
        t1, n = first(self.cb, t)
        check(n, notify_pb2.OUTCOME_DEADLINE)
        return t1 - t0

    def stop(self):
        for p in (self.a, self.b):
            p.send_signal(signal.SIGCONT)
            p.terminate()
            p.wait(30)


def line(label, vals, ref, ref_label):
    m = statistics.median(vals)
    print("  %-12s %8.1f ms  (min %.1f  max %.1f)   %s %.1f ms   ratio %.2f" %
          (label, m * 1e3, min(vals) * 1e3, max(vals) * 1e3, ref_label, ref * 1e3, m / ref))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moongate", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--liveness-ms", type=int, default=2000)
    args = ap.parse_args()
    probe_s = min(args.liveness_ms / 4, 1000) / 1000
    causes = ["refused", "landed", "agent_gone", "restarted", "unreachable", "deadline"]
    res = {c: [] for c in causes}
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="mg-receiver-") as work:
        pair = Pair(args, work)
        try:
            for r in range(args.rounds):
                for k in range(len(causes)):
                    c = causes[(r + k) % len(causes)]
                    res[c].append(pair.refused(c == "landed") if c in ("refused", "landed")
                                  else getattr(pair, c)())
        finally:
            pair.stop()
    print("failure detection, as the waiting receiver sees it (probe interval %.0f ms, "
          "--peer-liveness-timeout %d ms):" % (probe_s * 1e3, args.liveness_ms))
    line("refused", res["refused"], statistics.median(res["landed"]), "landed WRITE")
    line("agent_gone", res["agent_gone"], probe_s, "probe interval")
    line("restarted", res["restarted"], probe_s, "probe interval")
    line("unreachable", res["unreachable"], args.liveness_ms / 1e3, "liveness timeout")
    line("deadline", res["deadline"], 0.5, "deadline")


if __name__ == "__main__":
    main()
