"""Submission rings (Transfer/AttachRing): a process on the daemon's host posts batches by index
into its prepared lists in shared memory and reads their ends there. Real daemons, the Python
client's ring (clients/python/moongate/ring.py) writing the layout of moongate/ringwire.h."""
import os
import signal
import struct
import subprocess
import sys
import time

import grpc
import pytest

import conftest

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402
from moongate import ring as mgring  # noqa: E402
from moongate.v1 import transfer_pb2  # noqa: E402

KiB = 1024
W, R = transfer_pb2.WRITE, transfer_pb2.READ
INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]


def pair(make_daemon):
    return [make_daemon("--peer-tls=false", "--advertise", "127.0.0.1:{h2c_port}")
            for _ in range(2)]


class Setup:
    """Daemon a's client with a 64 KiB source registered and listed (16 ranges of 4 KiB, and
    one of the whole), an agent "ring-b" on daemon b with a 64 KiB target listed the same
    ways."""

    def __init__(self, a, b, name="ring-b"):
        self.src, self.dst = bytearray(os.urandom(64 * KiB)), bytearray(64 * KiB)
        (self.s, _), (self.t, _) = mg.address_of(self.src), mg.address_of(self.dst)
        self.ca, self.cb = mg.Client("unix:" + a.sock), mg.Client("unix:" + b.sock)
        self.cb.register_agent(name)
        self.cb.register_memory("dst", self.t, 64 * KiB, remote_accessible=True)
        self.ca.register_memory("src", self.s, 64 * KiB)
        self.local = self.ca.prepare_list([self.s + i * 4 * KiB for i in range(16)],
                                          [4 * KiB] * 16)
        self.remote = self.ca.prepare_list([self.t + i * 4 * KiB for i in range(16)],
                                           [4 * KiB] * 16, peer=b.h2c, agent=name)
        self.local_all = self.ca.prepare_list([self.s], [64 * KiB])  # one range each
        self.remote_all = self.ca.prepare_list([self.t], [64 * KiB], peer=b.h2c, agent=name)

    def close(self):
        self.ca.close()
        self.cb.close()

    def block(self, buf, i):
        return bytes(buf[i * 4 * KiB:(i + 1) * 4 * KiB])


def one(ring, timeout=20):
    got = ring.wait(timeout)
    assert len(got) == 1, got
    return got[0]


def test_pairs_and_strided_posted_on_a_ring_move_and_end_there(make_daemon):
    """Pairs by index and a strided group posted on the ring move what the same batch through
    Submit would; each ends with one completion carrying its user_data, its batch's id and
    counts; the batch is one GetBatch sees; many pairs spill into the next slots; READs too."""
    a, b = pair(make_daemon)
    s = Setup(a, b)
    try:
        with s.ca.attach_ring(entries=16) as ring:
            assert ring.post_pairs(W, s.local, [0, 1, 2], s.remote, [15, 14, 13],
                                   user_data=77) == 77
            c = one(ring)
            assert (c.user_data, c.code, c.requests, c.done, c.failed) == (77, 0, 3, 3, None), c
            for k, r in ((0, 15), (1, 14), (2, 13)):
                assert s.block(s.dst, r) == s.block(s.src, k)
            batch = s.ca.get_batch(c.batch_id)
            assert batch.state == transfer_pb2.DONE and len(batch.requests) == 3
            # 16 pairs: 10 in the entry, 6 in the next slot
            ud = ring.post_pairs(W, s.local, list(range(16)), s.remote, list(range(16)))
            c = one(ring)
            assert c.user_data == ud and c.code == 0 and c.done == 16, c
            assert s.dst == s.src
            # a strided group: the first 512 bytes of every other block, into block 3 of b
            s.dst[:] = bytes(64 * KiB)
            ring.post_strided(W, s.local_all, 0, s.remote_all, 0, count=8, length=512,
                              local_stride=8 * KiB, remote_offset=3 * 4 * KiB,
                              remote_stride=512)
            c = one(ring)
            assert c.code == 0 and c.done == 8, c
            for k in range(8):
                assert bytes(s.dst[3 * 4 * KiB + k * 512:3 * 4 * KiB + (k + 1) * 512]) == \
                    bytes(s.src[k * 8 * KiB:k * 8 * KiB + 512])
            # READ back into the source's block 5
            ring.post_pairs(R, s.local, [5], s.remote, [3])
            c = one(ring)
            assert c.code == 0 and s.block(s.src, 5) == s.block(s.dst, 3)
            # a notification: the peer's topic has it once the bytes are there
            notes = s.cb.notifications("ring-t", timeout=20)
            ring.post_pairs(W, s.local, list(range(12)), s.remote, list(range(12)),
                            notify=("ring-t", b"\x00bytes\xff"))
            note = next(notes)
            assert note.payload == b"\x00bytes\xff" and s.dst[:12 * 4 * KiB] == \
                s.src[:12 * 4 * KiB]
            c = one(ring)
            assert c.code == 0 and note.batch_id == c.batch_id, c
            # numpy index arrays are taken as lists are
            import numpy as np
            ring.post_pairs(W, s.local, np.arange(16, dtype=np.int64), s.remote,
                            np.arange(16)[::-1].copy())
            assert one(ring).code == 0
            assert s.block(s.dst, 15) == s.block(s.src, 0)
    finally:
        s.close()


