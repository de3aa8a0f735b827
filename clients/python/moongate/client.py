"""moongate.client (also importable as `moongate` and `moongate_client`): a Python client for
the moongate daemon, on grpcio stubs generated from moongate's protos (python3-grpcio and
python3-grpc-tools from Debian; shipped inside the installed package, generated at first use in
a source tree).

    import moongate as mg                                          # or moongate_client

    with mg.Client("unix:/run/moongate/moongate.sock") as c:        # or "host:7443", ca=...
        seg = c.register("kv0", 1 << 20, remote_accessible=True)
        with c.map(seg) as buf:                                      # a memoryview of its file
            buf[:5] = b"hello"
        with c.lease(1 << 20) as lease:                              # released on exit
            lease.buffer[:5] = b"world"                              # the pool file, mapped
            batch = c.transfer([mg.write(lease=lease.id, peer="10.0.0.2:7443",
                                         remote_segment=42, length=5)],
                               notify=[mg.notify("10.0.0.2:7443", "kv", b"ready")])
        for note in c.notifications("kv", timeout=10):               # Watch, as they arrive
            print(note.payload)
        c.unregister(seg.id)

Errors are mg.Error (a grpc.RpcError's code and details; a failed transfer's first failed
request); `code` is a grpc.StatusCode. AsyncClient has the same methods as coroutines (and
notifications as an async iterator), on grpc.aio.

Memory the program already has — a memfd, a tmpfs file — is registered by descriptor, where it
lies: `c.register_fd("kv1", fd, offset=0, size=n)` passes the descriptor on the daemon's fd socket
(the Unix socket's path with ".fd" appended; fd_socket= to name another) and registers it; the
program's own mapping and the daemon's see the same bytes.

Credentials: token= (sent as "authorization: Bearer TOKEN"), or cert=/key= (a client
certificate), or the Unix socket's uid; ca= for TLS targets (host:port); plaintext=True for a
loopback h2c listener. See docs/security.md.
"""
import collections
import ctypes
import fcntl
import itertools
import mmap
import os
import socket
import threading
import time

import grpc

from moongate import restore as _restore  # noqa: E402
from moongate.v1 import (agent_pb2, agent_pb2_grpc, daemon_pb2, daemon_pb2_grpc,  # noqa: E402
                         memory_pb2, memory_pb2_grpc, notify_pb2, notify_pb2_grpc, pool_pb2,
                         pool_pb2_grpc, transfer_pb2, transfer_pb2_grpc)

__all__ = ["Client", "AsyncClient", "Buffer", "Error", "read", "write", "notify", "prepared", "strided",
           "pass_fd", "address_of", "device_of", "default_target", "default_token",
           "Registered"]
_names = itertools.count(1)


class Error(Exception):
    """A call or a transfer that failed: `code` (grpc.StatusCode) and `message`."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code.name, message))
        self.code = code
        self.message = message


def default_target():
    """The node's daemon: unix:$MOONGATE_SOCKET (default /run/moongate/moongate.sock)."""
    return "unix:" + (os.environ.get("MOONGATE_SOCKET") or "/run/moongate/moongate.sock")


def default_token():
    """$MOONGATE_TOKEN, else the first line of the file $MOONGATE_TOKEN_FILE, else None."""
    if os.environ.get("MOONGATE_TOKEN"):
        return os.environ["MOONGATE_TOKEN"]
    path = os.environ.get("MOONGATE_TOKEN_FILE")
    if path:
        with open(path) as f:
            return f.readline().strip() or None
    return None


def _code(value):
    for c in grpc.StatusCode:
        if c.value[0] == value:
            return c
    return grpc.StatusCode.UNKNOWN


def pass_fd(fd_socket, fd, token=None):
    """Passes descriptor `fd` to the daemon on its fd socket (SOCK_SEQPACKET, SCM_RIGHTS) and
    returns (handle, ttl_ms): RegisterSegment(source=FD, fd_handle=handle) in this process, as the
    same tenant, within ttl_ms, registers it. The caller keeps its own descriptor."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(fd_socket)
        socket.send_fds(s, [b"PUT " + token.encode() if token else b"PUT"], [fd])
        words = s.recv(1024).decode(errors="replace").split(" ", 2)
    if words[0] == "OK" and len(words) == 3:
        return int(words[1]), int(words[2])
    if words[0] == "ERR" and len(words) == 3 and words[1] in grpc.StatusCode.__members__:
        raise Error(grpc.StatusCode[words[1]], words[2])
    raise Error(grpc.StatusCode.INTERNAL, "fd socket answered %r" % " ".join(words))


def _fd_socket(target, fd_socket):
    if fd_socket:
        return fd_socket
    return target[len("unix:"):] + ".fd" if target.startswith("unix:") else None


def _fd_request(name, handle, offset, size, remote_accessible, share_with, kw):
    kw.setdefault("source", memory_pb2.FD)
    return memory_pb2.RegisterRequest(
        name=name, fd_handle=handle, offset=offset, size=size,
        remote_accessible=remote_accessible, share_with=list(share_with), **kw)


class _VramPiece(ctypes.Structure):  # mg_vram_piece (client/mg_vram.h)
    _fields_ = [("fd", ctypes.c_int), ("address", ctypes.c_uint64), ("size", ctypes.c_uint64),
                ("device", ctypes.c_int)]


class _VramMoveArgs(ctypes.Structure):  # mg_vram_move_args (client/mg_vram.h)
    _fields_ = [("write", ctypes.c_int), ("ptr", ctypes.c_uint64), ("len", ctypes.c_size_t),
                ("peer", ctypes.c_char_p), ("remote_segment", ctypes.c_uint64),
                ("remote_lease", ctypes.c_uint64), ("remote_agent", ctypes.c_char_p),
                ("remote_address", ctypes.c_uint64), ("remote_offset", ctypes.c_uint64),
                ("stream", ctypes.c_void_p), ("chunk", ctypes.c_size_t),
                ("timeout_ms", ctypes.c_uint32), ("path", ctypes.c_int)]


class _VramMoveResult(ctypes.Structure):  # mg_vram_move_result
    _fields_ = [("path", ctypes.c_char_p), ("bytes", ctypes.c_uint64), ("chunk", ctypes.c_uint64),
                ("chunks", ctypes.c_uint32), ("buffers", ctypes.c_int), ("bounce", ctypes.c_int),
                ("pool", ctypes.c_char * 64), ("why", ctypes.c_char * 256)]


VramMove = collections.namedtuple("VramMove", "path bytes chunk chunks buffers bounce pool why")
VRAM_PATHS = {"auto": 0, "staged": 1, "dmabuf": 2}

_mgclient = None


def device_of(address):
    """The CUDA device ordinal of `address` when the driver knows it as device memory, else
    None: host memory, or no CUDA driver or C library to ask. The driver ($MOONGATE_CUDA_LIB,
    else libcuda.so.1) and libmgclient are loaded by the first call, not before."""
    return _device_or_why(address)[0]


def _device_or_why(address):
    """(device_of(address), "") or (None, why not: no C library, no driver, or the driver
    does not know it as device memory)."""
    try:
        lib = _client_lib()
    except Error as e:
        return None, e.message
    why = ctypes.create_string_buffer(512)
    device = lib.mg_cuda_device_of(address, why, 512)
    return (device, "") if device >= 0 else (None, why.value.decode(errors="replace"))


Registered = collections.namedtuple("Registered", "segments kind path why")
Registered.__doc__ = """What Client.register_any made. segments: the Segments (one; one per
device allocation the range crosses by dma-buf). kind: "process" (host memory) or "device".
path: how peers reach it, "process_vm" (over TCP), "dmabuf" (over RDMA), "staged" (over TCP,
this process's copy thread moving it to and from the device), or "" (this process's own
transfers only). why: what refused a better path ("" when none did)."""


def _client_lib():
    """libmgclient.so.0 ($MOONGATE_CLIENT_LIB, else the system's): the CUDA driver work (loaded
    at run time, never linked) is the C library's."""
    global _mgclient
    if _mgclient is None:
        path = os.environ.get("MOONGATE_CLIENT_LIB") or "libmgclient.so.0"
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        "GPU memory needs moongate's C client library (%s): %s" % (path, e))
        lib.mg_vram_export.restype = ctypes.c_int
        lib.mg_vram_export.argtypes = [ctypes.c_uint64, ctypes.c_size_t,
                                       ctypes.POINTER(_VramPiece), ctypes.c_int,
                                       ctypes.c_char_p, ctypes.c_size_t]
        lib.mg_cuda_device_of.restype = ctypes.c_int
        lib.mg_cuda_device_of.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
        lib.mg_client_open.restype = ctypes.c_void_p
        lib.mg_client_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.c_size_t]
        lib.mg_client_close.restype = None
        lib.mg_client_close.argtypes = [ctypes.c_void_p]
        lib.mg_vram_stage_serve.restype = ctypes.c_int
        lib.mg_vram_stage_serve.argtypes = [ctypes.c_int, ctypes.c_uint64,
                                            ctypes.POINTER(ctypes.c_int),
                                            ctypes.POINTER(ctypes.c_int), ctypes.c_char_p,
                                            ctypes.c_size_t]
        lib.mg_vram_move.restype = ctypes.c_int
        lib.mg_vram_move.argtypes = [ctypes.c_void_p, ctypes.POINTER(_VramMoveArgs),
                                     ctypes.POINTER(_VramMoveResult), ctypes.POINTER(ctypes.c_int),
                                     ctypes.c_char_p, ctypes.c_size_t]
        _mgclient = lib
    return _mgclient


