"""GPU memory through moongate, on the emulators (no GPU here): processes allocate device memory
from the CUDA driver emulator (loaded as libcuda.so.1 would be), register it by its dma-buf
(Client.register_vram, the C library's mg_vram_export), and two daemons with the verbs
emulator move it device to device over RDMA, by (agent, address): not one byte over TCP. GPU
memory is refused where only RDMA reaches it: a daemon without RDMA devices, a peer without
RDMA (either side), a copy on one daemon, ReadSegment; host memory and a missing driver are
named."""
import os
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
                          str(size), "1" if remote else "0"], env=gpu_env(**env))


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
    with mg.Client("unix:" + b.sock) as c:
        for _ in range(1200):
            if not any(s.source == memory_pb2.DMABUF for s in c.segments()):
                break
            time.sleep(0.05)
        assert not any(s.source == memory_pb2.DMABUF for s in c.segments())
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
              "try:\n"
              "    c.register_vram(id(c), 4096)\n"
              "except mg.Error as e:\n"
              "    print(e.code.name, e.message)\n"
              % (os.path.join(conftest.ROOT, "clients", "python"), d.sock))
    run = subprocess.run([sys.executable, "-c", script], env=gpu_env(), capture_output=True,
                         text=True, timeout=60)
    assert "FAILED_PRECONDITION" in run.stdout and "is not GPU memory the CUDA driver knows" \
        in run.stdout, run.stdout + run.stderr
    run = subprocess.run([sys.executable, "-c", script],
                         env=gpu_env(MOONGATE_CUDA_LIB=str(tmp_path / "libcuda.so.1")),
                         capture_output=True, text=True, timeout=60)
    assert "no CUDA driver: " in run.stdout and "libcuda.so.1" in run.stdout, run.stdout