def test_every_bad_entry_is_answered_by_name_and_the_ring_goes_on(make_daemon):
    """Each submission that does not check gets one completion with INVALID_ARGUMENT (or
    NOT_FOUND for a list) naming what is wrong, nothing moves, and the next good one runs:
    bad op, kind, flags, count 0, length 0, more pairs than slots published, an index past
    its list, a strided block past its range, a list of another connection, sides swapped,
    an offset that overflows."""
    a, b = pair(make_daemon)
    s = Setup(a, b)
    other = mg.Client("unix:" + a.sock)
    try:
        foreign = other.prepare_list([s.s], [4 * KiB])
        head = struct.Struct("=QBBHIQQ")
        raw = [
            (head.pack(1, 7, 1, 0, 1, s.local, s.remote), "op 7"),
            (head.pack(2, 1, 9, 0, 1, s.local, s.remote), "kind 9"),
            (head.pack(3, 1, 1, 4, 1, s.local, s.remote), "flags other than NOTIFY"),
            (head.pack(4, 1, 1, 0, 0, s.local, s.remote), "count 0"),
            (head.pack(5, 1, 2, 0, 1, s.local, s.remote) + struct.pack("=IIQQQQQ", 0, 0, 0, 0,
                                                                         0, 0, 0), "length 0"),
            (head.pack(6, 1, 1, 0, 200, s.local, s.remote), "the entry takes 13 slots (200 pairs)"),
            (head.pack(7, 1, 1, 0, 1, s.local, s.remote).ljust(112, b"\0") +
             struct.pack("=I", 5), "note_len 5 without the NOTIFY flag"),
            (head.pack(8, 1, 1, 1, 1, s.local, s.remote).ljust(112, b"\0") +
             struct.pack("=I", 1), "note_len 1: 2.."),
        ]
        with s.ca.attach_ring(entries=16) as ring:
            for entry, why in raw:
                ring.post_raw([entry])
                c = one(ring)
                assert c.code == INVALID and why in c.why and c.batch_id == 0, (why, c)
            ring.post_raw([head.pack(9, 1, 1, 1, 1, s.local, s.remote).ljust(112, b"\0") +
                           struct.pack("=I", 3), b"abc"])  # a note without its NUL
            c = one(ring)
            assert c.code == INVALID and "no NUL after its topic" in c.why, c
            cases = [
                (lambda: ring.post_pairs(W, s.local, [16], s.remote, [0]), INVALID,
                 "pair 0: local index 16 is past the list's 16 ranges"),
                (lambda: ring.post_strided(W, s.local, 0, s.remote, 0, count=2, length=4 * KiB,
                                           local_stride=4 * KiB), INVALID,
                 "block 1 (local_offset 0 + 1 * local_stride 4096, 4096 bytes) ends past "
                 "range 0 of local_list (4096 bytes)"),
                (lambda: ring.post_strided(W, s.local, 0, s.remote, 0, count=3, length=1,
                                           remote_stride=1 << 63), INVALID, "remote_stride"),
                (lambda: ring.post_pairs(W, foreign, [0], s.remote, [0]), NOT_FOUND,
                 "no prepared list %d" % foreign),
                (lambda: ring.post_strided(W, s.remote, 0, s.local, 0, count=1, length=16),
                 INVALID, "local_list is this process's memory and remote_list an agent's"),
                (lambda: ring.post_strided(W, s.local, 20, s.remote, 0, count=1, length=16),
                 INVALID, "local_index 20 is past the list's 16 ranges"),
            ]
            for post, code, why in cases:
                ud = post()
                c = one(ring)
                assert c.user_data == ud and c.code == code and why in c.why, (why, c)
            ring.post_pairs(W, s.local, [0], s.remote, [0], notify=("", b"x"))
            c = one(ring)
            assert c.code == INVALID and "notification 0" in c.why and "topic" in c.why, c
            assert s.dst == bytearray(64 * KiB)  # nothing moved
            ring.post_pairs(W, s.local, [4], s.remote, [4])
            assert one(ring).code == 0 and s.block(s.dst, 4) == s.block(s.src, 4)
    finally:
        other.close()
        s.close()


