"""A process with GPU memory (the CUDA driver emulator's, loaded as libcuda would be) for the GPU
tests: it allocates SIZE bytes of device memory, names itself an agent, registers the memory by
its dma-buf (Client.register_vram), says where it is (one JSON line), then obeys stdin:

  dump OFF LEN          the device bytes there, in hex (cuMemcpyDtoH)
  fill OFF HEX          writes them (cuMemcpyHtoD)
  put AGENT ADDR LEN    WRITEs its device memory's first LEN bytes to ADDR of AGENT
  get AGENT ADDR LEN    READs them from there into its device memory
  read ID               ReadSegment of its registration (refused: GPU memory)
  copy SEG LEN          a copy on this daemon from its device memory to segment SEG (refused)
  move W|R OFF LEN PEER TARGET PATH CHUNK [TIMEOUT]
                        Client.move_vram of its device memory [OFF, OFF + LEN) to (W) or from
                        (R) TARGET — a segment id of PEER ("-": this daemon), or AGENT@ADDRESS
                        (an agent's "host:port" and an address in its process) — by PATH
                        (auto, staged, dmabuf), within TIMEOUT seconds: "ok JSON" (the
                        VramMove) or "err CODE MESSAGE"
  fillasync OFF HEX     queues that write on its stream (cuMemcpyHtoDAsync), not waiting
  quit

Usage: gpu_proc.py SOCKET NAME SIZE REMOTE(0|1|none|staged|any)   (NAME "-": no agent; REMOTE
none: the memory is not registered; staged: registered staged, Client.register_vram_staged;
any: Client.register_any, the JSON line saying its "kind" and "path" too; $MOONGATE_CUDA_LIB, $MOONGATE_CLIENT_LIB; GPU_PROC_STREAM=1: moves go
on the process's own CUDA stream, the one fillasync uses)
"""
import ctypes
import json
import os
import sys

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))
import moongate_client as mg  # noqa: E402


def main():
    sock, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cu = ctypes.CDLL(os.environ["MOONGATE_CUDA_LIB"])
    ctx, dptr = ctypes.c_void_p(), ctypes.c_uint64()
    assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0 and cu.cuMemAlloc_v2(ctypes.byref(dptr), size) == 0
    d = dptr.value
    stream, pending = ctypes.c_void_p(), []
    assert cu.cuStreamCreate(ctypes.byref(stream), 0) == 0
    on_stream = os.environ.get("GPU_PROC_STREAM") == "1"
    c = mg.Client("unix:" + sock)
    port = c.register_agent(name).port if name != "-" else 0  # "-": no agent
    segs, said = [], {}
    if sys.argv[4] == "any":
        r = c.register_any(d, size)
        segs, said = r.segments, {"kind": r.kind, "path": r.path}
    elif sys.argv[4] == "staged":
        segs = [c.register_vram_staged(d, size)]
    elif sys.argv[4] != "none":
        segs = c.register_vram(d, size, remote_accessible=sys.argv[4] == "1")
    print(json.dumps({"port": port, "address": d, "segments": [s.id for s in segs],
                      "source": segs[0].source if segs else 0,
                      "location": segs[0].location if segs else "",
                      "transports": list(segs[0].transports) if segs else [], **said}),
          flush=True)
    for line in sys.stdin:
        cmd = line.split()
        try:
            if cmd[0] == "dump":
                buf = ctypes.create_string_buffer(int(cmd[2]))
                assert cu.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(d + int(cmd[1])),
                                          ctypes.c_size_t(int(cmd[2]))) == 0
                print(buf.raw.hex(), flush=True)
            elif cmd[0] == "fill":
                data = bytes.fromhex(cmd[2])
                assert cu.cuMemcpyHtoD_v2(ctypes.c_uint64(d + int(cmd[1])), data,
                                          ctypes.c_size_t(len(data))) == 0
                print("ok", flush=True)
            elif cmd[0] in ("put", "get"):
                op = mg.write if cmd[0] == "put" else mg.read
                b = c.transfer([op(address=d, agent=cmd[1], remote_address=int(cmd[2]),
                                   length=int(cmd[3]))])
                print("ok " + b.requests[0].transport, flush=True)
            elif cmd[0] == "read":
                try:
                    list(c.memory.ReadSegment(mg.memory_pb2.ReadSegmentRequest(id=int(cmd[1])),
                                              timeout=30))
                    print("ok", flush=True)
                except grpc.RpcError as e:
                    print("err %s %s" % (e.code().name, e.details()), flush=True)
            elif cmd[0] == "copy":
                c.transfer([mg.write(address=d, peer="", remote_segment=int(cmd[1]),
                                     length=int(cmd[2]))])
                print("ok", flush=True)
            elif cmd[0] == "fillasync":
                pending.append(bytes.fromhex(cmd[2]))  # alive until the copy ran
                assert cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(d + int(cmd[1])), pending[-1],
                                               ctypes.c_size_t(len(pending[-1])), stream) == 0
                print("ok", flush=True)
            elif cmd[0] == "move":
                agent, _, addr = cmd[5].rpartition("@")
                target = dict(remote_agent=agent, remote_address=int(addr)) if agent else \
                    dict(remote_segment=int(addr))
                m = c.move_vram(cmd[1] == "W", d + int(cmd[2]), int(cmd[3]),
                                peer="" if cmd[4] == "-" else cmd[4], path=cmd[6],
                                chunk=int(cmd[7]), timeout=float(cmd[8]) if cmd[8:] else None,
                                stream=stream.value if on_stream else 0, **target)
                print("ok " + json.dumps(m._asdict()), flush=True)
            elif cmd[0] == "quit":
                break
        except mg.Error as e:
            print("err %s %s" % (e.code.name, e.message), flush=True)


if __name__ == "__main__":
    main()
