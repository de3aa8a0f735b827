"""The RDMA seam: libibverbs is opened at run time, never linked. With the software verbs
emulator (build/libmgverbs_emu.so, loaded through --ibverbs-lib like the real library) the
daemon finds its devices, reports them, and registers every segment with them (remote access
only for remote-accessible ones), deregistering on unregistration; a registration the device
refuses fails the segment with the reason and leaves nothing. Without the library, kernel
support or a device, TCP serves and the reason is reported; --require-rdma makes that a start-up
error. RDMA transfers themselves are not built yet: Info says so."""
import os
import subprocess

import grpc
import pytest

from conftest import BUILD, MGCTL, MOONGATE, h2c_channel
from moongate.v1 import (daemon_pb2, daemon_pb2_grpc, memory_pb2, memory_pb2_grpc, peer_pb2,
                         peer_pb2_grpc)

EMU = os.path.join(BUILD, "libmgverbs_emu.so")
MiB = 1 << 20


def rdma_info(d):
    with h2c_channel(d) as ch:
        info = daemon_pb2_grpc.DaemonStub(ch).Info(daemon_pb2.InfoRequest(), timeout=10)
    return [t for t in info.transports if t.name == "rdma"][0]


def test_the_daemon_does_not_link_libibverbs():
    out = subprocess.run(["readelf", "-d", MOONGATE], capture_output=True, text=True,
                         check=True).stdout
    needed = [line for line in out.splitlines() if "(NEEDED)" in line]
    assert needed and not [line for line in needed if "ibverbs" in line], needed


def test_devices_found_and_segments_registered_through_the_emulator(make_daemon):
    d = make_daemon("--ibverbs-lib", EMU)
    t = rdma_info(d)
    assert list(t.devices) == ["emu0 port 1 mtu 4096 roce gid ::ffff:127.0.0.1"]
    assert not t.available and "not implemented yet: TCP carries the bytes" in t.reason
    assert d.metric("moongate_rdma_devices") == 1
    assert d.metric("moongate_rdma_device", device="emu0", port="1", link="roce",
                    mtu="4096") == 1
    assert "event=rdma_device lib=%s device=emu0" % EMU in d.read_log()
    p = subprocess.run([MGCTL, "--target", "unix:" + d.sock, "info"], capture_output=True,
                       text=True, timeout=30)
    rc, out = p.returncode, p.stdout
    assert rc == 0 and "device emu0 port 1 mtu 4096 roce gid ::ffff:127.0.0.1" in out, out
    with h2c_channel(d) as ch:
        m = memory_pb2_grpc.MemoryStub(ch)
        shared = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="shared", size=8 * MiB, remote_accessible=True), timeout=10).segment
        private = m.RegisterSegment(memory_pb2.RegisterRequest(
            name="private", size=MiB), timeout=10).segment
        assert list(shared.transports) == ["tcp", "rdma"]
        assert list(private.transports) == []  # registered, but no remote access
        assert d.metric("moongate_rdma_memory_regions") == 2
        assert d.metric("moongate_rdma_registered_bytes") == 9 * MiB
        desc = peer_pb2_grpc.PeerStub(ch).DescribeTarget(
            peer_pb2.DescribeTargetRequest(id=shared.id), timeout=10)
        assert list(desc.transports) == ["tcp", "rdma"]
        m.UnregisterSegment(memory_pb2.UnregisterRequest(id=shared.id), timeout=10)
        assert d.metric("moongate_rdma_memory_regions") == 1
        assert d.metric("moongate_rdma_registered_bytes") == MiB


