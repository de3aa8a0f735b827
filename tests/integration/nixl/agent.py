"""A NIXL agent process as vLLM's NixlConnector drives one (`from nixl._api import nixl_agent`,
moongate's shim first on PYTHONPATH), on the daemon of $MOONGATE_SOCKET.

  agent.py NAME REGIONS BLOCKS BLOCK_LEN [VRAM]
      imports what vLLM imports, makes nixl_agent(NAME, nixl_agent_config(backends=["UCX"],
      capture_telemetry=True)), allocates REGIONS NumPy arrays of BLOCKS x BLOCK_LEN bytes
      (as a layer's K and V caches; with VRAM, device memory of the CUDA driver,
      $MOONGATE_CUDA_LIB), registers them (get_reg_descs of 4-tuples, register_memory),
      prepares its own blocks region-major ("NIXL_INIT_AGENT"; with $NIXL_TEST_LISTEN_PORT,
      its metadata listener on that port) and says
      {"metadata" (base64), "bases", "blocks", "block_len"} in one JSON line; then obeys lines:
        add META BASES BLOCKS BLOCK_LEN   add_remote_agent, then its blocks prepared as vLLM's
                                          handshake does (Nx3 array): {"name"}
        prep NAME BASES BLOCKS BLOCK_LEN  the blocks of an agent known already (through the
                                          metadata listener) prepared: {"name"}
        fill SEED IDS                      fills local blocks IDS (JSON list) with a pattern
        digest IDS                         {"digest"} of local blocks IDS, in that order
        move OP NAME REQ LOCAL REMOTE      make_prepped_xfer(OP, local, LOCAL, remote of NAME,
                                           REMOTE (compact JSON lists, given as int64 arrays),
                                           notif "REQ:1"), transfer,
                                           check_xfer_state until DONE; telemetry, release:
                                           {"state", "bytes", "descs", "post_us", "xfer_us"} or
                                           {"error": class name, "message"}
        notifs [N]                         get_new_notifs until N messages came (within 30 s;
                                           default 0: at once): {name: [messages]}
        call METHOD ARGS                   agent.METHOD(*ARGS) (JSON list; "h:local"/"h:NAME"
                                           for a prepared handle): {"ok"} or {"error", "message"}
        quit
"""
import base64
import ctypes
import hashlib
import json
import os
import sys
import time

import numpy as np

from nixl._api import nixl_agent as NixlWrapper  # vLLM's import block
from nixl._bindings import nixlXferTelemetry  # noqa: F401
from nixl._api import nixl_agent_config
from nixl import (DEFAULT_COMM_PORT, nixl_agent, nixl_backend_handle,  # the package's exports
                  nixl_prepped_dlist_handle, nixl_thread_sync_t, nixl_xfer_handle)

assert DEFAULT_COMM_PORT == 8888 and nixl_agent is NixlWrapper and nixl_backend_handle is int
assert nixl_prepped_dlist_handle and nixl_xfer_handle and nixl_thread_sync_t.NIXL_THREAD_SYNC_RW


class Vram:
    """Device memory of the CUDA driver, read and written with its copies."""

    def __init__(self, size):
        self.cu = ctypes.CDLL(os.environ.get("MOONGATE_CUDA_LIB") or "libcuda.so.1")
        ctx, d = ctypes.c_void_p(), ctypes.c_uint64()
        assert self.cu.cuInit(0) == 0
        assert self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        assert self.cu.cuCtxSetCurrent(ctx) == 0
        assert self.cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(size)) == 0
        self.base = d.value

    def get(self, off, n):
        buf = ctypes.create_string_buffer(n)
        assert self.cu.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(self.base + off),
                                       ctypes.c_size_t(n)) == 0
        return buf.raw

    def put(self, off, data):
        assert self.cu.cuMemcpyHtoD_v2(ctypes.c_uint64(self.base + off), data,
                                       ctypes.c_size_t(len(data))) == 0


