"""Mooncake's Transfer Engine, Python API (mooncake.engine.TransferEngine), on moongate.

Code written for Mooncake runs unchanged with this directory first on PYTHONPATH:

    export PYTHONPATH=$(python3 -m moongate.compat.mooncake --pythonpath)
    from mooncake.engine import TransferEngine        # this module, under Mooncake's name

or imports it by its own name: `from moongate.compat.mooncake import TransferEngine`.

The methods, arguments and return codes are Mooncake's (docs/migrating.md lists each and what
differs). An engine is an agent of this process on the node's moongate daemon, found through
MOONGATE_SOCKET (default /run/moongate/moongate.sock) with the token of MOONGATE_TOKEN or of the
file MOONGATE_TOKEN_FILE, if the daemon asks for one. Its name, "host:port", is what peers pass as
target_hostname: host is local_hostname's, port the agent's (get_rpc_port). Remote addresses are
addresses in the target process, as with Mooncake. Calls that wait release the GIL (grpcio does);
a synchronous transfer ends within MC_TRANSFER_TIMEOUT seconds (30, at least 5) plus 1 ns per
byte, as Mooncake's.

Memory: allocate_managed_buffer memory is a memfd this library maps and the daemon registers by
descriptor: peers may read and write it and RDMA reaches it. register_memory of memory the caller
mapped from a shared file (a memfd it keeps open, a /dev/shm file) registers that file by
descriptor too; of any other memory (malloc'd, an anonymous mmap, a bytearray, a NumPy array) as
process memory, remote-accessible: the daemon reads and writes it with process_vm, and peers
read and write it over TCP (never RDMA). It says which once, and memory_kind(addr) tells.
"""
import base64
import ctypes
import enum
import itertools
import json
import logging
import os
import socket
import stat
import sys
import threading

import grpc

from moongate import client as mg
from moongate.v1 import transfer_pb2

log = logging.getLogger("moongate.compat.mooncake")

P2PHANDSHAKE = "P2PHANDSHAKE"
ERR_INVALID_ARGUMENT = -1
ERR_ADDRESS_NOT_REGISTERED = -3
ERR_ADDRESS_OVERLAPPED = -7
_PAGE = 4096
_names = itertools.count(1)
_said = set()
_said_lock = threading.Lock()


def say_once(key, level, fmt, *args):
    """Logs a message the first time `key` is seen in this process."""
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.log(level, fmt, *args)


