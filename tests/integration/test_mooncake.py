"""Mooncake's Python API on moongate: a target process and an initiator process written as
Mooncake's users write them (`from mooncake.engine import TransferEngine`, moongate's shim first
on PYTHONPATH), each on its own daemon, over TCP and over the verbs emulator; the GIL released
while a synchronous transfer waits; failing soft with no daemon."""
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import conftest

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402,F401  (the package, with stubs)
from moongate.compat import mooncake  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(conftest.ROOT, "clients", "python")
SHIM = os.path.join(CLIENT, "moongate", "compat", "shim")
EMU = os.path.join(conftest.BUILD, "libmgverbs_emu.so")
MiB = 1 << 20


def env_for(d):
    env = dict(os.environ, MOONGATE_SOCKET=d.sock, MOONGATE_PYGEN=conftest.GEN,
               PYTHONPATH=os.pathsep.join([SHIM, CLIENT]))
    env.pop("MOONGATE_TOKEN", None)
    return env


class Target(conftest.Child):
    """A target process (argv) on daemon d: it says {"session", "address", ...} in one JSON line,
    then answers "dump OFF LEN" in hex, its notifications as JSON, and "quit"."""

    def __init__(self, d, argv=None, notes="notifies", env=None):
        self.notes = notes
        super().__init__(argv or [sys.executable, os.path.join(HERE, "mooncake", "target.py"),
                                  "127.0.0.1", str(MiB)], env=env or env_for(d))
        assert getattr(self, "rc", 0) == 0, self.__dict__

    def dump(self, off, n):
        return bytes.fromhex(self.ask("dump %d %d" % (off, n)))

    def notifications(self):
        return json.loads(self.ask(self.notes))


@pytest.fixture
def target(children):
    return lambda *a, **kw: children(Target, *a, **kw)


def pair(make_daemon, *flags):
    """Daemons a (the initiator's) and b (the target's): a reaches b's engines as
    "127.0.0.1:port" (its --peer-port is b's)."""
    b = make_daemon("--peer-tls=false", *flags)
    a = make_daemon("--peer-tls=false", "--peer-port", str(b.h2c_port), *flags)
    return a, b


EXPECTED = {
    "initialize": 0, "allocated": True, "write_bytes": 0, "read_bytes_same": True,
    "sync_write": 0, "sync_read": 0, "sync_same": True,
    "batch_sync_write": 0, "batch_sync_read": 0, "batch_same": True,
    "async_write_id": True, "batch_status": 0, "check_status": 1,
    "check_status_after_free": -1, "async_same": True, "submit_write": 1,
    "sync_notify": 0, "batch_notify": 0, "bytes_notify": 0,
    "first_buffer": True, "probe": 0, "probe_unknown": -1,
    "unknown_sync": -1, "unknown_async": 0, "beyond_region": -1, "mismatch": -1,
    "register": 0, "kind": ["process", "descriptor"], "overlap": -7, "heap_write": 0,
    "unregister": 0, "unregister_again": -3, "free": 0,
}


SHARED_WRITE = """
from mooncake.engine import TransferEngine
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
src = e.allocate_managed_buffer(4096)
e.write_bytes_to_buffer(src, b"hello", 5)
print(e.transfer_sync_write(%r, src, %d + 100, 5))
"""


