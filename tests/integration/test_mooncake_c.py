"""Mooncake's C API on moongate (libtransfer_engine.so): a program carrying its own copy of
transfer_engine_c.h's layouts loads the library with dlopen (tests/te/te_harness.c), as a target
process and as an initiator process on two daemons, over TCP and over the verbs emulator: batches
filled by several submits, statuses polled in tight loops (from a snapshot: no call per poll),
notifications with a batch and on their own, refusals with Mooncake's codes; a Python initiator
(Mooncake's Python API) against the C target; no daemon: createTransferEngine answers NULL.
Statuses are never torn (a COMPLETED with fewer bytes), polled across their publish or by the
hundred thousand; the header declares Mooncake's functions with Mooncake's prototypes."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

import conftest
from test_mooncake import EXPECTED, GpuTarget, env_for, gpu_env, pair, target  # noqa: F401

import moongate_client as mg  # noqa: E402  (the package, with stubs)

HARNESS = os.path.join(conftest.BUILD, "te_harness")
LIB = os.path.join(conftest.BUILD, "libtransfer_engine.so")
EMU = os.path.join(conftest.BUILD, "libmgverbs_emu.so")
HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
K64 = 65536


def c_target(make_target, d, size=MiB, memory="memfd"):
    """The C harness as a target process on daemon d, its memory a sealed memfd's mapping or
    malloc'd ("malloc": process memory, a peer's target over TCP)."""
    return make_target(d, [HARNESS, LIB, "target", str(size)] +
                       (["malloc"] if memory == "malloc" else []), notes="notifs")


C_EXPECTED = {
    "where": 1, "register": 0, "register_batch": 0, "overlap": -7, "open": 1,
    "open_unknown": -1, "open_unreachable": -1, "transport": 1,
    "submit_1": 0, "submit_2": 0, "too_many": 2, "completed": 4, "bytes": K64,
    "task_out_of_range": 1, "free": 0, "free_again": 1,
    "read": 0, "read_completed": 4, "read_same": 1,
    "heap_write": 0, "heap_completed": 1, "mixed": 0, "mixed_completed": 2, "mixed_same": 1,
    "notify_submit": 0, "notify_completed": 1, "gen_notify": 0,
    "notify_binary": 0, "notify_binary_completed": 1, "gen_binary": 0, "gen_unknown_segment": -1,
    "gen_no_engine": -1, "notify_after_failure": 0, "notify_after_failure_state": 0,
    "unregistered_source": 3, "unknown_segment": 1, "bad_opcode": 1, "past_the_region": 0,
    "past_the_region_state": 0, "forged_batch": 1, "no_meaning": 1, "no_notifs": 1,
    "unregister": 0, "unregister_again": -3,
}


def prototypes(include_dir, tmp_path):
    """{function: its prototype as gcc prints it (-aux-info)} for transfer_engine_c.h of
    include_dir: every function the header declares, with the types it names spelled out."""
    src, aux = tmp_path / "te_protos.c", tmp_path / "te_protos.aux"
    src.write_text('#include "transfer_engine_c.h"\n')
    subprocess.run(["gcc", "-std=gnu11", "-I", include_dir, "-aux-info", str(aux), "-c",
                    str(src), "-o", os.devnull], check=True, capture_output=True)
    out = {}
    for line in aux.read_text().splitlines():
        m = re.match(r"/\* (\S+):\d+:\w+ \*/ (.*);$", line)
        if m and os.path.basename(m.group(1)) == "transfer_engine_c.h":
            out[re.search(r"(\w+) \(", m.group(2)).group(1)] = m.group(2)
    return out


def test_the_header_declares_what_mooncakes_declares(tmp_path):
    """client/te/transfer_engine_c.h against Mooncake's (tests/te/mooncake): the same functions,
    each with the same prototype; te_mooncake_abi.c (built and run by ctest) compares the
    types, constants and struct layouts those prototypes name, and compiles here too."""
    theirs = prototypes(os.path.join(conftest.ROOT, "tests", "te", "mooncake"), tmp_path)
    ours = prototypes(os.path.join(conftest.ROOT, "client", "te"), tmp_path)
    assert len(theirs) == 27 and "getNicLoadStats" in theirs
    assert sorted(ours) == sorted(theirs)
    assert {f: p for f, p in ours.items() if theirs[f] != p} == {}
    assert theirs["enableGracefulShutdown"] == "extern void enableGracefulShutdown " \
        "(transfer_engine_t)"
    abi = tmp_path / "te_mooncake_abi"
    run = subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o", str(abi),
                          "-I", os.path.join(conftest.ROOT, "client", "te"),
                          os.path.join(conftest.ROOT, "tests", "te", "te_mooncake_abi.c")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert subprocess.run([str(abi)], capture_output=True).returncode == 0


def pattern(n, start=0):
    return bytes(((start + i) * 7 + 3) & 0xff for i in range(n))


@pytest.mark.parametrize("transport,memory", [("tcp", "memfd"), ("rdma", "memfd"),
                                              ("tcp", "malloc"), ("rdma", "malloc")])
def test_c_target_and_initiator(make_daemon, target, transport, memory):
    a, b = pair(make_daemon, *(["--ibverbs-lib", EMU] if transport == "rdma" else []))
    t = c_target(target, b, memory=memory)
    run = subprocess.run([HARNESS, LIB, "initiator", t.session, str(t.address)], env=env_for(a),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    polls = got.pop("polls")
    assert got == C_EXPECTED, run.stderr
    # what landed: four 64 KiB writes from two submits, the heap's bytes, the notified write
    assert t.dump(0, 4 * K64) == pattern(4 * K64)
    assert t.dump(5 * K64, K64) == b"\x5a" * K64
    assert t.dump(6 * K64, 4096) == pattern(4096)
    assert t.dump(7 * K64, 4096) == pattern(4096)
    # bytes that are not UTF-8 arrive as they were sent (here, a byte per \u00XX)
    assert t.notifications() == [["kv-7", "written"], ["gen", "hello"],
                                 ["bin", "\x80\x04\x95pickle\xff\x01."],
                                 ["\xc3\x28", "\xfe\xff text"]]
    # each failure names its cause
    assert 'genNotifyInEngine: no "host:port" segment opened with id 99' in run.stderr
    assert "genNotifyInEngine: no engine (NULL" in run.stderr
    assert "submitTransferWithNotify: the notification to 127.0.0.1:" in run.stderr and \
        "was not sent: a transfer of its batch failed" in run.stderr, run.stderr
    # statuses came from the snapshot the Wait streams keep: not one GetBatch for the polls
    assert polls >= 15
    assert a.metric("moongate_grpc_started_total", grpc_service="moongate.v1.Transfer",
                    grpc_method="GetBatch") == 0
    assert a.metric("moongate_grpc_started_total", grpc_service="moongate.v1.Transfer",
                    grpc_method="Wait") == 0  # each submit is one call
    # the refusals were said, with what was wrong
    assert "submitTransfer: entry 0: [0x" in run.stderr and \
        "lies in no region this engine registered" in run.stderr, run.stderr
    # a range past the target's region: the daemon's refusal fails the task, said by name
    assert "runs past the end of agent at port" in run.stderr, run.stderr
    assert "no segment opened with id 99" in run.stderr, run.stderr
    assert "entry 0: opcode 7 is neither OPCODE_READ (0) nor OPCODE_WRITE (1)" in run.stderr
    assert "entry 0: no segment opened with id 1\n" not in run.stderr, run.stderr
    # an engine whose host has no daemon answering: named by the port asked for (9)
    assert 'segment "127.0.0.2:9": the engine at port 9 of 127.0.0.2 cannot be reached: the ' \
        "daemon of 127.0.0.2 does not answer" in run.stderr, run.stderr
    assert "4 more tasks" not in run.stderr and "1 more tasks in a batch of 4" in run.stderr
    if memory == "malloc":  # the target's process memory: over TCP, whatever the devices
        assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write",
                        transport="tcp") >= 4 * K64
        assert not a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default",
                            op="write", transport="rdma")
        assert b.metric("moongate_process_vm_bytes_total", op="write") >= 4 * K64
        assert "peers read and write it over TCP" in t.close()
        return
    if transport == "rdma":
        assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write",
                        transport="rdma") >= 4 * K64
    assert "registered by descriptor" in t.close()


@pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer build's "
                    "libmgclient without reports from grpcio's own threads")
@pytest.mark.parametrize("path", ["rdma-dmabuf", "staged"])
def test_device_memory_through_the_c_door(make_daemon, target, children, path):
    """registerLocalMemory of device pointers (the CUDA driver emulator's): a C target's device
    memory, registered with location "*" as TensorRT-LLM's and NIXL's Mooncake backends register
    theirs, is found by the driver (no host mapping holds it); a C initiator's device memory
    ("cuda:0") WRITEs into it and READs it back, device to device: by dma-buf over RDMA where
    both daemons have devices (the verbs emulator), else staged over TCP by each process's copy
    thread. Python's door and C's reach each other's device memory both ways. On a daemon
    without RDMA devices or a TCP data plane, no peer can reach it: it is registered staged for
    the process's own transfers, and the log says so."""
    a, b = pair(make_daemon, *(["--ibverbs-lib", EMU] if path == "rdma-dmabuf" else []))
    size = 256 * 1024 if path == "rdma-dmabuf" else 3 * MiB + 4096

    def c_device(t):
        run = subprocess.run([HARNESS, LIB, "device", t.session, str(t.address), str(size)],
                             env=gpu_env(a), capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout) == {"register": 0, "write": 1, "read": 1, "same": 1,
                                          "unregister": 0}, run.stderr
        assert bytes.fromhex(t.ask("dump 0 %d" % size)) == pattern(size)

    t = target(b, [HARNESS, LIB, "target", str(size), "device"], notes="notifs", env=gpu_env(b))
    c_device(t)
    moved, never = ("rdma", "tcp") if path == "rdma-dmabuf" else ("tcp", "rdma")
    assert a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write",
                    transport=moved) >= size
    assert not a.metric("moongate_peer_bytes_total", peer=b.h2c, tenant="default", op="write",
                        transport=never)
    run = subprocess.run([sys.executable, os.path.join(HERE, "mooncake", "gpu.py"), "initiator",
                          "127.0.0.1", t.session, str(t.address), str(size)],
                         env=gpu_env(a), text=True, capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"register": 0, "kind": "device", "write": 0, "read": 0,
                                      "same": True}, run.stderr
    assert ("registered by its dma-buf" if path == "rdma-dmabuf" else
            "registered staged instead: peers reach it over TCP") in t.close()
    c_device(children(GpuTarget, b, size))  # the Python door's device memory as the target
    if path == "staged":
        return
    plain = make_daemon("--data-listen", "")  # no RDMA devices, no TCP data plane: no peer
    run = subprocess.run([HARNESS, LIB, "target", str(size), "device"], env=gpu_env(plain),
                         capture_output=True, text=True, timeout=300, input="")
    assert run.returncode == 0, run.stderr
    assert "registered staged instead: for this process's transfers only (no TCP data plane " \
        "for peers on this daemon)" in run.stderr, run.stderr


@pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer build's "
                    "libmgclient without reports from grpcio's own threads")
def test_pinned_memory_is_a_target_and_a_lost_device_pointer_is_named(make_daemon, target):
    """Through the C door: page-locked host memory from the CUDA driver (cuMemHostAlloc, what
    cudaHostAlloc makes), registered with location "*", is process memory, a peer's target; a C
    initiator WRITEs into it from device memory and READs it back. A device pointer the driver
    no longer knows (freed) is refused at registration (-1), the log naming both ways tried."""
    a, b = pair(make_daemon)
    size = MiB + 4096
    t = target(b, [HARNESS, LIB, "target", str(size), "pinned"], notes="notifs", env=gpu_env(b))
    run = subprocess.run([HARNESS, LIB, "device", t.session, str(t.address), str(size)],
                         env=gpu_env(a), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"register": 0, "write": 1, "read": 1, "same": 1,
                                      "unregister": 0}, run.stderr
    assert bytes.fromhex(t.ask("dump 0 %d" % size)) == pattern(size)
    assert not b.metric("moongate_staged_bytes_total", op="write")  # no device copy there
    assert "memory of no shared file is process memory" in t.close()
    run = subprocess.run([HARNESS, LIB, "target", str(MiB), "freed"], env=gpu_env(b),
                         input="quit\n", capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == "", run.stdout
    assert "neither memory of this process nor device memory the CUDA driver knows" in \
        run.stderr and "the CUDA driver does not know it as device memory" in run.stderr, \
        run.stderr


def polls(d, n, batch, **env):
    """te_harness polls: n copies of 8 KiB on daemon d, `batch` tasks a submit, each polled in
    a tight loop from C while a thread spins beside it."""
    run = subprocess.run([HARNESS, LIB, "polls", str(n), "8192", str(batch)],
                         env=dict(env_for(d), **env), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_memory_a_transfer_holds_stays_registered(make_daemon, target):
    """unregisterLocalMemory of a buffer a submitted WRITE still uses (its peer's daemon frozen)
    returns -1 and leaves it registered (-1 again, not -3); once the WRITE ended it goes (0, then
    -3). te_harness `held` waits for a line from the test between steps."""
    import signal
    a, b = pair(make_daemon)
    t = c_target(target, b)
    p = subprocess.Popen([HARNESS, LIB, "held", t.session, str(t.address)], env=env_for(a),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)

    def step(line=None):
        if line is not None:
            p.stdin.write(line + "\n")
            p.stdin.flush()
        got = p.stdout.readline().split()
        assert got, p.communicate(timeout=60)[1]
        return got

    try:
        assert step() == ["ready", "0"]
        b.signal(signal.SIGSTOP)
        try:
            assert step("frozen") == ["submitted", "0"]
            with mg.Client("unix:" + a.sock) as c:  # the batch took its hold on the memory
                deadline = time.monotonic() + 120
                while not any(s.holders for s in c.segments()):
                    if time.monotonic() > deadline:
                        p.kill()
                        raise AssertionError("no hold came; the engine's log: %s; daemon a's: %s"
                                             % (p.communicate(timeout=60)[1][-3000:],
                                                a.read_log()[-3000:]))
                    time.sleep(0.01)
            assert step("held") == ["held", "-1", "-1"]
        finally:
            b.signal(signal.SIGCONT)
        assert step("resumed") == ["after", "1", "0", "-3"]
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    assert t.dump(0, 4096) == b"\x6b" * 4096


def test_a_poll_straddling_the_publish_of_a_status_is_never_torn(make_daemon):
    """getTransferStatus loads a task's status, then its bytes; the engine's thread stores the
    bytes, then the status. MG_TE_TEST_STRADDLE=1 (test only) makes every terminal status wait
    to be published until a poll stands between its two loads, and that poll wait for the
    publish: each of the 1000 tasks is polled across its publish (straddled: the poll saw the
    task not yet ended with all its bytes), and none reads COMPLETED with another count. With
    the two loads the other way round nearly every one of them is torn (COMPLETED, 0 bytes)."""
    got = polls(make_daemon(), 1000, 1, MG_TE_TEST_STRADDLE="1")
    assert (got["transfers"], got["completed"], got["torn"]) == (1000, 1000, 0), got
    assert got["straddled"] == 1000, got


def test_tight_polls_of_many_small_transfers_are_never_torn(make_daemon):
    """100,000 copies of 8 KiB (4 tasks a submit), each task polled in a tight loop while a
    thread spins beside the polls: not one COMPLETED with a count other than 8192 (with the
    loads the other way round, tens of them were). Under ASan 20,000: the same loop, slower."""
    n = 20000 if conftest.sanitized() else 100000
    got = polls(make_daemon(), n, 4)
    assert (got["transfers"], got["completed"], got["torn"]) == (n, n, 0), got


@pytest.mark.parametrize("memory", ["memfd", "malloc"])
def test_python_initiator_against_a_c_target(make_daemon, target, memory):
    a, b = pair(make_daemon)
    t = c_target(target, b, memory=memory)
    run = subprocess.run([sys.executable, os.path.join(HERE, "mooncake", "initiator.py"),
                          t.session, str(t.address), str(t.address)],  # its one region
                         env=env_for(a), text=True,
                         capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == EXPECTED, run.stderr
    # bytes sent from Python arrive in C up to their first NUL: all a char * holds
    assert t.notifications() == [["req-1", "written"], ["req-2", "read"], ["req-3", "\x80\x04"]]


def test_a_c_engine_notifies_a_python_target_in_bytes(make_daemon, target):
    """genNotifyInEngine from C to a Python door's engine: text stays text, other bytes arrive
    as the bytes they were."""
    a, b = pair(make_daemon)
    t = target(b)
    for name, msg in ((b"gen", b"hello"), (b"bin", b"\x80\x04\x95pickle\xff\x01.")):
        run = subprocess.run([HARNESS, LIB, "notify", t.session, name.hex(), msg.hex()],
                             env=env_for(a), capture_output=True, text=True, timeout=60)
        assert run.stdout == "0\n", run.stderr
    assert t.notifications() == [["gen", "hello"],
                                 ["bin", {"bytes": "8004957069636b6c65ff012e"}]]


BOTH_DOORS = """
import ctypes, sys
from mooncake.engine import TransferEngine
py = TransferEngine()
assert py.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
te = ctypes.CDLL(sys.argv[1])
te.createTransferEngine.restype = ctypes.c_void_p
te.createTransferEngine.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                    ctypes.c_uint64, ctypes.c_int]
c = te.createTransferEngine(b"P2PHANDSHAKE", b"127.0.0.1", b"", 0, 1)
print("c engine" if c else "no c engine", py.get_rpc_port() > 0)
"""


@pytest.mark.skipif(conftest.tsan(), reason="python3 cannot host a ThreadSanitizer build of "
                    "the library (its runtime would have to come first, and grpcio's threads, "
                    "not instrumented, would then read as racing)")
def test_one_process_holds_an_engine_of_each_door(make_daemon):
    """The Python door and the C library name their engines apart: both initialize in one
    process (python3 loading the library with ctypes, as TensorRT-LLM's wrapper does)."""
    d = make_daemon()
    run = subprocess.run([sys.executable, "-c", BOTH_DOORS, LIB],
                         env=dict(env_for(d), **conftest.sanitizer_preload()), text=True,
                         capture_output=True, timeout=120)
    assert run.stdout.split() == ["c", "engine", "True"], run.stdout + run.stderr


def test_no_daemon_answers_null(tmp_path):
    env = dict(os.environ, MOONGATE_SOCKET=str(tmp_path / "none.sock"))
    run = subprocess.run([HARNESS, LIB, "initiator", "127.0.0.1:20000", "4096"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == "", run.stdout
    assert "moongate transfer_engine: no moongate daemon" in run.stderr, run.stderr
    assert str(tmp_path / "none.sock") in run.stderr


def test_malloc_memory_on_a_daemon_with_process_memory_off(make_daemon):
    """registerLocalMemory of malloc'd memory where the daemon has process memory off (the helm
    chart's default): -1 at registration, the setting named; never a failure later at a peer."""
    d = make_daemon("--process-memory=false")
    run = subprocess.run([HARNESS, LIB, "target", str(MiB), "malloc"], env=env_for(d),
                         input="quit\n", capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == "", run.stdout
    assert "registerLocalMemory(0x" in run.stderr and \
        "processMemory.enabled=false" in run.stderr, run.stderr


def test_the_token_file_reaches_the_daemon(make_daemon, tmp_path):
    """Python and C engines send the token of MOONGATE_TOKEN_FILE; without one the daemon
    refuses them (said, and -1 / NULL)."""
    import hashlib
    auth, token = tmp_path / "auth", tmp_path / "token"
    auth.write_text("token sha256:%s team-te\n" % hashlib.sha256(b"te-token-42").hexdigest())
    token.write_text("te-token-42\n")
    d = make_daemon("--allow-anonymous=false", "--auth-file", str(auth))
    env = dict(env_for(d), MOONGATE_TOKEN_FILE=str(token))
    py = ("from mooncake.engine import TransferEngine\ne = TransferEngine()\n"
          "print(e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', ''), "
          "bool(e.allocate_managed_buffer(4096)))")
    for env_ in (env, env_for(d)):
        run = subprocess.run([sys.executable, "-c", py], env=env_, capture_output=True,
                             text=True, timeout=60)
        assert run.stdout.strip() == ("0 True" if env_ is env else "-1 False"), run.stderr
    assert "refused the agent: UNAUTHENTICATED" in run.stderr, run.stderr
    with subprocess.Popen([HARNESS, LIB, "target", str(MiB)], env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        assert json.loads(p.stdout.readline())["address"] > 0
        p.stdin.write("quit\n")
    run = subprocess.run([HARNESS, LIB, "target", str(MiB)], env=env_for(d), input="quit\n",
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "refused the engine: no credentials" in run.stderr, run.stderr


def test_a_program_shaped_like_nixls_mooncake_plugin(certs, tmp_path):
    """As NIXL's Mooncake plugin runs (its own example: two agents in one process): an engine per
    agent, one on each of two daemons, openSegment both ways, WRITEs and READs both ways polled
    in tight loops, notifications both ways, the first a pickled message (bytes that are not
    UTF-8)."""
    started = []
    for attempt in range(5):  # a port taken meanwhile: both drawn again (each names the other's)
        b = conftest.Daemon(certs, str(tmp_path), ["--peer-tls=false"])
        a = conftest.Daemon(certs, str(tmp_path), ["--peer-tls=false", "--peer-port",
                                                    str(b.h2c_port)])
        b.args += ["--peer-port", str(a.h2c_port)]  # each reaches the other's engines
        try:
            for d in (a, b):
                started.append(d._start_once())
            break
        except RuntimeError as e:
            for d in started:
                d.kill()
            started = []
            if "listen_failed" not in str(e) or attempt == 4:
                raise
    try:
        run = subprocess.run([HARNESS, LIB, "nixl", a.sock, b.sock], env=env_for(a),
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout) == {
            "register_a": 0, "register_b": 0, "open_both": 1, "write_ab": 1, "write_ba": 1,
            "landed_ab": 1, "read_ab": 1, "read_same": 1, "notify_ab": 0, "notify_ba": 0,
            "note_at_b": ["agent-a", "\x80\x04\x95pickled"], "note_at_a": ["agent-b", "ack"]}, \
            run.stderr
    finally:
        for d in started:
            assert d.stop() == 0, d.read_log()
