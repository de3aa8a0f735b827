"""One trace across nodes: a Submit with a W3C traceparent (sampled) is logged on daemon A as the
batch's span (the caller's span its parent), each request's start and end (children of the
batch) and the notification sent (a child of the batch); daemon B logs the notification received
as a child of A's notification span and hands it to its reader carrying B's span. Both export
the same ids as OTLP/JSON lines (GET /traces on the ops port), every span ending no earlier than
it starts. An unsampled trace logs no
request lines and exports nothing; a malformed traceparent is ignored."""
import json
import os
import re
import time

from conftest import h2c_channel, register, req, wait_batch

from moongate.v1 import notify_pb2, notify_pb2_grpc  # noqa: E402
from moongate.v1 import transfer_pb2, transfer_pb2_grpc  # noqa: E402

MiB = 1 << 20


def lines(d, event, trace):
    """The log lines of `event` with trace id `trace`, as dicts of their key=value fields."""
    out = []
    for line in d.read_log().splitlines():
        if "event=%s " % event in line and "trace=%s" % trace in line:
            out.append(dict(kv.split("=", 1) for kv in re.findall(r'(\w+=(?:"[^"]*"|\S+))', line)))
    return out


def spans(d, trace):
    got = []
    for line in d.ops_get("/traces")[1].splitlines():
        rs = json.loads(line)["resourceSpans"][0]
        assert rs["resource"]["attributes"][0]["value"]["stringValue"] == "moongate"
        for sp in rs["scopeSpans"][0]["spans"]:
            if sp["traceId"] == trace:
                got.append(sp)
    return got


def submit(a, b, src, dst, traceparent, topic):
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)
        bid = t.Submit(transfer_pb2.SubmitRequest(
            requests=[req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096),
                      req(transfer_pb2.WRITE, src.id, b.h2c, dst.id, 4096, 0, 8192)],
            notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic=topic)]),
            metadata=[("traceparent", traceparent)] if traceparent else None).batch_id
        assert wait_batch(t, bid).state == transfer_pb2.DONE
    nb = notify_pb2_grpc.NotifyStub(h2c_channel(b))
    deadline = time.monotonic() + 30
    while True:
        got = nb.Poll(notify_pb2.PollRequest(topic=topic)).notifications
        if got:
            return bid, got[0]
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_one_trace_across_two_daemons(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    tid, caller = os.urandom(16).hex(), os.urandom(8).hex()
    bid, note = submit(a, b, src, dst, "00-%s-%s-01" % (tid, caller), "traced")

    [sub] = lines(a, "transfer_submitted", tid)
    assert sub["parent"] == caller and sub["sampled"] == "1" and sub["batch"] == "%016x" % bid
    batch_span = sub["span"]
    starts, ends = lines(a, "transfer_request_start", tid), lines(a, "transfer_request_end", tid)
    assert sorted(x["request"] for x in starts) == ["0", "1"], starts
    assert {x["parent"] for x in starts + ends} == {batch_span}
    assert sorted((x["request"], x["span"]) for x in starts) == \
        sorted((x["request"], x["span"]) for x in ends)
    [sent] = lines(a, "notification_sent", tid)
    assert sent["parent"] == batch_span and sent["span"] not in (batch_span, caller)
    [got] = lines(b, "notification_received", tid)
    assert got["parent"] == sent["span"] and got["batch"] == "%016x" % bid
    # The reader goes on from B's span.
    assert note.traceparent == "00-%s-%s-01" % (tid, got["span"])

    sa = {s["name"]: s for s in spans(a, tid) if s["name"] != "transfer.request"}
    assert sa["transfer.batch"]["spanId"] == batch_span
    assert sa["transfer.batch"]["parentSpanId"] == caller
    assert sa["notify.send"]["spanId"] == sent["span"]
    assert sa["notify.send"]["parentSpanId"] == batch_span
    reqs = [s for s in spans(a, tid) if s["name"] == "transfer.request"]
    assert len(reqs) == 2 and {s["parentSpanId"] for s in reqs} == {batch_span}
    assert all(int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]) > 0 for s in reqs)
    [sb] = spans(b, tid)
    assert (sb["name"], sb["spanId"], sb["parentSpanId"]) == \
        ("notify.receive", got["span"], sent["span"])
    # Every kind of span, on either daemon, ends no earlier than it starts.
    every = spans(a, tid) + spans(b, tid)
    assert {s["name"] for s in every} == {"transfer.batch", "transfer.request", "notify.send",
                                          "notify.receive"}
    for s in every:
        assert int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]) > 0, s


def test_unsampled_and_malformed_traces(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    src = register(a, "src", MiB)
    dst = register(b, "dst", MiB, remote=True)
    tid = os.urandom(16).hex()
    _, note = submit(a, b, src, dst, "00-%s-%s-00" % (tid, os.urandom(8).hex()), "unsampled")
    [sub] = lines(a, "transfer_submitted", tid)
    assert sub["sampled"] == "0"
    assert lines(a, "transfer_request_start", tid) == []  # a 4096-block batch does not flood
    assert lines(a, "transfer_request_end", tid) == []
    assert len(lines(a, "notification_sent", tid)) == 1
    assert len(lines(b, "notification_received", tid)) == 1
    assert spans(a, tid) == [] and spans(b, tid) == []
    assert note.traceparent.startswith("00-%s-" % tid) and note.traceparent.endswith("-00")
    # Malformed (upper-case hex, a zero trace id): ignored; the batch starts a trace of its own.
    for bad in ("00-%s-%s-01" % (tid.upper(), "ab" * 8), "00-%s-%s-01" % ("0" * 32, "ab" * 8),
                "xx"):
        _, note = submit(a, b, src, dst, bad, "malformed")
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00", note.traceparent), note
        assert tid not in note.traceparent and "0" * 32 not in note.traceparent
    # A standalone Send is logged as a batch is: with the caller's trace, and not with a
    # malformed one.
    sender = notify_pb2_grpc.NotifyStub(h2c_channel(a))
    sender.Send(notify_pb2.SendRequest(peer=b.h2c, topic="send-traced", payload=b"x"),
                metadata=[("traceparent", "00-%s-%s-01" % (tid, "cd" * 8))])
    sender.Send(notify_pb2.SendRequest(peer=b.h2c, topic="send-malformed", payload=b"x"),
                metadata=[("traceparent", "xx")])
    assert [x["topic"] for x in lines(a, "notification_sent", tid)] == [
        '"unsampled"', '"send-traced"']
    assert [x for x in lines(a, "notification_sent", "")
            if x["topic"] in ('"malformed"', '"send-malformed"')] == []
