"""End-to-end digests (SubmitRequest.digest): the sender's CRC32C of every slice against the
receiver's of the bytes where they landed. Daemon B's data plane is made to corrupt what it
serves (Debug/CorruptSlices: a WRITE slice gets a byte flipped where it landed, a READ answer a
wrong CRC); the request fails DATA_LOSS, the receiver's topic gets a failure notice saying so
and never the notification. Without a digest the same batch moves unchecked."""
import os

import grpc
import pytest

from conftest import h2c_channel, register, req, wait_batch

from moongate.v1 import debug_pb2, debug_pb2_grpc, notify_pb2, notify_pb2_grpc  # noqa: E402
from moongate.v1 import transfer_pb2, transfer_pb2_grpc  # noqa: E402

MiB = 1 << 20


def corrupt(d, count):
    with h2c_channel(d) as ch:
        debug_pb2_grpc.DebugStub(ch).CorruptSlices(debug_pb2.CorruptRequest(count=count))


def test_a_flipped_byte_fails_the_request_and_the_receiver_hears_it(make_daemon):
    a = make_daemon("--peer-tls=false")
    b = make_daemon("--peer-tls=false")
    n = 3 * MiB + 7  # four slices
    src, back = register(a, "src", n), register(a, "back", n)
    dst = register(b, "dst", n, remote=True)
    data = os.urandom(n)
    with open(src.path, "r+b") as f:
        f.write(data)
    nb = notify_pb2_grpc.NotifyStub(h2c_channel(b))
    with h2c_channel(a) as ch:
        t = transfer_pb2_grpc.TransferStub(ch)

        def submit(op, local, topic, digest=True):
            return wait_batch(t, t.Submit(transfer_pb2.SubmitRequest(
                requests=[req(op, local, b.h2c, dst.id, n)], digest=digest,
                notify=[transfer_pb2.NotifyPeer(peer=b.h2c, topic=topic, payload=b"p")]
            )).batch_id)
        # Checked and intact: done, the bytes in place.
        assert submit(transfer_pb2.WRITE, src.id, "ok").state == transfer_pb2.DONE
        with open(dst.path, "rb") as f:
            assert f.read() == data
        # And back, checked as it lands here: the same bytes.
        assert submit(transfer_pb2.READ, back.id, "back").state == transfer_pb2.DONE
        with open(back.path, "rb") as f:
            assert f.read() == data
        # One slice corrupted where it landed: DATA_LOSS, and a failure notice instead.
        corrupt(b, 1)
        batch = submit(transfer_pb2.WRITE, src.id, "bad")
        r = batch.requests[0]
        assert batch.state == transfer_pb2.FAILED, batch
        assert r.code == grpc.StatusCode.DATA_LOSS.value[0], r
        assert "refused slice" in r.message and r.transport == "tcp"
        notes = nb.Poll(notify_pb2.PollRequest(topic="bad")).notifications
        assert [x.outcome for x in notes] == [notify_pb2.OUTCOME_FAILED], notes
        assert notes[0].code == grpc.StatusCode.DATA_LOSS.value[0]
        assert "not sent" in batch.notify[0].message
        # A READ whose answer carries a wrong CRC: DATA_LOSS here.
        corrupt(b, 1)
        batch = submit(transfer_pb2.READ, back.id, "read")
        assert batch.requests[0].code == grpc.StatusCode.DATA_LOSS.value[0], batch
        # Without a digest nothing is checked: the switch waits for a checksummed slice.
        corrupt(b, 1)
        assert submit(transfer_pb2.WRITE, src.id, "unchecked", False).state == \
            transfer_pb2.DONE
        with open(dst.path, "rb") as f:
            assert f.read() == data
        assert [x.outcome for x in nb.Poll(notify_pb2.PollRequest(topic="unchecked"))
                .notifications] == [notify_pb2.OUTCOME_LANDED]
    assert b.metric("moongate_data_slices_total", op="refused") == 1


def crc32c(data):
    """CRC32C (Castagnoli), bit by bit: small inputs only."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def test_checksum_of_a_range_the_caller_owns(daemon):
    from moongate.v1 import memory_pb2, memory_pb2_grpc
    seg = register(daemon, "sum", MiB)
    data = os.urandom(4096)
    with open(seg.path, "r+b") as f:
        f.seek(1000)
        f.write(data)
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    with h2c_channel(daemon) as ch:
        m = memory_pb2_grpc.MemoryStub(ch)
        got = m.Checksum(memory_pb2.ReadSegmentRequest(id=seg.id, offset=1000, length=4096))
        assert (got.crc32c, got.length) == (crc32c(data), 4096)
        assert m.Checksum(memory_pb2.ReadSegmentRequest(id=seg.id)).length == MiB
        for fields, code in [(dict(id=seg.id, offset=MiB, length=1), "OUT_OF_RANGE"),
                             (dict(id=seg.id + 1000), "NOT_FOUND"),
                             (dict(id=seg.id, lease_id=1), "INVALID_ARGUMENT")]:
            with pytest.raises(grpc.RpcError) as err:
                m.Checksum(memory_pb2.ReadSegmentRequest(**fields))
            assert err.value.code().name == code, err.value
