"""Agents: client processes name themselves to their daemon (a name unique per tenant, a port
unique per host), and peers address their memory by (agent, address) — by name with the peer's
control endpoint, or by the one-string form "host:port" (the daemon at host on --peer-port).
Each agent here is a process of its own (agent_proc.py) with a buffer it allocated; the test
process submits from its own buffer. Covered: WRITE and READ by name and by "host:port",
blocks, an agent on the same daemon (a copy), lookups (DescribeAgent, first address,
ListAgents), a region registered again (new id, perhaps the same address) and a restarted peer
(new epoch), an unknown agent, a duplicate name or port, another tenant's agent (NOT_FOUND,
said as for none), and an agent whose connection drops while a transfer to it runs."""
import os
import subprocess
import sys
import time

import grpc
import pytest

import conftest

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402
from moongate.v1 import transfer_pb2  # noqa: E402

MiB = 1 << 20
HERE = os.path.dirname(__file__)


class Agent(conftest.Child):
    """An agent process on daemon d (agent_proc.py): .port, .address, .segment."""

    def __init__(self, d, name, port=0, size=MiB, token=None):
        super().__init__([sys.executable, os.path.join(HERE, "agent_proc.py"), d.sock, name,
                          str(port), str(size)] + ([token] if token else []))

    def dump(self, off, n):
        return bytes.fromhex(self.ask("dump %d %d" % (off, n)))

    def fill(self, off, data):
        assert self.ask("fill %d %s" % (off, data.hex())) == "ok"

    def put(self, agent, addr, n, peer=""):
        return self.ask("put %s %d %d %s" % (agent, addr, n, peer))

    def get(self, agent, addr, n, peer=""):
        return self.ask("get %s %d %d %s" % (agent, addr, n, peer))

    def again(self):
        self.p.stdin.write("again\n")
        self.p.stdin.flush()
        self.where()

    def quit(self):
        self.close()


@pytest.fixture
def agents(children):
    return lambda *a, **kw: children(Agent, *a, **kw)


def client(d, **kw):
    return mg.Client("unix:" + d.sock, **kw)


def pair(make_daemon):
    """Daemons a and b; a reaches b's agents by "127.0.0.1:port" (its --peer-port is b's)."""
    b = make_daemon("--peer-tls=false")
    a = make_daemon("--peer-tls=false", "--peer-port", str(b.h2c_port))
    return a, b


