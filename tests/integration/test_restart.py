"""Serving processes outlive their daemon: a daemon killed (SIGKILL) or stopped (SIGTERM) and
started again costs its clients a pause, not their state. The Python client reconnects by itself
and makes again its agent (same name, same port), the memory it registered (process memory,
descriptors, buffers), its expectations; what cannot come back (daemon-made segments) says so
when used; a batch of the old epoch names the restart. A Mooncake-shaped target and initiator
keep looping WRITEs, READs and notifications across restarts of either daemon, failing only
while one is away, with every byte they counted done in place. A daemon that does not come
back, or comes back refusing the client's token, is said once, clearly."""
import os
import signal
import hashlib
import subprocess
import sys
import threading
import time

import grpc
import pytest

import conftest
import test_mooncake
import test_mooncake_c

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def restart(d, how):
    """Stops d (SIGKILL or SIGTERM) and starts it again with the same arguments."""
    if how == "kill":
        d.kill()
    else:
        assert d.stop() == 0, d.read_log()
    d.log.close()
    d._start_once()


def until(what, check, timeout=60):
    """Waits for check() to hold (event-driven: each try is a call; the deadline is a net)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.05)


def agents_of(d):
    with mg.Client("unix:" + d.sock, timeout=5) as c:
        return {a.name: a.port for a in c.agents()}


@pytest.mark.parametrize("how", ["kill", "term"])
def test_the_client_makes_again_what_it_had(make_daemon, how):
    d = make_daemon()
    c = mg.Client("unix:" + d.sock, timeout=10)
    try:
        info = c.register_agent("kv-0")
        heap = bytearray(b"h" * 8192)
        addr, size = mg.address_of(heap)
        proc = c.register_memory("heap", addr, size)
        buf = c.allocate_buffer(8192, remote_accessible=True)
        heap[:5] = b"heapp"
        made = c.register("made", 4096)
        exp = c.expect("later", 600000, peer=d.h2c)
        epoch = c.epoch
        assert epoch
        restart(d, how)
        until("agent kv-0 back", lambda: agents_of(d).get("kv-0") == info.port)
        until("the client restored", lambda: c.restarts == 1 and c.epoch != epoch)
        # its memory is back, under the ids the program holds
        names = until("segments back", lambda: {s.name for s in c.segments()} >= {"heap",
                                                                                  buf.segment.name}
                      and {s.name for s in c.segments()})
        assert "made" not in names
        batch = c.transfer([mg.write(segment=proc.id, peer="", remote_segment=buf.segment.id,
                                     length=5)])
        assert batch.state == mg.transfer_pb2.DONE
        assert bytes(buf.view[:5]) == b"heapp"
        assert [e.topic for e in c.expectations()] == ["later"]
        # what did not come back says so
        with pytest.raises(mg.Error) as e:
            c.transfer([mg.write(segment=made.id, peer="", remote_segment=buf.segment.id,
                                 length=5)])
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert "did not come back" in e.value.message, e.value.message
        c.unregister(made.id)  # nothing to undo: no error
        c.unexpect(exp)
        assert c.expectations() == []
        buf.free()
        c.unregister(proc.id)
        assert {s.name for s in c.segments()} == set()
    finally:
        c.close()


def test_the_async_client_makes_again_what_it_had(make_daemon):
    import asyncio
    d = make_daemon()

    async def main():
        c = mg.AsyncClient("unix:" + d.sock, timeout=10)
        try:
            info = await c.register_agent("kv-async")
            a = await c.allocate_buffer(4096)
            b = await c.allocate_buffer(4096)
            a.view[:5] = b"async"
            made = await c.register("made", 4096)
            await c.expect("later", 600000, peer=d.h2c)
            epoch = c.epoch
            restart(d, "kill")
            deadline = time.monotonic() + 60
            while c.restarts != 1 or c.epoch == epoch:
                assert time.monotonic() < deadline, "the async client did not restore"
                await asyncio.sleep(0.05)
            await c.transfer([mg.write(segment=a.segment.id, peer="",
                                       remote_segment=b.segment.id, length=5)])
            assert bytes(b.view[:5]) == b"async"
            assert {x.name: x.port for x in await c.agents()} == {"kv-async": info.port}
            with pytest.raises(mg.Error) as e:
                await c.transfer([mg.write(segment=made.id, peer="", remote_segment=b.segment.id,
                                           length=5)])
            assert "did not come back" in e.value.message
            await a.free()
            await b.free()
        finally:
            await c.close()
    asyncio.run(main())


def test_a_batch_of_the_old_epoch_names_the_restart(make_daemon):
    d = make_daemon()
    c = mg.Client("unix:" + d.sock, timeout=10)
    try:
        c.register_agent("kv-1")
        a = c.allocate_buffer(4096)
        b = c.allocate_buffer(4096)
        bid = c.submit([mg.write(segment=a.segment.id, peer="", remote_segment=b.segment.id,
                                 length=4096)])
        restart(d, "kill")
        until("the client restored", lambda: c.restarts == 1)
        with pytest.raises(mg.Error) as e:
            c.wait(bid)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert "daemon restarted" in e.value.message, e.value.message
    finally:
        c.close()


@pytest.mark.parametrize("how", ["kill", "term"])
def test_the_first_call_after_a_restart_names_memory_by_the_ids_held(make_daemon, how):
    """A call made at once after the daemon is back (the library may not have begun to restore)
    names segments by the ids the program holds and goes, mapped to the daemon's new ones."""
    d = make_daemon()
    c = mg.Client("unix:" + d.sock, timeout=10)
    try:
        a = c.allocate_buffer(4096)
        b = c.allocate_buffer(4096)
        a.view[:4] = b"now!"
        restart(d, how)
        batch = c.transfer([mg.write(segment=a.segment.id, peer="", remote_segment=b.segment.id,
                                     length=4)])
        assert batch.state == mg.transfer_pb2.DONE
        assert bytes(b.view[:4]) == b"now!"
        assert c.restarts == 1
        b.free()  # by the id held, too
        assert [s.name for s in c.segments()] == [a.segment.name]
        a.free()
    finally:
        c.close()