def shared_file_of(addr, size):
    """(fd, offset) of the shared file mapping [addr, addr + size) lies in — a memfd this process
    keeps open, a /dev/shm or hugetlbfs file — opened again for reading and writing; None when the
    range is not inside one such mapping or its file cannot be opened (the caller closes fd)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if not lo <= addr < hi:
                continue
            if addr + size > hi or not parts[1].startswith("rw") or parts[1][3] != "s" or \
                    parts[4] == "0":
                return None
            major, minor = (int(x, 16) for x in parts[3].split(":"))
            path = parts[5].strip() if len(parts) > 5 else ""
            fd = _open_file(os.makedev(major, minor), int(parts[4]), path, lo, hi)
            return None if fd is None else (fd, int(parts[2], 16) + addr - lo)
    return None


def _open_file(dev, ino, path, lo, hi):
    """The mapped file opened again: by a descriptor this process holds, by its path, or by
    /proc/self/map_files where the kernel allows it."""
    tries = ["/proc/self/fd/" + n for n in os.listdir("/proc/self/fd")]
    if path.startswith("/") and not path.endswith(" (deleted)"):
        tries.append(path)
    tries.append("/proc/self/map_files/%x-%x" % (lo, hi))
    for p in tries:
        try:
            st = os.stat(p)
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == (dev, ino):
                return os.open(p, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
    return None


# What Mooncake's mooncake.engine says of its build, for code that reads it at import: this
# module has no EFA, HIP, MNNVL or intra-node NVLink transport (the daemon chooses RDMA or TCP),
# and it has what Mooncake's CUDA builds have: device pointers and the *_on_cuda methods (the
# CUDA driver loaded at run time, when a call needs it).
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_CUDA = True

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_cuda = None


def _cuda_driver():
    """The CUDA driver ($MOONGATE_CUDA_LIB, else libcuda.so.1), loaded by the first call that
    needs it; RuntimeError naming the dlopen error."""
    global _cuda
    if _cuda is None:
        path = os.environ.get("MOONGATE_CUDA_LIB") or "libcuda.so.1"
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise RuntimeError("the CUDA driver (%s): %s" % (path, e))
        lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, _HOST_FN, ctypes.c_void_p]
        lib.cuLaunchHostFunc.restype = ctypes.c_int
        _cuda = lib
    return _cuda


class TransferOpcode(enum.IntEnum):
    Read = 0
    Write = 1


Read, Write = TransferOpcode.Read, TransferOpcode.Write  # module-level too, as Mooncake's


class TransferNotify:
    """A notification: `name` and `msg`, as the sender gave them."""

    def __init__(self, name="", msg=""):
        self.name, self.msg = name, msg

    def __eq__(self, other):
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name,
                                                                                 other.msg)

    def __repr__(self):
        return "TransferNotify(name=%r, msg=%r)" % (self.name, self.msg)


def note_payload(name, msg):
    """A notification's payload, as libtransfer_engine.so writes it: JSON {"name", "msg"}, each a
    string when it is text (str), else its bytes in base64 as "name_b64" / "msg_b64" — so
    that bytes of any value, NUL included, arrive as they were sent."""
    d = {}
    for key, v in (("name", name), ("msg", msg)):
        if isinstance(v, (bytes, bytearray, memoryview)):
            d[key + "_b64"] = base64.b64encode(bytes(v)).decode()
        else:
            d[key] = str(v)
    return json.dumps(d).encode()


def note_of_payload(payload):
    """(name, msg) of a payload note_payload() made (or libtransfer_engine.so): str for text,
    bytes for what was sent as bytes. Raises ValueError or KeyError for another payload."""
    d = json.loads(payload)
    out = []
    for key in ("name", "msg"):
        if key in d:
            out.append(str(d[key]))
        else:
            out.append(base64.b64decode(d[key + "_b64"], validate=True))
    return out


def transfer_timeout_s():
    """Mooncake's MC_TRANSFER_TIMEOUT: seconds, at least 5, default 30."""
    try:
        return max(5, int(os.environ.get("MC_TRANSFER_TIMEOUT", "30")))
    except ValueError:
        return 30