def test_write_and_read_by_agent_and_address(make_daemon, agents):
    a, b = pair(make_daemon)
    b1, b2 = agents(b, "decode-0"), agents(b, "decode-1", port=23456)
    a1, a2 = agents(a, "prefill-0"), agents(a, "prefill-1")
    assert b2.port == 23456 and b1.port != 23456 and b1.port >= 20000
    pattern = os.urandom(256 * 1024)
    with client(a) as c:
        src = c.allocate_buffer(MiB)
        src.view[:len(pattern)] = pattern
        # by name on the peer, and by the one-string form
        c.transfer([mg.write(address=src.address, peer=b.h2c, agent="decode-0",
                             remote_address=b1.address + 4096, length=len(pattern)),
                    mg.write(address=src.address, agent="127.0.0.1:%d" % b2.port,
                             remote_address=b2.address, remote_offset=8192,
                             length=len(pattern))])
        assert b1.dump(4096, len(pattern)) == pattern
        assert b2.dump(8192, len(pattern)) == pattern
        # READ back from an agent, into another place of our buffer
        c.transfer([mg.read(address=src.address, offset=512 * 1024,
                            agent="127.0.0.1:%d" % b2.port, remote_address=b2.address + 8192,
                            length=len(pattern))])
        assert bytes(src.view[512 * 1024:512 * 1024 + len(pattern)]) == pattern
        # blocks: remote_address + remote_offsets[k]
        b1.fill(0, bytes(64 * 1024))
        blocks = transfer_pb2.Blocks(op=transfer_pb2.WRITE, local_address=src.address,
                                     peer=b.h2c, remote_agent="decode-0",
                                     remote_address=b1.address,
                                     local_offsets=[k * 4096 for k in range(16)],
                                     remote_offsets=[(15 - k) * 4096 for k in range(16)],
                                     lengths=[4096] * 16)
        resp = c.transfers.Submit(transfer_pb2.SubmitRequest(blocks=[blocks], wait=True),
                                  timeout=30)
        assert resp.batch.state == transfer_pb2.DONE, resp
        got = b1.dump(0, 64 * 1024)
        assert all(got[(15 - k) * 4096:(16 - k) * 4096] == pattern[k * 4096:(k + 1) * 4096]
                   for k in range(16))
        # an agent on this daemon, by name with peer "": a copy into its process
        c.transfer([mg.write(address=src.address, agent="prefill-0", remote_address=a1.address,
                             length=4096)])
        assert a1.dump(0, 4096) == pattern[:4096]
        # agent to agent: prefill-1 on a writes into decode-1 on b by its one-string form, and
        # decode-0 on b reads from prefill-1 by name and a's endpoint
        note = os.urandom(8192)
        a2.fill(0, note)
        assert a2.put("127.0.0.1:%d" % b2.port, b2.address + 65536, len(note)) == "ok"
        assert b2.dump(65536, len(note)) == note
        assert b1.get("prefill-1", a2.address, len(note), a.h2c) == "ok"
        assert b1.dump(0, len(note)) == note
        # lookups: here, on the peer by name and by "host:port"
        mine = c.describe_agent("prefill-0")
        assert (mine.name, mine.tenant, mine.peer) == ("prefill-0", "default", "")
        assert [(r.address, r.length, r.segment) for r in mine.regions] == \
            [(a1.address, MiB, a1.segment)]
        theirs = c.describe_agent("127.0.0.1:%d" % b2.port)
        assert (theirs.name, theirs.port, theirs.peer) == ("decode-1", 23456,
                                                           "127.0.0.1:%d" % b.h2c_port)
        assert theirs.first_address == b2.address and theirs.regions[0].remote_accessible
        assert c.first_buffer_address("decode-0", peer=b.h2c) == b1.address
        assert c.describe_agent("decode-0", peer=b.h2c).epoch == theirs.epoch != mine.epoch
    with client(b) as cb:
        assert sorted((x.name, x.port) for x in cb.agents()) == \
            sorted([("decode-0", b1.port), ("decode-1", 23456)])
    assert b.metric("moongate_agents") == 2


def test_a_region_registered_again_and_a_restarted_peer(make_daemon, agents):
    a, b = pair(make_daemon)
    b1 = agents(b, "decode-0")
    data = os.urandom(8192)
    with client(a) as c:
        src = c.allocate_buffer(MiB)
        src.view[:len(data)] = data

        def put(off=0):
            c.transfer([mg.write(address=src.address, peer=b.h2c, agent="decode-0",
                                 remote_address=b1.address + off, length=len(data))])
        put()
        old = (b1.address, b1.segment)
        b1.again()  # a new region: a new segment id, often at the same address
        assert b1.segment != old[1]
        put(4096)
        assert b1.dump(4096, len(data)) == data
        # an address the agent no longer has
        if b1.address != old[0]:
            with pytest.raises(mg.Error) as e:
                c.transfer([mg.write(address=src.address, peer=b.h2c, agent="decode-0",
                                     remote_address=old[0], length=8)])
            assert e.value.code == grpc.StatusCode.NOT_FOUND
        # the peer restarts: its agents are gone, then one registers again
        b1.quit()
        b.stop()
        b.start()
        with pytest.raises(mg.Error) as e:
            put()
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert "no agent \"decode-0\"" in e.value.message
        b1 = agents(b, "decode-0")
        put(64)
        assert b1.dump(64, len(data)) == data


