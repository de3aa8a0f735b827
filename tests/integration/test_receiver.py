"""No receiver waits forever. A client waiting on a topic of daemon B hears a failure notice
when the batch it waits for does not land — a WRITE refused by B, the batch cancelled — and,
having declared an expectation (Notify/Expect) with a deadline long enough (120 s) that only
detection can end the wait, when the sender goes: its agent's process SIGKILLed, its daemon
restarted (another epoch) or frozen (SIGSTOP: no answer for --peer-liveness-timeout). Each
notice names its cause. How fast detection is, is bench_receiver.py's business, not these
tests'."""
import json
import os
import signal
import sys
import time

import grpc
import pytest

import conftest
from conftest import Child, curl, h2c_channel, register, req, wait_batch

from moongate.v1 import memory_pb2, memory_pb2_grpc, notify_pb2, notify_pb2_grpc  # noqa: E402
from moongate.v1 import transfer_pb2, transfer_pb2_grpc  # noqa: E402

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
LONG = 120000  # ms: no test may end by this deadline


class Agent(Child):
    """An agent process on daemon d (agent_proc.py): .port, .address, .segment."""

    def __init__(self, d, name):
        super().__init__([sys.executable, os.path.join(HERE, "agent_proc.py"), d.sock, name,
                          "0", str(MiB)])


def notify(d):
    return notify_pb2_grpc.NotifyStub(h2c_channel(d))


def first(nb, topic, timeout=60):
    """The first notification of `topic` (Watch); fails when none comes in `timeout`."""
    call = nb.Watch(notify_pb2.WatchRequest(topic=topic), timeout=timeout)
    try:
        for n in call:
            return n
    finally:
        call.cancel()
    pytest.fail("no notification on %s" % topic)


def known(nb, eid, timeout=30):
    """Waits until expectation eid's sender answered a probe (its epoch is known)."""
    deadline = time.monotonic() + timeout
    while True:
        got = [e for e in nb.ListExpectations(notify_pb2.ListExpectationsRequest()).expectations
               if e.id == eid]
        assert got, "expectation %d ended early" % eid
        if got[0].epoch:
            return got[0]
        assert time.monotonic() < deadline, "the sender never answered: %s" % got[0]
        time.sleep(0.02)


def test_a_write_refused_by_the_receiver_reaches_its_topic(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    nb = notify(b)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)

        def submit(topic):
            return t.Submit(transfer_pb2.SubmitRequest(
                requests=[req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096),
                          req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096, 0, 8192)],
                notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic=topic, payload=b"kv 7")]
            )).batch_id
        assert wait_batch(t, submit("warm")).state == transfer_pb2.DONE  # A caches dst
        e = nb.Expect(notify_pb2.ExpectRequest(topic="kv/7", timeout_ms=LONG, peer=a.h2c,
                                               segment=dst.id))
        assert (e.topic, e.peer, e.segment) == ("kv/7", a.h2c, dst.id)
        memory_pb2_grpc.MemoryStub(h2c_channel(b)).UnregisterSegment(
            memory_pb2.UnregisterRequest(id=dst.id))
        bid = submit("kv/7")
        n = first(nb, "kv/7")
        assert n.outcome == notify_pb2.OUTCOME_FAILED, n
        assert (n.batch_id, n.payload, n.expectation) == (bid, b"kv 7", 0)
        assert n.code == grpc.StatusCode.NOT_FOUND.value[0] and "request 0:" in n.message
        assert list(n.failed_requests) == [0, 1] and n.failed_count == 2
        # The notice met the expectation: nothing more comes, nothing waits.
        assert list(nb.ListExpectations(notify_pb2.ListExpectationsRequest()).expectations) == []
        assert b.metric("moongate_expectations_ended_total", result="met") == 1
        batch = wait_batch(t, bid)
        assert "the peer's topic got a failure notice" in batch.notify[0].message