def _request(op, segment, lease, offset, peer, remote_segment, remote_lease, remote_offset,
             length, address, agent, remote_address):
    if (segment is None) + (lease is None) + (address is None) != 2:
        raise ValueError("name the local memory: segment=, lease= or address=, one of them")
    if (remote_segment is None) + (remote_lease is None) + (agent is None) != 2:
        raise ValueError("name the target: remote_segment=, remote_lease= or agent= (with "
                         "remote_address=), one of them")
    return transfer_pb2.TransferRequest(
        op=op, local_segment=segment or 0, local_lease=lease or 0, local_offset=offset,
        peer=peer, remote_segment=remote_segment or 0, remote_lease=remote_lease or 0,
        remote_offset=remote_offset, length=length, local_address=address or 0,
        remote_agent=agent or "", remote_address=remote_address)


def write(segment=None, lease=None, offset=0, peer="", remote_segment=None, remote_lease=None,
          remote_offset=0, length=0, address=None, agent=None, remote_address=0):
    """A WRITE: local bytes (a segment or a lease of the caller, or `address` in a region this
    process registered with its address, e.g. a Buffer's) to a peer's segment or lease (peer ""
    is this daemon), or to `remote_address` in the process of `agent`: its one-string form
    "host:port", or its name on `peer`."""
    return _request(transfer_pb2.WRITE, segment, lease, offset, peer, remote_segment,
                    remote_lease, remote_offset, length, address, agent, remote_address)


def read(segment=None, lease=None, offset=0, peer="", remote_segment=None, remote_lease=None,
         remote_offset=0, length=0, address=None, agent=None, remote_address=0):
    """A READ: a peer's bytes (or an agent's, as in write) into local memory."""
    return _request(transfer_pb2.READ, segment, lease, offset, peer, remote_segment,
                    remote_lease, remote_offset, length, address, agent, remote_address)


def strided(op, count, length, stride, remote_stride=None, segment=None, lease=None, offset=0,
            peer="", remote_segment=None, remote_lease=None, remote_offset=0, address=None,
            agent=None, remote_address=0):
    """`count` blocks of `length` bytes at regular intervals (a cache laid out layer by layer):
    block k's local bytes at offset + k * stride of the local memory, its remote bytes at
    remote_offset + k * remote_stride (default: stride) of the target; memory named as in
    read() and write(); op transfer_pb2.READ or WRITE. One group of a batch
    (transfer(strided=[...])): each block one request, checked as such."""
    r = _request(op, segment, lease, offset, peer, remote_segment, remote_lease, remote_offset,
                 length, address, agent, remote_address)
    return transfer_pb2.Strided(
        op=op, local_segment=r.local_segment, local_lease=r.local_lease,
        local_address=r.local_address, local_offset=offset, local_stride=stride, peer=peer,
        remote_segment=r.remote_segment, remote_lease=r.remote_lease,
        remote_agent=r.remote_agent, remote_address=remote_address, remote_offset=remote_offset,
        remote_stride=stride if remote_stride is None else remote_stride, length=length,
        count=count)


def address_of(buf):
    """(address, size) of a writable buffer of this process: a bytearray, an mmap, a
    memoryview, a numpy array. The buffer must stay alive (and unmoved: do not resize a
    bytearray) while the daemon may reach it."""
    view = memoryview(buf)
    c = (ctypes.c_char * view.nbytes).from_buffer(view)
    try:
        return ctypes.addressof(c), view.nbytes
    finally:
        del c  # an exported buffer would keep an mmap from closing
        view.release()


class Buffer:
    """Memory this client allocated and the daemon registered where it lies (allocate_buffer):
    `address` (its first byte in this process), `view` (a writable memoryview of it), `size`,
    `segment` (the registered Segment). Transfers name it by segment id or by address. free()
    (or the end of a `with` block) unregisters and unmaps it."""

    def __init__(self, client, mm, segment):
        self._client, self._mm = client, mm
        self.segment = segment
        self.size = segment.size
        self.address = segment.client_address
        self.view = memoryview(mm)

    def free(self):
        if self._mm is None:
            return
        try:
            self._client.unregister(self.segment.id)
        finally:
            self.view.release()
            self._mm.close()
            self._mm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


class _AsyncBuffer(Buffer):
    async def free(self):
        if self._mm is None:
            return
        try:
            await self._client.unregister(self.segment.id)
        finally:
            self.view.release()
            self._mm.close()
            self._mm = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.free()


