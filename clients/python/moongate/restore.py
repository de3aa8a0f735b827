"""What a client restores when its daemon comes back (moongate.client uses it).

A daemon restarted (an upgrade, a crash, SIGKILL) forgets its clients: their agents, the memory
they registered, their expectations. The client notices that its connection broke (the channel's
connectivity), waits for the daemon to answer again — within MOONGATE_RECONNECT_S seconds
(default 30; 0: it never reconnects), the channel retrying every MOONGATE_RECONNECT_BACKOFF_MS
at most (default 1000) — and makes again, in the order first made, everything its table holds:

  one row per thing the daemon forgot, with how to make it again (`redo`, which returns the
  new id or None) and what to let go of when the row goes (`close`: a descriptor kept for it).

Later kinds of client state add their rows here instead of logic of their own. What cannot come
back (daemon-made segments, shm files by name, pool leases) has a row without `redo`: after a
restart its id is remembered as lost, and using it says so.

Calls made while the client restores wait for it (within the bound); calls that were on their
way when the connection broke fail once, naming it.
"""
import collections
import logging
import os
import threading
import time

log = logging.getLogger("moongate")


def reconnect_bound_s():
    """MOONGATE_RECONNECT_S: how long a client waits for its daemon to come back."""
    try:
        return max(0.0, float(os.environ.get("MOONGATE_RECONNECT_S", "30")))
    except ValueError:
        log.warning("MOONGATE_RECONNECT_S=%r is not a number of seconds: 30 used",
                    os.environ.get("MOONGATE_RECONNECT_S"))
        return 30.0


def reconnect_backoff_ms():
    """MOONGATE_RECONNECT_BACKOFF_MS: the longest the channel waits between two tries."""
    try:
        return max(10, int(os.environ.get("MOONGATE_RECONNECT_BACKOFF_MS", "1000")))
    except ValueError:
        return 1000


Row = collections.namedtuple("Row", "what redo close")


class Table:
    """The rows, in the order made, by key; and what became of ids across restarts."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows = collections.OrderedDict()
        self._now = {}   # an id the program holds -> the id the daemon has for it now
        self._lost = {}  # an id the program holds -> why it is gone

    def add(self, key, what, redo=None, close=None):
        """A row for `key` (("segment", id), ("agent", name), ...): `what` names it in messages;
        redo() makes it again and returns the new id (or None); close() lets go of what the
        row keeps. Without redo, the thing is lost at a restart."""
        with self._lock:
            old = self._rows.pop(key, None)
            self._rows[key] = Row(what, redo, close)
        if old and old.close:
            old.close()

    def drop(self, key):
        with self._lock:
            row = self._rows.pop(key, None)
            if key[1] in self._now:
                del self._now[key[1]]
            self._lost.pop(key[1], None)
        if row and row.close:
            row.close()

    def __len__(self):
        return len(self._rows)

    def id(self, kind, value):
        """The id the daemon has now for `value`, an id of `kind` the program holds. Raises
        LookupError(why) when that thing did not survive a restart."""
        if not value:
            return value
        with self._lock:
            if (kind, value) in self._rows or value not in self._lost:
                return self._now.get(value, value)
            raise LookupError(self._lost[value])

    def lost(self, value):
        """Why this id is gone, or None."""
        with self._lock:
            return self._lost.get(value)

    def _steps(self, epoch_was, epoch_now):
        """The rows to make again, in order. Across a restart (another epoch) those without redo
        are lost on the way; across a reconnect to the same daemon (the same epoch: only the
        connection broke) the daemon still has them, and they stay as they are."""
        with self._lock:
            rows = list(self._rows.items())
        for key, row in rows:
            if row.redo is not None:
                yield key, row
                continue
            if epoch_was is not None and epoch_was == epoch_now:
                continue
            with self._lock:
                self._rows.pop(key, None)
                self._lost[key[1]] = ("%s was the daemon's before it restarted (epoch %016x, "
                                      "now %016x) and did not come back" %
                                      (row.what, epoch_was or 0, epoch_now))
            if row.close:
                row.close()

    def _made(self, key, new):
        if new is not None and key[0] in ("segment", "expect"):
            with self._lock:
                self._now[key[1]] = new

    def replay(self, epoch_was, epoch_now):
        """Makes every row again, in order. Rows without redo are lost. Returns the number
        made again and the failures [(what, error)]."""
        made, failed = 0, []
        for key, row in self._steps(epoch_was, epoch_now):
            try:
                self._made(key, row.redo())
                made += 1
            except Exception as e:  # noqa: BLE001 - each row says what went wrong, then the next
                failed.append((row.what, e))
        return made, failed

    async def areplay(self, epoch_was, epoch_now):
        """replay() for an asyncio client, whose redo() are coroutines."""
        made, failed = 0, []
        for key, row in self._steps(epoch_was, epoch_now):
            try:
                self._made(key, await row.redo())
                made += 1
            except Exception as e:  # noqa: BLE001 - as replay()
                failed.append((row.what, e))
        return made, failed

    def close(self):
        with self._lock:
            rows, self._rows = list(self._rows.values()), collections.OrderedDict()
        for row in rows:
            if row.close:
                row.close()


def epoch_of(metadata):
    """The moongate-epoch header's value among a call's metadata, or None."""
    for key, value in metadata or ():
        if key == "moongate-epoch":
            try:
                return int(value, 16)
            except ValueError:
                return None
    return None


def _still_there(was, now, failed):
    """The failures of a replay, less those a reconnect to the same daemon (the same epoch: only
    the connection broke) met because the daemon still has the thing (ALREADY_EXISTS): those
    stand as they were, under the ids the program holds."""
    if was is None or was != now:
        return failed
    return [(what, e) for what, e in failed
            if "ALREADY_EXISTS" not in str(getattr(e, "code", ""))]


def _said(e):
    """An error in one line: a gRPC error's code and details, not its whole repr."""
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    if callable(code) and callable(details):
        return "%s: %s" % (getattr(code(), "name", code()), details())
    return str(e)