@pytest.mark.parametrize("transport", ["tcp", "rdma"])
def test_target_and_initiator_processes(make_daemon, target, transport):
    a, b = pair(make_daemon, *(["--ibverbs-lib", EMU] if transport == "rdma" else []))
    t = target(b)
    assert t.ask("fill 0 " + "00" * 16) == "0"
    run = subprocess.run([sys.executable, os.path.join(HERE, "mooncake", "initiator.py"),
                          t.session, str(t.address), str(t.address)],  # registered first
                         env=env_for(a), text=True,
                         capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got == EXPECTED, run.stderr
    # what the initiator's calls left in the target's memory, and told it
    heap = t.dump(MiB - 64 * 1024, 64 * 1024)
    assert t.dump(0, 4096) == heap[:4096]  # the notified 4 KiB write and the heap write agree
    assert t.notifications() == [["req-1", "written"], ["req-2", "read"],
                                 ["req-3", {"bytes": "800400ff656e64"}]]
    assert t.notifications() == []  # drained
    # memory the target mapped itself from a shared file: registered by descriptor, a target
    assert t.shared_kind == "descriptor"
    e = subprocess.run([sys.executable, "-c", SHARED_WRITE % (t.session, t.shared)],
                       env=env_for(a), capture_output=True, text=True, timeout=120)
    assert e.stdout.strip() == "0", e.stderr
    assert bytes.fromhex(t.ask("peek %d 5" % (t.shared + 100))) == b"hello"
    # the failures were said, with what failed
    assert "target '127.0.0.1:1'" in run.stderr, run.stderr
    assert "transfer_sync_read to %s: OUT_OF_RANGE" % t.session in run.stderr, run.stderr
    if os.environ.get("MOONGATE_RING", "1") != "0":  # single sync transfers on the ring
        assert a.metric("moongate_ring_submissions_total") == 4
    if transport == "rdma":  # managed memory moved over the verbs emulator, heap over TCP
        assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write",
                        transport="rdma") > 0
        assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="read",
                        transport="rdma") > 0
    t.close()


class Blocks(conftest.Child):
    """mooncake/blocks.py as a target: n anonymous mmap blocks of `size` registered (with
    batch_register_memory when asked), then "peek ADDR LEN" in hex."""

    def __init__(self, d, n, size, batch):
        super().__init__([sys.executable, os.path.join(HERE, "mooncake", "blocks.py"), "target",
                          "127.0.0.1", str(n), str(size)] + (["batch"] if batch else []),
                         env=env_for(d))