def test_unknown_duplicate_and_another_tenants_agents(make_daemon, agents, tmp_path):
    auth = tmp_path / "auth"
    auth.write_text("token sha256:%s t1\ntoken sha256:%s t2\n" % (
        __import__("hashlib").sha256(b"tok1").hexdigest(),
        __import__("hashlib").sha256(b"tok2").hexdigest()))
    b = make_daemon("--peer-tls=false", "--auth-file", str(auth))
    a = make_daemon("--peer-tls=false", "--peer-port", str(b.h2c_port), "--auth-file", str(auth))
    b1 = agents(b, "decode-0", port=24000, token="tok1")
    with client(b, token="tok2") as c:
        # the name is per tenant; the port is the host's
        assert c.register_agent("decode-0").port != 24000
        with pytest.raises(mg.Error) as e:
            c.register_agent("other", port=24000)
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(mg.Error) as e:
            c.register_agent("decode-0")
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(mg.Error) as e:
            c.register_agent("bad name")
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(mg.Error) as e:
            c.register_agent("x", port=b.h2c_port)  # the daemon's own
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with client(a, token="tok1") as c1, client(a, token="tok2") as c2:
        src = c1.allocate_buffer(MiB)
        src2 = c2.allocate_buffer(MiB)
        c1.transfer([mg.write(address=src.address, agent="127.0.0.1:24000",
                              remote_address=b1.address, length=64)])
        answers = {}
        for what, agent in (("unknown", "127.0.0.1:24999"), ("other tenant's", "127.0.0.1:24000")):
            with pytest.raises(mg.Error) as e:
                c2.transfer([mg.write(address=src2.address, agent=agent,
                                      remote_address=b1.address, length=64)])
            assert e.value.code == grpc.StatusCode.NOT_FOUND, what
            answers[what] = e.value.message.replace("24999", "N").replace("24000", "N")
            with pytest.raises(mg.Error) as e:
                c2.describe_agent(agent)
            assert e.value.code == grpc.StatusCode.NOT_FOUND, what
        assert answers["unknown"] == answers["other tenant's"]
        # a Send to an agent: the peer checks it is there, of the sender's tenant
        c1.send("t", b"x", agent="127.0.0.1:24000")
        sent = {}
        for what, agent in (("unknown", "127.0.0.1:24999"), ("other tenant's", "127.0.0.1:24000")):
            with pytest.raises(mg.Error) as e:
                c2.send("t", b"y", agent=agent)
            assert e.value.code == grpc.StatusCode.NOT_FOUND, (what, e.value.message)
            sent[what] = e.value.message.replace("24999", "N").replace("24000", "N")
        assert sent["unknown"] == sent["other tenant's"] and "no agent at port N" in \
            sent["unknown"], sent
        # the one-string form with a port no agent can have: refused naming it, not looked up
        for agent, port in (("127.0.0.1:70000", "70000"), ("127.0.0.1:0", "0")):
            for call in (lambda: c1.transfer([mg.write(address=src.address, agent=agent,
                                                       remote_address=b1.address, length=8)]),
                         lambda: c1.describe_agent(agent)):
                with pytest.raises(mg.Error) as e:
                    call()
                assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value.message
                assert "port %s is not 1..65535" % port in e.value.message, e.value.message
        with pytest.raises(mg.Error) as e:
            c1.transfer([mg.write(address=src.address, peer=b.h2c, agent="nobody",
                                  remote_address=b1.address, length=64)])
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert "no agent \"nobody\"" in e.value.message
        # an address outside the agent's regions, and a range running out of its region
        for addr, n, code in ((b1.address + 2 * MiB, 8, grpc.StatusCode.NOT_FOUND),
                              (b1.address + MiB - 8, 16, grpc.StatusCode.OUT_OF_RANGE)):
            with pytest.raises(mg.Error) as e:
                c1.transfer([mg.write(address=src.address, agent="127.0.0.1:24000",
                                      remote_address=addr, length=n)])
            assert e.value.code == code, e.value.message
        # bad forms
        for kw in ({"agent": "nope nope"}, {"agent": "127.0.0.1:24000", "remote_segment": 5}):
            with pytest.raises((mg.Error, ValueError)):
                c1.transfer([mg.write(address=src.address, remote_address=b1.address,
                                      length=8, **kw)])


