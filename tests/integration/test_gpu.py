"""GPU memory through moongate, on the emulators (no GPU here): processes allocate device memory
from the CUDA driver emulator (loaded as libcuda.so.1 would be), register it by its dma-buf
(Client.register_vram, the C library's mg_vram_export), and two daemons with the verbs
emulator move it device to device over RDMA, by (agent, address): not one byte over TCP. GPU
memory is refused where only RDMA reaches it: a daemon without RDMA devices, a peer without
RDMA (either side), a copy on one daemon, ReadSegment; host memory and a missing driver are
named."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

import conftest

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402
from moongate.v1 import memory_pb2  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EMU = os.path.join(conftest.BUILD, "libmgverbs_emu.so")
CUDA_EMU = os.path.join(conftest.BUILD, "libmgcuda_emu.so")
CLIENT_LIB = os.path.join(conftest.BUILD, "libmgclient.so.0")
MiB = 1 << 20

# The GPU processes are python3 loading the build's libmgclient. ThreadSanitizer's runtime would
# have to be preloaded into the interpreter, whose grpcio threads (not instrumented, their
# atomics unseen) then read as racing. The release and ASan passes run these.
pytestmark = pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer "
                                "build's libmgclient without reports from grpcio's own threads")


def gpu_env(**kw):
    env = dict(os.environ, MOONGATE_CUDA_LIB=CUDA_EMU, MOONGATE_CLIENT_LIB=CLIENT_LIB,
               MOONGATE_PYGEN=conftest.GEN)
    env.update(conftest.sanitizer_preload())  # python3 loads the build's libmgclient
    env.update(kw)
    return env


class Gpu(conftest.Child):
    """A process with device memory registered on daemon d (gpu_proc.py): .port, .address,
    .segments, .source, .location, .transports."""

    def __init__(self, d, name, size=MiB, remote=True, **env):
        super().__init__([sys.executable, os.path.join(HERE, "gpu_proc.py"), d.sock, name,
                          str(size), "none" if remote is None else remote
                          if remote in ("staged", "any") else "1" if remote else "0"],
                         env=gpu_env(**env))

    def move(self, *args):
        """move W|R OFF LEN PEER SEG PATH CHUNK: the VramMove as a dict, or mg.Error."""
        out = self.ask("move " + " ".join(str(a) for a in args))
        if out.startswith("err "):
            code, _, msg = out[4:].partition(" ")
            raise mg.Error(getattr(mg.grpc.StatusCode, code), msg)
        return json.loads(out[3:])


def assert_gone(d, source):
    """Daemon d lets every segment of `source` go (once no request holds it), within 60 s."""
    with mg.Client("unix:" + d.sock) as c:
        for _ in range(1200):
            if not any(s.source == source for s in c.segments()):
                break
            time.sleep(0.05)
        assert not any(s.source == source for s in c.segments())


@pytest.fixture
def gpus(children):
    return lambda *a, **kw: children(Gpu, *a, **kw)


def pair(make_daemon, a_flags=("--ibverbs-lib", EMU), b_flags=("--ibverbs-lib", EMU)):
    b = make_daemon("--peer-tls=false", *b_flags)
    a = make_daemon("--peer-tls=false", "--peer-port", str(b.h2c_port), *a_flags)
    return a, b


def test_device_to_device_over_rdma(make_daemon, gpus):
    a, b = pair(make_daemon)
    t = gpus(b, "decode-0")
    i = gpus(a, "prefill-0", remote=False)
    assert t.source == memory_pb2.DMABUF and t.location == "cuda:0", t.__dict__
    assert t.transports == ["rdma"]  # never TCP: the daemon cannot reach its bytes
    data = os.urandom(256 * 1024)
    assert i.ask("fill 0 " + data.hex()) == "ok"
    target = "127.0.0.1:%d" % t.port
    assert i.ask("put %s %d %d" % (target, t.address + 4096, len(data))) == "ok rdma"
    assert bytes.fromhex(t.ask("dump 4096 %d" % len(data))) == data
    assert t.ask("fill 0 " + ("ab" * 16384)) == "ok"
    assert i.ask("get %s %d %d" % (target, t.address, 16384)) == "ok rdma"
    assert bytes.fromhex(i.ask("dump 0 16384")) == b"\xab" * 16384
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write",
                    transport="rdma") == len(data)
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="read",
                    transport="rdma") == 16384
    assert b.metric("moongate_data_bytes_total", dir="in") == 0  # not one byte over TCP
    assert b.metric("moongate_data_bytes_total", dir="out") == 0
    # where only RDMA reaches it: never inline, never a copy on the daemon
    out = t.ask("read %d" % t.segments[0])
    assert out.startswith("err FAILED_PRECONDITION") and "the segment is GPU memory" in out, out
    with mg.Client("unix:" + a.sock) as c:
        seg = c.register("host", MiB)
        out = i.ask("copy %d 4096" % seg.id)
    assert out.startswith("err INVALID_ARGUMENT") and "GPU memory moves over RDMA only" in out
    # the agent ends with its connection: its dma-buf registrations go with it
    t.close()
    assert_gone(b, memory_pb2.DMABUF)
    assert "agent_ended" in b.read_log()
    i.close()


def test_refused_without_rdma_and_said_why(make_daemon, gpus):
    # a daemon without RDMA devices cannot take GPU memory
    plain = make_daemon()
    with pytest.raises(RuntimeError, match="GPU memory moves over RDMA only, and this daemon has "
                                           "no RDMA device"):
        gpus(plain, "lonely")
    # GPU memory here, a peer without RDMA: the request fails naming it, nothing moves
    a, b = pair(make_daemon, b_flags=())
    i = gpus(a, "prefill-0", remote=False)
    with mg.Client("unix:" + b.sock) as c:
        c.register_agent("host-t")
        buf = c.allocate_buffer(MiB, remote_accessible=True)
        out = i.ask("put 127.0.0.1:%d %d 4096" % (c.describe_agent("host-t").port, buf.address))
    assert out.startswith("err FAILED_PRECONDITION") and "moves over RDMA only" in out, out
    assert b.metric("moongate_data_bytes_total", dir="in") == 0
    i.close()


def test_a_gpu_target_without_rdma_is_refused_before_sending(make_daemon, gpus):
    a, b = pair(make_daemon, a_flags=())  # the sender has no RDMA
    t = gpus(b, "decode-0")
    with mg.Client("unix:" + a.sock) as c:
        buf = c.allocate_buffer(MiB)
        with pytest.raises(mg.Error) as e:
            c.transfer([mg.write(address=buf.address, agent="127.0.0.1:%d" % t.port,
                                 remote_address=t.address, length=4096)])
    assert e.value.code.name == "FAILED_PRECONDITION", e.value
    assert "the target is GPU memory, which moves over RDMA only" in e.value.message
    assert b.metric("moongate_data_bytes_total", dir="in") == 0  # nothing was sent
    t.close()


def test_each_rdma_device_answers_for_a_dmabuf(make_daemon, gpus):
    """Every device's provider decides on a dma-buf; when one refuses, the registration fails
    and says what each device answered."""
    d = make_daemon("--ibverbs-lib", EMU, wrap=("env", "MG_VERBS_EMU_DEVICES=emu0,emu1",
                                                "MG_VERBS_EMU_NO_DMABUF=emu1"))
    with pytest.raises(RuntimeError, match="device emu0: took it; device emu1: ibv_reg_dmabuf_mr "
                                           "of 1048576 bytes: Operation not supported"):
        gpus(d, "-")
    assert gpu_segments(d) == []


def gpu_segments(d):
    with mg.Client("unix:" + d.sock) as c:
        return [s.id for s in c.segments() if s.source == memory_pb2.DMABUF]


def test_gpu_memory_goes_with_its_connection(make_daemon, gpus):
    """No agent: the registering connection holds the dma-buf registrations; a process killed
    with SIGKILL leaves none behind."""
    d = make_daemon("--ibverbs-lib", EMU)
    g = gpus(d, "-", size=3 * MiB)
    assert sorted(gpu_segments(d)) == sorted(g.segments)
    g.p.kill()
    g.p.wait()
    for _ in range(1200):
        if not gpu_segments(d):
            break
        time.sleep(0.05)
    assert gpu_segments(d) == []
    assert 'reason="its connection closed"' in d.read_log()


def test_from_c(make_daemon):
    """client/example_vram.c: device memory registered with mg_vram_register, gone with the
    connection; refused by a daemon without RDMA, with the reason."""
    d = make_daemon("--ibverbs-lib", EMU)
    exe = os.path.join(conftest.BUILD, "example_vram")
    run = subprocess.run([exe, "unix:" + d.sock, str(3 * MiB + 5)], env=gpu_env(),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.startswith("ok vram 0x"), run.stderr
    assert ": 1 segment(s) " in run.stdout
    for _ in range(1200):
        if not gpu_segments(d):
            break
        time.sleep(0.05)
    assert gpu_segments(d) == []
    plain = make_daemon()
    run = subprocess.run([exe, "unix:" + plain.sock, "4096"], env=gpu_env(), capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 1 and "no RDMA device" in run.stderr, run.stderr
    assert "(FAILED_PRECONDITION)" in run.stderr


def test_host_memory_and_no_driver_are_named(make_daemon, tmp_path):
    d = make_daemon("--ibverbs-lib", EMU)
    script = ("import os, sys; sys.path.insert(0, %r)\n"
              "import moongate_client as mg\n"
              "c = mg.Client('unix:' + %r)\n"
              "for f in (c.register_vram, c.write_vram):\n"
              "    try:\n"
              "        f(id(c), 4096)\n"
              "    except mg.Error as e:\n"
              "        print(e.code.name, e.message)\n"
              % (os.path.join(conftest.ROOT, "clients", "python"), d.sock))
    run = subprocess.run([sys.executable, "-c", script], env=gpu_env(), capture_output=True,
                         text=True, timeout=60)
    reg, move = run.stdout.splitlines()
    assert reg.startswith("FAILED_PRECONDITION") and "is not GPU memory the CUDA driver knows" \
        in reg, run.stdout + run.stderr
    assert move.startswith("INVALID_ARGUMENT [0x") and "is not GPU memory the CUDA driver " \
        "knows" in move, run.stdout + run.stderr
    run = subprocess.run([sys.executable, "-c", script],
                         env=gpu_env(MOONGATE_CUDA_LIB=str(tmp_path / "libcuda.so.1")),
                         capture_output=True, text=True, timeout=60)
    lines = run.stdout.splitlines()
    assert len(lines) == 2 and all("no CUDA driver: " in ln and "libcuda.so.1" in ln
                                   for ln in lines), run.stdout


def pool_leases(d):
    with mg.Client("unix:" + d.sock) as c:
        return sum(p.leases for p in c.pool.PoolStats(mg.pool_pb2.PoolStatsRequest()).pools)


def staged_pair(make_daemon, pool="64M", a_flags=(), b_flags=()):
    """Two daemons without RDMA: a (the GPU's, with a pool of `pool`) and b (the target's)."""
    b = make_daemon("--peer-tls=false", *b_flags)
    a = make_daemon("--peer-tls=false", "--peer-port", str(b.h2c_port), "--pool-bytes", pool,
                    *a_flags)
    return a, b


def test_staged_over_tcp_write_and_read(make_daemon, gpus):
    """No RDMA: device memory goes through leases of the pool, in steps, both ways; unaligned
    offsets and lengths; the daemons count the bytes as staged and the leases come back."""
    a, b = staged_pair(make_daemon)
    g = gpus(a, "-", size=4 * MiB, remote=None)
    n = MiB + 4097
    data = os.urandom(n)
    for off in range(0, n, 256 * 1024):  # fill in pieces (a line each)
        assert g.ask("fill %d %s" % (123 + off, data[off:off + 256 * 1024].hex())) == "ok"
    with mg.Client("unix:" + b.sock) as c:
        buf = c.allocate_buffer(2 * MiB, remote_accessible=True)
        m = g.move("W", 123, n, b.h2c, buf.segment.id, "auto", 256 * 1024)
        assert m["path"] == "staged" and m["why"] == "this daemon has no RDMA device", m
        assert m["bytes"] == n and m["chunk"] == 256 * 1024 and m["chunks"] == 5, m
        assert m["buffers"] == 4 and not m["bounce"], m
        assert bytes(buf.view[:n]) == data
        back = os.urandom(n)
        buf.view[7:7 + n] = back
        m = g.move("R", 2 * MiB + 1, n, b.h2c, buf.segment.id, "staged", 0)  # chunk: its own
        assert m["path"] == "staged" and m["bytes"] == n, m
        assert m["chunk"] == MiB and m["chunks"] == 2, m  # a quarter of n, at least 1 MiB
        got = b"".join(bytes.fromhex(g.ask("dump %d %d" % (2 * MiB + 1 + o, min(65536, n - o))))
                       for o in range(0, n, 65536))
        assert got == bytes(buf.view[:n])
        buf.free()
    assert a.metric("moongate_transfer_tagged_bytes_total", tag="staged", op="write") == n
    assert a.metric("moongate_transfer_tagged_bytes_total", tag="staged", op="read") == n
    assert a.metric("moongate_transfer_tagged_requests_total", tag="staged", op="write") == 5
    assert a.metric("moongate_transfer_tagged_bytes_total", tag="rdma-dmabuf", op="write") == 0
    assert b.metric("moongate_data_bytes_total", dir="in") >= n  # over TCP
    assert pool_leases(a) == 0
    g.close()


def test_a_staged_target_over_tcp(make_daemon, gpus):
    """Client.register_vram_staged on a daemon without RDMA devices: GPU memory a peer WRITEs
    into and READs from over TCP by (agent, address), unaligned, the target's copy thread
    moving each piece between its device and the daemon's staging buffer (the WRITE done only
    once the bytes are in device memory: dumped right after). The segment says STAGED and TCP;
    it goes with its connection, and its copy channel with it."""
    a, b = pair(make_daemon, a_flags=(), b_flags=())
    t = gpus(b, "decode-0", size=4 * MiB, remote="staged")
    assert (t.source, t.location, t.transports) == (memory_pb2.STAGED, "cuda:0", ["tcp"])
    n = 2 * MiB + 4097
    data = os.urandom(n)
    agent = "127.0.0.1:%d" % t.port
    with mg.Client("unix:" + a.sock) as c:
        buf = c.allocate_buffer(3 * MiB)
        buf.view[:n] = data
        b1 = c.transfer([mg.write(address=buf.address, agent=agent, remote_address=t.address + 5,
                                  length=n)])
        got = b"".join(bytes.fromhex(t.ask("dump %d %d" % (5 + o, min(65536, n - o))))
                       for o in range(0, n, 65536))
        assert got == data
        buf.view[:n] = bytes(n)
        b2 = c.transfer([mg.read(address=buf.address, agent=agent, remote_address=t.address + 5,
                                 length=n)])
        assert bytes(buf.view[:n]) == data
        assert b1.requests[0].transport == b2.requests[0].transport == "tcp"
        buf.free()
    assert b.metric("moongate_data_bytes_total", dir="in") >= n
    t.close()
    assert_gone(b, memory_pb2.STAGED)


def test_any_memory_by_address_through_moongates_own_clients(make_daemon, gpus):
    """Client.register_any (Python) and mg_client_register_any (C) register memory of the
    process by its address whatever it is: malloc'd and pinned host memory (cuMemHostAlloc) as
    process memory, device memory by its dma-buf where both daemons have RDMA devices, else
    staged; each a peer's target over the path they say (a WRITE from daemon a lands, read back
    where it lies). A freed device pointer is refused INVALID_ARGUMENT naming both ways tried."""
    a, b = pair(make_daemon, a_flags=(), b_flags=())
    n = MiB + 4097
    t = gpus(b, "any-py", size=2 * MiB, remote="any")
    assert (t.kind, t.path, t.source) == ("device", "staged", memory_pb2.STAGED)
    c_prog = conftest.CProgram(b, gpu_env())
    try:
        with mg.Client("unix:" + a.sock) as c:
            buf = c.allocate_buffer(2 * MiB)
            for kind, how in (("malloc", ["process", "process_vm"]),
                              ("pinned", ["process", "process_vm"]),
                              ("device", ["device", "staged"])):
                said = c_prog("any", kind, 2 * MiB)
                assert said[0] == "any" and said[4:] == how, said
                seg, at = int(said[2]), int(said[3])
                buf.view[:n] = bytes([0x5a]) * n
                c.transfer([mg.write(address=buf.address, peer=b.h2c, remote_segment=seg,
                                     remote_offset=7, length=n)])
                assert c_prog("check", at + 7, 0x5a, n) == ["ok"], kind
            buf.view[:n] = os.urandom(n)
            c.transfer([mg.write(address=buf.address, agent="127.0.0.1:%d" % t.port,
                                 remote_address=t.address + 3, length=n)])
            assert bytes.fromhex(t.ask("dump 3 %d" % n)) == bytes(buf.view[:n])
            buf.free()
        said = " ".join(c_prog("any", "freed", MiB))
        assert said.startswith("error INVALID_ARGUMENT") and "is neither memory of this " \
            "process nor device memory the CUDA driver knows" in said and \
            "the CUDA driver does not know it as device memory" in said, said
    finally:
        c_prog.close()
    t.close()
    a2, b2 = pair(make_daemon)  # both with RDMA devices: by its dma-buf
    t = gpus(b2, "any-rdma", size=MiB, remote="any")
    assert (t.kind, t.path, t.source) == ("device", "dmabuf", memory_pb2.DMABUF)
    t.close()


@pytest.mark.parametrize("how", ["kill", "term"])
def test_a_python_processs_staged_gpu_memory_outlives_its_daemon(make_daemon, gpus, how):
    """GPU memory a Python process registered staged (Client.register_any on a daemon without
    RDMA devices) is made again, with a new copy channel, after its daemon is SIGKILLed or
    stopped and started again, while the process makes no call of its own: a peer's WRITE by
    (agent, address) lands in its device memory again once the agent is back."""
    a, b = pair(make_daemon, a_flags=(), b_flags=())
    t = gpus(b, "kv-staged", size=MiB, remote="any")
    assert (t.kind, t.path) == ("device", "staged")
    agent, n = "127.0.0.1:%d" % t.port, 256 * 1024 + 5
    with mg.Client("unix:" + a.sock) as c:
        buf = c.allocate_buffer(MiB)
        for k in range(2):
            buf.view[:n] = os.urandom(n)
            deadline = time.monotonic() + 60
            while True:  # after the restart: until the process has made its memory again
                try:
                    c.transfer([mg.write(address=buf.address, agent=agent,
                                         remote_address=t.address + 1, length=n)])
                    break
                except mg.Error as e:
                    assert k == 1 and time.monotonic() < deadline, e
                    time.sleep(0.1)
            assert bytes.fromhex(t.ask("dump 1 %d" % n)) == bytes(buf.view[:n])
            if k == 0:
                if how == "kill":
                    b.kill()
                else:
                    assert b.stop() == 0, b.read_log()
                b.log.close()
                b._start_once()
        buf.free()
    assert b.metric("moongate_staged_bytes_total", op="write") == n  # this epoch's
    t.close()


def test_staged_through_a_small_pool_and_refused_without_one(make_daemon, gpus):
    a, b = staged_pair(make_daemon, pool="1M")
    g = gpus(a, "-", size=3 * MiB, remote=None)
    data = os.urandom(65536)
    assert g.ask("fill %d %s" % (3 * MiB - 65536, data.hex())) == "ok"
    with mg.Client("unix:" + b.sock) as c:
        buf = c.allocate_buffer(3 * MiB, remote_accessible=True)
        m = g.move("W", 0, 3 * MiB, b.h2c, buf.segment.id, "staged", 0)  # 8 MiB asked
        assert m["chunk"] <= MiB // 4 and m["chunk"] % 4096 == 0, m  # four leases fit the pool
        assert m["buffers"] == 4 and m["bytes"] == 3 * MiB, m
        assert bytes(buf.view[3 * MiB - 65536:3 * MiB]) == data
    assert pool_leases(a) == 0
    g.close()
    # a pool of one page: one lease in turn, a step per page, both ways
    a, b = staged_pair(make_daemon, pool="4K")
    g = gpus(a, "-", size=MiB, remote=None)
    data = os.urandom(65537)
    assert g.ask("fill 1 " + data.hex()) == "ok"
    with mg.Client("unix:" + b.sock) as c:
        buf = c.allocate_buffer(MiB, remote_accessible=True)
        m = g.move("W", 1, len(data), b.h2c, buf.segment.id, "staged", 0)
        assert (m["chunk"], m["buffers"], m["chunks"]) == (4096, 1, 17), m
        assert bytes(buf.view[:len(data)]) == data
        buf.view[:len(data)] = data[::-1]
        m = g.move("R", 4096, len(data), b.h2c, buf.segment.id, "staged", 0)
        assert (m["chunk"], m["buffers"], m["bytes"]) == (4096, 1, len(data)), m
        assert bytes.fromhex(g.ask("dump 4096 %d" % len(data))) == data[::-1]
    assert pool_leases(a) == 0
    g.close()
    # a daemon without a pool: said, with the pool's flag
    plain, _ = staged_pair(make_daemon, pool="0")
    g = gpus(plain, "-", size=MiB, remote=None)
    with pytest.raises(mg.Error) as e:
        g.move("W", 0, 4096, b.h2c, 1, "staged", 0)
    assert e.value.code.name == "FAILED_PRECONDITION", e.value
    assert "GPU memory is staged through leases: " in e.value.message, e.value
    assert "no buffer pool" in e.value.message and "--pool-bytes" in e.value.message, e.value
    g.close()


def test_a_cuda_error_mid_copy_fails_the_move_and_returns_the_leases(make_daemon, gpus):
    a, b = staged_pair(make_daemon)
    # the move's 3rd device copy (step 2's) fails: steps 0 and 1 went, step 2 never does
    g = gpus(a, "-", size=4 * MiB, remote=None, MG_CUDA_EMU_FAIL="copy:3")
    with mg.Client("unix:" + b.sock) as c:
        buf = c.allocate_buffer(4 * MiB, remote_accessible=True)
        with pytest.raises(mg.Error) as e:
            g.move("W", 0, 4 * MiB, b.h2c, buf.segment.id, "staged", MiB)
        assert e.value.code.name == "INTERNAL", e.value
        assert "cuMemcpyDtoHAsync: CUDA_ERROR_ILLEGAL_ADDRESS" in e.value.message, e.value
    assert pool_leases(a) == 0
    assert a.metric("moongate_transfer_tagged_bytes_total", tag="staged", op="write") == 2 * MiB
    g.close()


def test_staging_waits_for_a_busy_pool_within_the_deadline(make_daemon, gpus):
    a, b = staged_pair(make_daemon, pool="4M")
    g = gpus(a, "-", size=MiB, remote=None)
    with mg.Client("unix:" + b.sock) as cb, mg.Client("unix:" + a.sock) as ca:
        buf = cb.allocate_buffer(MiB, remote_accessible=True)
        hog = ca.lease(4 * MiB)  # all of the pool
        with pytest.raises(mg.Error) as e:
            g.move("W", 0, MiB, b.h2c, buf.segment.id, "staged", 0, 2)
        assert e.value.code.name == "DEADLINE_EXCEEDED", e.value
        assert pool_leases(a) == 1  # the hog's only
        # a move waiting in line goes on once the pool has room
        g.p.stdin.write("move W 0 %d %s %d staged 0 60\n" % (MiB, b.h2c, buf.segment.id))
        g.p.stdin.flush()
        for _ in range(1200):
            if sum(p.waiters for p in ca.pool.PoolStats(mg.pool_pb2.PoolStatsRequest()).pools):
                break
            time.sleep(0.05)
        ca.release(hog)
        out = g.line("gpu_proc ended: ")
        assert out.startswith("ok ") and json.loads(out[3:])["bytes"] == MiB, out
    assert pool_leases(a) == 0
    g.close()


def test_staged_copies_go_after_the_work_on_the_callers_stream(make_daemon, gpus):
    """The caller's stream orders the move after what it queued there: writes queued on it
    (each copy takes 0.3 s; the move's own copy would end before the second) are what the move
    reads, not the bytes before them."""
    a, b = staged_pair(make_daemon)
    g = gpus(a, "-", size=MiB, remote=None, MG_CUDA_EMU_COPY_US="300000", GPU_PROC_STREAM="1")
    data = os.urandom(4096)
    with mg.Client("unix:" + b.sock) as c:
        buf = c.allocate_buffer(MiB, remote_accessible=True)
        assert g.ask("fillasync 8192 00") == "ok"  # queued, not done: 0.3 s
        assert g.ask("fillasync 0 " + data.hex()) == "ok"  # then this: 0.6 s
        m = g.move("W", 0, 4096, b.h2c, buf.segment.id, "staged", 0)
        assert m["bytes"] == 4096, m
        assert bytes(buf.view[:4096]) == data
    g.close()


def test_a_pool_the_driver_will_not_pin_goes_through_a_bounce_buffer(make_daemon, gpus):
    a, b = staged_pair(make_daemon)
    g = gpus(a, "-", size=MiB, remote=None, MG_CUDA_EMU_FAIL="cuMemHostRegister_v2:1")
    data = os.urandom(65536)
    assert g.ask("fill 0 " + data.hex()) == "ok"
    with mg.Client("unix:" + b.sock) as c:
        buf = c.allocate_buffer(MiB, remote_accessible=True)
        m = g.move("W", 0, 65536, b.h2c, buf.segment.id, "staged", 0)
        assert m["bounce"] and m["bytes"] == 65536, m
        assert bytes(buf.view[:65536]) == data
    g.close()


def test_auto_takes_dmabuf_over_rdma_and_stages_what_is_not_registered(make_daemon, gpus):
    a, b = pair(make_daemon)
    g = gpus(a, "-", size=MiB, remote=False)  # registered by its dma-buf
    data = os.urandom(65536)
    assert g.ask("fill 0 " + data.hex()) == "ok"
    with mg.Client("unix:" + b.sock) as c:
        buf = c.allocate_buffer(MiB, remote_accessible=True)
        m = g.move("W", 0, 65536, b.h2c, buf.segment.id, "auto", 0)
        assert m["path"] == "rdma-dmabuf" and m["bytes"] == 65536, m
        assert bytes(buf.view[:65536]) == data
        # device to a peer's device memory, by its agent and address
        t = gpus(b, "decode-0")
        m = g.move("W", 0, 65536, "-", "127.0.0.1:%d@%d" % (t.port, t.address + 8192), "auto", 0)
        assert m["path"] == "rdma-dmabuf" and m["bytes"] == 65536, m
        assert bytes.fromhex(t.ask("dump 8192 65536")) == data
        assert t.ask("fill 0 " + data[::-1].hex()) == "ok"
        m = g.move("R", 4096, 65536, "-", "127.0.0.1:%d@%d" % (t.port, t.address), "dmabuf", 0)
        assert m["path"] == "rdma-dmabuf", m
        assert bytes.fromhex(g.ask("dump 4096 65536")) == data[::-1]
        t.close()
    assert a.metric("moongate_transfer_tagged_bytes_total", tag="rdma-dmabuf", op="write") == \
        2 * 65536
    assert a.metric("moongate_transfer_tagged_bytes_total", tag="rdma-dmabuf", op="read") == 65536
    assert a.metric("moongate_transfer_tagged_bytes_total", tag="staged", op="write") == 0
    assert a.metric("moongate_transfer_tagged_bytes_total", tag="staged", op="read") == 0
    assert b.metric("moongate_data_bytes_total", dir="in") == 0  # zero TCP bytes
    assert b.metric("moongate_data_bytes_total", dir="out") == 0
    g.close()
    # memory not registered: refused by dma-buf before a byte moved, so staged, and said why
    a2, b2 = pair(make_daemon, a_flags=("--ibverbs-lib", EMU, "--pool-bytes", "16M"))
    g = gpus(a2, "-", size=MiB, remote=None)
    with mg.Client("unix:" + b2.sock) as c:
        buf = c.allocate_buffer(MiB, remote_accessible=True)
        m = g.move("W", 0, 65536, b2.h2c, buf.segment.id, "auto", 0)
    assert m["path"] == "staged" and m["why"].startswith("by dma-buf: "), m
    g.close()


def test_submit_tags_are_checked_and_shown(make_daemon):
    d = make_daemon("--pool-bytes", "4M")
    with mg.Client("unix:" + d.sock) as c:
        src = c.register("src", MiB)
        dst = c.register("dst", MiB)
        req = mg.transfer_pb2.TransferRequest(op=mg.transfer_pb2.WRITE, local_segment=src.id,
                                             peer="", remote_segment=dst.id, length=4096)
        r = c.transfers.Submit(mg.transfer_pb2.SubmitRequest(requests=[req], wait=True,
                                                             tag="staged"), timeout=30)
        assert r.batch.tag == "staged" and r.batch.state == mg.transfer_pb2.DONE
        assert c.transfers.GetBatch(mg.transfer_pb2.GetBatchRequest(id=r.batch_id)).tag == \
            "staged"
        with pytest.raises(mg.grpc.RpcError) as e:
            c.transfers.Submit(mg.transfer_pb2.SubmitRequest(requests=[req], tag="gpu"),
                               timeout=30)
        assert e.value.code().name == "INVALID_ARGUMENT" and 'tag "gpu" is none of' in \
            e.value.details()
    assert d.metric("moongate_transfer_tagged_requests_total", tag="staged", op="write") == 1
    run = subprocess.run([os.path.join(conftest.BUILD, "mgctl"), "--target", "unix:" + d.sock,
                          "transfers", "get", str(r.batch_id)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and ", tagged staged" in run.stdout, run.stdout + run.stderr
    with mg.Client("unix:" + d.sock) as c:
        plain = c.transfers.Submit(mg.transfer_pb2.SubmitRequest(requests=[req], wait=True),
                                   timeout=30)
    assert plain.batch.tag == ""
    run = subprocess.run([os.path.join(conftest.BUILD, "mgctl"), "--target", "unix:" + d.sock,
                          "transfers", "get", str(plain.batch_id)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and "tagged" not in run.stdout, run.stdout + run.stderr


def test_gpu_check_on_the_emulator_and_skipped_without_a_driver():
    """tests/gpu/check.sh from the source tree: two daemons, device memory through staging and
    back, compared on the device; then device to device through mooncake.engine, staged at
    both ends, read back and compared; without a driver (and none named) it says it is
    skipped."""
    check = os.path.join(conftest.ROOT, "tests", "gpu", "check.sh")
    run = subprocess.run([check, "--size", "8M", "--rounds", "1",
                          "--ports", conftest.two_free_ports()],
                         env=gpu_env(MG_BUILD_DIR=conftest.BUILD), capture_output=True, text=True,
                         timeout=480)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verify: 8388608 bytes written from the device and read back onto it (staged): " \
        "equal" in run.stdout, run.stdout
    assert re.search(r"write +8\.0 MiB +host memory +[\d.]+ GB/s +vram \(staged\) +[\d.]+ GB/s "
                     r"+ratio [\d.]+", run.stdout), run.stdout
    assert "cuMemcpyDtoH into pinned host memory" in run.stdout
    assert re.search(r"CUDA driver \d+\.\d+: every symbol moongate's table uses resolved",
                     run.stdout), run.stdout
    assert "verify: 8388608 bytes written device -> peer device and read back through " \
        "mooncake.engine (staged): equal" in run.stdout, run.stdout
    assert re.search(r"device -> device, staged at both ends +[\d.]+", run.stdout), run.stdout
    if not os.path.exists("/proc/driver/nvidia/version"):
        env = {k: v for k, v in gpu_env(MG_BUILD_DIR=conftest.BUILD).items()
               if k != "MOONGATE_CUDA_LIB"}
        run = subprocess.run([check], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and "check.sh: skipped: no NVIDIA driver" in run.stdout, \
            run.stdout + run.stderr