def test_a_peer_away_is_not_called_a_broken_connection(make_daemon):
    """UNAVAILABLE that the daemon answers (a peer it cannot reach) is said as the daemon says
    it, even by a client with things to restore."""
    d = make_daemon()
    with mg.Client("unix:" + d.sock, timeout=10) as c:
        c.register_agent("kv-peer")
        with pytest.raises(mg.Error) as e:
            c.send("t", b"x", peer="127.0.0.1:1")
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert "connection to the daemon broke" not in e.value.message, e.value.message
        assert "127.0.0.1:1" in e.value.message


def test_a_daemon_slow_to_answer_a_new_connection_is_waited_for(make_daemon):
    """A daemon back but busy (here: stopped for 2 s) answers a new connection late; the client's
    calls wait for it within their timeout instead of failing on a short connect timeout."""
    import signal
    d = make_daemon()
    d.signal(signal.SIGSTOP)
    woke = threading.Timer(2.0, d.signal, (signal.SIGCONT,))
    woke.start()
    try:
        with mg.Client("unix:" + d.sock, timeout=30) as c:
            assert c.agents() == []
    finally:
        woke.join()


def test_a_daemon_that_does_not_come_back_is_said_once(make_daemon, monkeypatch):
    monkeypatch.setenv("MOONGATE_RECONNECT_S", "1")
    d = make_daemon()
    c = mg.Client("unix:" + d.sock, timeout=5)
    try:
        c.register_agent("kv-2")
        d.kill()

        def gave_up():
            try:
                c.agents()
            except mg.Error as e:
                return "did not come back within MOONGATE_RECONNECT_S=1 s" in e.message and e
            return False
        e = until("the client gave up", gave_up)
        assert e.code == grpc.StatusCode.UNAVAILABLE
        # and once the daemon is back after all, the client is too
        d.log.close()
        d._start_once()
        until("agent back", lambda: agents_of(d).get("kv-2"))
    finally:
        c.close()


def test_leases_go_with_the_daemon_and_their_holders_are_told(make_daemon):
    from moongate.pool import BufferPool, LeaseReleaseError
    d = make_daemon("--pool-bytes", str(4 << 20))
    c = mg.Client("unix:" + d.sock, timeout=10)
    pool = BufferPool(2 << 20, client=c)
    try:
        old = pool.acquire(1 << 20)
        old.buffer[:4] = b"old!"
        mine = c.lease(4096)
        restart(d, "kill")
        until("the client restored", lambda: c.restarts == 1)
        new = pool.acquire(1 << 20)  # the new daemon's pool file, mapped afresh
        new.buffer[:4] = b"new!"
        with pytest.raises(LeaseReleaseError) as e:
            old.release()
        assert "restarted" in str(e.value) and "lease %d" % old.id in str(e.value), e.value
        with pytest.raises(mg.Error) as e2:
            c.release(mine)
        assert e2.value.code == grpc.StatusCode.NOT_FOUND and "restarted" in e2.value.message
        assert pool.stats()["held_bytes"] == 1 << 20  # the lost lease's bytes counted back
        # the new lease's bytes are the daemon's: read them through a segment copy
        buf = c.allocate_buffer(4096)
        c.transfer([mg.write(lease=new.id, peer="", remote_segment=buf.segment.id, length=4)])
        assert bytes(buf.view[:4]) == b"new!"
        new.release()
        buf.free()
    finally:
        pool.close()
        c.close()