@pytest.mark.parametrize("batch", [True, False])
def test_anonymous_memory_blocks_are_a_peers_target(make_daemon, children, batch):
    """Blocks of the target's own memory (anonymous mmap, no file: process memory), registered
    as Mooncake's users register KV-cache pools: a peer READs each whole block and WRITEs into
    each, through mooncake.engine at both ends, over TCP."""
    a, b = pair(make_daemon)
    size = 3 * MiB + 4096
    t = children(Blocks, b, 4, size, batch)
    assert t.rc == 0
    run = subprocess.run([sys.executable, os.path.join(HERE, "mooncake", "blocks.py"),
                          "initiator", "127.0.0.1", t.session, "4", str(size)],
                         input=json.dumps({"blocks": t.blocks}) + "\n", env=env_for(a),
                         text=True, capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got == {"first": t.blocks[0], "reads": [0] * 4, "same": [True] * 4,
                   "writes": [0] * 4}, run.stderr
    for i, addr in enumerate(t.blocks):  # in the target's memory itself, the rest untouched
        assert bytes.fromhex(t.ask("peek %d 4100" % addr)) == \
            b"\xee" * 4096 + bytes([i + 1]) * 4
    assert b.metric("moongate_process_vm_bytes_total", op="write") >= 4 * 4096
    assert b.metric("moongate_process_vm_bytes_total", op="read") >= 4 * size


def test_process_memory_off_fails_registration_by_name(make_daemon, children):
    """On a daemon with process memory off (the helm chart's default), registering memory of
    no file fails at registration, with the setting named: never later, at a peer."""
    d = make_daemon("--process-memory=false")
    t = children(Blocks, d, 2, MiB, True)
    assert t.rc == -1
    assert "processMemory.enabled=false" in t.close()


def gpu_env(d, **more):
    """env_for(d), with the CUDA driver emulator as the driver and the build's libmgclient
    (and `more`: the emulator's settings)."""
    env = dict(env_for(d), MOONGATE_CUDA_LIB=os.path.join(conftest.BUILD, "libmgcuda_emu.so"),
               MOONGATE_CLIENT_LIB=os.path.join(conftest.BUILD, "libmgclient.so.0"), **more)
    env.update(conftest.sanitizer_preload())  # python3 loads the build's libmgclient
    return env


class GpuTarget(conftest.Child):
    """mooncake/gpu.py as a target: device memory (or `what`="pinned": page-locked host
    memory) registered with register_memory."""

    def __init__(self, d, size, what="target", **more):
        super().__init__([sys.executable, os.path.join(HERE, "mooncake", "gpu.py"), what,
                          "127.0.0.1", str(size)], env=gpu_env(d, **more))


def gpu_py(d, *args, **more):
    """mooncake/gpu.py ARGS on daemon d (`more`: the emulator's settings): its JSON answer, and
    what it logged."""
    run = subprocess.run([sys.executable, os.path.join(HERE, "mooncake", "gpu.py")] +
                         [str(a) for a in args], env=gpu_env(d, **more), text=True,
                         capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr
    gpu_py.stderr = run.stderr
    return json.loads(run.stdout)


def pattern(n):
    return bytes((i * 7 + 3) & 0xff for i in range(n))


@pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer build's "
                    "libmgclient without reports from grpcio's own threads")
@pytest.mark.parametrize("path", ["rdma-dmabuf", "staged", "rdma-without-dmabuf"])
def test_device_pointers_are_registered_as_gpu_memory(make_daemon, children, path):
    """register_memory of a device pointer (the CUDA driver emulator's) through mooncake.engine:
    found by the driver once the daemon cannot reach it as host memory, and moved device to
    device between two daemons, a WRITE into the target's device memory and a READ back. Where
    both daemons have RDMA devices (the verbs emulator) by its dma-buf over RDMA; where they
    have none, or the GPUs export no dma-buf (RDMA without GPUDirect), staged over TCP: each
    process's copy thread moves the bytes between its device and its daemon's staging buffer,
    in pieces (the range is larger than the buffer and not a multiple of it). A host initiator
    reaches a staged target too."""
    a, b = pair(make_daemon, *(["--ibverbs-lib", EMU] if path.startswith("rdma") else []))
    emu = {"MG_CUDA_EMU_DMABUF": "0"} if path == "rdma-without-dmabuf" else {}
    size = 256 * 1024 if path == "rdma-dmabuf" else 3 * MiB + 4096
    t = children(GpuTarget, b, size, **emu)
    assert (t.rc, t.kind) == (0, "device")
    assert gpu_py(a, "initiator", "127.0.0.1", t.session, t.address, size, **emu) == {
        "register": 0, "kind": "device", "write": 0, "read": 0, "same": True}
    assert bytes.fromhex(t.ask("dump 0 %d" % size)) == pattern(size)
    moved, never = ("rdma", "tcp") if path == "rdma-dmabuf" else ("tcp", "rdma")
    if path == "rdma-without-dmabuf":
        path = "staged"
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write",
                    transport=moved) >= size
    assert not a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default",
                        op="write", transport=never)
    if path == "staged":  # each daemon says what its processes copied, both ways
        assert b.metric("moongate_staged_bytes_total", op="write") == size
        assert b.metric("moongate_staged_bytes_total", op="read") == size
        assert a.metric("moongate_staged_bytes_total", op="read") == size  # the source
        assert a.metric("moongate_staged_bytes_total", op="write") == size  # read back
        assert gpu_py(a, "host", "127.0.0.1", t.session, t.address, size) == {
            "write": 0, "read": 0, "same": True}
        assert "registered staged instead: peers reach it over TCP" in t.close()


@pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer build's "
                    "libmgclient without reports from grpcio's own threads")
def test_pinned_host_memory_is_a_peers_target_and_a_lost_pointer_is_named(make_daemon,
                                                                           children):
    """Page-locked host memory from the CUDA driver (cuMemHostAlloc, what cudaHostAlloc makes)
    registered through mooncake.engine is host memory: process memory, a peer's target over
    TCP, written from a peer's device memory and read back. A device pointer the driver no
    longer knows (freed; as a pointer of another process or a destroyed context) is refused
    at registration, naming both ways it was tried, and the engine goes on."""
    a, b = pair(make_daemon)
    size = MiB + 4096
    t = children(GpuTarget, b, size, "pinned")
    assert (t.rc, t.kind) == (0, "process")
    assert gpu_py(a, "initiator", "127.0.0.1", t.session, t.address, size) == {
        "register": 0, "kind": "device", "write": 0, "read": 0, "same": True}
    assert bytes.fromhex(t.ask("dump 0 %d" % size)) == pattern(size)
    assert a.metric("moongate_staged_bytes_total", op="read") == size  # the device source
    assert not b.metric("moongate_staged_bytes_total", op="write")  # no device copy there
    assert gpu_py(b, "unreachable", "127.0.0.1") == {"freed": -1, "kind": None}
    said = gpu_py.stderr
    assert "neither memory of this process nor device memory the CUDA driver knows" in said, \
        said
    t.close()


@pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer build's "
                    "libmgclient without reports from grpcio's own threads")
def test_a_staged_targets_notification_comes_after_its_device_copies(make_daemon, children):
    """A WRITE with a notification into GPU memory staged at the target, whose device copies
    the emulator slows down (MG_CUDA_EMU_COPY_US): the target, watching for the notification
    while the WRITE goes, sees it only once the bytes are in its device memory (read the moment
    the notification is seen)."""
    a, b = pair(make_daemon)
    size = MiB + 4096
    t = children(Target, b, [sys.executable, os.path.join(HERE, "mooncake", "gpu.py"), "target",
                             "127.0.0.1", str(size)],
                 env=dict(gpu_env(b), MG_CUDA_EMU_COPY_US="50000"))
    w = subprocess.Popen([sys.executable, os.path.join(HERE, "mooncake", "gpu.py"), "host",
                          "127.0.0.1", t.session, str(t.address), str(size), "kv-9"],
                         env=gpu_env(a), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    name, msg, seen = json.loads(t.ask("noted %d" % size))  # watching while it lands
    out, err = w.communicate(timeout=120)
    assert json.loads(out) == {"write": 0, "read": 0, "same": True}, err
    assert (name, msg) == ("gpu", "kv-9")
    assert bytes.fromhex(seen) == pattern(size)
    t.close()


@pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer build's "
                    "libmgclient without reports from grpcio's own threads")
def test_a_staged_target_killed_mid_landing(make_daemon, children):
    """A staged GPU target frozen (SIGSTOP) while a peer WRITEs into it, then killed: the WRITE
    fails naming why (the process stopped serving its copies, or, had the kill come first, its
    segment gone with it), the READ after it too, and the target's daemon goes on serving: a
    new target registers and is written. A device copy that fails (CUDA_ERROR_ILLEGAL_ADDRESS,
    the emulator's injected failure) fails the WRITE too, the CUDA error in the daemon's log."""
    a, b = pair(make_daemon)
    size = 2 * MiB
    t = children(GpuTarget, b, size)
    t.p.send_signal(signal.SIGSTOP)
    w = subprocess.Popen([sys.executable, os.path.join(HERE, "mooncake", "gpu.py"), "host",
                          "127.0.0.1", t.session, str(t.address), str(size)], env=gpu_env(a),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # landing or not yet: either way the outcome is named
    t.p.kill()
    out, err = w.communicate(timeout=120)
    assert json.loads(out) == {"write": -1, "read": -1, "same": False}, err
    assert ("stopped serving its copies" in err or "no such segment" in err or
            "unknown agent" in err or "not found" in err.lower()), err
    t2 = children(GpuTarget, b, MiB)  # the daemon goes on
    assert gpu_py(a, "host", "127.0.0.1", t2.session, t2.address, MiB) == {
        "write": 0, "read": 0, "same": True}
    t2.close()
    env = dict(gpu_env(b), MG_CUDA_EMU_FAIL="copy:3")  # the target's third device copy fails
    t3 = children(Target, b, [sys.executable, os.path.join(HERE, "mooncake", "gpu.py"),
                              "target", "127.0.0.1", str(MiB)], env=env)
    got = gpu_py(a, "host", "127.0.0.1", t3.session, t3.address, MiB)
    assert got["write"] == -1, got
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in b.read_log()
    t3.close()


@pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer build's "
                    "libmgclient without reports from grpcio's own threads")