def main():
    name, nreg, nblocks, blen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    kind = "VRAM" if sys.argv[5:] == ["VRAM"] else "DRAM"
    listen = int(os.environ.get("NIXL_TEST_LISTEN_PORT", "0"))
    agent = NixlWrapper(name, nixl_agent_config(backends=["UCX"], capture_telemetry=True,
                                                enable_listen_thread=bool(listen),
                                                listen_port=listen))
    if kind == "VRAM":
        mem = [Vram(nblocks * blen) for _ in range(nreg)]
        bases = [m.base for m in mem]
    else:
        mem = [np.zeros(nblocks * blen, dtype=np.uint8) for _ in range(nreg)]
        bases = [int(m.ctypes.data) for m in mem]
    descs = agent.get_reg_descs([(b, nblocks * blen, 0, "") for b in bases], kind)
    agent.register_memory(descs, backends=["UCX"])
    blocks = [(b + i * blen, blen, 0) for b in bases for i in range(nblocks)]
    handles = {"local": agent.prep_xfer_dlist("NIXL_INIT_AGENT",
                                              agent.get_xfer_descs(blocks, kind))}
    names = {}
    print(json.dumps({"metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
                      "bases": bases, "blocks": nblocks, "block_len": blen}), flush=True)

    def get(i):
        m, off = mem[i // nblocks], (i % nblocks) * blen
        return m.get(off, blen) if kind == "VRAM" else m[off:off + blen].tobytes()

    def put(i, data):
        m, off = mem[i // nblocks], (i % nblocks) * blen
        if kind == "VRAM":
            m.put(off, data)
        else:
            m[off:off + blen] = np.frombuffer(data, np.uint8)

    def handle(h):
        return handles[h[2:]] if isinstance(h, str) and h.startswith("h:") else h

    for line in sys.stdin:
        cmd = line.rstrip("\n").split(" ", 1)
        rest = cmd[1] if len(cmd) > 1 else ""
        try:
            if cmd[0] in ("add", "prep"):
                meta, rbases, rn, rl = rest.split()
                rname = agent.add_remote_agent(base64.b64decode(meta)) if cmd[0] == "add" \
                    else meta.encode()
                rb, rn, rl = json.loads(rbases), int(rn), int(rl)
                arr = np.array([(b + i * rl, rl, 0) for b in rb for i in range(rn)],
                               dtype=np.uint64)
                handles[rname.decode()] = agent.prep_xfer_dlist(
                    rname, agent.get_xfer_descs(arr, kind))
                names[rname.decode()] = rname
                out = {"name": rname.decode(), "bytes": isinstance(rname, bytes)}
            elif cmd[0] == "fill":
                seed, ids = rest.split(" ", 1)
                for i in json.loads(ids):
                    put(i, (hashlib.sha256(b"%s:%d" % (seed.encode(), i)).digest() *
                            (blen // 32 + 1))[:blen])
                out = {"ok": True}
            elif cmd[0] == "digest":
                h = hashlib.sha256()
                for i in json.loads(rest):
                    h.update(get(i))
                out = {"digest": h.hexdigest()}
            elif cmd[0] == "move":
                op, rname, req, lids, rids = rest.split(" ", 4)
                lids, rids = json.loads(lids), json.loads(rids)
                x = agent.make_prepped_xfer(op, handles["local"], np.array(lids, dtype=np.int64),
                                            handles[rname], np.array(rids, dtype=np.int64),
                                            notif_msg=("%s:1" % req).encode())
                agent.transfer(x)
                while (state := agent.check_xfer_state(x)) == "PROC":
                    pass
                t = agent.get_xfer_telemetry(x)
                agent.release_xfer_handle(x)
                out = {"state": state, "bytes": t.totalBytes, "descs": t.descCount,
                       "post_us": t.postDuration, "xfer_us": t.xferDuration}
            elif cmd[0] == "notifs":
                want, out, end = int(rest or 0), {}, time.monotonic() + 30
                while True:
                    for k, v in agent.get_new_notifs().items():
                        out.setdefault(k, []).extend(m.decode() for m in v)
                    if sum(map(len, out.values())) >= want or time.monotonic() > end:
                        break
                    time.sleep(0.01)
            elif cmd[0] == "call":
                method, args = rest.split(" ", 1)
                got = getattr(agent, method)(*[handle(a) for a in json.loads(args)])
                out = {"ok": repr(got)}
            elif cmd[0] == "quit":
                break
            else:
                out = {"error": "usage", "message": line}
        except Exception as e:  # noqa: BLE001 (the test reads what was raised)
            out = {"error": type(e).__name__, "message": str(e)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
