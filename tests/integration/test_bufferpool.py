"""moongate.pool.BufferPool, leases in the shape TransferQueue's receive path uses: exhaustion
(this pool's and the daemon's) as a distinct error, blocking with a timeout and without one (the
daemon's --max-wait), release twice, release of a lease in use (deferred, never raising), an
exception inside `with` never masked by a failing release, stats."""
import collections
import ctypes
import os
import signal
import threading
import time

import pytest

import conftest

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402
from moongate.pool import (BufferPool, BufferPoolExhausted, BufferPoolTimeout,  # noqa: E402
                           LeaseReleaseError)

MiB = 1 << 20


def pool_of(d, max_bytes, **kw):
    return BufferPool(max_bytes, client=mg.Client("unix:" + d.sock), **kw)


def test_leases_are_the_pool_files_bytes_and_stats(make_daemon):
    d = make_daemon("--pool-bytes", "8M")
    with mg.Client("unix:" + d.sock) as c, BufferPool(4 * MiB, client=c) as pool:
        seg = c.register("dst", MiB)
        with pool.acquire(MiB) as lease:
            assert lease.nbytes == MiB and lease.buffer.nbytes == MiB and lease.ptr
            lease.buffer[:5] = b"hello"
            assert ctypes.string_at(lease.ptr, 5) == b"hello"
            c.transfer([mg.write(lease=lease.id, peer="", remote_segment=seg.id, length=5)])
        with c.map(seg) as view:
            assert bytes(view[:5]) == b"hello"
        s = pool.stats()
        assert (s["held_bytes"], s["leases"], s["acquired"], s["released"]) == (0, 0, 1, 1), s
        with pytest.raises(ValueError):
            pool.acquire(4 * MiB + 1)  # more than the pool may ever hold


def test_exhaustion_and_waiting(make_daemon):
    d = make_daemon("--pool-bytes", "8M")
    pool = pool_of(d, 2 * MiB)
    one, two = pool.acquire(MiB), pool.acquire(MiB)
    with pytest.raises(BufferPoolExhausted, match="holds 2097152 of its 2097152 bytes"):
        pool.acquire(MiB, block=False)
    with pytest.raises(BufferPoolTimeout) as e:
        pool.acquire(MiB, timeout=0.2)
    assert isinstance(e.value, BufferPoolExhausted) and isinstance(e.value, TimeoutError)

    # a waiter gets the room a release makes, however long that takes
    got = []

    def releaser():
        while pool.stats()["waits"] < 2:
            pass
        one.release()
    th = threading.Thread(target=releaser)
    th.start()
    got.append(pool.acquire(MiB, timeout=120))
    th.join()
    s = pool.stats()
    assert (s["held_bytes"], s["waits"], s["exhausted"], s["timeouts"]) == (2 * MiB, 2, 1, 1), s
    for x in (two, got[0]):
        x.release()
    pool.close()


def test_the_daemons_pool_and_its_max_wait(make_daemon):
    d = make_daemon("--pool-bytes", "2M", "--max-wait", "1")
    pool = pool_of(d, 8 * MiB)
    held = pool.acquire(2 * MiB)
    with pytest.raises(BufferPoolExhausted, match="daemon's pool: .*cannot serve 1048576 bytes"):
        pool.acquire(MiB, block=False)
    with pytest.raises(BufferPoolTimeout):  # no timeout: the daemon's --max-wait ends it
        pool.acquire(MiB)
    small = pool_of(d, MiB)
    with pytest.raises(BufferPoolExhausted, match="the daemon's pool"):
        small.acquire(MiB, block=False)  # room in this pool, none in the daemon's
    held.release()
    # this pool's own limit with timeout=None: bounded by the daemon's --max-wait too
    one = small.acquire(MiB)
    with pytest.raises(BufferPoolTimeout, match="within 1 s"):
        small.acquire(MiB)
    one.release()
    assert pool.stats()["held_bytes"] == 0 and small.stats()["held_bytes"] == 0
    pool.close()
    small.close()


def test_release_twice_and_a_lease_in_use(make_daemon):
    d = make_daemon("--pool-bytes", "8M")
    pool = pool_of(d, 2 * MiB)
    lease = pool.acquire(MiB)
    lease.release()
    lease.release()  # twice: nothing
    assert pool.stats()["released"] == 1

    lease = pool.acquire(MiB)
    view = lease.buffer[16:32]  # the lease's memory, still in use
    view[:4] = b"busy"
    lease.release()  # deferred, no error
    s = pool.stats()
    assert (s["in_use"], s["held_bytes"], s["deferred"], s["released"]) == (1, MiB, 1, 1), s
    assert bytes(view[:4]) == b"busy"  # still the lease's bytes: not given back yet
    with pytest.raises(BufferPoolExhausted):
        pool.acquire(2 * MiB, block=False)
    del view  # the last view goes: the release happens
    s = pool.stats()
    assert (s["in_use"], s["held_bytes"], s["released"]) == (0, 0, 2), s
    pool.acquire(2 * MiB, block=False).release()
    pool.close()