def test_a_submit_refused_for_good_reaches_its_topics(make_daemon):
    """A Submit refused before it started has no batch, but its receivers still hear: refused
    for good (a request that can never run as asked), each notification's topic gets a failure
    notice with batch id 0 and the refusal's code and words; refused for now (a peer that did
    not answer: the caller may retry), nothing comes, and the batch sent after is the first
    the topic hears of."""
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    nb = notify(b)
    good = req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)

        def submit(topic, *requests):
            return t.Submit(transfer_pb2.SubmitRequest(
                requests=requests,
                notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic=topic, payload=b"kv 9")]))

        def refused(topic, *requests):
            with pytest.raises(grpc.RpcError) as err:
                submit(topic, *requests)
            return err.value

        nb.Expect(notify_pb2.ExpectRequest(topic="kv/9", timeout_ms=LONG, peer=a.h2c))
        # at once: request 1's local range runs past src's end
        err = refused("kv/9", good, req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096, MiB))
        n = first(nb, "kv/9")
        assert n.outcome == notify_pb2.OUTCOME_FAILED, n
        assert n.code == err.code().value[0] and "request 1:" in err.details()
        assert (n.batch_id, n.payload, n.failed_count, n.expectation) == (0, b"kv 9", 0, 0)
        assert n.message == "the sender's Submit was refused; nothing was moved: " + \
            err.details()
        assert list(nb.ListExpectations(notify_pb2.ListExpectationsRequest()).expectations) == []
        # once B was asked of the target: it has no segment 999
        err = refused("kv/10", req(transfer_pb2.WRITE, src.id, b.h2c, 999, 4096))
        n = first(nb, "kv/10")
        assert (n.outcome, n.code) == (notify_pb2.OUTCOME_FAILED, err.code().value[0]), n
        assert "999" in n.message and n.message.endswith(err.details())
        # for now: the agent named is on a daemon that does not answer
        err = refused("kv/11", transfer_pb2.TransferRequest(
            op=transfer_pb2.WRITE, local_segment=src.id, peer="127.0.0.1:1", remote_agent="x",
            remote_address=4096, length=4096))
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        bid = submit("kv/11", good).batch_id
        n = first(nb, "kv/11")
        assert (n.outcome, n.batch_id) == (notify_pb2.OUTCOME_LANDED, bid), n
    assert a.metric("moongate_transfer_notifications_total", result="failed") == 0


def test_a_cancelled_batch_reaches_its_topic(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    src = register(a, "src", 64 * MiB)
    dst = register(b, "dst", 64 * MiB, remote=True)
    nb = notify(b)
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(requests=[
            req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096)])).batch_id
        assert wait_batch(t, bid).state == transfer_pb2.DONE  # a session and a connection
        b.signal(signal.SIGSTOP)  # the WRITE stalls mid-flight
        try:
            bid = t.Submit(transfer_pb2.SubmitRequest(
                requests=[req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 64 * MiB)],
                notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic="kv/8")])).batch_id
            deadline = time.monotonic() + 10
            while t.GetBatch(transfer_pb2.GetBatchRequest(id=bid)).requests[0].state != \
                    transfer_pb2.RUNNING:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            t.Cancel(transfer_pb2.GetBatchRequest(id=bid))
        finally:
            b.signal(signal.SIGCONT)
        n = first(nb, "kv/8")
        assert n.outcome == notify_pb2.OUTCOME_CANCELLED, n
        assert n.code == grpc.StatusCode.CANCELLED.value[0] and n.batch_id == bid
        assert list(n.failed_requests) == [0]