def test_transfers_on_a_cuda_stream(make_daemon, children):
    """Mooncake's *_on_cuda methods: a WRITE and a READ of device memory queued on a CUDA stream
    run in the stream's order, after the copy queued before them and before the copy after,
    and the calls return at once. The stream is held by a host function of the test's own
    until all is queued, so a transfer run at the call would see the bytes of before the
    copies, not after. A WRITE that fails on the stream ends the process with its failure
    logged, as Mooncake's does: nothing else could tell the stream's later work."""
    a, b = pair(make_daemon, "--ibverbs-lib", EMU)
    size = 256 * 1024
    t = children(GpuTarget, b, size)
    argv = [sys.executable, os.path.join(HERE, "mooncake", "gpu.py"), "on_cuda", "127.0.0.1",
            t.session, str(t.address), str(size)]
    run = subprocess.run(argv, env=gpu_env(a), text=True, capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"returned": True, "same": True}, run.stderr
    assert bytes.fromhex(t.ask("dump 0 %d" % size)) == bytes((i * 7 + 3) & 0xff
                                                             for i in range(size))
    run = subprocess.run(argv + [str(size)], env=gpu_env(a), text=True, capture_output=True,
                         timeout=300)  # past the target's region
    assert run.returncode == 1, run.stderr
    assert "transfer_write_on_cuda to %s: " % t.session in run.stderr, run.stderr
    assert "failed on its CUDA stream (said above): ending the process" in run.stderr


def test_a_second_thread_runs_while_a_sync_transfer_waits(make_daemon, target, monkeypatch):
    """The initiator's daemon is stopped (SIGSTOP) before a transfer_sync_write: the call waits
    for its answer. A second thread, which can only run if the waiting call let go of the GIL,
    sees the request waiting in the daemon's socket and resumes the daemon. If the GIL were
    held, nothing would resume it and the call would fail at its deadline."""
    a, b = pair(make_daemon)
    t = target(b)
    monkeypatch.setenv("MOONGATE_SOCKET", a.sock)
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "120")
    monkeypatch.setenv("MOONGATE_RING", "0")  # the call's request is what lands in the socket
    e = mooncake.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = e.allocate_managed_buffer(MiB)
    assert e.transfer_sync_write(t.session, src, t.address, 4096) == 0  # target opened
    order = []

    def queued():
        out = subprocess.run(["ss", "-xH", "src", a.sock], capture_output=True, text=True)
        return sum(int(line.split()[2]) for line in out.stdout.splitlines()
                   if len(line.split()) > 2)

    def second():
        while queued() == 0:  # runs only while the main thread waits without the GIL
            pass
        order.append("second thread ran")
        a.signal(signal.SIGCONT)

    base = queued()
    assert base == 0
    th = threading.Thread(target=second)
    a.signal(signal.SIGSTOP)
    try:
        th.start()
        rc = e.transfer_sync_write(t.session, src, t.address, MiB)
        order.append("sync call returned %d" % rc)
    finally:
        a.signal(signal.SIGCONT)
        th.join(timeout=60)
    assert order == ["second thread ran", "sync call returned 0"]
    e.close()


def test_memory_a_transfer_holds_stays_registered(make_daemon, monkeypatch):
    """unregister_memory of a buffer a transfer still uses (its peer's daemon frozen) fails
    (-1) and leaves it registered: asked again it fails the same way, not as unknown (-3); once
    the transfer ended it goes (0)."""
    a, b = pair(make_daemon)
    monkeypatch.setenv("MOONGATE_SOCKET", b.sock)
    t = mooncake.TransferEngine()
    assert t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    dst = t.allocate_managed_buffer(MiB)
    monkeypatch.setenv("MOONGATE_SOCKET", a.sock)
    i = mooncake.TransferEngine()
    assert i.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = ctypes.create_string_buffer(MiB)
    src = ctypes.addressof(buf)
    assert i.register_memory(src, MiB) == 0
    assert i.transfer_sync_write(t.session, src, dst, 4096) == 0  # the target opened
    b.signal(signal.SIGSTOP)
    try:
        bid = i.batch_transfer_async_write(t.session, [src], [dst], [MiB])
        assert bid > 0
        assert i.unregister_memory(src) == -1
        assert i.unregister_memory(src) == -1  # still registered
    finally:
        b.signal(signal.SIGCONT)
    assert i.get_batch_transfer_status([bid]) == 0
    assert i.unregister_memory(src) == 0
    assert i.unregister_memory(src) == -3
    for e in (i, t):
        e.close()