class Reconnector:
    """Watches a channel; when its connection breaks, waits for the daemon (`probe()`, which
    returns the daemon's epoch or raises), then replays the table. `gate()` holds calls while
    that runs."""

    def __init__(self, channel, table, probe, fatal, bound_s, after=None):
        self._table, self._probe, self._fatal, self._bound = table, probe, fatal, bound_s
        self._after = after  # after(was, now): the table was replayed under a new epoch
        self._cv = threading.Condition()
        self._restoring = False
        self._ready_once = False
        self._thread = None
        self._closed = False
        self.gone = None       # why calls fail now (the daemon did not come back), or None
        self.fatal = False     # gone for good: the daemon back refuses us, or is another's
        self.epoch = None      # the daemon's epoch when last seen
        self.restarts = 0      # restarts of the daemon this client went through
        self.restores = 0      # times the table was replayed
        self._channel = channel
        if bound_s > 0:
            channel.subscribe(self._on_state, try_to_connect=False)

    def seen(self, epoch):
        with self._cv:
            if self.epoch is None:
                self.epoch = epoch

    def _on_state(self, state):
        import grpc
        if self.fatal:
            return
        if state == grpc.ChannelConnectivity.READY:
            self._ready_once = True
            if self.gone:  # back after the client gave up: restore now
                self._start()
            return
        if state != grpc.ChannelConnectivity.SHUTDOWN and self._ready_once:
            self._start()  # IDLE or TRANSIENT_FAILURE after READY: the connection broke

    def _start(self):
        with self._cv:
            if self._restoring or self._closed or len(self._table) == 0:
                return
            self._restoring = True
            self._ready_once = False
            self._thread = threading.Thread(target=self._run, name="moongate-reconnect",
                                            daemon=True)
            self._thread.start()

    def busy(self):
        return self._restoring

    def mark_up(self):
        """A call just went through: the connection was up (grpc's state watcher, polling, may
        not have seen it READY before it broke)."""
        self._ready_once = True

    def answered(self, metadata):
        """A call's answer, with its moongate-epoch header: a daemon with another epoch than the
        one this client restored for is a restart that grpc reconnected to on its own (its state
        watcher, polling, can miss a break and a reconnect in between): restore now."""
        epoch = epoch_of(metadata)
        if epoch is None or self.epoch is None or epoch == self.epoch:
            return
        if self._bound > 0 and not self.fatal and not self._restoring:
            self._start()


    def gate(self):
        """Waits while the client restores (the restoring thread itself passes)."""
        if not self._restoring or threading.current_thread() is self._thread:
            return
        with self._cv:
            self._cv.wait_for(lambda: not self._restoring, timeout=self._bound + 5)

    def _run(self):
        t0 = time.monotonic()
        deadline, last = t0 + self._bound, None
        while not self._closed:
            try:
                epoch = self._probe(max(0.05, min(1.0, deadline - time.monotonic())))
            except Exception as e:  # noqa: BLE001 - the probe's error is the reason given
                last = e
                why = self._fatal(e)
                if why or time.monotonic() >= deadline:
                    self.fatal = why is not None
                    self._give_up(why or "the daemon did not come back within "
                                  "MOONGATE_RECONNECT_S=%g s (last: %s); calls fail until it "
                                  "does" % (self._bound, _said(e)))
                    return
                continue
            was = self.epoch
            if was is not None and epoch != was:
                self.restarts += 1
            self.epoch = epoch
            made, failed = self._table.replay(was, epoch)
            failed = _still_there(was, epoch, failed)
            if self._after and was != epoch:
                self._after(was, epoch)
            self.restores += 1
            self.gone = None
            if any(self._fatal(e) is None and "UNAVAILABLE" in str(getattr(e, "code", ""))
                   for _, e in failed) and time.monotonic() < deadline:
                last = failed[0][1]
                continue  # the connection broke again meanwhile: once more, from the top
            for what, e in failed:
                log.warning("after the daemon came back, %s could not be made again: %s", what, e)
            log.log(logging.WARNING if was != epoch else logging.INFO,
                    "daemon %s (epoch %016x): %d thing%s made again in %.0f ms%s",
                    "restarted" if was != epoch else "reconnected", epoch, made,
                    "" if made == 1 else "s",
                    (time.monotonic() - t0) * 1000,
                    " (last error: %s)" % _said(last) if last else "")
            break
        self._end()

    def _give_up(self, why):
        log.error("%s", why)
        self.gone = why
        self._end()

    def _end(self):
        with self._cv:
            self._restoring = False
            self._cv.notify_all()

    def close(self):
        """Before the channel closes: grpc's thread that watches its state looks again every
        200 ms and raises if the channel closed under it, so it is let finish first."""
        self._closed = True
        if self._bound <= 0:
            return
        try:
            self._channel.unsubscribe(self._on_state)
        except Exception:  # noqa: BLE001 - the channel may be closed already
            return
        state = getattr(self._channel, "_connectivity_state", None)
        deadline = time.monotonic() + 0.5
        while getattr(state, "polling", False) and time.monotonic() < deadline:
            time.sleep(0.01)


