"""BufferPool: leases of the daemon's pre-registered buffer pool, in the shape TransferQueue's
receive path uses (acquire -> lease with .ptr, .buffer, .nbytes, .release()).

    from moongate.pool import BufferPool
    with BufferPool(256 << 20) as pool:                   # at most 256 MiB held at once
        with pool.acquire(1 << 20, timeout=5) as lease:   # released at the end of the block
            c.transfer([mg.read(lease=lease.id, peer=..., remote_segment=..., length=1 << 20)])
            data = bytes(lease.buffer)

- max_bytes bounds the bytes this pool object holds at once, within the daemon's pool (whose
  own limit is --pool-bytes, shared by every client of the tenant).
- acquire(nbytes, block=True, timeout=None): without room, BufferPoolExhausted at once
  (block=False) or after waiting, first come first served: BufferPoolTimeout (a
  BufferPoolExhausted) once `timeout` seconds pass; timeout=None waits at most the daemon's
  --max-wait. Never a silent allocation beyond max_bytes.
- lease.release() is idempotent and never raises while the lease's memory is in use (a view of
  .buffer, an array over it, still alive): it is released when the last view goes. A release
  the daemon refuses raises LeaseReleaseError; at the end of a `with` block it never replaces
  an exception already on its way out (that one is logged instead).
- stats(): what the pool holds and has done.
"""
import collections
import ctypes
import functools
import logging
import mmap
import os
import sys
import threading
import time
import weakref

import grpc

from moongate import client as mg
from moongate.v1 import pool_pb2

log = logging.getLogger("moongate.pool")


class BufferPoolExhausted(Exception):
    """No room for the lease: this pool's max_bytes or the daemon's pool is full."""


class BufferPoolTimeout(BufferPoolExhausted, TimeoutError):
    """No room came before the timeout (or the daemon's --max-wait)."""


class LeaseReleaseError(Exception):
    """The daemon did not take a lease back (its TTL still ends it)."""


@functools.lru_cache(maxsize=64)
def _bytes_type(n):
    """A ctypes array type of n bytes whose instances take weak references."""
    return type("LeaseBytes%d" % n, (ctypes.c_ubyte * n,), {})


