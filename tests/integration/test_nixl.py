"""NIXL's Python agent on moongate (`nixl._api`, moongate's shim first on PYTHONPATH), driven as
vLLM's NixlConnector drives it: agents in their own processes on two daemons exchange metadata
over the test's own channel (as vLLM's ZMQ side channel), the decode side READs the prefill
side's blocks by index with a "req_id:N" notification and the prefill side frees them on it
(pull); the prefill side WRITEs into the decode side's blocks (push); heterogeneous block counts;
NIXL's exceptions for each error; telemetry; the notification only after the bytes landed."""
import json
import os
import subprocess
import sys
import time

import pytest

import conftest

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402,F401  (the package, with stubs)

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(conftest.ROOT, "clients", "python")
SHIM = os.path.join(CLIENT, "moongate", "compat", "shim")
KiB = 1024


def env_for(d):
    env = dict(os.environ, MOONGATE_SOCKET=d.sock, MOONGATE_PYGEN=conftest.GEN,
               PYTHONPATH=os.pathsep.join([SHIM, CLIENT]))
    env.pop("MOONGATE_TOKEN", None)
    return env


class Agent(conftest.Child):
    """tests/integration/nixl/agent.py on daemon d: .metadata, .bases, .blocks, .block_len
    (vram: its memory the CUDA driver emulator's device memory)."""

    def __init__(self, d, name, regions, blocks, block_len, vram=False, listen=0):
        env = env_for(d)
        if listen:
            env["NIXL_TEST_LISTEN_PORT"] = str(listen)
        if vram:
            env.update(MOONGATE_CUDA_LIB=os.path.join(conftest.BUILD, "libmgcuda_emu.so"),
                       MOONGATE_CLIENT_LIB=os.path.join(conftest.BUILD, "libmgclient.so.0"),
                       **conftest.sanitizer_preload())
        super().__init__([sys.executable, os.path.join(HERE, "nixl", "agent.py"), name,
                          str(regions), str(blocks), str(block_len)] + ["VRAM"] * vram,
                         env=env)

    def __call__(self, *words):
        return json.loads(self.ask(" ".join(
            w if isinstance(w, str) else json.dumps(w, separators=(",", ":")) for w in words)))

    def add(self, other):
        return self("add", other.metadata, other.bases, str(other.blocks), str(other.block_len))


def pair(make_daemon):
    """Daemons a (decode) and b (prefill), each advertising its h2c endpoint to peers."""
    return [make_daemon("--peer-tls=false", "--advertise", "127.0.0.1:{h2c_port}")
            for _ in range(2)]


def test_vllm_pull_push_and_heterogeneous_blocks(make_daemon, children):
    """Pull: the decode agent adds the prefill agent's metadata, prepares its blocks (an Nx3
    array) and READs 12 of them by index (int64 arrays, as vLLM's) into its own, with
    notif "req-1:1"; the prefill side hears it from the decode agent, by name, and the bytes
    read are the prefill side's. Push: the prefill agent WRITEs into the decode agent's blocks,
    which hears "req-2:1". The two sides have different block counts (16 and 24 a region)."""
    a, b = pair(make_daemon)
    p = children(Agent, b, "prefill-0", 2, 16, 16 * KiB)
    d = children(Agent, a, "decode-0", 2, 24, 16 * KiB)
    assert d.add(p) == {"name": "prefill-0", "bytes": True}  # NIXL's binding answers bytes
    remote = [3, 5, 7, 8, 9, 15, 16 + 0, 16 + 1, 16 + 2, 16 + 10, 16 + 14, 16 + 15]
    local = [0, 1, 2, 3, 4, 5, 24 + 0, 24 + 1, 24 + 2, 24 + 3, 24 + 4, 24 + 5]
    assert p("fill", "s1", remote) == {"ok": True}
    moved = d("move", "READ", "prefill-0", "req-1", local, remote)
    assert (moved["state"], moved["bytes"], moved["descs"]) == ("DONE", 12 * 16 * KiB, 12), moved
    assert moved["xfer_us"] >= moved["post_us"] >= 0, moved
    assert d("digest", local) == p("digest", remote)
    assert p("notifs", "1") == {"decode-0": ["req-1:1"]}
    assert p("notifs") == {}  # each once
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="read",
                    transport="tcp") >= 12 * 16 * KiB
    if os.environ.get("MOONGATE_RING", "1") != "0":  # posted on the agent's ring
        assert a.metric("moongate_ring_submissions_total") == 1
    # push: the prefill side writes into the decode side's blocks
    assert p.add(d)["name"] == "decode-0"
    assert p("fill", "s2", [0, 1, 31]) == {"ok": True}
    moved = p("move", "WRITE", "decode-0", "req-2", [0, 1, 31], [40, 41, 47])
    assert (moved["state"], moved["descs"]) == ("DONE", 3), moved
    assert d("digest", [40, 41, 47]) == p("digest", [0, 1, 31])
    assert d("notifs", "1") == {"prefill-0": ["req-2:1"]}
    # a notification on its own, by the bytes name add_remote_agent gave
    assert d("call", "send_notif", ["prefill-0", "req-3:1"]) == {"ok": "None"}
    assert p("notifs", "1") == {"decode-0": ["req-3:1"]}
    p.close()
    d.close()