def test_an_agent_whose_connection_drops_mid_transfer(make_daemon, agents):
    a, b = pair(make_daemon)
    b1 = agents(b, "decode-0", size=64 * MiB)
    with client(a) as c:
        src = c.allocate_buffer(64 * MiB)
        bid = c.submit([mg.write(address=src.address, peer=b.h2c, agent="decode-0",
                                 remote_address=b1.address, length=64 * MiB)] * 8)
        b1.p.kill()  # its connection closes: the agent ends, its region goes once released
        last = c.wait(bid, check=False)
        assert last.state in (transfer_pb2.DONE, transfer_pb2.FAILED)
        for r in last.requests:
            assert r.state == transfer_pb2.DONE or r.message
        deadline = time.monotonic() + 20  # its region goes once no request holds it
        while b.metric("moongate_segments", state="ready") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not b.metric("moongate_segments", state="ready")
        with pytest.raises(mg.Error) as e:
            c.transfer([mg.write(address=src.address, peer=b.h2c, agent="decode-0",
                                 remote_address=b1.address, length=8)])
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert "no agent \"decode-0\"" in e.value.message
    assert b.metric("moongate_agents") == 0
    assert b.metric("moongate_agents_total", event="ended") == 1
    b2 = agents(b, "decode-0")  # the name is free again
    assert b2.port > 0


def test_closing_a_client_ends_its_agent_while_another_of_the_process_stays(make_daemon):
    """Each Client has a connection of its own (grpc would share one between the channels of a
    process to one target): closing one ends its agent, not the other's."""
    d = make_daemon()
    c1, c2 = client(d), client(d)
    c1.register_agent("mine")
    c2.register_agent("other")
    c1.close()
    deadline = time.monotonic() + 30
    while "mine" in {a.name for a in c2.agents()}:
        assert time.monotonic() < deadline, "agent 'mine' outlived its client"
        time.sleep(0.02)
    assert {a.name for a in c2.agents()} == {"other"}
    c2.close()