class PoolLease:
    """A lease: `ptr` (its first byte in this process), `buffer` (a writable memoryview of
    exactly `nbytes` bytes), `nbytes`, `id` (what transfers name: lease=id)."""

    def __init__(self, pool, msg, ptr):
        self._pool, self.id, self.nbytes, self.ptr = pool, msg.id, msg.requested, ptr
        self._mem = _bytes_type(msg.requested).from_address(ptr)
        whole = memoryview(self._mem)
        self.buffer = whole.cast("B")
        whole.release()
        self.released = False
        self.views_live = False  # released, but given back only when its last view goes

    def release(self):
        """Gives the lease back (at once, or when the last view of its memory goes)."""
        self._pool._release(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.release()
        except LeaseReleaseError as e:
            if exc_type is None:
                raise
            log.warning("%s (while %s propagates)", e, exc_type.__name__)
        return False


class BufferPool:
    """Leases of up to max_bytes in all, from the daemon of `client` (else a client of
    unix:$MOONGATE_SOCKET, with $MOONGATE_TOKEN or the token in $MOONGATE_TOKEN_FILE)."""

    def __init__(self, max_bytes, client=None, remote_accessible=False, ttl_ms=0):
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes, self.remote_accessible, self.ttl_ms = max_bytes, remote_accessible, ttl_ms
        self._own = client is None
        self._c = client or mg.Client(mg.default_target(), token=mg.default_token())
        # Threads share a pool: every field below and every lease's released and views_live
        # change under this condition's lock, so stats() reads one consistent state.
        self._cv = threading.Condition()
        self._held = 0            # bytes of leases not yet given back (deferred included)
        self._leases = {}         # id -> PoolLease
        self._deferred = collections.deque()  # leases whose last view went: release them
        self._maps = {}           # pool file path -> (mmap, address)
        self._max_wait_s = None
        self._counts = collections.Counter()
        self._c._after_restart.append(self._restarted)

    def _restarted(self, was, now):
        """The daemon restarted: its pool file is another; the next lease maps it afresh (the
        old mappings stay while leases of the old daemon still have views of them)."""
        with self._cv:
            self._maps.clear()
            self._max_wait_s = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _mapping(self, path):
        with self._cv:  # threads acquiring at once map the pool file once
            return self._mapping_locked(path)

    def _mapping_locked(self, path):
        ent = self._maps.get(path)
        if ent is None:
            fd = os.open(path, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
            ent = self._maps[path] = (mm, mg.address_of(mm)[0])
        return ent[1]

    def _max_wait(self):
        if self._max_wait_s is None:
            self._max_wait_s = (self._c.info().max_wait_ms or 30000) / 1000.0
        return self._max_wait_s

    def acquire(self, nbytes, block=True, timeout=None):
        if nbytes <= 0 or nbytes > self.max_bytes:
            raise ValueError("acquire(%d): a lease is 1 to max_bytes (%d) bytes" %
                             (nbytes, self.max_bytes))
        self._drain()
        limit = timeout if timeout is not None else self._max_wait()
        deadline = time.monotonic() + limit
        with self._cv:
            self._counts["acquired"] += 1
            if self._held + nbytes > self.max_bytes:
                if not block:
                    self._counts["exhausted"] += 1
                    raise BufferPoolExhausted(
                        "this pool holds %d of its %d bytes: %d more do not fit" %
                        (self._held, self.max_bytes, nbytes))
                self._counts["waits"] += 1
                while self._held + nbytes > self.max_bytes:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._counts["timeouts"] += 1
                        raise BufferPoolTimeout(
                            "no room for %d bytes within %.3g s (this pool holds %d of %d)" %
                            (nbytes, limit, self._held, self.max_bytes))
                    self._cv.wait(min(left, 0.05))
                    self._drain_locked()
            self._held += nbytes  # reserved while the daemon is asked
        try:
            msg = self._ask(nbytes, block, deadline, limit)
            lease = PoolLease(self, msg, self._mapping(msg.path) + msg.offset)
        except BaseException:
            with self._cv:
                self._held -= nbytes
                self._cv.notify_all()
            raise
        with self._cv:
            self._leases[lease.id] = lease
        self._c._remember(("lease", lease.id), "lease %d of a BufferPool" % lease.id)
        return lease

    def _ask(self, nbytes, block, deadline, limit):
        left = deadline - time.monotonic()
        try:
            return self._c._call(self._c.pool.AcquireLease, pool_pb2.AcquireLeaseRequest(
                size=nbytes, block=block, remote_accessible=self.remote_accessible,
                ttl_ms=self.ttl_ms), timeout=max(left, 0.001))
        except mg.Error as e:
            if e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                with self._cv:
                    self._counts["exhausted"] += 1
                raise BufferPoolExhausted("the daemon's pool: " + e.message) from None
            if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                with self._cv:
                    self._counts["timeouts"] += 1
                raise BufferPoolTimeout("no room for %d bytes in the daemon's pool within "
                                        "%.3g s" % (nbytes, limit)) from None
            raise

    def _release(self, lease):
        with self._cv:
            if lease.released:
                return
            lease.released = True
        lease.buffer.release()
        lease.buffer = None
        mem, lease._mem = lease._mem, None
        if sys.getrefcount(mem) > 2:  # a view of it still lives: release when it goes
            with self._cv:
                self._counts["deferred"] += 1
                lease.views_live = True
            weakref.finalize(mem, self._deferred.append, lease)
            return
        del mem
        self._give_back(lease)

    def _give_back(self, lease):
        gone = self._c._table.lost(lease.id)  # the daemon restarted: it went with its pool file
        self._c._table.drop(("lease", lease.id))
        try:
            if gone:
                raise mg.Error(grpc.StatusCode.NOT_FOUND, gone)
            self._c._call(self._c.pool.ReleaseLease, pool_pb2.ReleaseLeaseRequest(id=lease.id))
        except Exception as e:
            with self._cv:
                self._counts["release_errors"] += 1
            raise LeaseReleaseError("releasing lease %d: %s" % (lease.id, e)) from None
        finally:
            with self._cv:
                self._counts["released"] += 1
                self._held -= lease.nbytes
                self._leases.pop(lease.id, None)
                self._cv.notify_all()

    def _drain_locked(self):
        """Inside the condition: gives back the leases whose last view went (without it)."""
        if not self._deferred:
            return
        self._cv.release()
        try:
            self._drain()
        finally:
            self._cv.acquire()

    def _drain(self):
        while True:
            try:  # threads drain at once: the last lease goes to one of them
                lease = self._deferred.popleft()
            except IndexError:
                return
            try:
                self._give_back(lease)
            except LeaseReleaseError as e:
                log.warning("%s (a release deferred until its views went)", e)

    def stats(self):
        """max_bytes; held_bytes (leases not yet given back, deferred included, and the room
        acquires reserve while they ask the daemon) and leases (not yet given back); in_use
        (leases whose release waits for their views); counts of acquired, released, waits,
        exhausted, timeouts, deferred and release_errors."""
        self._drain()
        with self._cv:
            out = {"max_bytes": self.max_bytes, "held_bytes": self._held,
                   "leases": len(self._leases),
                   "in_use": sum(1 for x in self._leases.values() if x.views_live)}
            for k in ("acquired", "released", "waits", "exhausted", "timeouts", "deferred",
                      "release_errors"):
                out[k] = self._counts[k]
        return out

    def close(self):
        """Gives back every lease not yet released (views of them are then stale) and closes
        the pool's mappings and its own client."""
        self._drain()
        if self._restarted in self._c._after_restart:
            self._c._after_restart.remove(self._restarted)
        for lease in list(self._leases.values()):
            if not lease.released:
                try:
                    lease.release()
                except LeaseReleaseError as e:
                    log.warning("close: %s", e)
        with self._cv:
            in_use = any(x.views_live for x in self._leases.values())
        if not in_use:  # else views of a lease still point into the mappings: they stay
            for mm, _ in self._maps.values():
                mm.close()
            self._maps.clear()
        if self._own:
            self._c.close()