def test_a_full_ring_is_back_pressure_and_nothing_is_lost(make_daemon):
    """With completions unread, the daemon takes only what it can answer: the ring fills,
    posting says so, and once completions are read every submission posted ends, each once."""
    a, b = pair(make_daemon)
    s = Setup(a, b)
    try:
        with s.ca.attach_ring(entries=8) as ring:
            posted = []
            with pytest.raises(mgring.RingError, match="the ring is full") as e:
                for i in range(64):
                    posted.append(ring.post_pairs(W, s.local, [i % 16], s.remote, [i % 16]))
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert 8 <= len(posted) <= 16, len(posted)  # 8 answered + 8 waiting in the queue
            # one larger than the whole ring is refused as such, not as "full"
            with pytest.raises(mgring.RingError, match="takes 13 slots; the ring has 8") as e:
                ring.post_pairs(W, s.local, [0] * 200, s.remote, [0] * 200)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            seen = []
            while len(seen) < len(posted):
                got = ring.wait(20)
                assert got, (len(seen), len(posted))
                seen += got
                while len(posted) < 40:  # keep posting as room comes
                    try:
                        posted.append(ring.post_pairs(W, s.local, [0], s.remote, [1]))
                    except mgring.RingError:
                        break
            assert sorted(c.user_data for c in seen) == sorted(posted)
            assert all(c.code == 0 for c in seen)
            assert ring.poll() == []
    finally:
        s.close()


def test_ring_and_http2_submits_mix_and_ring_batches_are_batches(make_daemon):
    """On one connection, batches submitted over HTTP/2 and posted on the ring run side by
    side; a ring's batch is in GetBatch, counted in the daemon's metrics, and can be
    cancelled like any; a second ring of the connection works too; a ring cannot be attached
    over TCP."""
    a, b = pair(make_daemon)
    s = Setup(a, b)
    try:
        with s.ca.attach_ring() as r1, s.ca.attach_ring(entries=8) as r2:
            before = a.metric("moongate_transfer_requests_total", op="write", result="done") or 0
            u1 = r1.post_pairs(W, s.local, [0, 1], s.remote, [0, 1])
            bid = s.ca.submit([], prepared=[mg.prepared(W, s.local, [2], s.remote, [2])])
            u2 = r2.post_strided(W, s.local, 3, s.remote, 3, count=1, length=4 * KiB)
            c1, c2 = one(r1), one(r2)
            assert (c1.user_data, c1.code, c2.user_data, c2.code) == (u1, 0, u2, 0)
            assert s.ca.wait(bid).state == transfer_pb2.DONE
            assert s.dst[:4 * 4 * KiB] == s.src[:4 * 4 * KiB]
            assert a.metric("moongate_transfer_requests_total", op="write",
                            result="done") == before + 4
            assert s.ca.get_batch(c2.batch_id).requests[0].state == transfer_pb2.DONE
        # accepted=True: a first completion when the batch is accepted, with its id; a batch
        # refused gets one completion only, and the ring's room is whole after it
        with s.ca.attach_ring(entries=8) as r3:
            for k in range(12):
                u = r3.post_pairs(W, s.local, [k % 16], s.remote, [k % 16], accepted=True)
                got = r3.wait(20)
                while len(got) < 2:
                    got += r3.wait(20)
                assert [c.accepted for c in got] == [True, False], got
                assert got[0].batch_id == got[1].batch_id and got[0].user_data == u
                assert got[1].code == 0
                r3.post_pairs(W, s.local, [99], s.remote, [0], accepted=True)
                c = one(r3)
                assert not c.accepted and c.code == INVALID, c
                assert r3.poll() == []
            # accepted: its id while it goes, to cancel it
            u = r3.post_pairs(W, s.local, list(range(16)), s.remote, list(range(16)),
                              accepted=True)
            got = r3.wait(20)  # its end may come with its acceptance: it is that quick
            c = got[0]
            assert c.accepted and c.user_data == u
            assert s.ca.cancel(c.batch_id).id == c.batch_id
            c = got[1] if len(got) > 1 else one(r3)
            assert len(got) <= 2 and c.user_data == u and not c.accepted
            assert c.code in (0, grpc.StatusCode.CANCELLED.value[0]), c
        with mg.Client(a.h2c, plaintext=True) as tcp:
            with pytest.raises(mgring.RingError, match="Unix socket"):
                tcp.attach_ring()
    finally:
        s.close()