class AsyncReconnector:
    """Reconnector for grpc.aio: a task watches the channel's state (started with the first row,
    inside the client's event loop); when the connection breaks it probes the daemon and
    replays the table (areplay). `await gate()` holds calls meanwhile."""

    def __init__(self, channel, table, probe, fatal, bound_s):
        self._ch, self._table, self._probe, self._fatal = channel, table, probe, fatal
        self._bound = bound_s
        self._task = None
        self._idle = None  # asyncio.Event: set when no restore runs
        self.gone, self.epoch, self.restarts, self.restores = None, None, 0, 0
        self.fatal = False
        self._was_ready = False  # the connection was seen up since the last restore
        self._restorer = None    # the task restoring now (its calls pass the gate)

    def start(self, epoch):
        import asyncio
        if self.epoch is None:
            self.epoch = epoch
        if self._task is None and self._bound > 0:
            self._idle = asyncio.Event()
            self._idle.set()
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def busy(self):
        return self._idle is not None and not self._idle.is_set()

    async def gate(self):
        import asyncio
        if self._idle is not None and not self._idle.is_set() and \
                asyncio.current_task() is not self._restorer:
            try:
                await asyncio.wait_for(self._idle.wait(), self._bound + 5)
            except asyncio.TimeoutError:
                pass

    def mark_up(self):
        """A call just went through: the connection was up."""
        self._was_ready = True

    def answered(self, metadata):
        """Reconnector.answered for the asyncio client: a daemon of another epoch is restored
        for now, whatever states the watcher saw."""
        import asyncio
        epoch = epoch_of(metadata)
        if epoch is None or self.epoch is None or epoch == self.epoch or self.fatal or \
                self._idle is None or not self._idle.is_set() or not len(self._table):
            return
        self._idle.clear()  # before any other call of this loop can pass the gate
        asyncio.get_running_loop().create_task(self._restore_now())

    async def _restore_now(self):
        import asyncio
        self._restorer = asyncio.current_task()
        try:
            await self._restore()
        finally:
            self._idle.set()

    async def _watch(self):
        import grpc
        self._was_ready = False
        while True:
            state = self._ch.get_state(try_to_connect=False)
            if state == grpc.ChannelConnectivity.READY and not self.gone:
                self._was_ready = True
            elif state == grpc.ChannelConnectivity.SHUTDOWN or self.fatal:
                return
            elif (self._was_ready or (self.gone and state == grpc.ChannelConnectivity.READY)) \
                    and len(self._table):  # the connection broke, or the daemon is back after all
                self._was_ready = False
                self._idle.clear()
                self._restorer = self._task
                try:
                    await self._restore()
                finally:
                    self._idle.set()
                continue
            await self._ch.wait_for_state_change(state)

    async def _restore(self):
        t0 = time.monotonic()
        deadline = t0 + self._bound
        while True:
            try:
                epoch = await self._probe(max(0.05, min(1.0, deadline - time.monotonic())))
                break
            except Exception as e:  # noqa: BLE001 - the probe's error is the reason given
                why = self._fatal(e)
                if why or time.monotonic() >= deadline:
                    self.fatal = why is not None
                    self.gone = why or ("the daemon did not come back within "
                                        "MOONGATE_RECONNECT_S=%g s (last: %s); calls fail until "
                                        "it does" % (self._bound, _said(e)))
                    log.error("%s", self.gone)
                    return
        was = self.epoch
        self.restarts += was is not None and epoch != was
        self.epoch = epoch
        made, failed = await self._table.areplay(was, epoch)
        failed = _still_there(was, epoch, failed)
        self.restores += 1
        self.gone = None
        for what, e in failed:
            log.warning("after the daemon came back, %s could not be made again: %s", what, e)
        log.log(logging.WARNING if was != epoch else logging.INFO,
                "daemon %s (epoch %016x): %d thing%s made again in %.0f ms",
                "restarted" if was != epoch else "reconnected", epoch, made,
                "" if made == 1 else "s",
                (time.monotonic() - t0) * 1000)

    async def close(self):
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: BLE001 - cancelled, as asked
                pass