def test_metadata_through_nixls_listener_alone(make_daemon, children):
    """Two agents, each with its metadata listener (enable_listen_thread), exchange metadata
    through the listeners alone: the decode side fetches the prefill side's and READs from it;
    the decode side sends its own (partial: one region) and the prefill side WRITEs into it;
    invalidate_local_metadata makes the prefill side forget it. A listener refuses what does
    not check (junk, metadata that is not an agent's, an agent it does not serve) and goes on."""
    import socket
    a, b = pair(make_daemon)
    pp, dp = conftest.free_ports(2)
    p = children(Agent, b, "prefill-l", 1, 8, 16 * KiB, listen=pp)
    d = children(Agent, a, "decode-l", 2, 8, 16 * KiB, listen=dp)
    with socket.create_connection(("127.0.0.1", pp)) as s:  # junk: closed, nothing answered
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:  # closed with the rest unread
            pass
    assert d("call", "fetch_remote_metadata", ["prefill-l", "127.0.0.1", pp]) == {"ok": "None"}
    deadline = time.monotonic() + 30
    while d("call", "check_remote_metadata", ["prefill-l"]) != {"ok": "True"}:
        assert time.monotonic() < deadline, "the metadata never came"
        time.sleep(0.05)
    assert d("prep", "prefill-l", p.bases, str(p.blocks), str(p.block_len)) == {
        "name": "prefill-l", "bytes": True}
    assert p("fill", "l1", [1, 5]) == {"ok": True}
    assert d("move", "READ", "prefill-l", "req-l", [0, 1], [1, 5])["state"] == "DONE"
    assert d("digest", [0, 1]) == p("digest", [1, 5])
    regions = [[base, 8 * 16 * KiB, 0] for base in d.bases[:1]]
    assert d("call", "send_partial_agent_metadata", [regions, False, [], "127.0.0.1", pp]) == \
        {"ok": "None"}
    assert p("prep", "decode-l", d.bases[:1], "8", str(16 * KiB))["name"] == "decode-l"
    assert p("move", "WRITE", "decode-l", "req-w", [5], [3])["state"] == "DONE"
    assert d("digest", [3]) == p("digest", [5])
    refused = d("call", "fetch_remote_metadata", ["nobody", "", pp])
    assert refused["error"] == "nixlNotSupportedError", refused
    said = p("call", "send_local_metadata", ["127.0.0.1", dp])  # fine: D adds P again
    assert said == {"ok": "None"}, said
    said = d("call", "invalidate_local_metadata", ["127.0.0.1", pp])
    assert said == {"ok": "None"}, said
    assert p("call", "check_remote_metadata", ["decode-l"]) == {"ok": "False"}
    said = p("call", "invalidate_local_metadata", ["127.0.0.1", conftest.free_ports(1)[0]])
    assert said["error"] == "nixlBackendError" and "metadata listener at 127.0.0.1" in \
        said["message"], said
    p.close()
    d.close()


@pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer build's "
                    "libmgclient without reports from grpcio's own threads")
def test_vllm_pull_between_gpus_staged_without_rdma(make_daemon, children):
    """vLLM's pull with "VRAM" (kv_buffer_device cuda): both agents' KV caches are device
    memory of the CUDA driver emulator, registered through the door by address (staged: the
    daemons have no RDMA devices); the decode side READs the prefill side's blocks by index into
    its own device memory, and the prefill side hears the notification once they landed."""
    a, b = pair(make_daemon)
    p = children(Agent, b, "prefill-g", 2, 8, 64 * KiB, vram=True)
    d = children(Agent, a, "decode-g", 2, 8, 64 * KiB, vram=True)
    assert d.add(p)["name"] == "prefill-g"
    remote, local = [1, 2, 8 + 5, 8 + 7], [7, 6, 8 + 0, 8 + 1]
    assert p("fill", "g1", remote) == {"ok": True}
    moved = d("move", "READ", "prefill-g", "req-g", local, remote)
    assert (moved["state"], moved["bytes"], moved["descs"]) == ("DONE", 4 * 64 * KiB, 4), moved
    assert d("digest", local) == p("digest", remote)
    assert p("notifs", "1") == {"decode-g": ["req-g:1"]}
    assert b.metric("moongate_staged_bytes_total", op="read") >= 4 * 64 * KiB  # out of P's GPU
    assert a.metric("moongate_staged_bytes_total", op="write") >= 4 * 64 * KiB  # into D's
    p.close()
    d.close()


def notes(agent, want, timeout=30):
    """agent.get_new_notifs() gathered until `want` messages came (they are delivered to the
    agent as they arrive), or for 0.5 s when none is wanted; then at most that long."""
    out, end = {}, time.monotonic() + (timeout if want else 0.5)
    while time.monotonic() < end:
        for k, v in agent.get_new_notifs().items():
            out.setdefault(k, []).extend(v)
        if want and sum(map(len, out.values())) >= want:
            break
        time.sleep(0.01)
    return out


@pytest.fixture
def nixl(monkeypatch):
    """moongate.compat.nixl, and agent(d, name, **config) made on daemon d."""
    from moongate.compat import nixl as nx
    made = []

    def agent(d, name, token=None, **conf):
        monkeypatch.setenv("MOONGATE_SOCKET", d.sock)
        if token:
            monkeypatch.setenv("MOONGATE_TOKEN", token)
        else:
            monkeypatch.delenv("MOONGATE_TOKEN", raising=False)
        a = nx.nixl_agent(name, nx.nixl_agent_config(**conf))
        made.append(a)
        return a
    nx.agent = agent
    yield nx
    for a in made:
        a.close()