def test_from_c(make_daemon):
    d = make_daemon("--idle-timeout", "1")
    out = subprocess.run([os.path.join(conftest.BUILD, "example_agent"), "unix:" + d.sock,
                          "c-agent"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok agent c-agent port 2") and "moved 4096 bytes" in out.stdout


def test_an_agent_outlives_idleness(make_daemon, agents):
    d = make_daemon("--idle-timeout", "1")
    ag = agents(d, "quiet")
    time.sleep(2.5)  # an idle connection without an agent would be closed by now
    with client(d) as c:
        (info,) = c.agents()
        assert (info.name, info.port) == ("quiet", ag.port)
    ag.quit()
    deadline = time.monotonic() + 20
    while d.metric("moongate_agents") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.metric("moongate_agents") == 0
    assert not d.metric("moongate_segments", state="ready")  # its region went with it


def test_descriptors_export_import_and_refuse_the_stale_and_forged(make_daemon, agents):
    from moongate.v1 import agent_pb2
    a, b = pair(make_daemon)
    b1 = agents(b, "decode-0", port=25000)
    with client(b) as cb, client(a) as ca:
        blob = cb.export_agent("decode-0", endpoint=b.h2c)
        assert len(blob) < 200  # small: it travels over the users' own channels
        d = agent_pb2.AgentDescriptor.FromString(blob)
        assert (d.version, d.endpoint, d.tenant, d.name, d.port) == \
            (1, b.h2c, "default", "decode-0", 25000)
        assert [(r.address, r.length) for r in d.regions] == [(b1.address, MiB)]
        info = ca.import_agent(blob)
        assert (info.peer, info.name, info.port, info.epoch) == (b.h2c, "decode-0", 25000,
                                                                d.epoch)
        assert info.first_address == b1.address
        src = ca.allocate_buffer(MiB)
        src.view[:5] = b"hello"
        ca.transfer([mg.write(address=src.address, peer=info.peer, agent=info.name,
                              remote_address=info.first_address + 100, length=5)])
        assert b1.dump(100, 5) == b"hello"
        # the blob's addresses are never trusted: the daemon's regions come back
        forged = agent_pb2.AgentDescriptor()
        forged.CopyFrom(d)
        forged.regions[0].address = 0x1000
        assert ca.import_agent(forged.SerializeToString()).regions[0].address == b1.address
        # forged fields that the daemon checks, each named with both values
        for field, value, code, needle in (
                ("port", 25001, grpc.StatusCode.FAILED_PRECONDITION,
                 "the descriptor's port 25001 differs from the agent's 25000"),
                ("agent_id", d.agent_id + 1, grpc.StatusCode.FAILED_PRECONDITION,
                 "the descriptor's agent_id %d differs from the agent's %d" %
                 (d.agent_id + 1, d.agent_id)),
                ("epoch", d.epoch ^ 1, grpc.StatusCode.FAILED_PRECONDITION,
                 "the descriptor's epoch %d differs from its daemon's %d" %
                 (d.epoch ^ 1, d.epoch)),
                ("name", "nobody", grpc.StatusCode.NOT_FOUND, "nobody"),
                ("tenant", "other", grpc.StatusCode.PERMISSION_DENIED, "another tenant"),
                ("version", 2, grpc.StatusCode.INVALID_ARGUMENT, "version must be 1"),
                ("endpoint", "no-port", grpc.StatusCode.INVALID_ARGUMENT, "host:port")):
            f = agent_pb2.AgentDescriptor()
            f.CopyFrom(d)
            setattr(f, field, value)
            with pytest.raises(mg.Error) as e:
                ca.import_agent(f.SerializeToString())
            assert e.value.code == code, (field, e.value.message)
            assert needle in e.value.message, (field, e.value.message)
        # two forged at once: both named
        f = agent_pb2.AgentDescriptor()
        f.CopyFrom(d)
        f.port, f.agent_id = 25001, d.agent_id + 1
        with pytest.raises(mg.Error) as e:
            ca.import_agent(f.SerializeToString())
        assert "port 25001 differs" in e.value.message and \
            "agent_id %d differs" % (d.agent_id + 1) in e.value.message, e.value.message
        for junk in (b"", b"\xff" * 64, blob[:-3], blob + b"\x00" * 200000):
            with pytest.raises(mg.Error) as e:
                ca.import_agent(junk)
            assert e.value.code in (grpc.StatusCode.INVALID_ARGUMENT,
                                    grpc.StatusCode.RESOURCE_EXHAUSTED), e.value.message
        # stale: the agent registered again (another agent of the same name and port)
        b1.quit()
        b1 = agents(b, "decode-0", port=25000)
        with pytest.raises(mg.Error) as e:
            ca.import_agent(blob)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "the descriptor's agent_id %d differs from the agent's" % d.agent_id in \
            e.value.message and "registered again" in e.value.message, e.value.message
        blob = cb.export_agent("decode-0", endpoint=b.h2c)
        with pytest.raises(mg.Error) as e:
            cb.export_agent("nobody")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
    # stale: the daemon restarted
    b1.quit()
    b.stop()
    b.start()
    agents(b, "decode-0", port=25000)
    with client(a) as ca:
        with pytest.raises(mg.Error) as e:
            ca.import_agent(blob)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "restarted" in e.value.message
