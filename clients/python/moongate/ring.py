"""A submission ring (Transfer/AttachRing): shared memory with the daemon where this process
posts batches by index into its prepared lists and reads their ends without a call each. The
layout is engine/include/moongate/ringwire.h's; this module writes and reads it with struct.

    ring = client.attach_ring()
    ring.post_pairs(transfer_pb2.WRITE, local, [0, 1], remote, [7, 8])   # -> user_data
    done = ring.wait()          # a Completion: user_data, batch_id, code, requests, done, ...

A ring belongs to the client's connection (its lists are that connection's) and goes with it.
One thread posts and reads at a time (the caller's lock, if it shares a ring)."""
import collections
import mmap
import os
import select
import socket
import struct
import threading
import time

import grpc

MAGIC = 0x31676e69726d6d
SQE, CQE = 128, 256
PAIRS, STRIDED = 1, 2
NOTIFY, ACCEPTED = 1, 2
CQE_ACCEPTED = 1
INLINE_PAIRS, SLOT_PAIRS = 10, SQE // 8
# mg_ring_hdr's fields (offsets pinned by engine/src/mg_ring.c).
H_SQ_ENTRIES, H_SQ_OFF, H_CQ_OFF, H_BROKEN, H_WHY = 8, 16, 24, 40, 44
H_SQ_TAIL, H_SQ_HEAD, H_SLEEPING, H_NEEDS_ROOM = 192, 256, 260, 264
H_CQ_TAIL, H_CQ_HEAD, H_WAITING = 320, 384, 388

_U32 = struct.Struct("=I")
_HEAD = struct.Struct("=QBBHIQQ")              # user_data, op, kind, flags, count, lists
_STRIDED = struct.Struct("=IIQQQQQ")           # indices, offsets, strides, length
_CQE = struct.Struct("=QQIIIII")  # user_data, batch_id, code, requests, done, failed, flags

Completion = collections.namedtuple(
    "Completion", "user_data batch_id code requests done failed why accepted")
Completion.__doc__ = """A submission's end: code 0 (grpc.StatusCode.OK) when every request is
done; else the gRPC code (an int), failed the index of the first failed request (or None) and
why; batch_id 0 when it was refused before a batch was made. accepted: this is not the end but
the batch's acceptance (posted with accepted=True), with its batch_id; the end follows."""


class RingError(Exception):
    """The ring cannot take this submission now (full), or it broke."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code.name, message))
        self.code = code
        self.message = message


def attach(client, entries=256):
    """A ring for client's connection (the Unix socket): see Client.attach_ring."""
    from moongate.client import pass_fd
    from moongate.v1 import transfer_pb2
    if not client.fd_socket:
        raise RingError(grpc.StatusCode.FAILED_PRECONDITION,
                        "a ring is for a process on the daemon's host: connect on its Unix socket")
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = []
    try:
        with theirs:
            handle, _ = pass_fd(client.fd_socket, theirs.fileno(), client._token)
        resp = client._call(client.transfers.AttachRing,
                            transfer_pb2.AttachRingRequest(channel=handle, entries=entries))
        msg, fds, _, _ = socket.recv_fds(mine, 64, 3)
        magic, ring_id, size = struct.unpack("=QQQ", msg[:24])
        if magic != MAGIC or ring_id != resp.ring_id or len(fds) != 3:
            raise RingError(grpc.StatusCode.INTERNAL, "the daemon's ring hello does not check")
        mm = mmap.mmap(fds[0], size)
    except BaseException:
        for fd in fds:
            os.close(fd)
        mine.close()
        raise
    os.close(fds[0])
    return Ring(mm, fds[1], fds[2], resp.ring_id, mine)