def test_the_first_buffer_is_the_one_registered_first(make_daemon, monkeypatch):
    """get_first_buffer_address answers the buffer the engine registered first (of those it
    still has), as Mooncake's: here the higher of two, asked of the target's daemon through the
    initiator's (the peer's answer) and of the target's daemon itself (DescribeAgent there)."""
    a, b = pair(make_daemon)
    monkeypatch.setenv("MOONGATE_SOCKET", b.sock)
    t = mooncake.TransferEngine()
    assert t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    bufs = [ctypes.create_string_buffer(1 << 16) for _ in range(2)]
    low, high = sorted(ctypes.addressof(x) for x in bufs)
    assert t.register_memory(high, 1 << 16) == 0 and t.register_memory(low, 1 << 16) == 0
    monkeypatch.setenv("MOONGATE_SOCKET", a.sock)
    i = mooncake.TransferEngine()
    assert i.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert i.get_first_buffer_address(t.session) == high  # not the lowest address
    with mg.Client("unix:" + b.sock) as c:
        info = c.describe_agent(t._name)
        assert (info.first_address, info.regions[0].address) == (high, low)
    assert t.unregister_memory(high) == 0  # the next one registered becomes the first
    assert i.get_first_buffer_address(t.session) == low
    for e in (i, t):
        e.close()


def test_the_module_has_mooncakes_names(make_daemon):
    """What Mooncake's mooncake.engine exports at module level, as code reads it at import:
    the SUPPORT_* flags of its build (none of those transports: False; CUDA: True, with the
    *_on_cuda methods) and TransferOpcode's members as module names."""
    code = ("import json, mooncake.engine as m\n"
            "print(json.dumps([m.SUPPORT_EFA, m.SUPPORT_HIP, m.SUPPORT_MNNVL, "
            "m.SUPPORT_INTRA_NVLINK, m.SUPPORT_CUDA, int(m.Read), int(m.Write), "
            "m.Read is m.TransferOpcode.Read, m.Write is m.TransferEngine.TransferOpcode.Write, "
            "hasattr(m.TransferEngine, 'transfer_write_on_cuda'), "
            "m.TransferNotify('n', 'x').msg]))")
    run = subprocess.run([sys.executable, "-c", code], env=env_for(make_daemon()),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [False] * 4 + [True, 0, 1, True, True, True, "x"]


def test_no_daemon_fails_soft(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MOONGATE_SOCKET", str(tmp_path / "none.sock"))
    e = mooncake.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1
    assert "no moongate daemon answers at unix:%s" % (tmp_path / "none.sock") in caplog.text
    assert e.allocate_managed_buffer(4096) == 0
    assert e.transfer_sync_write("127.0.0.1:20000", 4096, 4096, 10) == -1
    assert e.batch_transfer_async_read("127.0.0.1:20000", [1], [1], [1]) == 0
    assert e.get_notifies() == []
    assert "not initialized" in caplog.text


def test_names_chosen_ports_and_what_has_no_meaning(make_daemon, monkeypatch, caplog):
    a = make_daemon("--peer-tls=false")
    monkeypatch.setenv("MOONGATE_SOCKET", a.sock)
    caplog.set_level(logging.INFO, logger="moongate.compat.mooncake")
    port = conftest.free_port()
    e = mooncake.TransferEngine()
    # a local_server_name with a port and a metadata server: the name, on that port
    assert e.initialize("127.0.0.1:%d" % port, "127.0.0.1:2379", "tcp", "") == 0
    assert e.get_rpc_port() == port
    assert "not needed" in caplog.text
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1  # once
    twin = mooncake.TransferEngine()
    assert twin.initialize("127.0.0.1:%d" % port, "P2PHANDSHAKE", "tcp", "") == 0
    assert twin.get_rpc_port() != port  # P2PHANDSHAKE: the daemon assigns the port
    same = mooncake.TransferEngine()
    assert same.initialize("127.0.0.1:%d" % port, "etcd://x", "tcp", "") == -1  # taken
    assert "refused the agent" in caplog.text
    assert e.get_local_topology() == "{}" and "daemon owns the devices" in caplog.text
    assert e.warmup_efa_segment("x") == 0
    with pytest.raises(NotImplementedError):
        e.get_engine()
    assert e.write_bytes_to_buffer(4096, b"x", 1) == -1  # not its memory: refused, no crash
    with pytest.raises(ValueError):
        e.read_bytes_from_buffer(4096, 1)
    assert e.register_memory(4096, 0) == -1
    for x in (e, twin):
        x.close()