def _buffer_memory(size, name):
    """A memfd of `size` bytes that can neither shrink nor grow (safe to register for RDMA),
    mapped here. Returns (fd, mmap, address)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        mm = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd, mm, address_of(mm)[0]


def prepared(op, local_list, local_indices, remote_list, remote_indices):
    """A group of requests by index into two prepared lists (Client.prepare_list): pair k moves
    local_indices[k] of local_list (this process's memory) with remote_indices[k] of
    remote_list (an agent's); op transfer_pb2.READ or WRITE."""
    return transfer_pb2.Prepared(op=op, local_list=local_list, local_indices=local_indices,
                                 remote_list=remote_list, remote_indices=remote_indices)


def notify(peer, topic, payload=b""):
    """A notification for `peer`'s readers of `topic`, sent once the batch's WRITEs there are
    in place."""
    return transfer_pb2.NotifyPeer(peer=peer, topic=topic, payload=payload)


def _channel(target, ca, cert, key, plaintext, aio):
    """h2c for unix: targets and with plaintext (a loopback --h2c-listen), else TLS."""
    g = grpc.aio if aio else grpc
    opts = [("grpc.max_receive_message_length", 16 << 20),
            ("grpc.max_send_message_length", 16 << 20),
            # never closed for idleness: an agent lives as long as its connection
            ("grpc.client_idle_timeout_ms", 2**31 - 1),
            # a connection of its own: grpc would share one between the channels of a process
            # to the same target, so that closing one client would not end its agent
            ("grpc.use_local_subchannel_pool", 1),
            # a daemon that restarts is found again quickly (MOONGATE_RECONNECT_BACKOFF_MS)
            # (not grpc.min_reconnect_backoff_ms: grpc takes it as the time a connection has to
            # answer too, and a busy daemon answering a new connection after it would fail calls)
            ("grpc.initial_reconnect_backoff_ms", min(100, _restore.reconnect_backoff_ms())),
            ("grpc.max_reconnect_backoff_ms", _restore.reconnect_backoff_ms())]
    if target.startswith("unix:") or plaintext:
        return g.insecure_channel(target, options=opts)

    def read_file(p):
        with open(p, "rb") as f:
            return f.read()
    creds = grpc.ssl_channel_credentials(
        root_certificates=read_file(ca) if ca else None,
        private_key=read_file(key) if key else None,
        certificate_chain=read_file(cert) if cert else None)
    return g.secure_channel(target, creds, options=opts)


class _Maps:
    """One shared mapping per file, reference-counted: a lease's buffer is a slice of it.
    Threads sharing a Client lease and release at once: the table and the counts change under
    one lock, so a mapping is made once per file and closed only when its last user is done
    (os.open and mmap let another thread run between the lookup and the count)."""

    def __init__(self):
        self.files = {}  # path -> [mmap, users]
        self._lock = threading.Lock()

    def view(self, path, offset, length):
        with self._lock:
            ent = self.files.get(path)
            if ent is None:
                fd = os.open(path, os.O_RDWR)
                try:
                    ent = self.files[path] = [mmap.mmap(fd, 0), 0]
                finally:
                    os.close(fd)
            ent[1] += 1
            return memoryview(ent[0])[offset:offset + length]

    def done(self, path, view):
        view.release()
        with self._lock:
            ent = self.files.get(path)
            if ent is not None:
                ent[1] -= 1
                if ent[1] == 0:
                    ent[0].close()
                    del self.files[path]

    def close(self):
        with self._lock:
            for m, _ in self.files.values():
                try:
                    m.close()
                except BufferError:
                    pass  # a buffer still exported: the mapping goes with it
            self.files.clear()


class Lease:
    """A leased slice of the buffer pool: `id`, `size` (requested), `offset` and `path` of the
    pool file, and `buffer`, a writable memoryview of exactly those bytes (valid until the lease
    is released: leaving the `with` block releases both)."""

    def __init__(self, client, msg):
        self._client = client
        self.msg = msg
        self.id, self.size, self.offset, self.path = msg.id, msg.requested, msg.offset, msg.path
        self.buffer = client._maps.view(msg.path, msg.offset, msg.requested)

    def _drop_view(self):
        if self.buffer is not None:
            self._client._maps.done(self.path, self.buffer)
            self.buffer = None


class _Mapped:
    def __init__(self, maps, path, offset, length):
        self.maps, self.path = maps, path
        self.view = maps.view(path, offset, length)

    def __enter__(self):
        return self.view

    def __exit__(self, *exc):
        self.maps.done(self.path, self.view)


def _metadata(md, traceparent):
    """A call's metadata: the client's (its token), and the caller's trace when it gives one."""
    if not traceparent:
        return md
    return list(md or ()) + [("traceparent", traceparent)]


def _batch_error(b):
    for r in b.requests:
        if r.state == transfer_pb2.FAILED:
            return Error(_code(r.code), r.message)
    for n in b.notify:
        if n.code:
            return Error(_code(n.code), "notification: " + n.message)
    return Error(grpc.StatusCode.UNKNOWN, "batch %d failed" % b.id)


def _segment_now(table, value):
    """The segment id the daemon has now for one the program holds (restore.Table); Error
    NOT_FOUND when it did not survive a restart."""
    try:
        return table.id("segment", value)
    except LookupError as why:
        raise Error(grpc.StatusCode.NOT_FOUND, "segment %d: %s" % (value, why)) from None


def _ids_now(requests, id_now):
    """The requests (or strided groups) with the segment ids the daemon has now (after a
    restart): id_now(id)."""
    out = []
    for r in requests:
        local = id_now(r.local_segment)
        remote = id_now(r.remote_segment) if not r.peer else r.remote_segment
        if (local, remote) != (r.local_segment, r.remote_segment):
            r = type(r).FromString(r.SerializeToString())
            r.local_segment, r.remote_segment = local, remote
        out.append(r)
    return out


class _OtherOwner(Exception):
    """The Unix socket the daemon came back on is another user's."""


def _socket_owner(target):
    """The uid owning a unix: target's socket file, or None (another kind of target, or none
    there)."""
    if not target.startswith("unix:"):
        return None
    try:
        return os.stat(target[5:]).st_uid
    except OSError:
        return None


def _same_owner(target, uid):
    """Raises _OtherOwner when the socket at target is no longer owned by uid."""
    now = _socket_owner(target)
    if uid is not None and now is not None and now != uid:
        raise _OtherOwner("the daemon came back on %s as another user's (the socket is uid %d's, "
                          "was uid %d's): refused, this client makes nothing there" % (
                              target[5:], now, uid))


def _fatal(e):
    """Why reconnecting is pointless after probe error e (credentials the daemon that came
    back refuses: said once, not retried; a socket now another user's), or None."""
    if isinstance(e, _OtherOwner):
        return str(e)
    code = e.code() if isinstance(e, grpc.RpcError) else getattr(e, "code", None)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        details = e.details() if isinstance(e, grpc.RpcError) else getattr(e, "message", str(e))
        return ("the daemon came back and refuses this client's credentials (%s: %s); not "
                "retried" % (code.name, details))
    return None


class Client:
    """A synchronous client of one daemon. When the daemon restarts, the client reconnects and
    makes again what it had made there (moongate/restore.py; docs/api.md, \"When the daemon
    restarts\")."""

    def __init__(self, target="unix:/run/moongate/moongate.sock", ca=None, cert=None, key=None,
                 token=None, plaintext=False, timeout=30.0, fd_socket=None):
        self.timeout = timeout
        self.md = [("authorization", "Bearer " + token)] if token else None
        self._token = token
        self._target, self._plain = target, plaintext or target.startswith("unix:")
        self._cclient, self._clock = None, threading.Lock()
        self.fd_socket = _fd_socket(target, fd_socket)
        self._ch = _channel(target, ca, cert, key, plaintext, aio=False)
        self.memory = memory_pb2_grpc.MemoryStub(self._ch)
        self.pool = pool_pb2_grpc.PoolStub(self._ch)
        self.transfers = transfer_pb2_grpc.TransferStub(self._ch)
        self._submit_raw = None  # Submit of a request serialized by the caller
        self._notify = notify_pb2_grpc.NotifyStub(self._ch)
        self.agent = agent_pb2_grpc.AgentStub(self._ch)
        self.daemon = daemon_pb2_grpc.DaemonStub(self._ch)
        self._maps = _Maps()
        # what comes back when the daemon does (moongate/restore.py)
        self._table = _restore.Table()
        self._batch_epochs = collections.OrderedDict()  # batch id -> the epoch it ran under
        self._after_restart = []  # f(was, now) of users of the client (BufferPool)
        self._owner = _socket_owner(target)  # who the daemon's socket belongs to
        self._re = _restore.Reconnector(self._ch, self._table, self._probe, _fatal,
                                        _restore.reconnect_bound_s(), self._restarted)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._re.close()
        with self._clock:
            if self._cclient:
                _client_lib().mg_client_close(self._cclient)
                self._cclient = None
        self._maps.close()
        self._ch.close()
        self._table.close()

    @property
    def epoch(self):
        """The daemon's epoch as this client last saw it (None before the first agent,
        registration or expectation); a restart changes it (restarts counts them)."""
        return self._re.epoch

    @property
    def restarts(self):
        return self._re.restarts

    def _restarted(self, was, now):
        for f in list(self._after_restart):
            f(was, now)

    def _probe(self, timeout):
        _same_owner(self._target, self._owner)  # before the credentials go to whoever is there
        epoch = self.daemon.Info(daemon_pb2.InfoRequest(), metadata=self.md, timeout=timeout,
                                 wait_for_ready=True).epoch
        _same_owner(self._target, self._owner)
        return epoch

    def _call(self, fn, req, timeout=None, traceparent=""):
        self._re.gate()
        if self._re.fatal:  # said once when it happened; this client is done with the daemon
            raise Error(grpc.StatusCode.UNAVAILABLE, self._re.gone)
        try:
            out, call = fn.with_call(req, metadata=_metadata(self.md, traceparent),
                                     timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            self._re.answered(e.trailing_metadata())
            raise self._error(e) from None
        self._re.mark_up()
        self._re.answered(call.initial_metadata())
        return out

    def _error(self, e):
        """A call's error as Error; one that met a broken connection says so."""
        if self._re.gone and e.code() in (grpc.StatusCode.UNAVAILABLE,
                                          grpc.StatusCode.UNAUTHENTICATED,
                                          grpc.StatusCode.PERMISSION_DENIED):
            return Error(e.code(), self._re.gone)
        if e.code() != grpc.StatusCode.UNAVAILABLE or not len(self._table) or \
                _restore.epoch_of(tuple(e.initial_metadata() or ()) +
                                  tuple(e.trailing_metadata() or ())) is not None:
            return Error(e.code(), e.details())  # the daemon's own answer (a peer away, ...)
        return Error(e.code(), "the connection to the daemon broke (%s): it may be restarting; "
                     "this client reconnects and makes its agent, memory and expectations again "
                     "(within MOONGATE_RECONNECT_S)" % e.details())

    def _remember(self, key, what, redo=None, close=None):
        """A row of the restore table; the daemon's epoch is learnt with the first."""
        if self._re.epoch is None:
            try:
                self._re.seen(self._probe(self.timeout))
            except grpc.RpcError:
                pass
        self._table.add(key, what, redo, close)

    def _id(self, value):
        return _segment_now(self._table, value)

    def info(self):
        """The daemon's Daemon/Info: version, epoch, transports, max_wait_ms, ..."""
        return self._call(self.daemon.Info, daemon_pb2.InfoRequest())

    # agents
    def register_agent(self, name, port=0):
        """Names this client an agent of its tenant on the daemon, with `port` (0: one the
        daemon assigns): "host:port" then names it. It lives as long as this client's
        connection; the regions this process registered with their address are its regions.
        Returns the AgentInfo (.port is the port)."""
        info = self._call(self.agent.RegisterAgent,
                          agent_pb2.RegisterAgentRequest(name=name, port=port))
        self._remember(("agent", name), "agent %r (port %d)" % (name, info.port),
                       lambda: self._call(self.agent.RegisterAgent, agent_pb2.RegisterAgentRequest(
                           name=name, port=info.port)) and None)
        return info

    def unregister_agent(self, name):
        self._call(self.agent.UnregisterAgent, agent_pb2.UnregisterAgentRequest(name=name))
        self._table.drop(("agent", name))

    def describe_agent(self, agent, peer=""):
        """An agent's port, epoch and regions: "host:port", or a name on `peer` ("" here)."""
        return self._call(self.agent.DescribeAgent,
                          agent_pb2.DescribeAgentRequest(agent=agent, peer=peer))

    def first_buffer_address(self, agent, peer=""):
        """The address of the agent's first region (Mooncake's get_first_buffer_address)."""
        return self.describe_agent(agent, peer).first_address

    def agents(self):
        return list(self._call(self.agent.ListAgents, agent_pb2.ListAgentsRequest()).agents)

    def export_agent(self, name, endpoint=""):
        """The agent's descriptor: bytes another process hands to import_agent (endpoint: this
        daemon's control endpoint as peers reach it; "" for its --advertise)."""
        return self._call(self.agent.ExportAgent, agent_pb2.ExportAgentRequest(
            name=name, endpoint=endpoint)).descriptor

    def import_agent(self, descriptor):
        """Checks a descriptor with the daemon it names; returns the agent as that daemon
        describes it now (AgentInfo: .peer and .name name it in transfers)."""
        return self._call(self.agent.ImportAgent,
                          agent_pb2.ImportAgentRequest(descriptor=descriptor))

    # segments
    def register(self, name, size, remote_accessible=False, share_with=(), **kw):
        """A segment the daemon makes (or a shm file by name): it does not survive a
        restart of the daemon; its id then says so."""
        seg = self._call(self.memory.RegisterSegment, memory_pb2.RegisterRequest(
            name=name, size=size, remote_accessible=remote_accessible,
            share_with=list(share_with), **kw)).segment
        self._remember(("segment", seg.id), "segment %d (%r, made by the daemon)" % (
            seg.id, name))
        return seg

    def register_fd(self, name, fd, offset=0, size=0, remote_accessible=False, share_with=(),
                    **kw):
        """Registers [offset, offset + size) of the file `fd` is open on (size 0: to its end):
        a memfd, a tmpfs file, any regular file open O_RDWR. The caller keeps its descriptor."""
        if not self.fd_socket:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        "descriptors are passed on a Unix socket: connect with unix:PATH")
        keep = os.dup(fd)  # passed again when the daemon comes back
        try:
            seg = self._register_fd(name, keep, offset, size, remote_accessible, share_with, kw)
        except BaseException:
            os.close(keep)
            raise
        self._remember(("segment", seg.id), "segment %d (%r, a file passed by descriptor)" % (
            seg.id, name), lambda: self._register_fd(name, keep, offset, size, remote_accessible,
                                                     share_with, kw).id,
            lambda: os.close(keep))
        return seg

    def _register_fd(self, name, fd, offset, size, remote_accessible, share_with, kw):
        handle, _ = pass_fd(self.fd_socket, fd, self._token)
        return self._call(self.memory.RegisterSegment, _fd_request(
            name, handle, offset, size, remote_accessible, share_with, kw)).segment

    def allocate_buffer(self, size, remote_accessible=False, name=None, **kw):
        """Memory for transfers, allocated here and registered in one call: a sealed memfd
        mapped in this process and registered by descriptor with its address. Returns a Buffer
        (address, writable view, segment); free() it, or use it in a `with` block."""
        name = name or "buffer-%d-%d" % (os.getpid(), next(_names))
        fd, mm, address = _buffer_memory(size, name)
        try:
            seg = self.register_fd(name, fd, size=size, remote_accessible=remote_accessible,
                                   client_address=address, **kw)
        except BaseException:
            mm.close()
            raise
        finally:
            os.close(fd)  # the mapping and the daemon keep the memory
        return Buffer(self, mm, seg)

    def register_vram(self, address, size, remote_accessible=False, name=None):
        """Registers GPU memory [address, address + size) (a device pointer: a torch CUDA
        tensor's data_ptr()) by its dma-bufs, one region per allocation it crosses, widened to
        whole pages: the daemon registers them with its RDMA devices and moves them over RDMA
        only. Returns the Segments. Needs the CUDA driver (or $MOONGATE_CUDA_LIB) and moongate's
        C library (libmgclient.so.0, or $MOONGATE_CLIENT_LIB)."""
        if not self.fd_socket:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        "GPU memory is passed as dma-bufs on a Unix socket: connect with "
                        "unix:PATH")
        lib, pieces = _client_lib(), (_VramPiece * 64)()
        err = ctypes.create_string_buffer(512)
        n = lib.mg_vram_export(address, size, pieces, 64, err, 512)
        if n < 0:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION, err.value.decode(errors="replace"))
        segs = []
        try:
            for k in range(n):
                p = pieces[k]
                segs.append(self._vram_piece("%s-%d" % (
                    name or "vram-%d-%x" % (os.getpid(), address), k), p, remote_accessible))
        except BaseException:
            for seg in segs:
                self.unregister(seg.id)
            raise
        finally:
            for k in range(n):
                os.close(pieces[k].fd)
        return segs

    def _vram_piece(self, name, p, remote_accessible):
        """One dma-buf piece registered; when the daemon comes back, exported again by its
        address (the same allocation) and registered again."""
        def make(p):
            handle, _ = pass_fd(self.fd_socket, p.fd, self._token)
            return self._call(self.memory.RegisterSegment, _fd_request(
                name, handle, 0, p.size, remote_accessible, (), dict(
                    source=memory_pb2.DMABUF, client_address=p.address,
                    location="cuda:%d" % p.device))).segment

        def again(address=p.address, size=p.size):
            again_pieces, err = (_VramPiece * 1)(), ctypes.create_string_buffer(512)
            if _client_lib().mg_vram_export(address, size, again_pieces, 1, err, 512) != 1:
                raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                            "GPU memory at 0x%x: %s" % (address, err.value.decode(
                                errors="replace") or "no longer one allocation"))
            try:
                return make(again_pieces[0]).id
            finally:
                os.close(again_pieces[0].fd)
        seg = make(p)
        self._remember(("segment", seg.id), "segment %d (%r, GPU memory at 0x%x)" % (
            seg.id, name, p.address), again)
        return seg

    def register_vram_staged(self, address, size, remote_accessible=True, name=None):
        """Registers GPU memory [address, address + size) as STAGED: a peer's target over TCP
        where no RDMA path reaches it (a daemon without RDMA devices, a GPU without dma-buf).
        moongate's C library (libmgclient.so.0, or $MOONGATE_CLIENT_LIB) serves the range's
        copy channel on a thread of its own: a peer's WRITE is copied from the daemon's staging
        buffer into the device, and a READ out of it, in the context that owns the pointer,
        while this program does nothing (the GIL is never taken). Returns the Segment; made
        again after a daemon restart."""
        if not self.fd_socket:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        "staged GPU memory is registered on a Unix socket: connect with "
                        "unix:PATH")
        lib = _client_lib()
        name = name or "vram-staged-%d-%x" % (os.getpid(), address)

        def make():
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            served = socket.socket(fileno=os.dup(mine.fileno()))  # to end it on a refusal
            dev, status = ctypes.c_int(), ctypes.c_int()
            err = ctypes.create_string_buffer(512)
            fd = mine.detach()  # the C library's from here, served and closed by it
            try:
                if lib.mg_vram_stage_serve(fd, address, ctypes.byref(dev), ctypes.byref(status),
                                           err, 512) != 0:
                    os.close(fd)
                    raise Error(_code(status.value), err.value.decode(errors="replace"))
                handle, _ = pass_fd(self.fd_socket, theirs.fileno(), self._token)
                return self._call(self.memory.RegisterSegment, _fd_request(
                    name, handle, 0, size, remote_accessible, (), dict(
                        source=memory_pb2.STAGED, client_address=address,
                        location="cuda:%d" % dev.value))).segment
            except BaseException:
                served.shutdown(socket.SHUT_RDWR)  # the serving thread sees the end
                raise
            finally:
                served.close()
                theirs.close()

        seg = make()
        self._remember(("segment", seg.id), "segment %d (%r, staged GPU memory at 0x%x)" % (
            seg.id, name, address), lambda: make().id)
        return seg

    def move_vram(self, write, address, size, peer="", remote_segment=0, remote_lease=0,
                  remote_agent="", remote_address=0, remote_offset=0, stream=0, chunk=0,
                  timeout=None, path="auto"):
        """Moves GPU memory [address, address + size) (a device pointer: a torch CUDA tensor's
        data_ptr()) to (write) or from a target, as mg_vram_move does in moongate's C library:
        by its dma-buf registration over RDMA (register_vram first), or staged through leases of
        this daemon's pool over any transport, the device copies (on `stream`, a CUstream
        handle, or one of the library's own) overlapping the transfers. `path` is "auto",
        "staged" or "dmabuf". Returns a VramMove saying how the bytes went; raises Error
        (the daemon's refusal, RESOURCE_EXHAUSTED naming a pool too small, INTERNAL naming a
        CUDA error of a copy). The GIL is released while it runs."""
        if not self._plain:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        "GPU memory moves go through moongate's C library, which speaks to a "
                        "unix:PATH or plaintext target")
        if path not in VRAM_PATHS:
            raise ValueError("path is one of %s" % ", ".join(VRAM_PATHS))
        lib = _client_lib()
        args = _VramMoveArgs(1 if write else 0, address, size, peer.encode(), remote_segment,
                             remote_lease, remote_agent.encode(), remote_address, remote_offset,
                             stream or None, chunk, int((timeout or 60) * 1000), VRAM_PATHS[path])
        res, status, err = _VramMoveResult(), ctypes.c_int(), ctypes.create_string_buffer(1024)
        with self._clock:  # one call at a time on the C connection
            if self._cclient is None:
                tok = self._token.encode() if self._token else None
                self._cclient = lib.mg_client_open(self._target.encode(), tok, err, 1024)
                if not self._cclient:
                    raise Error(grpc.StatusCode.UNAVAILABLE, err.value.decode(errors="replace"))
            rc = lib.mg_vram_move(self._cclient, ctypes.byref(args), ctypes.byref(res),
                                  ctypes.byref(status), err, 1024)
        if rc != 0:
            raise Error(_code(status.value), err.value.decode(errors="replace"))
        return VramMove((res.path or b"").decode(), res.bytes, res.chunk, res.chunks,
                        res.buffers, bool(res.bounce), res.pool.decode(), res.why.decode())

    def write_vram(self, address, size, **kw):
        """move_vram(True, ...): GPU memory -> the target."""
        return self.move_vram(True, address, size, **kw)

    def read_vram(self, address, size, **kw):
        """move_vram(False, ...): the target -> GPU memory."""
        return self.move_vram(False, address, size, **kw)

    def register_any(self, address, size, name=None, remote_accessible=True):
        """Memory of this process by its address, whatever it is (malloc, mmap, a NumPy
        array, pinned host memory, GPU memory), registered the way a path serves it: host
        memory as process memory (register_memory); memory the daemon cannot reach in this
        process that the CUDA driver (loaded only then) knows as a device's by its dma-bufs
        (register_vram: peers reach it over RDMA), and where that is refused (no RDMA device
        on the daemon, a GPU without dma-buf) staged (register_vram_staged: over TCP). With
        remote_accessible, where no path lets peers reach it (the daemon's TCP data plane off)
        it is registered for this process's transfers only. Returns a Registered saying which.
        Raises Error: FAILED_PRECONDITION where no path serves it at all (process memory off on
        the daemon: the error names the setting), INVALID_ARGUMENT naming both ways tried for
        memory that is neither (freed, another process's, of a CUDA context that is gone)."""
        name = name or "mem-%d-%x" % (os.getpid(), address)
        remote = remote_accessible
        try:
            seg = self.register_memory(name, address, size, remote_accessible=remote)
            return Registered([seg], "process", "process_vm" if remote else "", "")
        except Error as e:
            if e.code == grpc.StatusCode.INVALID_ARGUMENT:
                return self._register_device_any(name, address, size, remote, e)
            if e.code != grpc.StatusCode.FAILED_PRECONDITION or not remote:
                raise
            why = e.message  # no data plane for peers; process memory off fails again below
        try:
            seg = self.register_memory(name, address, size)
        except Error as e:
            if e.code == grpc.StatusCode.INVALID_ARGUMENT:
                return self._register_device_any(name, address, size, False, e)
            raise
        return Registered([seg], "process", "", why)

    def _register_device_any(self, name, address, size, remote, refused):
        """register_any of memory the daemon refused as this process's (`refused`)."""
        device, why_not = _device_or_why(address)
        if device is None:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                        "0x%x (%d bytes) is neither memory of this process nor device memory "
                        "the CUDA driver knows (freed, another process's, or of a context that "
                        "is gone): as host memory, %s; as device memory, %s" % (
                            address, size, refused.message, why_not))
        try:
            return Registered(self.register_vram(address, size, remote, name), "device",
                              "dmabuf" if remote else "", "")
        except Error as e:
            if e.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            why = "GPU memory by dma-buf: " + e.message
        try:
            return Registered([self.register_vram_staged(address, size, remote, name)],
                              "device", "staged" if remote else "", why)
        except Error as e:
            if e.code != grpc.StatusCode.FAILED_PRECONDITION or not remote:
                raise
            why += "; staged for peers: " + e.message  # no TCP data plane for peers here
        return Registered([self.register_vram_staged(address, size, False, name)], "device",
                          "", why)

    def register_memory(self, name, address, size, **kw):
        """Registers memory this process allocated itself (a bytearray, a numpy array: see
        address_of) where it lies, with no file: the daemon reads and writes it with
        process_vm_readv/writev (copy and TCP paths; never RDMA). Transfers name it by segment id
        or by address; with remote_accessible=True peers write into and read from it over TCP.
        Keep the memory alive until it is unregistered."""
        def make():
            return self._call(self.memory.RegisterSegment, memory_pb2.RegisterRequest(
                name=name, source=memory_pb2.PROCESS, client_address=address, size=size,
                **kw)).segment
        seg = make()
        self._remember(("segment", seg.id), "segment %d (%r, process memory at 0x%x)" % (
            seg.id, name, address), lambda: make().id)
        return seg

    def _call_ids(self, fn, build, **kw):
        """_call(fn, build()) for a request naming segments by the ids the program holds: built
        after any restore on its way, and built and made once more when a restore ran while it
        went and the daemon refused it for an id (it was mapped before the restore)."""
        self._re.gate()
        restores = self._re.restores
        try:
            return self._call(fn, build(), **kw)
        except Error as e:
            if e.code not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND) or \
                    (self._re.restores == restores and not self._re.busy()):
                raise
        self._re.gate()
        return self._call(fn, build(), **kw)

    def unregister(self, segment_id):
        self._re.gate()
        if self._table.lost(segment_id):  # gone with the daemon's restart: nothing to undo
            self._table.drop(("segment", segment_id))
            return
        self._call_ids(self.memory.UnregisterSegment,
                       lambda: memory_pb2.UnregisterRequest(id=self._id(segment_id)))
        self._table.drop(("segment", segment_id))

    def segments(self):
        token = ""
        while True:
            page = self._call(self.memory.ListSegments,
                              memory_pb2.ListSegmentsRequest(page_token=token))
            yield from page.segments
            token = page.next_page_token
            if not token:
                return

    def map(self, segment):
        """The segment's file as a writable memoryview, in a `with` block."""
        return _Mapped(self._maps, segment.path, 0, segment.size)

    # leases
    def lease(self, size, ttl_ms=0, block=False, remote_accessible=False, timeout=None):
        """Acquires a lease; use it in a `with` block (released on exit) or call release()."""
        msg = self._call(self.pool.AcquireLease, pool_pb2.AcquireLeaseRequest(
            size=size, ttl_ms=ttl_ms, block=block, remote_accessible=remote_accessible),
            timeout)
        self._remember(("lease", msg.id), "lease %d" % msg.id)  # gone with a restart
        return _SyncLease(self, msg)

    def release(self, lease):
        """Releases a lease; one that went with a restart of the daemon raises Error
        (NOT_FOUND) saying so."""
        lid = lease.id if isinstance(lease, Lease) else lease
        if isinstance(lease, Lease):
            lease._drop_view()
        why = self._table.lost(lid)
        self._table.drop(("lease", lid))
        if why:
            raise Error(grpc.StatusCode.NOT_FOUND, "lease %d: %s" % (lid, why))
        self._call(self.pool.ReleaseLease, pool_pb2.ReleaseLeaseRequest(id=lid))

    # prepared lists
    def prepare_list(self, addresses, lengths, peer="", agent=""):
        """Keeps a list of ranges on the daemon that later batches of this client name by
        index (prepared(); NIXL's prepared lists): this process's own memory by address
        (peer and agent ""), each range checked now to lie in one region it registered; or an
        agent's memory (agent, on peer), checked now where the daemon knows the agent's regions
        (import_agent), else when a batch uses it. Returns the list's id.
        The list lives as long as this client's connection: after a daemon restart, or when the
        connection is made again, prepare it again (a batch naming it fails NOT_FOUND)."""
        return self._call(self.transfers.PrepareList, transfer_pb2.PrepareListRequest(
            addresses=list(addresses), lengths=list(lengths), peer=peer,
            remote_agent=agent)).id

    def release_list(self, list_id):
        self._call(self.transfers.ReleaseList, transfer_pb2.ReleaseListRequest(id=list_id))

    def attach_ring(self, entries=256):
        """A submission ring for this client's connection (on the daemon's Unix socket): a
        moongate.ring.Ring where batches by index into this connection's prepared lists are
        posted, and their ends read, without a call each. It goes with the connection."""
        from moongate import ring
        return ring.attach(self, entries)

    # transfers
    def transfer(self, requests, notify=(), timeout_ms=0, request_id="", check=True,
                 digest=False, traceparent="", brief=False, prepared=(), strided=()):
        """Submits a batch and waits for its end (one call: Submit with wait). Returns the
        Batch; with check, raises Error for the first failed request or notification.
        digest: every request checked end to end (CRC32C; DATA_LOSS when the bytes that
        landed differ); traceparent: a W3C traceparent the batch's trace continues; brief:
        the Batch lists only the requests that failed (each with its index), not one status
        per request. prepared: groups by index into prepared lists (see prepared()), after
        the requests; strided: groups of blocks at regular intervals (see strided()), after
        those."""
        requests, strided = list(requests), list(strided)
        resp = self._call_ids(self.transfers.Submit, lambda: transfer_pb2.SubmitRequest(
            requests=self._now(requests), notify=list(notify), timeout_ms=timeout_ms,
            request_id=request_id, wait=True, digest=digest, brief=brief,
            prepared=list(prepared), strided=self._now(strided)),
            timeout=max(self.timeout, timeout_ms / 1000.0 + 5), traceparent=traceparent)
        if check and resp.batch.state != transfer_pb2.DONE:
            raise _batch_error(resp.batch)
        return resp.batch

    def submit(self, requests, notify=(), timeout_ms=0, request_id="", digest=False,
               traceparent="", prepared=(), strided=()):
        """Submits a batch without waiting; returns its id (see wait()). digest, traceparent,
        prepared and strided as for transfer()."""
        requests, strided = list(requests), list(strided)
        bid = self._call_ids(self.transfers.Submit, lambda: transfer_pb2.SubmitRequest(
            requests=self._now(requests), notify=list(notify), timeout_ms=timeout_ms,
            request_id=request_id, digest=digest, prepared=list(prepared),
            strided=self._now(strided)),
            traceparent=traceparent).batch_id
        self._ran(bid)
        return bid

    def submit_pending(self, request):
        """A SubmitRequest sent with `wait` set, not waited for: a Pending whose done() looks
        without a call to the daemon and whose result() is the SubmitResponse with the batch
        at its end (Error if it failed to be taken). For callers that poll many transfers
        (the NIXL door's check_xfer_state). `request` may be the request's bytes, serialized
        by the caller (who sets `wait` in them, or not)."""
        self._re.gate()
        if isinstance(request, (bytes, bytearray)):
            if self._submit_raw is None:
                self._submit_raw = self._ch.unary_unary(
                    "/moongate.v1.Transfer/Submit", request_serializer=None,
                    response_deserializer=transfer_pb2.SubmitResponse.FromString)
            return _Pending(self, self._submit_raw.future(bytes(request), metadata=self.md))
        request.wait = True
        return _Pending(self, self.transfers.Submit.future(request, metadata=self.md))

    def _now(self, requests):
        return _ids_now(requests, self._id)

    def _ran(self, batch_id):
        """Keeps which epoch a batch ran under (the last 4096), to name a restart."""
        if self._re.epoch is not None:
            self._batch_epochs[batch_id] = self._re.epoch
            while len(self._batch_epochs) > 4096:
                self._batch_epochs.popitem(last=False)

    def _batch_gone(self, batch_id, e):
        """An Error for a batch the daemon does not know: one of an earlier epoch names the
        restart (its outcome is unknown), else the daemon's own words."""
        was = self._batch_epochs.get(batch_id)
        if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE) and \
                was is not None and self._re.epoch is not None and was != self._re.epoch:
            return Error(grpc.StatusCode.UNAVAILABLE,
                         "batch %d ran on the daemon before it restarted (epoch %016x, now "
                         "%016x): daemon restarted; what it moved is unknown" % (
                             batch_id, was, self._re.epoch))
        return self._error(e)

    def cancel(self, batch_id, brief=True):
        """Cancels a batch (Transfer/Cancel): its requests not done end CANCELLED. Returns the
        batch as it stands."""
        return self._call(self.transfers.Cancel,
                          transfer_pb2.GetBatchRequest(id=batch_id, brief=brief))

    def get_batch(self, batch_id, brief=False):
        """The batch as it stands (GetBatch): its state, counts and requests."""
        return self._call(self.transfers.GetBatch,
                          transfer_pb2.GetBatchRequest(id=batch_id, brief=brief))

    def wait(self, batch_id, progress=None, check=True, brief=False):
        """Follows a batch to its end (Transfer/Wait); `progress(batch)` sees each report.
        brief: each report lists only the requests that failed (see transfer())."""
        last = None
        self._re.gate()
        try:
            for b in self.transfers.Wait(transfer_pb2.GetBatchRequest(id=batch_id, brief=brief),
                                         metadata=self.md):
                last = b
                if progress:
                    progress(b)
        except grpc.RpcError as e:
            raise self._batch_gone(batch_id, e) from None
        if check and last is not None and last.state != transfer_pb2.DONE:
            raise _batch_error(last)
        return last

    # notifications
    def notifications(self, topic, timeout=None):
        """Notifications of `topic` as they arrive (Notify/Watch); ends after `timeout`
        seconds (None: never) without raising."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            self._re.gate()
            left = None if end is None else max(0.0, end - time.monotonic())
            call = self._notify.Watch(notify_pb2.WatchRequest(topic=topic), metadata=self.md,
                                      timeout=left)
            try:
                yield from call
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return
                if e.code() != grpc.StatusCode.UNAVAILABLE or not len(self._table) or \
                        _restore.reconnect_bound_s() == 0:
                    raise self._error(e) from None
                _restore.log.warning("notifications of %r: the connection to the daemon broke "
                                     "(%s); watching again once it is back (what it had queued "
                                     "and not given is lost)", topic, e.details())
                time.sleep(0.05)  # the channel's state reaches the restorer first
            finally:
                call.cancel()

    def send(self, topic, payload=b"", peer="", agent="", traceparent=""):
        """A notification to `topic` on a peer daemon (peer, or the daemon of agent
        "host:port"), without a transfer; after this client's earlier notifications to that
        peer and topic (its batches' included). Returns once the peer queued it."""
        self._call(self._notify.Send, notify_pb2.SendRequest(peer=peer, agent=agent, topic=topic,
                                                             payload=payload),
                   traceparent=traceparent)

    def poll(self, topic, max=100):
        return list(self._call(self._notify.Poll, notify_pb2.PollRequest(topic=topic, max=max))
                    .notifications)

    def expect(self, topic, timeout_ms, peer="", agent="", epoch=0, lease=0, segment=0):
        """Declares that a notification is due on `topic` within timeout_ms, from `peer` (its
        daemon, "host:port") or `agent` if named. If none comes, this client's daemon posts a
        failure notice to the topic (outcome: DEADLINE, SENDER_UNREACHABLE, SENDER_RESTARTED
        or SENDER_AGENT_GONE), so notifications()/poll() of the topic always end. Returns the
        Expectation (its id for unexpect())."""
        def make():
            return self._call(self._notify.Expect, notify_pb2.ExpectRequest(
                topic=topic, timeout_ms=timeout_ms, peer=peer, agent=agent, epoch=epoch,
                lease=getattr(lease, "id", lease), segment=self._id(segment)))
        got = make()
        self._remember(("expect", got.id), "expectation %d of topic %r" % (got.id, topic),
                       lambda: make().id)
        return got

    def unexpect(self, expectation):
        eid = getattr(expectation, "id", expectation)
        try:
            now = self._table.id("expect", eid)
        except LookupError:
            now = eid
        self._call(self._notify.Unexpect, notify_pb2.UnexpectRequest(id=now))
        self._table.drop(("expect", eid))

    def expectations(self):
        return list(self._call(self._notify.ListExpectations,
                               notify_pb2.ListExpectationsRequest()).expectations)


class _Pending:
    """Client.submit_pending's call in flight."""

    def __init__(self, client, future):
        self._c, self._f = client, future

    def done(self):
        return self._f.done()

    def result(self):
        try:
            return self._f.result()
        except grpc.RpcError as e:
            raise self._c._error(e) from None


class _SyncLease(Lease):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._client.release(self)

    def release(self):
        self._client.release(self)


class AsyncClient:
    """The same on grpc.aio: every method is a coroutine; notifications is an async
    iterator; lease() is an async context manager."""

    def __init__(self, target="unix:/run/moongate/moongate.sock", ca=None, cert=None, key=None,
                 token=None, plaintext=False, timeout=30.0, fd_socket=None):
        self.timeout = timeout
        self.md = [("authorization", "Bearer " + token)] if token else None
        self._token = token
        self.fd_socket = _fd_socket(target, fd_socket)
        self._ch = _channel(target, ca, cert, key, plaintext, aio=True)
        self.memory = memory_pb2_grpc.MemoryStub(self._ch)
        self.pool = pool_pb2_grpc.PoolStub(self._ch)
        self.transfers = transfer_pb2_grpc.TransferStub(self._ch)
        self._notify = notify_pb2_grpc.NotifyStub(self._ch)
        self.agent = agent_pb2_grpc.AgentStub(self._ch)
        self.daemon = daemon_pb2_grpc.DaemonStub(self._ch)
        self._maps = _Maps()
        self._table = _restore.Table()  # what comes back with the daemon, as Client's
        self._target, self._owner = target, _socket_owner(target)
        self._re = _restore.AsyncReconnector(self._ch, self._table, self._probe, _fatal,
                                             _restore.reconnect_bound_s())

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        await self._re.close()
        self._maps.close()
        await self._ch.close()
        self._table.close()

    @property
    def epoch(self):
        return self._re.epoch

    @property
    def restarts(self):
        return self._re.restarts

    async def _probe(self, timeout):
        _same_owner(self._target, self._owner)  # before the credentials go to whoever is there
        epoch = (await self.daemon.Info(daemon_pb2.InfoRequest(), metadata=self.md,
                                        timeout=timeout, wait_for_ready=True)).epoch
        _same_owner(self._target, self._owner)
        return epoch

    async def _call(self, fn, req, timeout=None, traceparent=""):
        await self._re.gate()
        if self._re.fatal:
            raise Error(grpc.StatusCode.UNAVAILABLE, self._re.gone)
        try:
            call = fn(req, metadata=_metadata(self.md, traceparent),
                      timeout=timeout or self.timeout)
            out = await call
            self._re.mark_up()
            self._re.answered(await call.initial_metadata())
            return out
        except grpc.RpcError as e:
            self._re.answered(e.trailing_metadata())
            if self._re.gone and e.code() == grpc.StatusCode.UNAVAILABLE:
                raise Error(e.code(), self._re.gone) from None
            raise Error(e.code(), e.details()) from None

    async def _remember(self, key, what, redo=None, close=None):
        if self._re.epoch is None:
            try:
                self._re.start(await self._probe(self.timeout))
            except grpc.RpcError:
                pass
        self._table.add(key, what, redo, close)

    def _id(self, value):
        return _segment_now(self._table, value)

    async def register_agent(self, name, port=0):
        """Client.register_agent: made again (same name and port) after a daemon restart."""
        info = await self._call(self.agent.RegisterAgent,
                                agent_pb2.RegisterAgentRequest(name=name, port=port))

        async def again():
            await self._call(self.agent.RegisterAgent,
                             agent_pb2.RegisterAgentRequest(name=name, port=info.port))
        await self._remember(("agent", name), "agent %r (port %d)" % (name, info.port), again)
        return info

    async def unregister_agent(self, name):
        await self._call(self.agent.UnregisterAgent, agent_pb2.UnregisterAgentRequest(name=name))
        self._table.drop(("agent", name))

    async def agents(self):
        return list((await self._call(self.agent.ListAgents,
                                      agent_pb2.ListAgentsRequest())).agents)

    async def register(self, name, size, remote_accessible=False, share_with=(), **kw):
        seg = (await self._call(self.memory.RegisterSegment, memory_pb2.RegisterRequest(
            name=name, size=size, remote_accessible=remote_accessible,
            share_with=list(share_with), **kw))).segment
        await self._remember(("segment", seg.id), "segment %d (%r, made by the daemon)" % (
            seg.id, name))
        return seg

    async def register_fd(self, name, fd, offset=0, size=0, remote_accessible=False,
                          share_with=(), **kw):
        if not self.fd_socket:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        "descriptors are passed on a Unix socket: connect with unix:PATH")
        keep = os.dup(fd)  # passed again when the daemon comes back

        async def make():
            handle, _ = pass_fd(self.fd_socket, keep, self._token)  # a local socket
            return (await self._call(self.memory.RegisterSegment, _fd_request(
                name, handle, offset, size, remote_accessible, share_with, kw))).segment
        try:
            seg = await make()
        except BaseException:
            os.close(keep)
            raise

        async def again():
            return (await make()).id
        await self._remember(("segment", seg.id), "segment %d (%r, a file passed by "
                             "descriptor)" % (seg.id, name), again, lambda: os.close(keep))
        return seg

    async def allocate_buffer(self, size, remote_accessible=False, name=None, **kw):
        """Client.allocate_buffer as a coroutine; `await b.free()`, or `async with` it."""
        name = name or "buffer-%d-%d" % (os.getpid(), next(_names))
        fd, mm, address = _buffer_memory(size, name)
        try:
            seg = await self.register_fd(name, fd, size=size,
                                         remote_accessible=remote_accessible,
                                         client_address=address, **kw)
        except BaseException:
            mm.close()
            raise
        finally:
            os.close(fd)
        return _AsyncBuffer(self, mm, seg)

    async def unregister(self, segment_id):
        await self._re.gate()
        if self._table.lost(segment_id):
            self._table.drop(("segment", segment_id))
            return
        await self._call_ids(self.memory.UnregisterSegment,
                             lambda: memory_pb2.UnregisterRequest(id=self._id(segment_id)))
        self._table.drop(("segment", segment_id))

    def map(self, segment):
        return _Mapped(self._maps, segment.path, 0, segment.size)

    def lease(self, size, ttl_ms=0, block=False, remote_accessible=False, timeout=None):
        return _AsyncLeaseCtx(self, pool_pb2.AcquireLeaseRequest(
            size=size, ttl_ms=ttl_ms, block=block, remote_accessible=remote_accessible), timeout)

    async def release(self, lease):
        lid = lease.id if isinstance(lease, Lease) else lease
        if isinstance(lease, Lease):
            lease._drop_view()
        why = self._table.lost(lid)
        self._table.drop(("lease", lid))
        if why:
            raise Error(grpc.StatusCode.NOT_FOUND, "lease %d: %s" % (lid, why))
        await self._call(self.pool.ReleaseLease, pool_pb2.ReleaseLeaseRequest(id=lid))

    async def _call_ids(self, fn, build, **kw):
        """Client._call_ids for coroutines."""
        await self._re.gate()
        restores = self._re.restores
        try:
            return await self._call(fn, build(), **kw)
        except Error as e:
            if e.code not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND) or \
                    (self._re.restores == restores and not self._re.busy()):
                raise
        await self._re.gate()
        return await self._call(fn, build(), **kw)

    async def transfer(self, requests, notify=(), timeout_ms=0, request_id="", check=True,
                       digest=False, traceparent="", brief=False, prepared=(), strided=()):
        requests, strided = list(requests), list(strided)
        resp = await self._call_ids(self.transfers.Submit, lambda: transfer_pb2.SubmitRequest(
            requests=_ids_now(requests, self._id), notify=list(notify), timeout_ms=timeout_ms,
            request_id=request_id, wait=True, digest=digest, brief=brief,
            prepared=list(prepared), strided=_ids_now(strided, self._id)),
            timeout=max(self.timeout, timeout_ms / 1000.0 + 5), traceparent=traceparent)
        if check and resp.batch.state != transfer_pb2.DONE:
            raise _batch_error(resp.batch)
        return resp.batch

    async def expect(self, topic, timeout_ms, peer="", agent="", epoch=0, lease=0, segment=0):
        async def make():
            return await self._call(self._notify.Expect, notify_pb2.ExpectRequest(
                topic=topic, timeout_ms=timeout_ms, peer=peer, agent=agent, epoch=epoch,
                lease=getattr(lease, "id", lease), segment=self._id(segment)))
        got = await make()

        async def again():
            return (await make()).id
        await self._remember(("expect", got.id), "expectation %d of topic %r" % (got.id, topic),
                             again)
        return got

    async def unexpect(self, expectation):
        eid = getattr(expectation, "id", expectation)
        try:
            now = self._table.id("expect", eid)
        except LookupError:
            now = eid
        await self._call(self._notify.Unexpect, notify_pb2.UnexpectRequest(id=now))
        self._table.drop(("expect", eid))

    async def notifications(self, topic, timeout=None):
        call = self._notify.Watch(notify_pb2.WatchRequest(topic=topic), metadata=self.md,
                                  timeout=timeout)
        try:
            async for n in call:
                yield n
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Error(e.code(), e.details()) from None
        finally:
            call.cancel()


class _AsyncLeaseCtx:
    def __init__(self, client, req, timeout):
        self.client, self.req, self.timeout, self.lease = client, req, timeout, None

    def __await__(self):  # `lease = await c.lease(...)`: released with c.release(lease)
        return self.__aenter__().__await__()

    async def __aenter__(self):
        msg = await self.client._call(self.client.pool.AcquireLease, self.req, self.timeout)
        await self.client._remember(("lease", msg.id), "lease %d" % msg.id)
        self.lease = Lease(self.client, msg)
        return self.lease

    async def __aexit__(self, *exc):
        await self.client.release(self.lease)