def test_the_senders_agent_killed(make_daemon, children):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    agent = children(Agent, a, "prefill-0")
    nb = notify(b)
    e = nb.Expect(notify_pb2.ExpectRequest(topic="kv/9", timeout_ms=LONG, peer=a.h2c,
                                           agent="prefill-0"))
    assert e.agent == "prefill-0"
    known(nb, e.id)
    t0 = time.monotonic()
    agent.p.kill()  # its connection closes: its daemon ends the agent
    n = first(nb, "kv/9")
    assert n.outcome == notify_pb2.OUTCOME_SENDER_AGENT_GONE, n
    assert n.expectation == e.id and getattr(n, "from") == a.h2c
    assert n.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert 'agent "prefill-0" is gone from its daemon' in n.message
    assert time.monotonic() - t0 < LONG / 1000 / 2  # detection, not the deadline
    assert b.metric("moongate_expectations_ended_total", result="sender_agent_gone") == 1
    assert b.metric("moongate_expectations") == 0


def test_the_senders_daemon_restarted(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false", "--peer-liveness-timeout", "60000")
    nb = notify(b)
    e = nb.Expect(notify_pb2.ExpectRequest(topic="kv/10", timeout_ms=LONG, peer=a.h2c))
    epoch = known(nb, e.id).epoch
    assert a.stop() == 0
    a.start()  # the same ports, a new epoch
    n = first(nb, "kv/10")
    assert n.outcome == notify_pb2.OUTCOME_SENDER_RESTARTED, n
    assert ("%016x" % epoch) in n.message and "restarted" in n.message


def test_the_senders_daemon_frozen(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false", "--peer-liveness-timeout", "2000")
    nb = notify(b)
    e = nb.Expect(notify_pb2.ExpectRequest(topic="kv/11", timeout_ms=LONG, peer=a.h2c))
    known(nb, e.id)
    a.signal(signal.SIGSTOP)
    try:
        n = first(nb, "kv/11")
    finally:
        a.signal(signal.SIGCONT)
    assert n.outcome == notify_pb2.OUTCOME_SENDER_UNREACHABLE, n
    assert "did not answer for 2000 ms (--peer-liveness-timeout)" in n.message
    assert b.metric("moongate_expectations_ended_total", result="sender_unreachable") == 1


def test_expectations_met_ended_and_timed_out(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    nb = notify(b)
    sender = notify_pb2_grpc.NotifyStub(h2c_channel(a))
    # Met: a notification on the topic ends it without a notice, the oldest first.
    first_e = nb.Expect(notify_pb2.ExpectRequest(topic="t", timeout_ms=LONG))
    second_e = nb.Expect(notify_pb2.ExpectRequest(topic="t", timeout_ms=LONG))
    assert second_e.id != first_e.id and 0 < second_e.deadline_left_ms <= LONG
    sender.Send(notify_pb2.SendRequest(peer=b.h2c, topic="t", payload=b"x"))
    assert [x.id for x in nb.ListExpectations(
        notify_pb2.ListExpectationsRequest()).expectations] == [second_e.id]
    # Ended by its client: NOT_FOUND the second time.
    nb.Unexpect(notify_pb2.UnexpectRequest(id=second_e.id))
    with pytest.raises(grpc.RpcError) as err:
        nb.Unexpect(notify_pb2.UnexpectRequest(id=second_e.id))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # Its deadline: a notice, past the topic's bound, after the one queued there.
    short = nb.Expect(notify_pb2.ExpectRequest(topic="t", timeout_ms=200))
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 2:
        got += nb.Poll(notify_pb2.PollRequest(topic="t")).notifications
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    assert [x.outcome for x in got] == [notify_pb2.OUTCOME_LANDED, notify_pb2.OUTCOME_DEADLINE]
    assert got[1].expectation == short.id and "within 200 ms" in got[1].message
    assert got[1].code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    # A notification queued before the expectation meets it at once, and only one.
    sender.Send(notify_pb2.SendRequest(peer=b.h2c, topic="early", payload=b"1"))
    met = nb.Expect(notify_pb2.ExpectRequest(topic="early", timeout_ms=LONG))
    assert met.met and met.id == 0
    late = nb.Expect(notify_pb2.ExpectRequest(topic="early", timeout_ms=LONG))
    assert not late.met and late.id
    nb.Unexpect(notify_pb2.UnexpectRequest(id=late.id))
    # curl declares, lists and ends them.
    rc, out, _ = curl("--http2-prior-knowledge", "-X", "POST", "-d",
                      '{"topic": "c", "timeout_ms": 120000, "peer": "%s"}' % a.h2c,
                      "http://%s/v1/expectations" % b.h2c)
    assert rc == 0 and json.loads(out)["topic"] == "c", out
    rc, out, _ = curl("--http2-prior-knowledge", "http://%s/v1/expectations" % b.h2c)
    assert [x["topic"] for x in json.loads(out)["expectations"]] == ["c"]
    rc, out, _ = curl("--http2-prior-knowledge", "-X", "DELETE",
                      "http://%s/v1/expectations/%s" % (b.h2c, json.loads(out)[
                          "expectations"][0]["id"]))
    assert rc == 0 and list(nb.ListExpectations(
        notify_pb2.ListExpectationsRequest()).expectations) == []


@pytest.mark.parametrize("fields,code,needle", [
    (dict(topic="", timeout_ms=1), "INVALID_ARGUMENT", "topic"),
    (dict(topic="t"), "INVALID_ARGUMENT", "timeout_ms must be 1..86400000"),
    (dict(topic="t", timeout_ms=86400001), "INVALID_ARGUMENT", "timeout_ms"),
    (dict(topic="t", timeout_ms=1, peer="nohost"), "INVALID_ARGUMENT", "host:port"),
    (dict(topic="t", timeout_ms=1, epoch=5), "INVALID_ARGUMENT", "needs the sender's daemon"),
    (dict(topic="t", timeout_ms=1, agent="no port"), "INVALID_ARGUMENT", "agent"),
    (dict(topic="t", timeout_ms=1, lease=77), "NOT_FOUND", "no lease 77"),
    (dict(topic="t", timeout_ms=1, segment=78), "NOT_FOUND", "no segment 78"),
    (dict(topic="t", timeout_ms=1, segment=1, lease=1), "INVALID_ARGUMENT", "one of lease"),
])
def test_bad_expectations_are_refused_by_name(daemon, fields, code, needle):
    nb = notify(daemon)
    with pytest.raises(grpc.RpcError) as err:
        nb.Expect(notify_pb2.ExpectRequest(**fields))
    assert err.value.code().name == code and needle in err.value.details(), err.value


def test_a_full_set_of_expectations_says_so(make_daemon):
    b = make_daemon("--max-expectations", "2")
    nb = notify(b)
    for _ in range(2):
        nb.Expect(notify_pb2.ExpectRequest(topic="t", timeout_ms=LONG))
    with pytest.raises(grpc.RpcError) as err:
        nb.Expect(notify_pb2.ExpectRequest(topic="t", timeout_ms=LONG))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-expectations" in err.value.details()
    assert conftest.sanitized() or b.alive()


@pytest.mark.parametrize("fields,needle", [
    (dict(outcome=notify_pb2.OUTCOME_DEADLINE), "outcome"),
    (dict(expectation=3), "expectation"),
    (dict(message="x" * 1025), "message"),
    (dict(failed_requests=[1, 2], failed_count=1), "failed_count"),
])
def test_a_peers_notice_is_checked(daemon, fields, needle):
    nb = notify(daemon)
    with pytest.raises(grpc.RpcError) as err:
        nb.Deliver(notify_pb2.Notification(topic="t", **fields))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in err.value.details()
    nb.Deliver(notify_pb2.Notification(topic="t", outcome=notify_pb2.OUTCOME_TIMED_OUT, code=4,
                                       failed_requests=[0], failed_count=7))
    [n] = nb.Poll(notify_pb2.PollRequest(topic="t")).notifications
    assert (n.outcome, n.failed_count) == (notify_pb2.OUTCOME_TIMED_OUT, 7)