def test_a_failing_release_never_masks_an_exception(make_daemon):
    d = make_daemon("--pool-bytes", "8M")
    pool = pool_of(d, 4 * MiB)
    with pytest.raises(ZeroDivisionError):
        with pool.acquire(MiB):
            d.kill()  # the daemon goes: the release at the end of the block fails
            1 / 0
    d = make_daemon("--pool-bytes", "8M")
    pool = pool_of(d, 4 * MiB)
    lease = pool.acquire(MiB)
    d.kill()
    with pytest.raises(LeaseReleaseError, match="releasing lease %d" % lease.id):
        with lease:
            pass
    assert pool.stats()["release_errors"] == 1


class _LockedCounts(dict):
    """A pool's counts that note every change made without the pool's lock held."""

    def __init__(self, pool):
        super().__init__()
        self.pool, self.unlocked = pool, []

    def __missing__(self, key):
        return 0

    def __setitem__(self, key, value):
        if not self.pool._cv._is_owned():
            self.unlocked.append(key)
        super().__setitem__(key, value)


def test_counts_change_under_the_pools_lock(make_daemon):
    """Threads share a pool: a count changed without its lock may lose another thread's change,
    and stats() would read it mid-way. Every path that counts, the daemon's refusals
    included."""
    d = make_daemon("--pool-bytes", "1M")
    pool = pool_of(d, 4 * MiB)
    counts = pool._counts = _LockedCounts(pool)
    held = pool.acquire(MiB)
    with pytest.raises(BufferPoolExhausted, match="the daemon's pool"):
        pool.acquire(MiB, block=False)
    with pytest.raises(BufferPoolTimeout, match="the daemon's pool"):
        pool.acquire(MiB, timeout=0.2)
    with pytest.raises(BufferPoolExhausted, match="this pool holds"):
        pool.acquire(4 * MiB, block=False)
    view = held.buffer[:8]
    held.release()  # deferred until the view goes
    del view
    s = pool.stats()
    assert counts.unlocked == [], counts.unlocked
    assert (s["acquired"], s["exhausted"], s["timeouts"], s["deferred"], s["released"],
            s["held_bytes"]) == (4, 2, 1, 1, 1, 0), s
    pool.close()


class _MeetingDeque(collections.deque):
    """A pool's deferred releases where the first two threads to ask whether one waits both
    hear yes before either takes it: the interleaving in which two threads race for the last."""

    def __init__(self):
        super().__init__()
        self.meet, self.lock, self.asked = threading.Barrier(2, timeout=30), threading.Lock(), 0

    def __len__(self):
        n = super().__len__()
        with self.lock:
            self.asked += 1 if n else 0
            first_two = n and self.asked <= 2
        if first_two:
            self.meet.wait()
        return n


def test_threads_draining_deferred_releases_at_once(make_daemon):
    """Two threads give back the deferred releases at once (stats(), acquire() do): the last
    one goes to one of them, and the other finds none left instead of failing."""
    d = make_daemon("--pool-bytes", "8M")
    pool = pool_of(d, 4 * MiB)
    pool._deferred = _MeetingDeque()
    lease = pool.acquire(MiB)
    view = lease.buffer[:8]
    lease.release()  # deferred until the view goes
    del view  # now waiting in the deque
    errors = []

    def stats():
        try:
            pool.stats()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))
    threads = [threading.Thread(target=stats) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = pool.stats()
    assert (s["released"], s["held_bytes"], s["leases"]) == (1, 0, 0), s
    pool.close()


def test_stats_while_a_release_is_on_its_way(make_daemon):
    """A lease whose release is with the daemon (frozen here) is not in use: in_use counts only
    releases waiting for views of the lease's memory."""
    d = make_daemon("--pool-bytes", "8M")
    pool = pool_of(d, 4 * MiB)
    lease = pool.acquire(MiB)
    d.signal(signal.SIGSTOP)
    try:
        th = threading.Thread(target=lease.release)
        th.start()
        deadline = time.monotonic() + 60  # a safety net only
        while not lease.released:  # set before the call to the daemon
            assert time.monotonic() < deadline and th.is_alive()
            time.sleep(0.001)
        s = pool.stats()
        assert (s["in_use"], s["leases"], s["held_bytes"]) == (0, 1, MiB), s
    finally:
        d.signal(signal.SIGCONT)
    th.join()
    s = pool.stats()
    assert (s["in_use"], s["leases"], s["held_bytes"], s["released"]) == (0, 0, 0, 1), s
    pool.close()