def test_each_error_is_nixls_exception_naming_moongates_reason(make_daemon, nixl):
    """Each refusal raises the exception NIXL raises for it, its status name first and
    moongate's reason after: a plugin moongate does not serve, metadata that is not an agent's,
    metadata naming a daemon that does not advertise where peers reach it, an agent not added,
    a descriptor outside registered memory, indices out of range or of different counts, pairs
    of different lengths, sides swapped, a transfer not posted, telemetry off; a region the peer unregistered under a prepared list fails the transfer by
    name; the agent goes on after each."""
    a, b = pair(make_daemon)
    mem_b, mem_a = bytearray(64 * KiB), bytearray(64 * KiB)
    (ab, _), (aa, _) = mg.address_of(mem_b), mg.address_of(mem_a)
    pb = nixl.agent(b, "p-err", capture_telemetry=True)
    pa = nixl.agent(a, "d-err")  # telemetry off
    assert set(pa.get_plugin_list()) == {"MOONGATE", "UCX"}
    assert pa.get_backend_params("UCX")["served_by"] == "moongate"
    with pytest.raises(nixl.nixlNotFoundError, match="no plugin 'GDS'"):
        pa.create_backend("GDS")
    regs_b = pb.register_memory([(ab, 64 * KiB, 0, "")], "DRAM")
    pa.register_memory(pa.get_reg_descs([(aa, 64 * KiB, 0, "")], "DRAM"))
    with pytest.raises(nixl.nixlInvalidParamError, match="overlaps memory registered before"):
        pa.register_memory([(aa + 4096, 4096, 0, "")], "DRAM")
    with pytest.raises(nixl.nixlMismatchError, match="NIXL_ERR_MISMATCH: "
                       "add_remote_agent: not a moongate NIXL agent's metadata"):
        pa.add_remote_agent(b"\x00junk")
    with pytest.raises(nixl.nixlInvalidParamError, match="is this agent's own"):
        pa.add_remote_agent(pa.get_agent_metadata())
    with pytest.raises(nixl.nixlNotFoundError, match="add_remote_agent.. its metadata first"):
        pa.prep_xfer_dlist("p-err", [(ab, 4096, 0)], "DRAM")
    lost = nixl.agent(make_daemon("--peer-tls=false"), "p-unadvertised")  # no --advertise
    with pytest.raises((nixl.nixlNotFoundError, nixl.nixlRemoteDisconnectError),
                       match="--advertise must be the endpoint peers reach it at"):
        pa.add_remote_agent(lost.get_agent_metadata())
    assert pa.add_remote_agent(pb.get_agent_metadata()) == b"p-err"
    with pytest.raises(nixl.nixlNotFoundError, match=r"descriptor 1 \(0x%x, 4096\) is outside "
                       r"the registered memory of agent 'p-err'" % (ab + 64 * KiB)):
        pa.prep_xfer_dlist(b"p-err", [(ab, 4096, 0), (ab + 64 * KiB, 4096, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError, match="outside the registered memory of this "
                       "agent"):
        pa.prep_xfer_dlist("NIXL_INIT_AGENT", [(aa - 4096, 4096, 0)], "DRAM")
    local = pa.prep_xfer_dlist("", [(aa + i * 4096, 4096, 0) for i in range(16)], "DRAM")
    remote = pa.prep_xfer_dlist(b"p-err", [(ab + i * 4096, 4096, 0) for i in range(15)] +
                                [(ab + 15 * 4096, 2048, 0)], "DRAM")
    with pytest.raises(nixl.nixlInvalidParamError, match=r"remote index 16 out of range "
                       r"\(the list has 16 descriptors\)"):
        pa.make_prepped_xfer("READ", local, [0, 1], remote, [0, 16])
    with pytest.raises(nixl.nixlInvalidParamError, match="2 local indices, 1 remote"):
        pa.make_prepped_xfer("READ", local, [0, 1], remote, [0])
    with pytest.raises(nixl.nixlInvalidParamError, match="pair 1: local descriptor 3 is 4096 "
                       "bytes, remote descriptor 15 2048"):
        pa.make_prepped_xfer("WRITE", local, [2, 3], remote, [2, 15])
    with pytest.raises(nixl.nixlInvalidParamError, match="remote_xfer_side is prepared as "
                       "NIXL_INIT_AGENT"):
        pa.make_prepped_xfer("READ", local, [0], local, [0])
    with pytest.raises(nixl.nixlInvalidParamError, match="operation 'MOVE': READ or WRITE"):
        pa.make_prepped_xfer("MOVE", local, [0], remote, [0])
    x = pa.make_prepped_xfer("READ", local, [0, 1], remote, [4, 5], b"r:1")
    with pytest.raises(nixl.nixlNotPostedError):
        pa.check_xfer_state(x)
    mem_b[4 * 4096:6 * 4096] = os.urandom(8192)
    assert pa.transfer(x) in ("PROC", "DONE")
    while pa.check_xfer_state(x) == "PROC":
        pass
    assert bytes(mem_a[:8192]) == bytes(mem_b[4 * 4096:6 * 4096])
    with pytest.raises(nixl.nixlNoTelemetryError, match="capture_telemetry=True"):
        pa.get_xfer_telemetry(x)
    assert pa.query_xfer_backend(x) == "UCX"  # the config's default, as vLLM's
    pa.release_xfer_handle(x)
    with pytest.raises(nixl.nixlNotFoundError, match="released"):
        pa.transfer(x)
    assert notes(pb, 1) == {"d-err": [b"r:1"]}
    pb.deregister_memory(regs_b)  # the region goes from under the prepared list
    with pytest.raises(nixl.nixlNotFoundError, match="deregister_memory.*is not registered"):
        pb.deregister_memory(regs_b)
    x = pa.make_prepped_xfer("READ", local, [0], remote, [0], b"r:2")
    pa.transfer(x)
    with pytest.raises((nixl.nixlInvalidParamError, nixl.nixlNotFoundError)) as e:
        while pa.check_xfer_state(x) == "PROC":
            pass
    assert "transfer of 1 descriptors" in str(e.value) and "0x%x" % ab in str(e.value), e.value
    assert notes(pb, 0) == {}  # a transfer that failed notifies nobody
    pa.release_xfer_handle(x)
    pa.remove_remote_agent(b"p-err")
    with pytest.raises(nixl.nixlNotFoundError):
        pa.remove_remote_agent("p-err")
    with pytest.raises(nixl.nixlNotSupportedError, match="central metadata store"):
        pa.fetch_remote_metadata("p-err", "", 8888)
    with pytest.raises(nixl.nixlNotSupportedError, match="GPU kernel"):
        pa.prep_mem_view(local)


def test_telemetry_by_environment_and_an_agents_own_memory(make_daemon, nixl, monkeypatch):
    """NIXL_TELEMETRY_ENABLE=y turns telemetry on as capture_telemetry does; a transfer between
    two regions of one agent (its own name as the remote side, reached through its daemon as any
    agent is) moves, and its notification (given as str, as NIXL's binding takes it) reaches the
    agent itself."""
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "y")
    d = pair(make_daemon)[0]
    src, dst = bytearray(os.urandom(32 * KiB)), bytearray(32 * KiB)
    (s, _), (t, _) = mg.address_of(src), mg.address_of(dst)
    ag = nixl.agent(d, "solo")
    ag.register_memory([(s, 32 * KiB, 0, ""), (t, 32 * KiB, 0, "")], "DRAM")
    local = ag.prep_xfer_dlist("NIXL_INIT_AGENT", [(s + i * 8192, 8192, 0) for i in range(4)],
                               "DRAM")
    mine = ag.prep_xfer_dlist("solo", [(t + i * 8192, 8192, 0) for i in range(4)], "DRAM")
    x = ag.make_prepped_xfer("WRITE", local, [0, 1, 2, 3], mine, [3, 2, 1, 0], "self:1")
    ag.transfer(x)
    while ag.check_xfer_state(x) == "PROC":
        pass
    for i in range(4):
        assert dst[(3 - i) * 8192:(4 - i) * 8192] == src[i * 8192:(i + 1) * 8192]
    tel = ag.get_xfer_telemetry(x)
    assert (tel.totalBytes, tel.descCount) == (32 * KiB, 4) and tel.xferDuration > 0
    assert notes(ag, 1) == {"solo": [b"self:1"]}
    ag.release_dlist_handle(local)
    with pytest.raises(nixl.nixlNotFoundError, match="released"):
        ag.make_prepped_xfer("WRITE", local, [0], mine, [0])


def test_prepared_lists_in_the_native_api(make_daemon):
    """Client.prepare_list and Submit's prepared groups, as the NIXL door uses them: a batch of
    pairs by index moves what the same ranges by address would; each refusal names what is
    wrong (a range outside the process's regions, or outside the regions of an agent the daemon
    knows, here or on a peer; another connection's list, an index past the list, pairs of
    different lengths, a list released or gone with its connection); a region unregistered
    under a list fails the batch that uses it, naming the address."""
    from moongate.v1 import transfer_pb2
    a, b = pair(make_daemon)
    src, dst = bytearray(os.urandom(64 * KiB)), bytearray(64 * KiB)
    (s, _), (t, _) = mg.address_of(src), mg.address_of(dst)
    with mg.Client("unix:" + a.sock) as ca, mg.Client("unix:" + b.sock) as cb, \
            mg.Client("unix:" + a.sock) as other:
        cb.register_agent("lists-b")
        seg_t = cb.register_memory("dst", t, 64 * KiB, remote_accessible=True)
        seg_s = ca.register_memory("src", s, 64 * KiB)
        with pytest.raises(mg.Error, match=r"range 1 \(0x%x, 4096\): " % (s + 64 * KiB)) as e:
            ca.prepare_list([s, s + 64 * KiB], [4096, 4096])
        assert e.value.code == mg.grpc.StatusCode.INVALID_ARGUMENT
        local = ca.prepare_list([s + i * 4096 for i in range(16)], [4096] * 15 + [2048])
        remote = ca.prepare_list([t + i * 4096 for i in range(16)], [4096] * 16, peer=b.h2c,
                                 agent="lists-b")
        WRITE = transfer_pb2.WRITE
        b1 = ca.transfer([], prepared=[mg.prepared(WRITE, local, [0, 1, 2], remote,
                                                   [15, 14, 13])])
        assert b1.done == 3
        for k, r in ((0, 15), (1, 14), (2, 13)):
            assert dst[r * 4096:(r + 1) * 4096] == src[k * 4096:(k + 1) * 4096]
        # an agent this daemon knows the regions of: each range checked when the list is made
        with pytest.raises(mg.Error, match=r'range 1 \(0x%x, 4096\) of agent "lists-b"' % (
                t + 64 * KiB)) as e:
            ca.prepare_list([t, t + 64 * KiB], [4096, 4096], peer=b.h2c, agent="lists-b")
        assert e.value.code == mg.grpc.StatusCode.INVALID_ARGUMENT
        ca.register_agent("lists-a")  # an agent on this daemon: its process's regions
        assert ca.prepare_list([s], [4096], agent="lists-a")
        with pytest.raises(mg.Error, match=r'range 0 \(0x%x, 4096\) of agent "lists-a"' % (
                s + 64 * KiB)):
            ca.prepare_list([s + 64 * KiB], [4096], agent="lists-a")
        with pytest.raises(mg.Error, match='no agent "nobody" with regions on this daemon') as e:
            ca.prepare_list([s], [4096], agent="nobody")
        assert e.value.code == mg.grpc.StatusCode.NOT_FOUND
        for bad, why in (((0, 16), r"prepared 0: pair 1: remote index 16 is past the list's "
                                   r"16 ranges"),
                         ((15, 15), r"pair 1: local range 15 is 2048 bytes, remote range 15 "
                                    r"4096")):
            with pytest.raises(mg.Error, match=why) as e:
                ca.transfer([], prepared=[mg.prepared(WRITE, local, [0, bad[0]], remote,
                                                      [0, bad[1]])])
            assert e.value.code == mg.grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(mg.Error, match="no prepared list %d of this connection" % local):
            other.transfer([], prepared=[mg.prepared(WRITE, local, [0], remote, [0])])
        with pytest.raises(mg.Error, match="remote_list is the caller's own memory"):
            ca.transfer([], prepared=[mg.prepared(WRITE, local, [0], local, [0])])
        ca.unregister(seg_s.id)  # the region goes from under the list
        with pytest.raises(mg.Error, match="0x%x" % s):
            ca.transfer([], prepared=[mg.prepared(WRITE, local, [0], remote, [0])])
        ca.release_list(remote)
        with pytest.raises(mg.Error, match="no prepared list %d" % remote) as e:
            ca.release_list(remote)
        assert e.value.code == mg.grpc.StatusCode.NOT_FOUND
        cb.unregister(seg_t.id)
    with mg.Client("unix:" + a.sock) as ca:  # the connection that made them closed: gone
        with pytest.raises(mg.Error, match="no prepared list %d" % local):
            ca.release_list(local)


def test_a_prepared_transfer_goes_on_after_the_daemon_restarts(make_daemon, nixl):
    """The daemon's prepared lists go with a restart (they live with their connection); the
    agent's memory and name come back (the client's restore table) and the door prepares its
    lists again when a transfer finds them gone: the same handles move the same blocks."""
    a, b = pair(make_daemon)
    mem_a, mem_b = bytearray(64 * KiB), bytearray(os.urandom(64 * KiB))
    (aa, _), (ab, _) = mg.address_of(mem_a), mg.address_of(mem_b)
    pb = nixl.agent(b, "p-rs")
    pb.register_memory([(ab, 64 * KiB, 0, "")], "DRAM")
    pa = nixl.agent(a, "d-rs")
    pa.register_memory([(aa, 64 * KiB, 0, "")], "DRAM")
    pa.add_remote_agent(pb.get_agent_metadata())
    local = pa.prep_xfer_dlist("", [(aa + i * 4096, 4096, 0) for i in range(16)], "DRAM")
    remote = pa.prep_xfer_dlist("p-rs", [(ab + i * 4096, 4096, 0) for i in range(16)], "DRAM")
    for k in range(2):
        x = pa.make_prepped_xfer("READ", local, [k, 8 + k], remote, [k, 8 + k], b"rs:%d" % k)
        pa.transfer(x)
        while pa.check_xfer_state(x) == "PROC":
            pass
        pa.release_xfer_handle(x)
        for i in (k, 8 + k):
            assert mem_a[i * 4096:(i + 1) * 4096] == mem_b[i * 4096:(i + 1) * 4096]
        if k == 0:
            a.kill()
            a.log.close()
            a._start_once()
    assert notes(pb, 2) == {"d-rs": [b"rs:0", b"rs:1"]}


class Tensor:
    """What the door reads of a torch tensor (it never imports torch): a CPU tensor over a
    NumPy array, or one that claims a device."""

    def __init__(self, arr, device=-1, contiguous=True):
        self.arr, self.device, self.contiguous = arr, device, contiguous

    def data_ptr(self):
        return int(self.arr.ctypes.data)

    def numel(self):
        return self.arr.size

    def element_size(self):
        return self.arr.itemsize

    def get_device(self):
        return self.device

    def is_contiguous(self):
        return self.contiguous


def test_tensors_and_arrays_are_taken_as_nixl_takes_them(make_daemon, nixl):
    """Descriptors from a tensor, a list of tensors (one region each, DRAM for CPU tensors)
    and an Nx3 array; tensors on different devices, one not contiguous, a list of 3-tuples for
    registration and a list without mem_type are refused as NIXL refuses them (None)."""
    import numpy as np
    d = pair(make_daemon)[0]
    ag = nixl.agent(d, "tensors")
    k, v = np.zeros(4096, dtype=np.float32), np.zeros(2048, dtype=np.float16)
    regs = ag.get_reg_descs([Tensor(k), Tensor(v)])
    assert (regs.getType(), list(regs)) == (nixl.DRAM_SEG, [
        (int(k.ctypes.data), 16384, 0, ""), (int(v.ctypes.data), 4096, 0, "")])
    ag.register_memory(regs)
    one = ag.get_xfer_descs(Tensor(k))
    assert list(one) == [(int(k.ctypes.data), 16384, 0)]
    arr = np.array([[int(k.ctypes.data), 4096, 0], [int(v.ctypes.data), 4096, 0]],
                   dtype=np.uint64)
    assert ag.prep_xfer_dlist("NIXL_INIT_AGENT", arr, "DRAM") is not None
    assert ag.get_xfer_descs([Tensor(k), Tensor(v, device=1)]) is None
    assert ag.get_xfer_descs(Tensor(k, contiguous=False)) is None
    assert ag.get_reg_descs([(int(k.ctypes.data), 64, 0)], "DRAM") is None
    assert ag.get_xfer_descs([(int(k.ctypes.data), 64, 0)]) is None
    assert list(ag.deserialize_descs(ag.get_serialized_descs(one))) == list(one)


def test_every_grpc_code_raises_its_nixl_class():
    """A failure the daemon reports raises NIXL's class for its gRPC code, its status name and
    moongate's reason in the message: nixlUnknownError for UNKNOWN (the daemon names every
    failure it makes, so only the transport gives UNKNOWN, e.g. a proxy answering a status gRPC
    cannot map), nixlBackendError for a code NIXL has no class for."""
    import grpc
    from moongate.compat import nixl as nx
    want = {"INVALID_ARGUMENT": "nixlInvalidParamError", "OUT_OF_RANGE": "nixlInvalidParamError",
            "NOT_FOUND": "nixlNotFoundError", "PERMISSION_DENIED": "nixlNotAllowedError",
            "UNAUTHENTICATED": "nixlNotAllowedError", "UNIMPLEMENTED": "nixlNotSupportedError",
            "CANCELLED": "nixlCancelledError", "UNAVAILABLE": "nixlRemoteDisconnectError",
            "UNKNOWN": "nixlUnknownError"}
    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        e = nx._from_mg(mg.Error(code, "why it failed"), "check_xfer_state")
        cls = want.get(code.name, "nixlBackendError")
        assert type(e).__name__ == cls and isinstance(e, getattr(nx, cls)), (code, e)
        status = "NIXL_ERR_" + {"nixlUnknownError": "UNKNOWN"}.get(cls, "")
        assert str(e).startswith(status) and str(e).endswith(
            "check_xfer_state: %s: why it failed" % code.name), str(e)


def test_index_arrays_are_encoded_as_protobuf_encodes_them():
    """The door writes a prepared group of NumPy index arrays itself (no Python step per
    index): its bytes are protobuf's own for the same group, for indices of every varint
    length, and parse back with the rest of the request."""
    import numpy as np
    from moongate.compat import nixl as nx
    from moongate.v1 import transfer_pb2
    for arr in (np.arange(10000), np.array([0, 1, 127, 128, 300, 16383, 16384, 2 ** 21,
                                             2 ** 32 - 1], dtype=np.int64), np.array([5])):
        g = nx._PackedGroup(1, 2 ** 40, arr, 77, arr[::-1].copy())
        ref = transfer_pb2.SubmitRequest(prepared=[transfer_pb2.Prepared(
            op=1, local_list=2 ** 40, local_indices=arr.tolist(), remote_list=77,
            remote_indices=arr[::-1].tolist())]).SerializeToString()
        assert g.encode() == ref
        r = transfer_pb2.SubmitRequest.FromString(transfer_pb2.SubmitRequest(
            request_id="x", wait=True).SerializeToString() + g.encode())
        assert (r.request_id, r.wait, list(r.prepared[0].local_indices)) == (
            "x", True, arr.tolist())


# NIXL's nixl_agent methods and their parameters, as ai-dynamo/nixl's src/api/python/_api.py
# names them (the version vLLM uses): code calls them by these keywords.
NIXL_SIGNATURES = {
    "__init__": ["agent_name", "nixl_conf", "instantiate_all"],
    "get_plugin_list": [], "get_plugin_mem_types": ["backend"],
    "get_plugin_params": ["backend"], "get_backend_mem_types": ["backend"],
    "get_backend_params": ["backend"], "create_backend": ["backend", "initParams"],
    "register_memory": ["reg_list", "mem_type", "backends"],
    "deregister_memory": ["dereg_list", "backends"],
    "query_memory": ["reg_list", "backend", "mem_type"],
    "make_connection": ["remote_agent", "backends"],
    "prep_xfer_dlist": ["agent_name", "xfer_list", "mem_type", "backends"],
    "make_prepped_xfer": ["operation", "local_xfer_side", "local_indices", "remote_xfer_side",
                          "remote_indices", "notif_msg", "backends", "skip_desc_merge"],
    "initialize_xfer": ["operation", "local_descs", "remote_descs", "remote_agent", "notif_msg",
                        "backends"],
    "transfer": ["handle", "notif_msg"], "check_xfer_state": ["handle"],
    "get_xfer_telemetry": ["handle"], "query_xfer_backend": ["handle"],
    "estimate_xfer_cost": ["req_handle"], "release_xfer_handle": ["handle"],
    "release_dlist_handle": ["handle"], "get_new_notifs": ["backends"],
    "update_notifs": ["backends"],
    "check_remote_xfer_done": ["remote_agent_name", "lookup_tag", "backends", "tag_is_prefix"],
    "send_notif": ["remote_agent_name", "notif_msg", "backend"],
    "get_agent_metadata": [], "add_remote_agent": ["metadata"],
    "remove_remote_agent": ["agent"],
    "get_partial_agent_metadata": ["descs", "inc_conn_info", "backends"],
    "send_local_metadata": ["ip_addr", "port"],
    "send_partial_agent_metadata": ["descs", "inc_conn_info", "backends", "ip_addr", "port",
                                    "label"],
    "fetch_remote_metadata": ["remote_agent", "ip_addr", "port", "label"],
    "invalidate_local_metadata": ["ip_addr", "port"],
    "check_remote_metadata": ["agent", "descs"],
    "get_reg_descs": ["descs", "mem_type"], "get_xfer_descs": ["descs", "mem_type"],
    "get_serialized_descs": ["descs"], "deserialize_descs": ["serialized_descs"],
    "prep_mem_view": ["dlist", "backends"], "release_mem_view": ["mvh"],
    "get_remote_descs": ["descs", "mem_type"],
}


def test_every_method_takes_nixls_keywords_and_two_agents_may_share_a_name(make_daemon, nixl):
    """Each public method of NIXL's agent is there with NIXL's parameter names, in NIXL's
    order (code calls them by keyword); the config takes NIXL's keywords; two agents of one
    name in one process both work, as in NIXL."""
    import inspect
    for method, params in NIXL_SIGNATURES.items():
        got = [p for p in inspect.signature(getattr(nixl.nixl_agent, method)).parameters
               if p != "self"]
        assert got == params, (method, got)
    assert list(inspect.signature(nixl.nixl_agent_config).parameters) == [
        "enable_prog_thread", "enable_listen_thread", "listen_port", "capture_telemetry",
        "num_threads", "backends", "sync_mode"]
    d = pair(make_daemon)[0]
    one, two = nixl.agent(d, "twin"), nixl.agent(d, "twin")
    assert one.name == two.name == "twin"
    mem = bytearray(os.urandom(8192))
    (m, _) = mg.address_of(mem)
    one.register_memory(reg_list=[(m, 4096, 0, "")], mem_type="DRAM", backends=["UCX"])
    two.register_memory(reg_list=[(m + 4096, 4096, 0, "")], mem_type="DRAM")
    for ag, src, dst in ((one, m, m + 2048), (two, m + 4096, m + 6144)):
        x = ag.initialize_xfer(operation="WRITE", local_descs=[(src, 1024, 0)],
                               remote_descs=[(dst, 1024, 0)], remote_agent="twin",
                               notif_msg=b"t:1")
        assert ag.transfer(handle=x) == "PROC"
        while ag.check_xfer_state(handle=x) == "PROC":
            pass
        assert mem[dst - m:dst - m + 1024] == mem[src - m:src - m + 1024]
        assert notes(ag, 1) == {"twin": [b"t:1"]}  # each its own, by its own topic


def test_a_transfer_that_cannot_end_is_released_at_once_and_a_lost_peer_is_named(make_daemon,
                                                                                 nixl):
    """A READ from an agent whose daemon is frozen (SIGSTOP) stays "PROC"; posting it again
    raises nixlRepostActiveError; an operator's cancel of its batch makes it raise
    nixlCancelledError; release_xfer_handle of another returns at once (the batch is cancelled
    on this daemon). While the READ holds the memory it lands in, deregister_memory of it raises
    nixlBackendError and it stays registered. With the peer's daemon gone, a transfer raises
    nixlRemoteDisconnectError from check_xfer_state, naming the peer."""
    import signal
    a, b = pair(make_daemon)
    mem_a, mem_b = bytearray(1 << 20), bytearray(1 << 20)
    (ma, _), (mb, _) = mg.address_of(mem_a), mg.address_of(mem_b)
    pb = nixl.agent(b, "frozen-p")
    pb.register_memory([(mb, 1 << 20, 0, "")], "DRAM")
    pa = nixl.agent(a, "frozen-d")
    regs_a = [(ma, 1 << 20, 0, "")]
    pa.register_memory(regs_a, "DRAM")
    pa.add_remote_agent(pb.get_agent_metadata())
    local = pa.prep_xfer_dlist("", [(ma, 1 << 20, 0)], "DRAM")
    remote = pa.prep_xfer_dlist("frozen-p", [(mb, 1 << 20, 0)], "DRAM")
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        x = pa.make_prepped_xfer("READ", local, [0], remote, [0])
        assert pa.transfer(x) == "PROC"
        assert pa.check_xfer_state(x) == "PROC"
        with pytest.raises(nixl.nixlRepostActiveError, match="still going"):
            pa.transfer(x)
        # an operator cancels the stuck batch (mgctl transfers cancel ID; its id found here as
        # the door knows it: from the ring's completion at its acceptance, or by the request_id
        # the door gave its Submit): the transfer raises nixlCancelledError
        xf = pa._xfers[x._handle]
        with mg.Client("unix:" + a.sock) as op:
            if hasattr(xf.pending, "ud"):  # posted on the agent's ring
                deadline = time.monotonic() + 20
                while not pa._ring_acc.get(xf.pending.ud) and time.monotonic() < deadline:
                    assert pa.check_xfer_state(x) == "PROC"
                bid = pa._ring_acc[xf.pending.ud]
            else:
                bid = op.submit([mg.write(segment=1, remote_segment=1, length=1)],
                                request_id=xf.rid)
            # the READ holds the memory it lands in: deregistering it is refused and it stays
            with pytest.raises(nixl.nixlBackendError, match=r"deregister_memory\(0x%x\): "
                               r"FAILED_PRECONDITION: .*held by 1 lease\(s\) or transfer" % ma):
                pa.deregister_memory(regs_a)
            assert pa.query_memory(regs_a, "UCX", "DRAM") == [{"registered": "yes"}]
            run = subprocess.run([os.path.join(conftest.BUILD, "mgctl"), "--target",
                                  "unix:" + a.sock, "transfers", "cancel", str(bid)],
                                 capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, run.stderr
        with pytest.raises(nixl.nixlCancelledError, match="NIXL_ERR_CANCELED"):
            while pa.check_xfer_state(x) == "PROC":
                pass
        pa.release_xfer_handle(x)
        x = pa.make_prepped_xfer("READ", local, [0], remote, [0])
        assert pa.transfer(x) == "PROC"
        t0 = time.monotonic()
        pa.release_xfer_handle(x)
        assert time.monotonic() - t0 < 5  # never waits for the frozen peer
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    b.kill()
    x = pa.make_prepped_xfer("READ", local, [0], remote, [0])
    pa.transfer(x)
    with pytest.raises(nixl.nixlRemoteDisconnectError, match=b.h2c):
        while pa.check_xfer_state(x) == "PROC":
            pass
    pa.release_xfer_handle(x)
    pa.deregister_memory(regs_a)  # its transfers ended: it goes
    assert pa.query_memory(regs_a, "UCX", "DRAM") == [None]


def test_torch_cpu_tensors_as_vllm_hands_them(make_daemon, nixl):
    """Debian's torch (python3-torch, installed by scripts/deps.sh): KV caches as CPU tensors,
    registered from the tensors themselves (get_reg_descs of a list of tensors), their blocks
    prepared from data_ptr() as vLLM computes them, a READ by index between two agents on two
    daemons into a tensor, compared with torch."""
    torch = pytest.importorskip("torch")
    a, b = pair(make_daemon)
    src = torch.arange(8 * 1024, dtype=torch.float32).reshape(8, 1024)  # 8 blocks of 4 KiB
    dst = torch.zeros(8, 1024, dtype=torch.float32)
    pb, pa = nixl.agent(b, "torch-p"), nixl.agent(a, "torch-d")
    regs = pb.get_reg_descs([src])
    assert list(regs) == [(src.data_ptr(), 32 * KiB, 0, "")] and regs.getType() == nixl.DRAM_SEG
    pb.register_memory(regs)
    pa.register_memory(pa.get_reg_descs([dst]))
    pa.add_remote_agent(pb.get_agent_metadata())
    blk = src[0].numel() * src.element_size()
    local = pa.prep_xfer_dlist("NIXL_INIT_AGENT", [(dst.data_ptr() + i * blk, blk, 0)
                                                   for i in range(8)], "DRAM")
    remote = pa.prep_xfer_dlist("torch-p", [(src.data_ptr() + i * blk, blk, 0)
                                            for i in range(8)], "DRAM")
    x = pa.make_prepped_xfer("READ", local, torch.tensor([0, 1, 2]).numpy(), remote,
                             torch.tensor([5, 6, 7]).numpy(), b"torch:1")
    pa.transfer(x)
    while pa.check_xfer_state(x) == "PROC":
        pass
    assert torch.equal(dst[:3], src[5:]) and not dst[3:].any()
    assert notes(pb, 1) == {"torch-d": [b"torch:1"]}


def test_another_tenants_agent_is_not_allowed(make_daemon, nixl, tmp_path):
    """Metadata of another tenant's agent (daemons with an auth file, each agent its token's
    tenant) is refused by the daemon it names: nixlNotAllowedError, naming why; the agent's own
    tenant adds it. A list naming several remote agents (get_remote_descs) is refused by name."""
    import hashlib
    auth = tmp_path / "auth"
    auth.write_text("token sha256:%s t1\ntoken sha256:%s t2\n" % (
        hashlib.sha256(b"tok1-0123456789").hexdigest(),
        hashlib.sha256(b"tok2-0123456789").hexdigest()))
    a, b = [make_daemon("--peer-tls=false", "--advertise", "127.0.0.1:{h2c_port}",
                        "--auth-file", str(auth)) for _ in range(2)]
    p = nixl.agent(b, "tenant-p", token="tok1-0123456789")
    other = nixl.agent(a, "tenant-x", token="tok2-0123456789")
    with pytest.raises(nixl.nixlNotAllowedError, match="NIXL_ERR_NOT_ALLOWED: add_remote_agent"):
        other.add_remote_agent(p.get_agent_metadata())
    mine = nixl.agent(a, "tenant-d", token="tok1-0123456789")
    assert mine.add_remote_agent(p.get_agent_metadata()) == b"tenant-p"
    with pytest.raises(nixl.nixlNotSupportedError, match="one list per agent"):
        mine.get_remote_descs([(0x1000, 64, 0, "tenant-p")], "DRAM")