class Ring:
    def __init__(self, mm, doorbell, bell, ring_id, channel):
        self.id = ring_id
        self._mm = mm
        self._chan = channel  # the daemon's end closes when the ring is let go there
        self._doorbell, self._bell = doorbell, bell
        self.entries = _U32.unpack_from(mm, H_SQ_ENTRIES)[0]
        self._mask = self.entries - 1
        self._sq = struct.unpack_from("=Q", mm, H_SQ_OFF)[0]
        self._cq = struct.unpack_from("=Q", mm, H_CQ_OFF)[0]
        self._tail = self._u32(H_SQ_TAIL)
        self._head = self._u32(H_CQ_HEAD)
        self._next = 1
        # An uncontended lock's acquire is an atomic read-modify-write: the full fence between
        # a store of ours and a load of the daemon's flag (Python has no other).
        self._fence_lock = threading.Lock()

    def _u32(self, off):
        return _U32.unpack_from(self._mm, off)[0]

    def _fence(self):
        self._fence_lock.acquire()
        self._fence_lock.release()

    def alive(self):
        """Whether the daemon still serves the ring (one system call): its connection closed,
        the daemon stopped, or the ring broke, ends it."""
        if self._mm is None or self._u32(H_BROKEN):
            return False
        return not select.select([self._chan], [], [], 0)[0]

    def _check(self):
        if self._mm is None:
            raise RingError(grpc.StatusCode.FAILED_PRECONDITION, "the ring was closed here")
        broken = self._u32(H_BROKEN)
        if broken:
            from moongate.client import _code
            why = bytes(self._mm[H_WHY:H_WHY + 96]).split(b"\0", 1)[0].decode(errors="replace")
            raise RingError(_code(broken), "the ring broke: " + why)

    # posting
    def _room(self, slots):
        self._check()
        if slots > self.entries:
            raise RingError(grpc.StatusCode.INVALID_ARGUMENT,
                            "the submission takes %d slots; the ring has %d (attach a larger "
                            "ring, or post it in parts)" % (slots, self.entries))
        used = (self._tail - self._u32(H_SQ_HEAD)) & 0xffffffff
        if used + slots > self.entries:
            raise RingError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            "the ring is full (%d of %d slots): read completions" % (
                                used, self.entries))

    def _slot(self, k):
        return self._sq + ((self._tail + k) & self._mask) * SQE

    def _publish(self, slots, user_data):
        self._tail = (self._tail + slots) & 0xffffffff
        _U32.pack_into(self._mm, H_SQ_TAIL, self._tail)
        self._fence()
        if self._u32(H_SLEEPING):
            os.eventfd_write(self._doorbell, 1)
        return user_data

    def _user_data(self, user_data):
        if user_data is None:
            user_data, self._next = self._next, self._next + 1
        return user_data

    def _post(self, entry, extra, user_data):
        """Writes the entry (its first slot, SQE bytes) and the bytes of the slots after it,
        then publishes them."""
        slots = 1 + (len(extra) + SQE - 1) // SQE
        self._room(slots)
        at = self._slot(0)
        self._mm[at:at + SQE] = entry
        for k in range(1, slots):
            chunk = extra[(k - 1) * SQE:k * SQE]
            at = self._slot(k)
            self._mm[at:at + len(chunk)] = chunk
        return self._publish(slots, user_data)

    @staticmethod
    def _note(notify, accepted):
        """(flags, note_len, bytes) of a notification (topic, payload) or None."""
        flags = ACCEPTED if accepted else 0
        if notify is None:
            return flags, 0, b""
        topic, payload = notify
        note = topic.encode() + b"\0" + bytes(payload)
        return flags | NOTIFY, len(note), note

    def post_pairs(self, op, local_list, local_indices, remote_list, remote_indices,
                   user_data=None, notify=None, accepted=False):
        """A batch of pairs by index into two prepared lists of this connection (as
        Client.transfer's prepared groups). notify: (topic, payload) for the remote list's
        peer, sent once the batch's requests there ended (as SubmitRequest.notify); accepted:
        a completion when the batch is accepted too (its batch_id, to Cancel or GetBatch it
        while it goes), before the one at its end. Returns its user_data (given, or
        numbered)."""
        n = len(local_indices)
        if n != len(remote_indices) or n == 0:
            raise ValueError("1 or more pairs, local and remote indices of equal count")
        user_data = self._user_data(user_data)
        flags, note_len, note = self._note(notify, accepted)
        if hasattr(local_indices, "astype"):  # NumPy: interleaved without a Python step each
            import numpy as np
            both = np.empty((n, 2), dtype=np.uint32)
            both[:, 0], both[:, 1] = local_indices, remote_indices
            pairs = both.tobytes()
        else:
            pairs = struct.pack("=%dI" % (2 * n), *[x for p in zip(local_indices,
                                                                   remote_indices) for x in p])
        entry = bytearray(SQE)
        _HEAD.pack_into(entry, 0, user_data, op, PAIRS, flags, n, local_list, remote_list)
        entry[32:32 + min(len(pairs), 8 * INLINE_PAIRS)] = pairs[:8 * INLINE_PAIRS]
        _U32.pack_into(entry, 112, note_len)
        rest = pairs[8 * INLINE_PAIRS:]
        if note:
            rest = rest.ljust((len(rest) + SQE - 1) // SQE * SQE, b"\0") + note
        return self._post(entry, rest, user_data)

    def post_strided(self, op, local_list, local_index, remote_list, remote_index, count,
                     length, local_offset=0, remote_offset=0, local_stride=0, remote_stride=0,
                     user_data=None, notify=None, accepted=False):
        """A batch of `count` blocks of `length` bytes: block k at local_offset + k *
        local_stride of range local_index of local_list, and at remote_offset + k *
        remote_stride of range remote_index of remote_list. One slot (and a note's); count 1
        is one block anywhere in two listed ranges. notify and accepted as for post_pairs.
        Returns its user_data."""
        user_data = self._user_data(user_data)
        flags, note_len, note = self._note(notify, accepted)
        entry = bytearray(SQE)
        _HEAD.pack_into(entry, 0, user_data, op, STRIDED, flags, count, local_list, remote_list)
        _STRIDED.pack_into(entry, 32, local_index, remote_index, local_offset, remote_offset,
                           local_stride, remote_stride, length)
        _U32.pack_into(entry, 112, note_len)
        return self._post(entry, note, user_data)

    def post_raw(self, slots):
        """Publishes slots of bytes as written (for tests of the daemon's checks). Returns
        how many."""
        self._room(len(slots))
        for k, raw in enumerate(slots):
            at = self._slot(k)
            self._mm[at:at + SQE] = bytes(raw).ljust(SQE, b"\0")[:SQE]
        self._publish(len(slots), None)
        return len(slots)

    # completions
    def poll(self):
        """The completions written so far (none: []), without a system call."""
        out = []
        tail = self._u32(H_CQ_TAIL)
        while self._head != tail:
            at = self._cq + (self._head & self._mask) * CQE
            ud, bid, code, reqs, done, failed, flags = _CQE.unpack_from(self._mm, at)
            why = bytes(self._mm[at + 36:at + CQE]).split(b"\0", 1)[0].decode(errors="replace")
            out.append(Completion(ud, bid, code, reqs, done,
                                  None if failed == 0xffffffff else failed, why,
                                  bool(flags & CQE_ACCEPTED)))
            self._head = (self._head + 1) & 0xffffffff
        if out:
            _U32.pack_into(self._mm, H_CQ_HEAD, self._head)
            self._fence()
            if self._u32(H_NEEDS_ROOM):
                os.eventfd_write(self._doorbell, 1)
        return out

    def wait(self, timeout=None, spin_us=0):
        """The completions, at least one, waiting up to timeout seconds (None: for ever; then
        []). spin_us: look without sleeping this long first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if spin_us:
            until = time.monotonic() + spin_us / 1e6
            while time.monotonic() < until:
                got = self.poll()
                if got:
                    return got
        while True:
            got = self.poll()
            if got:
                return got
            self._check()
            _U32.pack_into(self._mm, H_WAITING, 1)
            self._fence()
            got = self.poll()
            if not got:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready = select.select([self._bell, self._chan], [], [], left)[0]
                if self._chan in ready and not self.poll_again():
                    raise RingError(grpc.StatusCode.UNAVAILABLE,
                                    "the daemon let the ring go (its connection closed, or the "
                                    "daemon stopped): what it had not answered is unknown")
                try:
                    os.eventfd_read(self._bell)
                except BlockingIOError:
                    pass
            _U32.pack_into(self._mm, H_WAITING, 0)
            if got:
                return got
            if deadline is not None and time.monotonic() >= deadline:
                return self.poll()

    def poll_again(self):
        """Whether completions are waiting (after the daemon let the ring go, the last ones
        it wrote are still read)."""
        return self._u32(H_CQ_TAIL) != self._head

    def close(self):
        """Lets go of the ring here (the daemon's goes with the connection)."""
        if self._mm is not None:
            self._mm.close()
            os.close(self._doorbell)
            os.close(self._bell)
            self._chan.close()
            self._mm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