def split_host_port(name):
    """("host", port) of "host:port" or "[v6]:port"; port None when there is none."""
    if name.startswith("["):
        host, _, rest = name[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    host, sep, port = name.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        return host, int(port)
    return name, None


def notify_topic(port):
    """The daemon topic an engine's notifications arrive on: one per agent port."""
    return "mooncake.notify.%d" % port


# What register_memory says once for each kind of memory it registered.
SAID = {
    "process": "memory of no shared file is registered as process memory: the daemon reaches "
               "it with process_vm, and peers read and write it over TCP (never RDMA). Memory "
               "from allocate_managed_buffer, or mapped from a shared file (a memfd kept open, "
               "/dev/shm), is registered by descriptor and RDMA reaches it too.",
    "descriptor": "memory mapped from a shared file is registered by descriptor: peers may read "
                  "and write it, RDMA reaches it",
    "device": "GPU memory is registered by its dma-bufs: peers read and write it over RDMA "
              "(both daemons need RDMA devices)",
}


class TransferEngine:
    """Mooncake's TransferEngine on moongate: one agent of this process on its daemon."""

    TransferOpcode = TransferOpcode

    def __init__(self):
        self._c = None
        self._lock = threading.Lock()
        self._host, self._port, self._name = "", 0, ""
        self._managed = {}     # address -> mg.Buffer (allocate_managed_buffer)
        self._regions = {}     # address -> (size, segment ids (none: inside a managed buffer), kind)
        self._batches = {}     # async batch id -> "timeout" once it timed out, else None
        self._targets = set()  # target names a peer has answered for
        self._timeout_s = transfer_timeout_s()
        self._host_fns = []    # [callback, ran] of *_on_cuda calls: kept until they ran
        # A single synchronous transfer is posted on a submission ring (on the daemon's Unix
        # socket; MOONGATE_RING=0: never): one strided entry over two prepared lists, each a
        # whole region (this process's, keyed by address; a target's, by (target, address)).
        self._ring, self._ring_off = None, os.environ.get("MOONGATE_RING", "1") == "0"
        self._ring_lock = threading.Lock()
        self._ring_lists = {}
        self._ring_regions = {}  # target -> its regions [(address, length)], from DescribeAgent

    # setup
    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type):
        if self._c is not None:
            log.error("initialize: this engine is initialized already (%s)", self.session)
            return -1
        host, port = split_host_port(local_hostname or "")
        if metadata_server == P2PHANDSHAKE:
            port, name = 0, "mooncake-%d-%d" % (os.getpid(), next(_names))
        else:
            say_once("metadata", logging.INFO, "metadata server %r (%s) not needed: peers are "
                     "found through their daemons", metadata_server, metadata_type or "etcd")
            name = local_hostname
            if port is None:
                say_once("bare:" + name, logging.WARNING, "local_hostname %r has no port: peers "
                         "reach this engine as host:port with the port get_rpc_port() gives",
                         name)
        say_once("proto", logging.INFO, "protocol %r, devices %r: the daemon chooses the "
                 "transport (RDMA where both daemons have a device, else TCP)", protocol,
                 device_name)
        try:
            c = mg.Client(mg.default_target(), token=mg.default_token(),
                          timeout=self._timeout_s + 5)
        except (OSError, mg.Error) as e:
            log.error("initialize: %s", e)
            return -1
        try:
            info = c.register_agent(name, port or 0)
        except mg.Error as e:
            c.close()
            log.error("initialize: no moongate daemon answers at %s (MOONGATE_SOCKET): %s"
                      if e.code in (grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.DEADLINE_EXCEEDED) else
                      "initialize: the daemon at %s refused the agent: %s",
                      mg.default_target(), e)
            return -1
        self._c, self._name, self._port = c, name, info.port
        self._host = host or socket.gethostname()
        return 0

    @property
    def session(self):
        """This engine's name for peers: "host:port"."""
        host = "[%s]" % self._host if ":" in self._host else self._host
        return "%s:%d" % (host, self._port)

    def get_rpc_port(self):
        return self._port

    def close(self):
        """Frees the managed buffers, unregisters the memory and ends the agent (moongate's;
        Mooncake frees on destruction)."""
        c, self._c = self._c, None
        if c is None:
            return
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        for buf in self._managed.values():
            try:
                buf.free()
            except mg.Error as e:
                log.warning("close: %s", e)
        self._managed.clear()
        self._regions.clear()
        c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _ready(self, what):
        if self._c is None:
            log.error("%s: the engine is not initialized (initialize() failed or was not "
                      "called)", what)
            return False
        return True

    # memory
    def allocate_managed_buffer(self, length):
        if not self._ready("allocate_managed_buffer"):
            return 0
        size = max(_PAGE, -(-length // _PAGE) * _PAGE)
        try:
            buf = self._c.allocate_buffer(size, remote_accessible=True)
        except mg.Error as e:
            log.error("allocate_managed_buffer(%d): %s", length, e)
            return 0
        with self._lock:
            self._managed[buf.address] = buf
        return buf.address

    def free_managed_buffer(self, buffer_addr, length):
        with self._lock:
            buf = self._managed.pop(buffer_addr, None)
            for a in [a for a in self._regions
                      if buf and buf.address <= a < buf.address + buf.size]:
                del self._regions[a]
        if buf is None:
            log.error("free_managed_buffer(0x%x): not a buffer allocate_managed_buffer gave",
                      buffer_addr)
            return -1
        try:
            buf.free()
        except mg.Error as e:
            log.error("free_managed_buffer(0x%x): %s", buffer_addr, e)
            return -1
        return 0

    def _managed_of(self, addr, size):
        for buf in self._managed.values():
            if buf.address <= addr and addr + size <= buf.address + buf.size:
                return buf
        return None

    def memory_kind(self, addr):
        """"descriptor" (managed memory, or a shared file's mapping), "device" (GPU memory),
        "process" (other memory the caller registered) or None."""
        with self._lock:
            if self._managed_of(addr, 1):
                return "descriptor"
            for a, (size, _, kind) in self._regions.items():
                if a <= addr < a + size:
                    return kind
        return None

    def register_memory(self, buffer_addr, capacity, location="*"):
        if not self._ready("register_memory"):
            return -1
        return self._register(buffer_addr, capacity)

    def _register(self, addr, size):
        if size == 0:
            log.error("register_memory(0x%x): length 0", addr)
            return ERR_INVALID_ARGUMENT
        with self._lock:
            if self._managed_of(addr, size):
                self._regions[addr] = (size, (), "descriptor")  # registered already
                return 0
            for a, (n, _, _) in self._regions.items():
                if a < addr + size and addr < a + n:
                    log.error("register_memory(0x%x, %d): overlaps [0x%x, 0x%x) registered "
                              "before", addr, size, a, a + n)
                    return ERR_ADDRESS_OVERLAPPED
        name = "mooncake-%d-%x" % (os.getpid(), addr)
        try:
            shared = shared_file_of(addr, size)
            if shared is not None:
                segs, kind = [self._register_shared(name, addr, size, *shared)], "descriptor"
            else:
                segs, kind = self._register_own(name, addr, size)
        except mg.Error as e:
            log.error("register_memory(0x%x, %d): %s", addr, size, e)
            return ERR_ADDRESS_OVERLAPPED if e.code == grpc.StatusCode.ALREADY_EXISTS else -1
        if all(s.remote_accessible for s in segs):  # else a warning said what it is instead
            say_once(kind, logging.INFO, "register_memory: %s", SAID[kind])
        with self._lock:
            self._regions[addr] = (size, tuple(s.id for s in segs), kind)
        return 0

    def _register_own(self, name, addr, size):
        """Memory of no shared file: (segments, kind), registered as Client.register_any does
        (process memory; GPU memory by its dma-bufs, else staged), a peer's target wherever a
        path lets peers reach it, else this process's own transfers (a warning says why)."""
        r = self._c.register_any(addr, size, name=name)
        if r.kind == "device" and r.path == "staged":
            say_once("staged", logging.WARNING, "register_memory(0x%x): %s; registered staged "
                     "instead: peers reach it over TCP, this process's copy thread moving it "
                     "to and from the device", addr, r.why)
        elif r.kind == "device" and not r.path:
            say_once("staged-local", logging.WARNING, "register_memory(0x%x): %s; registered "
                     "staged for this process's transfers only", addr, r.why)
        elif not r.path:
            say_once("no-tcp-targets", logging.WARNING, "register_memory(0x%x): %s; registered "
                     "for this process's transfers only", addr, r.why)
        return r.segments, r.kind

    def _register_shared(self, name, addr, size, fd, offset):
        try:
            try:
                return self._c.register_fd(name, fd, offset=offset, size=size,
                                           remote_accessible=True, client_address=addr)
            except mg.Error as e:
                if e.code != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                # a file that may shrink, with RDMA devices on the daemon: this process's use
                say_once("unsealed", logging.WARNING, "register_memory(0x%x): %s; registered "
                         "for this process's transfers only (a memfd sealed with F_SEAL_SHRINK "
                         "can be a peer's target)", addr, e.message)
                return self._c.register_fd(name, fd, offset=offset, size=size,
                                           client_address=addr)
        finally:
            os.close(fd)

    def unregister_memory(self, buffer_addr):
        if not self._ready("unregister_memory"):
            return -1
        with self._lock:
            ent = self._regions.pop(buffer_addr, None)
        if ent is None:
            log.error("unregister_memory(0x%x): not registered", buffer_addr)
            return ERR_ADDRESS_NOT_REGISTERED
        for i, seg_id in enumerate(ent[1]):
            try:
                self._c.unregister(seg_id)
            except mg.Error as e:
                if e.code == grpc.StatusCode.NOT_FOUND:  # gone already: with its daemon
                    continue
                log.error("unregister_memory(0x%x): %s", buffer_addr, e)
                with self._lock:  # still registered (a transfer holds it): the caller may retry
                    self._regions[buffer_addr] = (ent[0], ent[1][i:], ent[2])
                return -1
        return 0

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        """All or nothing, as Mooncake's."""
        if not self._ready("batch_register_memory"):
            return -1
        if len(buffer_addresses) != len(capacities):
            log.error("batch_register_memory: %d addresses, %d capacities",
                      len(buffer_addresses), len(capacities))
            return ERR_INVALID_ARGUMENT
        done = []
        for addr, size in zip(buffer_addresses, capacities):
            rc = self._register(addr, size)
            if rc:
                for a in done:
                    self.unregister_memory(a)
                return rc
            done.append(addr)
        return 0

    def batch_unregister_memory(self, buffer_addresses):
        rc = 0
        for addr in buffer_addresses:
            rc = self.unregister_memory(addr) or rc
        return rc

    def _check_range(self, what, addr, length):
        with self._lock:
            if self._managed_of(addr, length):
                return True
            for a, (n, _, _) in self._regions.items():
                if a <= addr and addr + length <= a + n:
                    return True
        log.error("%s(0x%x, %d): not in memory this engine allocated or registered", what, addr,
                  length)
        return False

    def write_bytes_to_buffer(self, dest_address, src, length):
        """Copies `length` bytes of `src` to dest_address (checked, unlike Mooncake's: the range
        must lie in memory this engine allocated or registered)."""
        if length > len(src) or not self._check_range("write_bytes_to_buffer", dest_address,
                                                      length):
            return -1
        ctypes.memmove(dest_address, bytes(src[:length]), length)
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        if not self._check_range("read_bytes_from_buffer", source_address, length):
            raise ValueError("read_bytes_from_buffer(0x%x, %d): not in memory this engine "
                             "allocated or registered" % (source_address, length))
        return ctypes.string_at(source_address, length)

    # transfers
    def _deadline_ms(self, nbytes):
        return self._timeout_s * 1000 + nbytes // 1000000 + 1

    def _open(self, target):
        """Mooncake's openSegment: the peer answers for the target once; cached."""
        if target in self._targets:
            return True
        try:
            info = self._c.describe_agent(target)
        except mg.Error as e:
            log.error("target %r: %s", target, e)
            return False
        with self._lock:
            self._targets.add(target)
            self._ring_regions[target] = [(r.address, r.length) for r in info.regions]
        return True

    # the submission ring
    def _ring_list(self, key, addr, length, agent):
        """The prepared list of one whole region (cached per connection)."""
        lid = self._ring_lists.get(key)
        if lid is None:
            lid = self._c.prepare_list([addr], [length], agent=agent)
            self._ring_lists[key] = lid
        return lid

    def _ring_sync(self, what, target, buffer, peer_address, length, op):
        """One synchronous transfer posted on the engine's ring: 0 or -1 (logged), or None
        where the ring cannot take it (no ring, memory outside what it knows, the ring full or
        gone): the caller submits it as a call."""
        from moongate import ring as mgring
        mine = [(a, n) for a, (n, _, _) in self._regions.items()]
        mine += [(a, b.size) for a, b in self._managed.items()]
        local = next(((a, n) for a, n in mine if a <= buffer and buffer + length <= a + n),
                     None)
        remote = next(((a, n) for a, n in self._ring_regions.get(target, ())
                       if a <= peer_address and peer_address + length <= a + n), None)
        if local is None or remote is None or length == 0:
            return None
        with self._ring_lock:
            attached = self._ring is None
            try:
                if attached:
                    self._ring = self._c.attach_ring(256)
                    self._ring_lists.clear()
                lo = self._ring_list(("local",) + local, local[0], local[1], "")
                ro = self._ring_list((target,) + remote, remote[0], remote[1], target)
                self._ring.post_strided(op, lo, 0, ro, 0, 1, length,
                                        local_offset=buffer - local[0],
                                        remote_offset=peer_address - remote[0])
                done = self._ring.wait(self._deadline_ms(length) / 1000.0 + 5)
            except (mgring.RingError, mg.Error, OSError) as e:
                if isinstance(e, mgring.RingError) and \
                        e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    return None
                if self._ring is not None:  # gone with its connection: again next time
                    self._ring.close()
                self._ring = None
                if attached or not isinstance(e, mgring.RingError):  # refused: calls only
                    self._ring_off = True
                    log.info("%s: transfers go as Submit calls, not on a ring: %s", what, e)
                return None
        if not done:
            log.error("%s to %s: no answer within its deadline", what, target)
            return -1
        if done[0].code != 0:
            log.error("%s to %s: %s", what, target, done[0].why)
            self._forget(target, mg.Error(mg._code(done[0].code), done[0].why))
            return -1
        return 0

    def _blocks(self, what, target, buffers, peer_addresses, lengths, opcode):
        """The batch as one compact group, or None (logged) when it cannot be one."""
        if not self._ready(what):
            return None
        if not (len(buffers) == len(peer_addresses) == len(lengths)) or not buffers:
            log.error("%s: %d buffers, %d peer addresses and %d lengths", what, len(buffers),
                      len(peer_addresses), len(lengths))
            return None
        if not self._open(target):
            return None
        lo, ro = min(buffers), min(peer_addresses)
        op = transfer_pb2.WRITE if int(opcode) == TransferOpcode.Write else transfer_pb2.READ
        return transfer_pb2.Blocks(
            op=op, local_address=lo, local_offsets=[b - lo for b in buffers],
            remote_agent=target, remote_address=ro,
            remote_offsets=[p - ro for p in peer_addresses], lengths=list(lengths))

    def _forget(self, target, err):
        if err.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
            with self._lock:
                self._targets.discard(target)
                self._ring_regions.pop(target, None)

    def _sync(self, what, target, buffers, peer_addresses, lengths, opcode, notify):
        blocks = self._blocks(what, target, buffers, peer_addresses, lengths, opcode)
        if blocks is None:
            return -1
        if len(lengths) == 1 and notify is None and not self._ring_off:
            rc = self._ring_sync(what, target, buffers[0], peer_addresses[0], lengths[0],
                                 blocks.op)
            if rc is not None:
                return rc
        timeout_ms = self._deadline_ms(sum(lengths))
        try:
            resp = self._c._call(self._c.transfers.Submit, transfer_pb2.SubmitRequest(
                blocks=[blocks], timeout_ms=timeout_ms, wait=True, brief=True),
                timeout=timeout_ms / 1000.0 + 5)
            if resp.batch.state != transfer_pb2.DONE:
                raise mg._batch_error(resp.batch)
        except mg.Error as e:
            log.error("%s to %s: %s", what, target, e)
            self._forget(target, e)
            return -1
        if notify is not None:
            return self._notify(what, target, notify)
        return 0

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint=""):
        return self._sync("transfer_sync_write", target_hostname, [buffer],
                          [peer_buffer_address], [length], TransferOpcode.Write, None)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint=""):
        return self._sync("transfer_sync_read", target_hostname, [buffer],
                          [peer_buffer_address], [length], TransferOpcode.Read, None)

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        return self._sync("transfer_sync", target_hostname, [buffer], [peer_buffer_address],
                          [length], opcode, notify)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self._sync("batch_transfer_sync_write", target_hostname, buffers,
                          peer_buffer_addresses, lengths, TransferOpcode.Write, None)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses,
                                 lengths, transport_hint=""):
        return self._sync("batch_transfer_sync_read", target_hostname, buffers,
                          peer_buffer_addresses, lengths, TransferOpcode.Read, None)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                            opcode, notify=None, transport_hint=""):
        return self._sync("batch_transfer_sync", target_hostname, buffers,
                          peer_buffer_addresses, lengths, opcode, notify)

    def _on_cuda(self, what, target, buffers, peer_addresses, lengths, opcode, stream_ptr):
        """Mooncake's *_on_cuda: the batch runs from a host function queued on the CUDA stream
        (cuLaunchHostFunc), after the work queued there before it; work queued after it waits
        for its end. The call returns at once. A host function cannot report back: a failure
        is logged, naming it, and ends the process (status 1), as Mooncake's does, since the
        stream's later work would use bytes that never came. A host function may make no CUDA
        call, so the memory is what moves without one: device memory registered by its dma-buf
        (RDMA), host memory."""
        if not (len(buffers) == len(peer_addresses) == len(lengths)):
            raise RuntimeError("buffers, peer_buffer_addresses and lengths have different size")
        if not self._ready(what) or not self._open(target):
            raise RuntimeError("Failed to open segment %s" % target)
        cu = _cuda_driver()
        buffers, peer_addresses, lengths = list(buffers), list(peer_addresses), list(lengths)
        slot = [None, False]

        def run(_):
            try:
                rc = self._sync(what, target, buffers, peer_addresses, lengths, opcode, None)
            except Exception as e:  # noqa: BLE001 (nothing may escape a host function)
                log.error("%s to %s: %s", what, target, e)
                rc = -1
            slot[1] = True
            if rc != 0:
                log.critical("%s to %s failed on its CUDA stream (said above): ending the "
                             "process, as Mooncake's does", what, target)
                logging.shutdown()
                os._exit(1)

        slot[0] = _HOST_FN(run)
        with self._lock:  # the callbacks that ran go; this one stays until it has
            self._host_fns = [f for f in self._host_fns if not f[1]] + [slot]
        rc = cu.cuLaunchHostFunc(ctypes.c_void_p(stream_ptr or None), slot[0], None)
        if rc != 0:
            slot[1] = True
            raise RuntimeError("cuLaunchHostFunc failed: CUDA error %d" % rc)

    def transfer_write_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                               stream_ptr=0, transport_hint=""):
        self._on_cuda("transfer_write_on_cuda", target_hostname, [buffer],
                      [peer_buffer_address], [length], TransferOpcode.Write, stream_ptr)

    def transfer_read_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                              stream_ptr=0, transport_hint=""):
        self._on_cuda("transfer_read_on_cuda", target_hostname, [buffer],
                      [peer_buffer_address], [length], TransferOpcode.Read, stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                     lengths, stream_ptr=0, transport_hint=""):
        self._on_cuda("batch_transfer_write_on_cuda", target_hostname, buffers,
                      peer_buffer_addresses, lengths, TransferOpcode.Write, stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                    lengths, stream_ptr=0, transport_hint=""):
        self._on_cuda("batch_transfer_read_on_cuda", target_hostname, buffers,
                      peer_buffer_addresses, lengths, TransferOpcode.Read, stream_ptr)

    def _async(self, what, target, buffers, peer_addresses, lengths, opcode):
        blocks = self._blocks(what, target, buffers, peer_addresses, lengths, opcode)
        if blocks is None:
            return 0
        try:
            bid = self._c._call(self._c.transfers.Submit, transfer_pb2.SubmitRequest(
                blocks=[blocks], timeout_ms=self._deadline_ms(sum(lengths)))).batch_id
        except mg.Error as e:
            log.error("%s to %s: %s", what, target, e)
            self._forget(target, e)
            return 0
        with self._lock:
            self._batches[bid] = None
        return bid

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint=""):
        return self._async("batch_transfer_async_write", target_hostname, buffers,
                           peer_buffer_addresses, lengths, TransferOpcode.Write)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self._async("batch_transfer_async_read", target_hostname, buffers,
                           peer_buffer_addresses, lengths, TransferOpcode.Read)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint=""):
        return self._async("batch_transfer_async", target_hostname, buffers,
                           peer_buffer_addresses, lengths, opcode)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint=""):
        return self._async("transfer_submit_write", target_hostname, [buffer],
                           [peer_buffer_address], [length], TransferOpcode.Write)

    def _known(self, what, bid):
        with self._lock:
            if bid in self._batches:
                return True
        log.error("%s: batch %d is not one of this engine's (unknown or ended and freed)",
                  what, bid)
        return False

    def get_batch_transfer_status(self, batch_ids):
        """Waits for every batch; 0 when all are done, else -1. Frees them all."""
        if not self._ready("get_batch_transfer_status"):
            return -1
        rc = 0
        for bid in batch_ids:
            if not self._known("get_batch_transfer_status", bid):
                rc = -1
                continue
            try:
                self._c.wait(bid, brief=True)
            except mg.Error as e:
                log.error("batch %d: %s", bid, e)
                rc = -1
            with self._lock:
                self._batches.pop(bid, None)
        return rc

    def transfer_check_status(self, batch_id):
        """1 done (freed), 0 running, -1 failed (freed), -2 timed out."""
        if not self._ready("transfer_check_status") or not self._known(
                "transfer_check_status", batch_id):
            return -1
        try:
            b = self._c._call(self._c.transfers.GetBatch,
                              transfer_pb2.GetBatchRequest(id=batch_id, brief=True))
        except mg.Error as e:
            log.error("transfer_check_status(%d): %s", batch_id, e)
            return -1
        if b.state == transfer_pb2.DONE:
            with self._lock:
                self._batches.pop(batch_id, None)
            return 1
        if b.state != transfer_pb2.FAILED:
            return 0
        if any(r.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0] for r in b.requests):
            return -2
        log.error("batch %d: %s", batch_id, mg._batch_error(b))
        with self._lock:
            self._batches.pop(batch_id, None)
        return -1

    # names and notifications
    def get_first_buffer_address(self, segment_name):
        """The address of the buffer the engine `segment_name` registered first (of those it
        still has), as Mooncake's; 0 when there is none or the engine cannot be asked."""
        if not self._ready("get_first_buffer_address"):
            return 0
        try:
            return self._c.first_buffer_address(segment_name)
        except mg.Error as e:
            log.error("get_first_buffer_address(%r): %s", segment_name, e)
            return 0

    def send_probe(self, peer_server_name):
        """0 when the peer's daemon answers for the engine, else -1."""
        if not self._ready("send_probe"):
            return -1
        try:
            self._c.describe_agent(peer_server_name)
        except mg.Error as e:
            log.info("send_probe(%r): %s", peer_server_name, e)
            return -1
        return 0

    def _notify(self, what, target, notify):
        _, port = split_host_port(target)
        if port is None:
            log.error("%s: a notification goes to a \"host:port\" engine, not %r", what, target)
            return -1
        payload = note_payload(notify.name, notify.msg)
        try:
            self._c.send(notify_topic(port), payload, agent=target)
        except mg.Error as e:
            log.error("%s: notification to %s: %s", what, target, e)
            return -1
        return 0

    def get_notifies(self):
        """The notifications sent to this engine since the last call, oldest first."""
        if not self._ready("get_notifies"):
            return []
        out = []
        while True:
            try:
                got = self._c.poll(notify_topic(self._port), max=100)
            except mg.Error as e:
                log.error("get_notifies: %s", e)
                return out
            for n in got:
                try:
                    out.append(TransferNotify(*note_of_payload(n.payload)))
                except (ValueError, KeyError, TypeError):
                    log.warning("get_notifies: a notification that is not a TransferEngine's "
                                "(%d bytes, no \"name\" and \"msg\") skipped", len(n.payload))
            if len(got) < 100:
                return out

    # what has no meaning on moongate
    def get_local_topology(self, device_name=None):
        say_once("topology", logging.WARNING, "get_local_topology: the daemon owns the devices; "
                 "`mgctl doctor` and Daemon/Info show them. Returns \"{}\".")
        return "{}"

    def warmup_efa_segment(self, segment_name):
        say_once("efa", logging.INFO, "warmup_efa_segment: no EFA transport on moongate; 0")
        return 0

    def get_engine(self):
        raise NotImplementedError("moongate has no in-process engine: transfers run in the "
                                  "node's daemon")

    get_engine_ptr = get_engine


if __name__ == "__main__":
    from moongate.compat import pythonpath_main
    sys.exit(pythonpath_main("mooncake", "from mooncake.engine import TransferEngine"))