RING_CHILD = r"""
import os, sys, time
sys.path[:0] = sys.argv[1:3]
import moongate_client as mg
import moongate.ring
from moongate.v1 import transfer_pb2
a_sock, h2c = sys.argv[3], sys.argv[4]
buf = bytearray(256 * 1024)
c = mg.Client("unix:" + a_sock)
(addr, _) = mg.address_of(buf)
c.register_memory("child-src", addr, len(buf))
local = c.prepare_list([addr + i * 4096 for i in range(64)], [4096] * 64)
remote = c.prepare_list([int(sys.argv[5]) + i * 4096 for i in range(16)], [4096] * 16,
                        peer=h2c, agent="ring-b")
ring = c.attach_ring(entries=64)
posted = 0
try:
    while posted < 48:
        ring.post_pairs(transfer_pb2.WRITE, local, list(range(64)),
                        remote, [k % 16 for k in range(64)])
        posted += 1
except moongate.ring.RingError:
    pass
print("posted", posted, flush=True)
time.sleep(60)
"""


def test_a_process_killed_with_entries_in_flight(make_daemon):
    """A process posts batches and is killed before reading their ends: the daemon lets its
    ring go (its batches end or fail by name, nothing else stops), and serves the next
    process's ring."""
    a, b = pair(make_daemon)
    s = Setup(a, b)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", RING_CHILD, conftest.GEN,
             os.path.join(conftest.ROOT, "clients", "python"), a.sock, b.h2c, str(s.t)],
            stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().startswith("posted ")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # its batches end (done, or failed by name)
            if (a.metric("moongate_rings_open") or 0) == 0 and \
                    a.metric("moongate_transfer_requests_in_flight") == 0:
                break
            time.sleep(0.05)
        assert (a.metric("moongate_rings_open") or 0) == 0
        with s.ca.attach_ring() as ring:
            ring.post_pairs(W, s.local, [6], s.remote, [6])
            assert one(ring).code == 0 and s.block(s.dst, 6) == s.block(s.src, 6)
    finally:
        s.close()


def test_a_ring_whose_connection_closes_says_so(make_daemon):
    """When the ring's connection closes (the client's channel to the daemon, or the daemon
    gone), the process hears it: alive() turns False and a wait raises UNAVAILABLE instead of
    waiting for ever; a ring of the new connection works."""
    a, b = pair(make_daemon)
    s = Setup(a, b)
    try:
        ring = s.ca.attach_ring(entries=8)
        assert ring.alive()
        ring.post_pairs(W, s.local, [1], s.remote, [1])
        assert one(ring).code == 0
        s.ca._ch.close()  # the connection the ring belongs to
        deadline = time.monotonic() + 10
        while ring.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not ring.alive()
        with pytest.raises(mgring.RingError, match="the daemon let the ring go") as e:
            ring.wait(5)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        ring.close()
        with mg.Client("unix:" + a.sock) as again:
            lo = again.prepare_list([s.s], [4 * KiB])
            ro = again.prepare_list([s.t], [4 * KiB], peer=b.h2c, agent="ring-b")
            with again.attach_ring(entries=8) as r2:
                r2.post_pairs(W, lo, [0], ro, [0])
                assert one(r2).code == 0
    finally:
        s.close()


def test_the_c_ring_example(make_daemon):
    """client/example_ring.c, built with the project: pairs with a notification and a strided
    group posted on a ring from C land in an agent's memory on a peer, and the peer hears."""
    a, b = pair(make_daemon)
    dst = bytearray(64 * KiB)
    (t, _) = mg.address_of(dst)
    with mg.Client("unix:" + b.sock) as cb:
        cb.register_agent("ring-c")
        cb.register_memory("dst", t, 64 * KiB, remote_accessible=True)
        notes = cb.notifications("ring-example", timeout=30)
        r = subprocess.run([os.path.join(conftest.BUILD, "example_ring"), "unix:" + a.sock,
                            b.h2c, "ring-c", str(t)], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, **conftest.sanitizer_preload()))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("ok ring "), r.stdout
        assert next(notes).payload == b"landed"
        for k in range(8):  # the strided group: 512 bytes of blocks 0, 2, 4, ... side by side
            assert dst[k * 512:(k + 1) * 512] == bytes([ord("a") + 2 * k]) * 512
        for k in range(1, 16):  # the pairs: block k is 'a' + k
            assert dst[k * 4 * KiB:(k + 1) * 4 * KiB] == bytes([ord("a") + k]) * 4 * KiB