def test_a_registration_the_device_refuses_fails_whole(make_daemon, monkeypatch):
    monkeypatch.setenv("MG_VERBS_EMU_MEMLOCK", str(4 * MiB))  # pinning past it fails
    d = make_daemon("--ibverbs-lib", EMU)
    with h2c_channel(d) as ch:
        m = memory_pb2_grpc.MemoryStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            m.RegisterSegment(memory_pb2.RegisterRequest(name="big", size=8 * MiB), timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "RDMA registration: device emu0: ibv_reg_mr of 8388608 bytes" in \
            e.value.details() and "memlock" in e.value.details()
        assert list(m.ListSegments(memory_pb2.ListSegmentsRequest(), timeout=10).segments) == []
        assert os.listdir(d.shm) == []  # nothing left behind
        assert d.metric("moongate_rdma_registrations_failed_total") == 1
        assert d.metric("moongate_rdma_memory_regions") == 0
        small = m.RegisterSegment(memory_pb2.RegisterRequest(name="small", size=MiB),
                                  timeout=10).segment  # the daemon serves on
        assert small.id


@pytest.mark.parametrize("env,args,reason", [
    ({}, ["--ibverbs-lib", "/nonexistent/libibverbs.so.1"],
     "cannot load /nonexistent/libibverbs.so.1"),
    ({"MG_VERBS_EMU_DEVICES": ""}, ["--ibverbs-lib", EMU], "no RDMA devices"),
    ({"MG_VERBS_EMU_PORT_DOWN": "emu0"}, ["--ibverbs-lib", EMU],
     "no usable RDMA device: device emu0: no active port (of 1)"),
    ({"MG_VERBS_EMU_DEVICES": "emu0,emu1"}, ["--ibverbs-lib", EMU, "--rdma-devices", "emu7"],
     "device emu7 (--rdma-devices) not found"),
    ({}, ["--ibverbs-lib", EMU, "--rdma-gid-index", "9"],
     "device emu0: no GID at index 9 (--rdma-gid-index; the port has 4)"),
    ({}, ["--ibverbs-lib", ""], "RDMA is off"),
])
def test_without_rdma_tcp_serves_and_says_why(make_daemon, monkeypatch, env, args, reason):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    d = make_daemon(*args)
    t = rdma_info(d)
    assert not t.available and list(t.devices) == [] and reason in t.reason, t
    assert d.metric("moongate_rdma_devices") == 0
    said = [line for line in d.read_log().splitlines() if "event=rdma_unavailable" in line]
    assert len(said) == 1 and reason in said[0] and said[0].endswith("transport=tcp"), said
    with h2c_channel(d) as ch:  # segments work, over TCP only
        seg = memory_pb2_grpc.MemoryStub(ch).RegisterSegment(memory_pb2.RegisterRequest(
            name="s", size=MiB, remote_accessible=True), timeout=10).segment
        assert list(seg.transports) == ["tcp"]


def test_pinned_devices(make_daemon, monkeypatch):
    monkeypatch.setenv("MG_VERBS_EMU_DEVICES", "emu0,emu1,emu2")
    d = make_daemon("--ibverbs-lib", EMU, "--rdma-devices", "emu2,emu0")
    assert [x.split()[0] for x in rdma_info(d).devices] == ["emu0", "emu2"]
    with h2c_channel(d) as ch:
        memory_pb2_grpc.MemoryStub(ch).RegisterSegment(memory_pb2.RegisterRequest(
            name="s", size=MiB), timeout=10)
    assert d.metric("moongate_rdma_memory_regions") == 1  # one registration, on both devices


def test_require_rdma(make_daemon, tmp_path):
    args = [MOONGATE, "--listen", "", "--h2c-listen", "127.0.0.1:0", "--ops-listen", "",
            "--unix-socket", "", "--shm-dir", str(tmp_path / "shm"), "--pool-bytes", "0",
            "--require-rdma", "--ibverbs-lib", "/nonexistent/libibverbs.so.1"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=20)
    assert p.returncode == 1
    assert 'event=rdma_required reason="cannot load /nonexistent/libibverbs.so.1' in \
        p.stdout + p.stderr
    d = make_daemon("--require-rdma", "--ibverbs-lib", EMU)  # with a device it starts
    assert rdma_info(d).devices