def sha(tok):
    return "sha256:" + hashlib.sha256(tok.encode()).hexdigest()


def test_a_daemon_back_with_another_auth_file_refuses_once(make_daemon, tmp_path):
    auth = tmp_path / "auth"
    auth.write_text("token %s team-a\n" % sha("tok-a-0123456789"))
    d = make_daemon("--allow-anonymous=false", "--auth-file", str(auth))
    c = mg.Client("unix:" + d.sock, token="tok-a-0123456789", timeout=5)
    try:
        c.register_agent("kv-3")
        auth.write_text("token %s team-a\n" % sha("tok-b-0123456789"))
        restart(d, "kill")

        def refused():
            try:
                c.agents()
            except mg.Error as e:
                return "refuses this client's credentials" in e.message and e
            return False
        e = until("the client refused", refused)
        assert e.code == grpc.StatusCode.UNAVAILABLE
        time.sleep(0.5)  # the client does not try again and again: its probe, and our calls
        refused = d.metric("moongate_auth_refused_total", reason="unauthenticated")
        assert refused is not None and refused <= 5, refused
    finally:
        c.close()


OTHER_UID = 4242  # a second local user (as test_auth.py's)


@pytest.mark.parametrize("door", ["python", "c"])
def test_a_daemon_back_as_another_users_is_refused(certs, door):
    """The socket path the client knew comes back owned by another uid: the client (Python, or
    C: libmgclient) makes nothing there (no agent, no memory) and its calls say why."""
    import shutil
    import tempfile
    world = tempfile.mkdtemp(prefix="moongate-owner-")
    os.chmod(world, 0o777)
    for f in ("server.pem", "server.key", "ca.pem"):
        shutil.copy(os.path.join(certs, f), world)
        os.chmod(os.path.join(world, f), 0o644)
    sock = os.path.join(world, "moongate.sock")
    shm = os.path.join(world, "shm")
    os.mkdir(shm)
    os.chmod(shm, 0o777)
    mine = conftest.Daemon(world, world, ("--unix-socket", sock, "--shm-dir", shm)).start()
    theirs = None
    c = mg.Client("unix:" + sock, timeout=5) if door == "python" else \
        conftest.CProgram(mine, sock=sock)
    try:
        if door == "python":
            c.register_agent("kv-4")
        else:
            assert c("agent", "kv-4")[0] == "port"
        mine.kill()
        mine.log.close()
        theirs = conftest.Daemon(world, world, ("--unix-socket", sock, "--shm-dir", shm + "-b"),
                                 wrap=["setpriv", "--reuid=%d" % OTHER_UID,
                                       "--regid=%d" % OTHER_UID, "--clear-groups"])
        os.mkdir(shm + "-b")
        os.chmod(shm + "-b", 0o777)
        theirs.start()
        assert os.stat(sock).st_uid == OTHER_UID

        def refused():
            try:
                c.agents()
            except mg.Error as e:
                return "as another user's" in e.message and e
            return False
        if door == "python":
            e = until("the client refused", refused)
            assert e.code == grpc.StatusCode.UNAVAILABLE
        else:
            said = " ".join(c("anon", "x", 4096))
            assert said.startswith("error UNAVAILABLE the daemon came back as another user's"), said
        with mg.Client("unix:" + sock, timeout=5) as other:
            assert "kv-4" not in [a.name for a in other.agents()]  # it made nothing there
    finally:
        c.close()
        if mine.alive():  # the test failed before its kill
            mine.kill()
        if theirs is not None:
            assert theirs.stop() == 0, theirs.read_log()
        shutil.rmtree(world, ignore_errors=True)


