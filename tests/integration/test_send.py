"""Notify/Send: a notification to a peer's topic without a transfer. Notifications keep their
order per (sending connection, peer, topic) — a Send goes after the notification of a batch the
same connection submitted before it, which waits for that batch's WRITEs — and keep their
tenant; the receiving topic's bound and the sender's line bound answer RESOURCE_EXHAUSTED;
an agent the peer does not have is NOT_FOUND; a failure on this daemon is told as one, not as
the peer's refusal; bad input (an agent's port outside 1..65535 among it) is refused by name."""
import os
import signal
import threading
import time

import grpc
import pytest

import conftest
from conftest import register

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402
from moongate.v1 import notify_pb2  # noqa: E402

MiB = 1 << 20


def client(d, **kw):
    return mg.Client("unix:" + d.sock, **kw)


def in_thread(fn, *a, **kw):
    out = {}

    def run():
        try:
            out["value"] = fn(*a, **kw)
        except Exception as e:  # noqa: BLE001 - handed to the test
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_send_goes_after_the_batch_notifications_before_it(make_daemon):
    b = make_daemon("--peer-tls=false")
    a = make_daemon("--peer-tls=false", "--peer-port", str(b.h2c_port))
    dst = register(b, "dst", 8 * MiB, remote=True)
    with client(a) as c, client(a) as other, client(b) as cb:
        port = cb.register_agent("reader").port  # Sends to an agent go where it is
        src = c.allocate_buffer(8 * MiB)
        c.transfer([mg.write(address=src.address, peer=b.h2c, remote_segment=dst.id,
                             length=4096)])  # the session and the target are known now
        b.signal(signal.SIGSTOP)
        try:
            bid = c.submit([mg.write(address=src.address, peer=b.h2c, remote_segment=dst.id,
                                     length=8 * MiB)],
                           notify=[mg.notify(b.h2c, "kv", b"batch"),
                                   mg.notify(b.h2c, "empty", b"")])
            t, out = in_thread(c.send, "kv", b"send", peer=b.h2c)
            # another connection's line is its own: not behind that batch
            t2, out2 = in_thread(other.send, "kv", b"other", agent="127.0.0.1:%d" % port)
            time.sleep(0.3)
            assert t.is_alive()  # behind the batch's notification, itself behind its WRITE
        finally:
            b.signal(signal.SIGCONT)
        t.join(30)
        t2.join(30)
        assert "error" not in out and "error" not in out2, (out, out2)
        assert c.wait(bid).state == 2
    with client(b) as cb:
        got = [n.payload for n in cb.poll("kv")]
        assert [n.payload for n in cb.poll("empty")] == [b""]
    assert got.index(b"batch") < got.index(b"send"), got
    assert sorted(got) == [b"batch", b"other", b"send"]
    notes = {n.payload: n for n in client(b).poll("kv")}  # taken already: none left
    assert notes == {}


def test_sends_keep_their_tenant_and_bounds(make_daemon, tmp_path):
    import hashlib
    auth = tmp_path / "auth"
    auth.write_text("token sha256:%s t1\ntoken sha256:%s t2\n" % (
        hashlib.sha256(b"tok1").hexdigest(), hashlib.sha256(b"tok2").hexdigest()))
    b = make_daemon("--peer-tls=false", "--auth-file", str(auth), "--notify-queue", "2")
    a = make_daemon("--peer-tls=false", "--auth-file", str(auth), "--notify-line", "1")
    with client(a, token="tok1") as c1, client(a, token="tok2") as c2:
        c1.send("t", b"one", peer=b.h2c)
        c2.send("t", b"two", peer=b.h2c)
        c1.send("t", b"three", peer=b.h2c)
        with pytest.raises(mg.Error) as e:  # t1's topic holds 2
            c1.send("t", b"four", peer=b.h2c)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        with client(b, token="tok1") as b1, client(b, token="tok2") as b2:
            assert [n.payload for n in b1.poll("t")] == [b"one", b"three"]
            assert [n.payload for n in b2.poll("t")] == [b"two"]
        # one Send of a connection may wait in line for a stopped peer; a second is refused
        b.signal(signal.SIGSTOP)
        try:
            t, out = in_thread(c1.send, "u", b"x", peer=b.h2c)
            time.sleep(0.3)
            t3, out3 = in_thread(c1.send, "u", b"y", peer=b.h2c)
            t3.join(30)
            assert out3["error"].code == grpc.StatusCode.RESOURCE_EXHAUSTED, out3
            assert "--notify-line" in out3["error"].message
        finally:
            b.signal(signal.SIGCONT)
        t.join(30)
        assert "error" not in out, out
        for kw, why in (({"topic": "", "peer": b.h2c}, "topic"),
                        ({"topic": "x" * 129, "peer": b.h2c}, "topic"),
                        ({"topic": "t\n", "peer": b.h2c}, "topic"),
                        ({"topic": "t", "payload": bytes(65537), "peer": b.h2c}, "payload"),
                        ({"topic": "t", "peer": "local_host:1"}, "host:port"),
                        ({"topic": "t", "peer": b.h2c, "agent": "127.0.0.1:5"}, "one way"),
                        ({"topic": "t", "agent": "name"}, "one-string"),
                        ({"topic": "t", "agent": "127.0.0.1:70000"},
                         "port 70000 is not 1..65535"),
                        ({"topic": "t", "agent": "127.0.0.1:0"}, "port 0 is not 1..65535")):
            with pytest.raises(mg.Error) as e:
                c1.send(**kw)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, kw
            assert why in e.value.message, (kw, e.value.message)
        with pytest.raises(mg.Error) as e:  # nobody there: it failed here, nobody refused it
            c1.send("t", peer="127.0.0.1:1")
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert "peer 127.0.0.1:1: " in e.value.message, e.value.message
        assert "refused it" not in e.value.message, e.value.message
    # received notifications say who sent them, with no batch
    with client(b, token="tok2") as b2, client(a, token="tok2") as c2:
        c2.send("v", b"p", peer=b.h2c)
        (n,) = b2.poll("v")
        assert (n.batch_id, n.payload) == (0, b"p") and n.tenant in ("", "t2")
    assert notify_pb2.SendRequest  # the message is in the generated module


def test_a_send_to_an_agent_the_peer_does_not_have_is_not_found(make_daemon):
    """The peer checks the agent a Send names ("host:port") is there, of the sending tenant:
    NOT_FOUND naming its port, nothing posted; once the agent is there, the Send is taken. A
    refusal by the peer reads "refused it"."""
    b = make_daemon("--peer-tls=false")
    a = make_daemon("--peer-tls=false", "--peer-port", str(b.h2c_port))
    with client(a) as c, client(b) as cb:
        with pytest.raises(mg.Error) as e:
            c.send("t", b"lost", agent="127.0.0.1:21001")
        assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value.message
        assert "peer 127.0.0.1:%d refused it" % b.h2c_port in e.value.message and \
            "no agent at port 21001" in e.value.message, e.value.message
        assert cb.poll("t") == []
        cb.register_agent("reader", port=21001)
        c.send("t", b"found", agent="127.0.0.1:21001")
        assert [n.payload for n in cb.poll("t")] == [b"found"]