class Loop:
    """tests/integration/mooncake/loop.py on daemon `d`, its lines collected as they come."""

    def __init__(self, d, target, address, slots=32, c_door=False):
        argv = ([test_mooncake_c.HARNESS, test_mooncake_c.LIB, "loop"] if c_door else
                [sys.executable, os.path.join(HERE, "mooncake", "loop.py")])
        self.p = subprocess.Popen(
            argv + [target, str(address), str(slots)], env=test_mooncake.env_for(d),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.slots, self.lines, self.cv = slots, [], threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cv:
                self.lines.append(line.split(None, 3))
                self.cv.notify_all()

    def oks(self):
        with self.cv:
            return [(int(x[1]), float(x[2])) for x in self.lines if x[0] == "ok"]

    def fails(self):
        with self.cv:
            return [(int(x[1]), float(x[2]), x[3].strip()) for x in self.lines if x[0] == "fail"]

    def more_ok(self, n, timeout=90):
        have = len(self.oks())
        try:
            until("%d more iterations" % n, lambda: len(self.oks()) >= have + n, timeout)
        except AssertionError:
            with self.cv:
                last = self.lines[-5:]
            self.p.kill()  # what it logged says why
            raise AssertionError("%d more iterations did not come; the last lines: %s; its log "
                                 "ends: %s" % (n, last, self.p.stderr.read()[-3000:])) from None

    def stop(self):
        self.p.stdin.write("stop\n")
        self.p.stdin.flush()
        out = self.p.wait(60)
        return out, self.p.stderr.read()


# The loop's target takes its notifications at the end only: its daemon keeps every one the loop
# sends, however many iterations this machine's pace makes (the default --notify-queue is 1024).
LOOP_FLAGS = ("--notify-queue", str(1 << 20))


def loop_across(a, b, t, restarts, c_door=False):
    """The loop on daemon a against target t on daemon b across `restarts` ((daemon, how)...):
    it fails only while a daemon is away, the target keeps its agent's name and port, every
    byte the loop counted done is in place, and the notifications of the iterations after the
    target's daemon last came back all arrived, in order."""
    name_port = agents_of(b)
    loop = Loop(a, t.session, t.address, c_door=c_door)
    try:
        loop.more_ok(10)
        windows, back = [], None
        for d, how in restarts:
            t0 = time.monotonic()
            restart(d, how)
            loop.more_ok(10)
            windows.append((t0, max(ts for _, ts in loop.oks())))
            back = windows[-1][1] if d is b else back
            assert agents_of(b) == name_port  # the target's agent: same name, same port
        rc, err = loop.stop()
        assert rc == 0, err
    finally:
        if loop.p.poll() is None:
            loop.p.kill()
    oks, fails = loop.oks(), loop.fails()
    # failures only while a daemon was away (from its stop to the loop's next success)
    for i, ts, why in fails:
        assert any(lo <= ts <= hi for lo, hi in windows), (i, ts, why, windows)
    # every byte the loop counted done is in place: each slot's last writer, if it succeeded
    last = {}
    for i in sorted(set(i for i, _ in oks) | set(i for i, _, _ in fails)):
        last[i % loop.slots] = i
    done = set(i for i, _ in oks)
    for slot, i in last.items():
        if i in done:
            assert t.dump(slot * 4096, 4096) == pattern(i), (slot, i)
    notes = [int(m) for name, m in t.notifications() if name == "loop"]
    assert notes == sorted(notes)  # in order
    assert {i for i, ts in oks if ts > back} <= set(notes)
    return oks, fails


def test_a_mooncake_loop_goes_on_across_restarts(make_daemon, children):
    a, b = test_mooncake.pair(make_daemon, *LOOP_FLAGS)
    t = children(test_mooncake.Target, b)
    loop_across(a, b, t, ((b, "kill"), (b, "term"), (a, "kill")))
    t.close()


def test_a_c_initiator_outlives_its_daemon(make_daemon, children):
    """Mooncake's C API as the initiator (tests/te/te_harness.c loop): its own daemon killed and
    stopped under it, then the target's."""
    a, b = test_mooncake.pair(make_daemon, *LOOP_FLAGS)
    t = children(test_mooncake.Target, b)
    loop_across(a, b, t, ((a, "kill"), (a, "term"), (b, "kill")), c_door=True)
    t.close()


def test_a_c_engine_gives_up_and_comes_back_with_its_daemon(make_daemon, children,
                                                           monkeypatch):
    """MOONGATE_RECONNECT_S=1 and a daemon away longer: libtransfer_engine.so says once that it
    gave up; the daemon back, the engine's next call finds it and makes its agent again, even
    when the daemon is slow to answer that call's one try."""
    monkeypatch.setenv("MOONGATE_RECONNECT_S", "1")
    b = make_daemon()
    t = test_mooncake_c.c_target(lambda *x, **kw: children(test_mooncake.Target, *x, **kw), b)
    had = agents_of(b)
    err = StderrOf(t)
    b.kill()
    until("the engine gave up", lambda: err.has("did not come back within "
                                                "MOONGATE_RECONNECT_S=1 s"))
    b.log.close()
    b._start_once()
    assert agents_of(b) == {}  # nothing until the engine calls
    b.proc.send_signal(signal.SIGSTOP)  # a busy machine: the daemon answers 0.3 s late
    threading.Timer(0.3, b.proc.send_signal, (signal.SIGCONT,)).start()
    assert t.notifications() == []  # a call: the engine tries again, finds the daemon
    until("the agent back", lambda: agents_of(b) == had)
    assert err.count("did not come back") == 1  # said once
    os.set_blocking(err.fd, True)
    t.close()


class StderrOf:
    """What a child process says on stderr so far, read without blocking."""

    def __init__(self, child):
        self.fd, self.said = child.p.stderr.fileno(), []
        os.set_blocking(self.fd, False)

    def has(self, text):
        try:
            self.said.append(os.read(self.fd, 65536).decode(errors="replace"))
        except BlockingIOError:
            pass
        return text in "".join(self.said)

    def count(self, text):
        self.has("")
        return "".join(self.said).count(text)


def test_a_c_engine_refused_by_the_daemon_back_says_so_once(make_daemon, children, tmp_path,
                                                            monkeypatch):
    """The daemon comes back with an auth file without the engine's token: the engine says so
    once and does not knock again and again."""
    auth = tmp_path / "auth"
    auth.write_text("token %s team-a\n" % sha("tok-a-0123456789"))
    b = make_daemon("--allow-anonymous=false", "--auth-file", str(auth))
    token = tmp_path / "token"
    token.write_text("tok-a-0123456789\n")
    monkeypatch.setenv("MOONGATE_TOKEN_FILE", str(token))
    t = test_mooncake_c.c_target(lambda *x, **kw: children(test_mooncake.Target, *x, **kw), b)
    err = StderrOf(t)
    auth.write_text("token %s team-a\n" % sha("tok-b-0123456789"))
    restart(b, "kill")
    until("the engine refused", lambda: err.has("refuses this engine's credentials"))
    for _ in range(5):  # calls fail at once, saying why; nothing knocks on the daemon
        assert t.notifications() == []
    # the engine's own line once (each failed call then logs its error, naming the reason)
    assert err.count("transfer_engine: the daemon came back and refuses this engine's") == 1
    refused = b.metric("moongate_auth_refused_total", reason="unauthenticated")
    assert refused is not None and refused <= 3, refused
    os.set_blocking(err.fd, True)
    t.close()


@pytest.mark.parametrize("memory", ["memfd", "malloc", "device", "staged"])
def test_a_c_target_outlives_its_daemon(make_daemon, children, memory):
    """Mooncake's C API (libtransfer_engine.so) as the target: its engine reconnects and makes
    its agent and region again, for each kind of memory it registers: a memfd's mapping (by
    descriptor), malloc'd memory (process memory, a peer's target over TCP), device memory by
    its dma-buf (exported again, over RDMA: the verbs and CUDA emulators) and device memory
    staged (a new copy channel, over TCP)."""
    gpu = memory in ("device", "staged")
    if gpu and conftest.tsan():
        pytest.skip("python3 cannot host a ThreadSanitizer build's libmgclient")
    flags = ["--ibverbs-lib", test_mooncake_c.EMU] if memory == "device" else []
    a, b = test_mooncake.pair(make_daemon, *LOOP_FLAGS, *flags)
    argv = [test_mooncake_c.HARNESS, test_mooncake_c.LIB, "target", str(1 << 20)]
    kind = {"memfd": [], "malloc": ["malloc"], "device": ["device"], "staged": ["device"]}
    t = children(test_mooncake.Target, b, argv + kind[memory], notes="notifs",
                 env=test_mooncake.gpu_env(b) if gpu else None)
    loop_across(a, b, t, ((b, "kill"), (b, "term")))
    t.close()


def pattern(i):
    """The loop's pattern of iteration i (as loop.py makes it)."""
    return (i.to_bytes(4, "little") * 1024)[:4096]


@pytest.mark.parametrize("how", ["kill", "term"])
def test_a_c_client_makes_again_what_it_had(make_daemon, how):
    """The C client (libmgclient): its agent (same name and port), process memory and buffers
    come back under the ids the program holds; a segment the daemon made does not, and says
    so; no call of the program fails when it makes none while the daemon is away."""
    d = make_daemon()
    c = conftest.CProgram(d)
    try:
        _, port = c("agent", "kv-c")
        _, src, src_at = c("process", "c-heap", 8192)
        _, dst, dst_at = c("buffer", 8192)
        _, made = c("anon", "c-made", 4096)
        assert c("fill", src_at, 0x61, 8192) == ["ok"]
        assert c("copy", src, dst, 8192) == ["DONE"]
        assert c("check", dst_at, 0x61, 8192) == ["ok"]
        epoch = c("epoch")[1]
        restart(d, how)
        assert c("fill", src_at, 0x62, 8192) == ["ok"]
        assert c("copy", src, dst, 8192) == ["DONE"]  # the first call: restored, then made
        assert c("check", dst_at, 0x62, 8192) == ["ok"]
        assert agents_of(d) == {"kv-c": int(port)}
        e = c("epoch")
        assert e[1] != epoch and e[3] == "1", e
        assert c("now", src) != ["now", src]  # made again under another id, mapped
        assert c("now", made) == ["now", "0"]  # did not come back
        assert c("unregister", made) == ["ok"]  # nothing to undo
        with mg.Client("unix:" + d.sock, timeout=10) as py:
            assert {"c-heap", "c-made"} & {s.name for s in py.segments()} == {"c-heap"}
            assert c("unregister", src) == ["ok"]
            assert c("unregister", dst) == ["ok"]
            assert [s.name for s in py.segments()] == []
    finally:
        c.close()


def test_a_c_client_gives_up_then_comes_back(make_daemon):
    d = make_daemon()
    c = conftest.CProgram(d, {"MOONGATE_RECONNECT_S": "1"})
    try:
        _, port = c("agent", "kv-c2")
        d.kill()
        said = c("epoch") and c("copy", 1, 2, 1)
        assert said[:2] == ["error", "UNAVAILABLE"], said
        assert "did not come back within MOONGATE_RECONNECT_S=1 s" in " ".join(said), said
        d.log.close()
        d._start_once()
        assert c("anon", "c-after", 4096)[0] == "anon"  # one more try finds it, and restores
        assert agents_of(d) == {"kv-c2": int(port)}
    finally:
        c.close()


def test_a_c_client_refused_by_the_daemon_back_says_so(make_daemon, tmp_path):
    auth = tmp_path / "auth"
    auth.write_text("token %s team-a\n" % sha("tok-a-0123456789"))
    d = make_daemon("--allow-anonymous=false", "--auth-file", str(auth))
    c = conftest.CProgram(d, {"MOONGATE_TOKEN": "tok-a-0123456789"})
    try:
        assert c("agent", "kv-c3")[0] == "port"
        auth.write_text("token %s team-a\n" % sha("tok-b-0123456789"))
        restart(d, "kill")
        for _ in range(5):  # said each time, tried once
            said = " ".join(c("anon", "x", 4096))
            assert said.startswith("error UNAVAILABLE the daemon came back and refuses this "
                                   "client's credentials"), said
        refused = d.metric("moongate_auth_refused_total", reason="unauthenticated")
        assert refused is not None and refused <= 2, refused
    finally:
        c.close()


def test_a_c_clients_gpu_memory_comes_back(make_daemon):
    """Device memory (the CUDA driver emulator) registered by mg_vram_register is exported and
    registered again by address after a restart."""
    d = make_daemon("--ibverbs-lib", os.path.join(conftest.BUILD, "libmgverbs_emu.so"))
    c = conftest.CProgram(d, {"MOONGATE_CUDA_LIB": os.path.join(conftest.BUILD,
                                                                 "libmgcuda_emu.so")})
    try:
        _, seg, at = c("vram", 1 << 20)
        restart(d, "kill")
        _, now = c("now", seg)
        assert now not in ("0", seg)
        with mg.Client("unix:" + d.sock, timeout=10) as py:
            back = {s.name: s for s in py.segments()}["c-vram-0"]
            assert back.id == int(now) and back.location == "cuda:0", back
        assert c("unregister", seg) == ["ok"]
    finally:
        c.close()
