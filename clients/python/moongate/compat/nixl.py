"""NIXL's Python agent (`nixl._api`, `nixl._bindings`) on moongate, for code written for NIXL:
vLLM's NixlConnector, SGLang's and LMCache's NIXL channels.

    from nixl._api import nixl_agent, nixl_agent_config     # the shim first on PYTHONPATH:
    from nixl._bindings import nixlXferTelemetry             # python3 -m moongate.compat.nixl
                                                             #   --pythonpath
    agent = nixl_agent("prefill-0", nixl_agent_config(backends=["UCX"]))

An agent is a moongate agent of this process on its node's daemon (MOONGATE_SOCKET). Its
memory is registered the way a path serves it (Client.register_any: host memory as process
memory, GPU memory by its dma-bufs or staged), its metadata is the agent's moongate descriptor
(ExportAgent) with the regions NIXL's carries, and a peer's metadata is checked with the daemon
it names (ImportAgent) before any transfer names it. A transfer is one batch of the daemon: its
descriptors a compact group of blocks, its notification sent to the remote agent only once
every descriptor has landed (WRITEs in place there, READs here). Waits are the daemon's: no call
here holds the GIL while the daemon works.

What differs from NIXL is in docs/migrating.md ("NIXL").
"""
import base64
import bisect
import collections
import enum
import itertools
import json
import logging
import os
import struct
import sys
import threading
import time

import grpc

from moongate import client as mg
from moongate.v1 import agent_pb2, transfer_pb2

log = logging.getLogger("moongate.nixl")

DEFAULT_COMM_PORT = 8888
NIXL_INIT_AGENT = ""
BACKEND = "MOONGATE"
# The backends this door answers to: its own, and UCX, which code written for NIXL names by
# default (vLLM's backends=["UCX"]): moongate's daemon serves it.
PLUGINS = (BACKEND, "UCX")
MEM_TYPES = {"DRAM": "DRAM", "VRAM": "VRAM", "cpu": "DRAM", "cuda": "VRAM"}
METADATA_MAGIC = b"moongate-nixl/1\n"
NOTE_MAGIC = b"nixl1"
SEND_OP, FETCH_OP, INVALIDATE_OP = 1, 2, 3  # the metadata listener's (nixl_listen.py)
MAX_METADATA = 1 << 20


# ---- nixl._bindings: exceptions, enums, telemetry, descriptor lists ----

class nixlNotPostedError(Exception):
    pass


class nixlInvalidParamError(Exception):
    pass


class nixlBackendError(Exception):
    pass


class nixlNotFoundError(Exception):
    pass


class nixlMismatchError(Exception):
    pass


class nixlNotAllowedError(Exception):
    pass


class nixlRepostActiveError(Exception):
    pass


class nixlUnknownError(Exception):
    pass


class nixlNotSupportedError(Exception):
    pass


class nixlRemoteDisconnectError(Exception):
    pass


class nixlCancelledError(Exception):
    pass


class nixlNoTelemetryError(Exception):
    pass


# NIXL's status names (nixl_status_t), each with the exception its binding raises.
STATUS = {
    "NIXL_ERR_NOT_POSTED": nixlNotPostedError, "NIXL_ERR_INVALID_PARAM": nixlInvalidParamError,
    "NIXL_ERR_BACKEND": nixlBackendError, "NIXL_ERR_NOT_FOUND": nixlNotFoundError,
    "NIXL_ERR_MISMATCH": nixlMismatchError, "NIXL_ERR_NOT_ALLOWED": nixlNotAllowedError,
    "NIXL_ERR_REPOST_ACTIVE": nixlRepostActiveError, "NIXL_ERR_UNKNOWN": nixlUnknownError,
    "NIXL_ERR_NOT_SUPPORTED": nixlNotSupportedError,
    "NIXL_ERR_REMOTE_DISCONNECT": nixlRemoteDisconnectError,
    "NIXL_ERR_CANCELED": nixlCancelledError, "NIXL_ERR_NO_TELEMETRY": nixlNoTelemetryError,
}
_STATUS_OF = {cls: name for name, cls in STATUS.items()}

# moongate's gRPC codes as NIXL's statuses.
_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: nixlInvalidParamError,
    grpc.StatusCode.OUT_OF_RANGE: nixlInvalidParamError,
    grpc.StatusCode.NOT_FOUND: nixlNotFoundError,
    grpc.StatusCode.PERMISSION_DENIED: nixlNotAllowedError,
    grpc.StatusCode.UNAUTHENTICATED: nixlNotAllowedError,
    grpc.StatusCode.UNIMPLEMENTED: nixlNotSupportedError,
    grpc.StatusCode.CANCELLED: nixlCancelledError,
    grpc.StatusCode.UNAVAILABLE: nixlRemoteDisconnectError,
    grpc.StatusCode.UNKNOWN: nixlUnknownError,
}


def _nixl_error(cls, why):
    """NIXL's exception `cls`, its status name first (as NIXL's message is), moongate's reason
    after it."""
    return cls("%s: %s" % (_STATUS_OF[cls], why))


def _from_mg(e, what):
    return _nixl_error(_CODE.get(e.code, nixlBackendError), "%s: %s" % (what, e))


class nixl_mem_t(int):
    pass


DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG = (nixl_mem_t(i) for i in range(5))
NIXL_READ, NIXL_WRITE = 0, 1
_SEG_NAMES = {DRAM_SEG: "DRAM", VRAM_SEG: "VRAM", BLK_SEG: "BLOCK", OBJ_SEG: "OBJ",
              FILE_SEG: "FILE"}
_SEG_OF = {v: k for k, v in _SEG_NAMES.items()}


class nixlXferTelemetry:
    """A finished transfer's figures: startTime (µs, a monotonic clock), postDuration and
    xferDuration (µs), totalBytes and descCount."""

    __slots__ = ("_start", "_post", "_xfer", "_bytes", "_count")

    def __init__(self, start=0, post=0, xfer=0, nbytes=0, count=0):
        self._start, self._post, self._xfer = start, post, xfer
        self._bytes, self._count = nbytes, count

    startTime = property(lambda s: s._start)
    postDuration = property(lambda s: s._post)
    xferDuration = property(lambda s: s._xfer)
    totalBytes = property(lambda s: s._bytes)
    descCount = property(lambda s: s._count)

    def __repr__(self):
        return ("nixlXferTelemetry(startTime=%d, postDuration=%d, xferDuration=%d, "
                "totalBytes=%d, descCount=%d)" % (self._start, self._post, self._xfer,
                                                   self._bytes, self._count))


class _DList:
    """A descriptor list: its memory type and (addr, len, devId[, metaInfo]) tuples."""

    _width = 3

    def __init__(self, mem_type, descs=None):
        if isinstance(mem_type, str):
            mem_type = _SEG_OF[MEM_TYPES.get(mem_type, mem_type)]
        self._type = nixl_mem_t(mem_type)
        self._descs = []
        if isinstance(descs, int) or descs is None:
            return
        rows = descs.tolist() if hasattr(descs, "tolist") else descs
        for d in rows:
            self.addDesc(tuple(d) if not isinstance(d, tuple) else d)

    def _check(self, d):
        if not isinstance(d, tuple):
            raise TypeError("Each descriptor must be a tuple when provided as a list")
        if len(d) != self._width:
            raise ValueError("Each descriptor tuple must have exactly %d elements" % self._width)
        addr, length, dev = (int(x) for x in d[:3])
        if addr < 0 or length < 0 or addr + length > 1 << 64:
            raise ValueError("descriptor (0x%x, %d): outside the address space" % (addr, length))
        return (addr, length, dev) + tuple(d[3:])

    def getType(self):
        return self._type

    def descCount(self):
        return len(self._descs)

    def isEmpty(self):
        return not self._descs

    def __len__(self):
        return len(self._descs)

    def __getitem__(self, i):
        return self._descs[i]

    def __iter__(self):
        return iter(self._descs)

    def __eq__(self, other):
        return type(other) is type(self) and (self._type, self._descs) == (other._type,
                                                                           other._descs)

    def addDesc(self, d):
        self._descs.append(self._check(d))

    append = addDesc

    def remDesc(self, i):
        del self._descs[i]

    def clear(self):
        self._descs.clear()

    def index(self, d):
        try:
            return self._descs.index(self._check(d))
        except ValueError:
            raise _nixl_error(nixlNotFoundError, "no such descriptor in the list") from None

    def __repr__(self):
        return "%s(%s, %r)" % (type(self).__name__, _SEG_NAMES[self._type], self._descs)


class nixlXferDList(_DList):
    pass


class nixlRegDList(_DList):
    _width = 4

    def _check(self, d):
        d = super()._check(d)
        return d[:3] + (str(d[3]),)

    def trim(self):
        return nixlXferDList(self._type, [d[:3] for d in self._descs])


# ---- nixl._api ----

class nixl_thread_sync_t(enum.Enum):
    """NIXL's thread-safety modes: taken, with no effect (the agent is thread-safe: its state
    is under a lock, and the daemon serializes the rest)."""
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0


class nixl_agent_config:
    """NIXL's agent configuration. The daemon runs the progress and the transfers: the thread
    settings are taken and have no effect; capture_telemetry (or NIXL_TELEMETRY_ENABLE) turns
    get_xfer_telemetry on, as in NIXL; enable_listen_thread serves the agent's metadata on
    listen_port (0: DEFAULT_COMM_PORT), for peers' fetch_remote_metadata and
    send_local_metadata (moongate.compat.nixl_listen)."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False, listen_port=0,
                 capture_telemetry=False, num_threads=0, backends=("UCX",), sync_mode=None):
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError("sync_mode must be a nixl_thread_sync_t")
        self.sync_mode = sync_mode
        self.backends = list(backends)
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads


class nixl_prepped_dlist_handle:
    __slots__ = ("_handle", "_agent", "_released")

    def __init__(self, agent, value):
        self._handle, self._agent, self._released = int(value), agent, False

    def __repr__(self):
        return "nixl_prepped_dlist_handle(0x%x, released=%s)" % (self._handle, self._released)

    def release(self):
        if not self._released:
            self._agent._release_dlist(self._handle)
            self._released = True


class nixl_xfer_handle:
    __slots__ = ("_handle", "_agent", "_released")

    def __init__(self, agent, value):
        self._handle, self._agent, self._released = int(value), agent, False

    def __repr__(self):
        return "nixl_xfer_handle(0x%x, released=%s)" % (self._handle, self._released)

    def release(self):
        if not self._released:
            self._agent._release_xfer(self._handle)
            self._released = True


nixl_backend_handle = int

_Remote = collections.namedtuple("_Remote", "name peer agent port topic starts ends")
_Region = collections.namedtuple("_Region", "addr size segments")


class _Prepped:
    """A prepared descriptor list: local (remote None) or an agent's (remote its _Remote; this
    agent's own memory as a target too), kept on the daemon as list `lid` (PrepareList) and
    here, to check indices and to prepare it again on a new connection."""

    __slots__ = ("remote", "addrs", "lens", "mem_type", "lid", "np_lens")

    def __init__(self, remote, addrs, lens, mem_type):
        self.remote, self.addrs, self.lens, self.mem_type = remote, addrs, lens, mem_type
        self.lid, self.np_lens = 0, None


def _varint(v):
    out = bytearray()
    while v > 0x7f:
        out.append(v & 0x7f | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _packed(np, field, a):
    """Field `field` of packed varints a (NumPy, non-negative), as protobuf writes it."""
    v = a.astype(np.uint64)
    size = np.ones(v.size, dtype=np.int64)
    rest = v >> np.uint64(7)
    while rest.any():
        size += rest > 0
        rest >>= np.uint64(7)
    out = np.empty(int(size.sum()), dtype=np.uint8)
    at = np.cumsum(size) - size
    for k in range(int(size.max(initial=0))):
        m = size > k
        out[at[m] + k] = ((v[m] & np.uint64(0x7f)) | np.where(
            size[m] > k + 1, np.uint64(0x80), np.uint64(0))).astype(np.uint8)
        v >>= np.uint64(7)
    body = out.tobytes()
    return _varint(field << 3 | 2) + _varint(len(body)) + body


class _PackedGroup:
    """SubmitRequest.prepared's group of index arrays of NumPy, encoded with NumPy (vLLM's
    transfers name thousands of blocks: no Python step per index)."""

    __slots__ = ("op", "local_list", "li", "remote_list", "ri", "_bytes", "_ids")

    def __init__(self, op, local_list, li, remote_list, ri):
        self.op, self.local_list, self.li = op, local_list, li
        self.remote_list, self.ri = remote_list, ri
        self._bytes, self._ids = b"", None

    def encode(self):
        """Field 10 (prepared) of a SubmitRequest, for the lists' ids now."""
        if self._ids != (self.local_list, self.remote_list):
            np = sys.modules["numpy"]
            body = (_varint(1 << 3) + _varint(self.op) + _varint(2 << 3) +
                    _varint(self.local_list) + _packed(np, 3, self.li) + _varint(4 << 3) +
                    _varint(self.remote_list) + _packed(np, 5, self.ri))
            self._bytes = _varint(10 << 3 | 2) + _varint(len(body)) + body
            self._ids = (self.local_list, self.remote_list)
        return self._bytes


class _Done:
    """An answer already in, shaped as a pending one."""

    def __init__(self, resp):
        self._r = resp

    def done(self):
        return True

    def result(self):
        return self._r


# What a transfer posted on a ring the daemon let go ends with (its connection closed): it is
# posted again as a Submit, its lists prepared again.
_RING_GONE = object()
_RING_GONE_ERROR = mg.Error(grpc.StatusCode.UNAVAILABLE, "the daemon let the agent's ring go "
                            "(its connection closed)")


class _RingResp:
    """A ring completion shaped as a Submit's answer: its batch DONE."""

    class batch:  # noqa: N801
        state = transfer_pb2.DONE


class _RingPending:
    """A transfer posted on the agent's submission ring: done() reads the ring's completions
    from shared memory, with no call to the daemon."""

    __slots__ = ("_a", "ud")

    def __init__(self, agent, ud):
        self._a, self.ud = agent, ud

    def done(self):
        return self._a._ring_ended(self.ud)

    def result(self):
        c = self._a._ring_take(self.ud)
        if c is _RING_GONE:
            raise _RING_GONE_ERROR
        if c.code == 0:
            return _RingResp
        raise mg.Error(mg._code(c.code), c.why)


def _pairs(lo, ro, local_indices, remote_indices):
    """(local indices, remote indices, bytes) of a transfer by index, checked: as many of
    each, every index in its list, each pair's descriptors the same length. Index arrays of
    NumPy (vLLM's) are checked with NumPy, without a Python step per pair."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(local_indices, np.ndarray) and \
            isinstance(remote_indices, np.ndarray) and local_indices.ndim == 1 and \
            remote_indices.ndim == 1 and local_indices.size == remote_indices.size and \
            local_indices.size:
        li, ri = local_indices.astype(np.int64), remote_indices.astype(np.int64)
        for side, idx, lst in (("local", li, lo), ("remote", ri, ro)):
            if idx.min() < 0 or idx.max() >= len(lst.addrs):
                bad = int(idx[(idx < 0) | (idx >= len(lst.addrs))][0])
                raise _nixl_error(nixlInvalidParamError, "make_prepped_xfer: %s index %d out "
                                  "of range (the list has %d descriptors)" % (
                                      side, bad, len(lst.addrs)))
            if lst.np_lens is None:
                lst.np_lens = np.array(lst.lens, dtype=np.uint64)
        ll, rl = lo.np_lens[li], ro.np_lens[ri]
        diff = np.flatnonzero(ll != rl)
        if diff.size:
            k = int(diff[0])
            raise _nixl_error(nixlInvalidParamError, "make_prepped_xfer: pair %d: local "
                              "descriptor %d is %d bytes, remote descriptor %d %d" % (
                                  k, li[k], ll[k], ri[k], rl[k]))
        return li, ri, int(ll.sum())
    li, ri = _ints(local_indices), _ints(remote_indices)
    if len(li) != len(ri):
        raise _nixl_error(nixlInvalidParamError, "make_prepped_xfer: %d local indices, %d "
                          "remote" % (len(li), len(ri)))
    if not li:
        raise _nixl_error(nixlInvalidParamError, "a transfer of no descriptors")
    for side, idx, lst in (("local", li, lo), ("remote", ri, ro)):
        n = len(lst.addrs)
        bad = next((i for i in idx if not 0 <= i < n), None)
        if bad is not None:
            raise _nixl_error(nixlInvalidParamError, "make_prepped_xfer: %s index %d out "
                              "of range (the list has %d descriptors)" % (side, bad, n))
    ll, rl = [lo.lens[i] for i in li], [ro.lens[i] for i in ri]
    if ll != rl:
        k = next(k for k in range(len(ll)) if ll[k] != rl[k])
        raise _nixl_error(nixlInvalidParamError, "make_prepped_xfer: pair %d: local "
                          "descriptor %d is %d bytes, remote descriptor %d %d" % (
                              k, li[k], ll[k], ri[k], rl[k]))
    return li, ri, sum(ll)


class _Xfer:
    """A transfer: its Submit (req) of one group of requests (Blocks of addresses, or Prepared
    indices into the daemon's lists lo and ro), made once and posted as often as asked, and its
    state."""

    __slots__ = ("op", "req", "group", "lo", "ro", "remote", "notif", "rid", "pending", "t0",
                 "post_us", "xfer_us", "nbytes", "count", "state", "backend", "polls", "err")

    def __init__(self, op, req, group, nbytes, count, remote, notif, backend, lo=None,
                 ro=None):
        self.op, self.req, self.group = op, req, group
        self.remote, self.notif = remote, _bytes(notif)
        self.lo, self.ro = lo, ro
        self.rid, self.pending, self.t0, self.post_us, self.xfer_us = "", None, 0, 0, 0
        self.nbytes, self.count = nbytes, count
        self.state, self.backend, self.polls, self.err = "NEW", backend, 0, None


def _name(name):
    """An agent name as NIXL's binding takes it: str or bytes."""
    return name.decode() if isinstance(name, (bytes, bytearray)) else str(name)


def _bytes(msg):
    """A notification's bytes: bytes as given, str as UTF-8 (NIXL's binding takes both)."""
    return msg.encode() if isinstance(msg, str) else bytes(msg or b"")


def _ints(xs):
    """A list of ints from a list, a tuple or a 1-D array (NumPy's, any integer dtype)."""
    if hasattr(xs, "ndim") and xs.ndim != 1:
        raise _nixl_error(nixlInvalidParamError, "indices must be 1-D, not %d-D" % xs.ndim)
    return xs.tolist() if hasattr(xs, "tolist") else [int(x) for x in xs]


def _telemetry_env():
    return os.environ.get("NIXL_TELEMETRY_ENABLE", "").lower() in ("1", "y", "yes", "true",
                                                                   "on")


def note_payload(sender, msg):
    """A notification's bytes: the sender agent's name, then the message as given."""
    who = sender.encode()
    return NOTE_MAGIC + struct.pack(">H", len(who)) + who + bytes(msg)


def note_of_payload(p):
    """(sender, message) of note_payload's bytes, or None for other bytes."""
    k = len(NOTE_MAGIC)
    if len(p) < k + 2 or not p.startswith(NOTE_MAGIC):
        return None
    (n,) = struct.unpack_from(">H", p, k)
    if len(p) < k + 2 + n:
        return None
    try:
        return p[k + 2:k + 2 + n].decode(), p[k + 2 + n:]
    except UnicodeDecodeError:
        return None


_agent_serial = itertools.count(1)


def _agent_name_of(name):
    """The moongate agent name of a NIXL agent name: itself where moongate takes it (1..128 of
    [A-Za-z0-9._:-], as vLLM's uuid4 names are), else "nixl-" and a digest of it."""
    ok = 0 < len(name) <= 128 and all(c.isalnum() and c.isascii() or c in "._:-" for c in name)
    if ok:
        return name
    import hashlib
    return "nixl-" + hashlib.sha256(name.encode()).hexdigest()[:40]


class nixl_agent:
    """NIXL's agent on moongate (nixl._api.nixl_agent)."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if nixl_conf is not None and instantiate_all:
            log.warning("nixl_agent(%r): instantiate_all is ignored with a config", agent_name)
            instantiate_all = False
        conf = nixl_conf or nixl_agent_config()
        self.name = _name(agent_name)
        self._listener = None
        self._telemetry = bool(conf.capture_telemetry) or _telemetry_env()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._regs = []        # _Region, by address
        self._starts = []      # their addresses
        self._remotes = {}     # NIXL name -> _Remote
        self._dlists = {}      # id -> _Prepped
        self._xfers = {}       # id -> _Xfer
        # The submission ring prepared transfers are posted on (on the daemon's Unix socket;
        # MOONGATE_RING=0: never), and its completions by user_data.
        self._ring, self._ring_off = None, os.environ.get("MOONGATE_RING", "1") == "0"
        self._ring_lock = threading.Lock()
        self._ring_ids = itertools.count(1)
        self._ring_out, self._ring_end, self._ring_acc = set(), {}, {}
        self._ring_polls = 0
        self._self = None      # this agent as a transfer's remote side, once named so
        self.notifs = {}       # update_notifs' map
        self.plugin_list = list(PLUGINS)
        self.backends, self.backend_mems, self.backend_options = {}, {}, {}
        self.plugin_mem_types = {p: ["DRAM", "VRAM"] for p in PLUGINS}
        self.nixl_mems = {"DRAM": DRAM_SEG, "VRAM": VRAM_SEG, "FILE": FILE_SEG,
                          "BLOCK": BLK_SEG, "OBJ": OBJ_SEG, "cpu": DRAM_SEG, "cuda": VRAM_SEG}
        self.nixl_ops = {"WRITE": NIXL_WRITE, "READ": NIXL_READ}
        self._mg_name = _agent_name_of(self.name)
        try:
            self._c = mg.Client(mg.default_target(), token=mg.default_token())
            try:
                info = self._c.register_agent(self._mg_name)
            except mg.Error as e:  # another agent of the name here (NIXL allows it): its own
                if e.code != grpc.StatusCode.ALREADY_EXISTS:
                    raise
                self._mg_name = _agent_name_of("%s#%d-%d" % (self.name, os.getpid(),
                                                             next(_agent_serial)))
                info = self._c.register_agent(self._mg_name)
        except (OSError, mg.Error) as e:
            raise _nixl_error(nixlBackendError, "agent %r: moongate daemon at %s (MOONGATE_"
                              "SOCKET): %s" % (self.name, mg.default_target(), e)) from None
        self._port = info.port
        self._topic = "nixl.%d" % info.port
        self._inbox = []  # notifications delivered, not yet taken (get_new_notifs)
        threading.Thread(target=self._watch, name="nixl-notifs", daemon=True).start()
        if conf.enable_listen:
            from moongate.compat.nixl_listen import Listener
            try:
                self._listener = Listener(self, conf.port or DEFAULT_COMM_PORT)
            except OSError as e:
                self._c.close()
                raise _nixl_error(nixlBackendError, "agent %r: its metadata listener on port "
                                  "%d: %s" % (self.name, conf.port or DEFAULT_COMM_PORT, e)) \
                    from None
        for b in (self.plugin_list if instantiate_all else conf.backends):
            if b not in self.plugin_list:
                log.warning("nixl_agent(%r): backend %r is not served by moongate (it serves "
                            "%s); skipped", self.name, b, ", ".join(PLUGINS))
                continue
            self.create_backend(b)

    def __repr__(self):
        return "nixl_agent(%r, moongate agent %r port %d)" % (self.name, self._mg_name,
                                                               self._port)

    def close(self):
        """Ends the agent: its memory is unregistered with it (moongate's; NIXL's agent ends
        when it is garbage)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._ring_lock:
            ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()
        c, self._c = self._c, None
        if c is not None:
            c.close()

    # the submission ring
    def _ring_now(self):
        """The agent's ring, attached on first use; None where there is none (not on the Unix
        socket, a daemon without rings, MOONGATE_RING=0): transfers go as Submit calls."""
        if self._ring_off:
            return None
        if self._ring is None:
            from moongate import ring as mgring
            try:
                self._ring = self._c.attach_ring(4096)
            except (mgring.RingError, mg.Error, OSError) as e:
                self._ring_off = True
                log.info("agent %r: transfers go as Submit calls, not on a ring: %s",
                         self.name, e)
                return None
        return self._ring

    def _ring_post(self, x):
        """Posts x on the ring: a _RingPending, or None (no ring, or full: a Submit call)."""
        from moongate import ring as mgring
        g = x.group
        li, ri = (g.li, g.ri) if isinstance(g, _PackedGroup) else (list(g.local_indices),
                                                                   list(g.remote_indices))
        note = (x.remote.topic, note_payload(self.name, x.notif)) if x.notif else None
        ud = next(self._ring_ids)
        with self._ring_lock:
            ring = self._ring_now()
            if ring is None:
                return None
            try:
                ring.post_pairs(x.op, x.lo.lid, li, x.ro.lid, ri, user_data=ud, notify=note,
                                accepted=True)
            except mgring.RingError as e:
                if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED:  # broken: let it go
                    self._ring_lost()
                return None
            self._ring_out.add(ud)
        return _RingPending(self, ud)

    def _ring_lost(self):
        """The daemon let the ring go: what was posted there ends UNAVAILABLE (a transfer by
        index is then posted again as a Submit, its lists prepared again). Under _ring_lock."""
        ring, self._ring = self._ring, None
        for ud in self._ring_out:
            self._ring_end[ud] = _RING_GONE
        self._ring_out.clear()
        if ring is not None:
            ring.close()

    def _ring_read(self):
        """Takes the ring's completions in (no system call; every 512th look asks whether the
        daemon still serves it). Under _ring_lock."""
        ring = self._ring
        if ring is None:
            return
        for c in ring.poll():
            if c.user_data not in self._ring_out:
                continue  # released before it ended
            if c.accepted:
                self._ring_acc[c.user_data] = c.batch_id
            else:
                self._ring_out.discard(c.user_data)
                self._ring_acc.pop(c.user_data, None)
                self._ring_end[c.user_data] = c
        self._ring_polls += 1
        if self._ring_out and self._ring_polls % 512 == 0 and not ring.alive():
            for c in ring.poll():  # the last it wrote
                if c.user_data in self._ring_out and not c.accepted:
                    self._ring_out.discard(c.user_data)
                    self._ring_end[c.user_data] = c
            self._ring_lost()

    def _ring_ended(self, ud):
        with self._ring_lock:
            if ud not in self._ring_end:
                self._ring_read()
            return ud in self._ring_end

    def _ring_take(self, ud):
        with self._ring_lock:
            return self._ring_end.pop(ud)

    def _ring_forget(self, ud):
        """A transfer released while it goes: its batch's id if it was accepted (to cancel
        it), else 0; its completions are not kept."""
        with self._ring_lock:
            self._ring_read()
            self._ring_out.discard(ud)
            self._ring_end.pop(ud, None)
            return self._ring_acc.pop(ud, 0)

    # backends
    def get_plugin_list(self):
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend):
        return list(self.plugin_mem_types.get(backend, []))

    def get_plugin_params(self, backend):
        return {"served_by": "moongate"} if backend in PLUGINS else {}

    def get_backend_mem_types(self, backend):
        return list(self.backend_mems.get(backend, []))

    def get_backend_params(self, backend):
        return dict(self.backend_options.get(backend, {}))

    def create_backend(self, backend, initParams={}):  # noqa: B006 (NIXL's signature)
        if backend not in PLUGINS:
            raise _nixl_error(nixlNotFoundError, "no plugin %r: moongate serves %s" % (
                backend, ", ".join(PLUGINS)))
        self.backends[backend] = len(self.backends) + 1
        self.backend_mems[backend] = ["DRAM", "VRAM"]
        self.backend_options[backend] = dict(initParams, served_by="moongate")

    def _backend(self, backends):
        for b in backends or ():
            if b not in self.backends:
                raise _nixl_error(nixlNotFoundError, "backend %r was not created on this agent "
                                  "(it has %s)" % (b, ", ".join(self.backends) or "none"))
        if not self.backends:
            raise _nixl_error(nixlBackendError, "no backend: the agent's config named none "
                              "moongate serves (%s)" % ", ".join(PLUGINS))
        return (backends or list(self.backends))[0]

    # descriptors
    def _descs(self, cls, descs, mem_type, what):
        if isinstance(descs, cls):
            return descs
        if descs is None:
            log.error("%s: no descriptors (None: a get_reg_descs or get_xfer_descs that refused "
                      "its input, logged before)", what)
            return None
        if isinstance(descs, _DList):
            log.error("%s: a %s where a %s is wanted", what, type(descs).__name__, cls.__name__)
            return None
        try:
            if hasattr(descs, "data_ptr"):  # a tensor (never imported: any object shaped so)
                descs = [descs]
            if isinstance(descs, (list, tuple)) and descs and hasattr(descs[0], "data_ptr"):
                return self._tensor_descs(cls, descs, what)
            if mem_type is None:
                log.error("%s: mem_type is needed with a list or an array", what)
                return None
            if isinstance(descs, (list, tuple)) and descs and cls is nixlRegDList and \
                    isinstance(descs[0], tuple) and len(descs[0]) != 4:
                log.error("%s: 4-tuple list needed for registration", what)
                return None
            if hasattr(descs, "ndim"):
                if descs.ndim != 2 or descs.shape[1] != 3:
                    log.error("%s: descs must be a Nx3 numpy array", what)
                    return None
                rows = descs.tolist()
                if cls is nixlRegDList:
                    rows = [tuple(r) + ("",) for r in rows]
                return cls(MEM_TYPES.get(mem_type, mem_type), [tuple(r) for r in rows])
            return cls(MEM_TYPES.get(mem_type, mem_type), list(descs))
        except (TypeError, ValueError, KeyError) as e:
            log.error("%s: %s", what, e)
            return None

    def _tensor_descs(self, cls, tensors, what):
        dev = {t.get_device() for t in tensors}
        if len(dev) != 1:
            log.error("%s: tensors on different devices", what)
            return None
        rows = []
        for t in tensors:
            if not t.is_contiguous():
                log.error("%s: a tensor that is not contiguous", what)
                return None
            d = t.get_device()
            rows.append((t.data_ptr(), t.numel() * t.element_size(), max(d, 0)) +
                        (("",) if cls is nixlRegDList else ()))
        return cls("VRAM" if dev.pop() >= 0 else "DRAM", rows)

    def get_reg_descs(self, descs, mem_type=None):
        return self._descs(nixlRegDList, descs, mem_type, "get_reg_descs")

    def get_xfer_descs(self, descs, mem_type=None):
        return self._descs(nixlXferDList, descs, mem_type, "get_xfer_descs")

    def get_remote_descs(self, descs, mem_type=None):
        raise _nixl_error(nixlNotSupportedError, "get_remote_descs: a list naming several "
                          "remote agents (nixlRemoteDList) is not served: prepare one list per "
                          "agent (prep_xfer_dlist)")

    def get_serialized_descs(self, descs):
        """A descriptor list as bytes (JSON; NIXL pickles, which nobody should load from a
        peer)."""
        return json.dumps({"type": _SEG_NAMES[descs.getType()], "reg":
                           isinstance(descs, nixlRegDList), "descs": list(descs)}).encode()

    def deserialize_descs(self, serialized_descs):
        d = json.loads(serialized_descs)
        cls = nixlRegDList if d["reg"] else nixlXferDList
        return cls(d["type"], [tuple(x) for x in d["descs"]])

    # memory
    def register_memory(self, reg_list, mem_type=None, backends=[]):  # noqa: B006
        """Registers each descriptor's memory (Client.register_any: host memory as process
        memory, GPU memory by its dma-bufs or staged); all or nothing. Returns the
        nixlRegDList."""
        self._backend(backends)
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise _nixl_error(nixlInvalidParamError, "register_memory: descriptors that are "
                              "not a list of (addr, len, devId, metaInfo), an Nx3 array or "
                              "tensors (logged)")
        made = []
        try:
            for addr, size, _dev, _meta in descs:
                if size == 0:
                    raise _nixl_error(nixlInvalidParamError, "register_memory: (0x%x, 0): "
                                      "length 0" % addr)
                with self._lock:
                    i = bisect.bisect_right(self._starts, addr)
                    if (i and self._regs[i - 1].addr + self._regs[i - 1].size > addr) or \
                            (i < len(self._regs) and self._regs[i].addr < addr + size):
                        raise _nixl_error(nixlInvalidParamError, "register_memory: (0x%x, %d) "
                                          "overlaps memory registered before" % (addr, size))
                try:
                    r = self._c.register_any(addr, size, name="%s-%x" % (self._mg_name, addr))
                except mg.Error as e:
                    raise _from_mg(e, "register_memory(0x%x, %d)" % (addr, size)) from None
                if r.why:
                    log.warning("register_memory(0x%x): %s", addr, r.why)
                reg = _Region(addr, size, tuple(s.id for s in r.segments))
                with self._lock:
                    bisect.insort(self._regs, reg)
                    self._starts = [r.addr for r in self._regs]
                made.append(reg)
        except BaseException:
            for reg in made:
                left = self._unregister(reg)
                if left is not None:
                    log.warning("register_memory: undoing 0x%x: %s", reg.addr, left[1])
            raise
        return descs

    def _unregister(self, reg):
        """Forgets a region and unregisters its segments. Returns None, or the region of the
        segments the daemon kept (a lease or a transfer of this tenant holds them) and why."""
        with self._lock:
            if reg in self._regs:
                self._regs.remove(reg)
                self._starts = [r.addr for r in self._regs]
        kept, why = [], None
        for seg in reg.segments:
            try:
                self._c.unregister(seg)
            except mg.Error as e:
                if e.code != grpc.StatusCode.NOT_FOUND:  # gone already: with its daemon
                    kept.append(seg)
                    why = why or e
        return (reg._replace(segments=tuple(kept)), why) if kept else None

    def deregister_memory(self, dereg_list, backends=[]):  # noqa: B006
        """Unregisters each region; one the daemon still holds (a transfer not ended) stays
        registered, and nixlBackendError (FAILED_PRECONDITION) names what holds it."""
        with self._lock:
            found = []
            for d in dereg_list:
                reg = next((r for r in self._regs if (r.addr, r.size) == (d[0], d[1])), None)
                if reg is None:
                    raise _nixl_error(nixlNotFoundError, "deregister_memory: (0x%x, %d) is not "
                                      "registered" % (d[0], d[1]))
                found.append(reg)
        failed = None
        for reg in found:
            left = self._unregister(reg)
            if left is not None:
                with self._lock:
                    bisect.insort(self._regs, left[0])
                    self._starts = [r.addr for r in self._regs]
                failed = failed or left
        if failed:
            raise _from_mg(failed[1], "deregister_memory(0x%x)" % failed[0].addr)

    def query_memory(self, reg_list, backend, mem_type=None):
        if backend not in self.backends:
            raise ValueError("Backend '%s' not found. Available backends: %s" % (
                backend, list(self.backends)))
        descs = self.get_reg_descs(reg_list, mem_type) or []
        return [{"registered": "yes"} if self._in_regs(d[0], d[1]) else None for d in descs]

    def _in_regs(self, addr, size):
        with self._lock:
            i = bisect.bisect_right(self._starts, addr) - 1
            return i >= 0 and addr + size <= self._regs[i].addr + self._regs[i].size

    # metadata and remote agents
    def get_agent_metadata(self):
        """This agent's metadata: its moongate descriptor (ExportAgent: the daemon's endpoint,
        epoch, agent id) and its NIXL name, as bytes for the peer's add_remote_agent."""
        try:
            blob = self._c.export_agent(self._mg_name)
        except mg.Error as e:
            raise _from_mg(e, "get_agent_metadata") from None
        with self._lock:
            regions = [[r.addr, r.size] for r in self._regs]
        return METADATA_MAGIC + json.dumps({
            "name": self.name, "descriptor": base64.b64encode(blob).decode(),
            "regions": regions}).encode()

    def add_remote_agent(self, metadata):
        """Checks a peer's metadata with the daemon it names (ImportAgent: the agent must be
        there, of this tenant, under the same epoch); returns its name (bytes, as NIXL's
        binding does). Its regions are the daemon's answer, never the metadata's. As NIXL's:
        metadata that does not parse is nixlMismatchError, an agent of this agent's own name
        nixlInvalidParamError."""
        metadata = bytes(metadata)
        if len(metadata) > MAX_METADATA or not metadata.startswith(METADATA_MAGIC):
            raise _nixl_error(nixlMismatchError, "add_remote_agent: not a moongate NIXL "
                              "agent's metadata (%d bytes)" % len(metadata))
        try:
            d = json.loads(metadata[len(METADATA_MAGIC):])
            name, blob = str(d["name"]), base64.b64decode(d["descriptor"], validate=True)
        except (ValueError, KeyError, TypeError) as e:
            raise _nixl_error(nixlMismatchError, "add_remote_agent: metadata that does not "
                              "parse: %s" % e) from None
        if not name:
            raise _nixl_error(nixlMismatchError, "add_remote_agent: metadata without an "
                              "agent's name")
        if name == self.name:
            raise _nixl_error(nixlInvalidParamError, "add_remote_agent: the remote agent's "
                              "name %r is this agent's own" % name)
        try:
            info = self._c.import_agent(blob)
        except mg.Error as e:
            err = _from_mg(e, "add_remote_agent(%r)" % name)
            if e.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                try:
                    where = agent_pb2.AgentDescriptor.FromString(blob).endpoint
                except Exception:  # noqa: BLE001 (the daemon said what is wrong with it)
                    where = "?"
                err.args = (err.args[0] + " (the metadata names the daemon at %s: that "
                            "daemon's --advertise must be the endpoint peers reach it at)" %
                            where,)
            raise err from None
        regions = sorted((r.address, r.length) for r in info.regions)
        rem = _Remote(name, info.peer, info.name, info.port, "nixl.%d" % info.port,
                      [a for a, _ in regions], [a + n for a, n in regions])
        with self._lock:
            self._remotes[name] = rem
        return name.encode()

    def remove_remote_agent(self, agent):
        with self._lock:
            if self._remotes.pop(_name(agent), None) is None:
                raise _nixl_error(nixlNotFoundError, "remove_remote_agent: no agent %r was "
                                  "added" % _name(agent))

    def check_remote_metadata(self, agent, descs=None):
        with self._lock:
            rem = self._remotes.get(_name(agent))
        if rem is None:
            return False
        return all(self._in(rem, d[0], d[1]) for d in (descs or []))

    def make_connection(self, remote_agent, backends=[]):  # noqa: B006
        """Sessions are the daemon's, opened by the first transfer: checks the agent is
        known."""
        self._remote(remote_agent, "make_connection")

    def _remote(self, agent, what):
        """The agent a call names: one added, or this agent itself (reached through its
        daemon as any agent is, so that its memory may be a transfer's target)."""
        who = _name(agent)
        if who == self.name:
            return self._self_remote()
        with self._lock:
            rem = self._remotes.get(who)
        if rem is None:
            raise _nixl_error(nixlNotFoundError, "%s: no agent %r: add_remote_agent() its "
                              "metadata first" % (what, _name(agent)))
        return rem

    def _self_remote(self):
        with self._lock:
            rem = self._self
        if rem is None:
            try:
                d = agent_pb2.AgentDescriptor.FromString(self._c.export_agent(self._mg_name))
            except mg.Error as e:
                raise _from_mg(e, "this agent as a transfer's target") from None
            rem = _Remote(self.name, d.endpoint, self._mg_name, self._port, self._topic, (), ())
            with self._lock:
                self._self = rem
        return rem

    def _in(self, rem, addr, size):
        """[addr, addr + size) lies in registered memory of rem (None or this agent: this
        agent's own)."""
        if rem is None or rem.name == self.name:
            return self._in_regs(addr, size)
        i = bisect.bisect_right(rem.starts, addr) - 1
        return i >= 0 and addr + size <= rem.ends[i]

    # prepared lists
    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=[]):  # noqa: B006
        """Checks and keeps a descriptor list for make_prepped_xfer: this agent's side
        ("NIXL_INIT_AGENT" or ""), this agent's own memory as the target (its name), or a remote
        agent's (its name, after add_remote_agent). A descriptor outside the registered memory
        of that side: nixlNotFoundError naming it."""
        self._backend(backends)
        who = _name(agent_name)
        descs = self.get_xfer_descs(xfer_list, mem_type)
        if descs is None:
            raise _nixl_error(nixlInvalidParamError, "prep_xfer_dlist: descriptors that are "
                              "not a list of (addr, len, devId), an Nx3 array or tensors "
                              "(logged)")
        local = who in ("NIXL_INIT_AGENT", NIXL_INIT_AGENT)
        rem = None if local else self._remote(who, "prep_xfer_dlist")
        addrs, lens = [d[0] for d in descs], [d[1] for d in descs]
        for k, (a, n) in enumerate(zip(addrs, lens)):
            if not self._in(rem, a, n):
                raise _nixl_error(nixlNotFoundError, "prep_xfer_dlist(%r): descriptor %d "
                                  "(0x%x, %d) is outside the registered memory of %s" % (
                                      who or "NIXL_INIT_AGENT", k, a, n,
                                      "this agent" if rem is None or rem.name == self.name
                                      else "agent %r" % who))
        p = _Prepped(rem, addrs, lens, descs.getType())
        self._prepare(p, "prep_xfer_dlist(%r)" % (who or "NIXL_INIT_AGENT"))
        h = next(self._ids)
        with self._lock:
            self._dlists[h] = p
        return nixl_prepped_dlist_handle(self, h)

    def _prepare(self, p, what):
        """Keeps list p on the daemon (PrepareList): its ranges sent once, later transfers
        naming them by index."""
        peer, agent = ("", "") if p.remote is None else (p.remote.peer, p.remote.agent)
        try:
            p.lid = self._c.prepare_list(p.addrs, p.lens, peer=peer, agent=agent)
        except mg.Error as e:
            raise _from_mg(e, what) from None

    def release_dlist_handle(self, handle):
        handle.release()

    def _release_dlist(self, h):
        with self._lock:
            p = self._dlists.pop(h, None)
        if p is not None and p.lid and self._c is not None:
            try:
                self._c.release_list(p.lid)
            except mg.Error as e:  # gone with its connection already: nothing left to free
                log.debug("release_dlist_handle: list %d: %s", p.lid, e)

    # transfers
    def _op(self, operation):
        op = self.nixl_ops.get(str(operation).upper() if operation else operation)
        if op is None:
            raise _nixl_error(nixlInvalidParamError, "operation %r: READ or WRITE" % (
                operation,))
        return transfer_pb2.WRITE if op == NIXL_WRITE else transfer_pb2.READ

    def _blocks(self, op, la, ll, rem, ra):
        lo, ro = min(la), min(ra)
        b = transfer_pb2.Blocks(op=op, local_address=lo, remote_address=ro)
        b.local_offsets.extend([a - lo for a in la])
        b.remote_offsets.extend([a - ro for a in ra])
        b.lengths.extend(ll)
        b.peer, b.remote_agent = rem.peer, rem.agent
        return b

    def _xfer(self, x):
        h = next(self._ids)
        with self._lock:
            self._xfers[h] = x
        return nixl_xfer_handle(self, h)

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side,
                          remote_indices, notif_msg=b"", backends=[],  # noqa: B006
                          skip_desc_merge=False):
        """A transfer of prepared lists by index: local descriptor local_indices[k] with remote
        descriptor remote_indices[k], each pair the same length; notif_msg reaches the remote
        agent once every descriptor landed."""
        op = self._op(operation)
        with self._lock:
            lo = self._dlists.get(local_xfer_side._handle)
            ro = self._dlists.get(remote_xfer_side._handle)
        if lo is None or ro is None:
            raise _nixl_error(nixlNotFoundError, "make_prepped_xfer: a list handle that was "
                              "released")
        if lo.remote is not None:
            raise _nixl_error(nixlInvalidParamError, "make_prepped_xfer: local_xfer_side is "
                              "not prepared as NIXL_INIT_AGENT")
        if ro.remote is None:
            raise _nixl_error(nixlInvalidParamError, "make_prepped_xfer: remote_xfer_side is "
                              "prepared as NIXL_INIT_AGENT, not for an agent")
        li, ri, nbytes = _pairs(lo, ro, local_indices, remote_indices)
        req = transfer_pb2.SubmitRequest(brief=True)
        if isinstance(li, list):
            group = req.prepared.add(op=op, local_list=lo.lid, remote_list=ro.lid)
            group.local_indices.extend(li)
            group.remote_indices.extend(ri)
        else:  # NumPy's: the group's bytes encoded with NumPy, no Python step per index
            group = _PackedGroup(op, lo.lid, li, ro.lid, ri)
        return self._xfer(_Xfer(op, req, group, nbytes, len(li), ro.remote, notif_msg,
                                self._backend(backends), lo, ro))

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent,
                        notif_msg=b"", backends=[]):  # noqa: B006
        """A transfer of descriptor lists as they are: local_descs[k] with remote_descs[k] of
        remote_agent (this agent's own name: its own memory)."""
        op = self._op(operation)
        who = _name(remote_agent)
        rem = self._remote(who, "initialize_xfer")
        if len(local_descs) != len(remote_descs):
            raise _nixl_error(nixlInvalidParamError, "initialize_xfer: %d local descriptors, "
                              "%d remote" % (len(local_descs), len(remote_descs)))
        la, ll, ra = [], [], []
        for k, (ld, rd) in enumerate(zip(local_descs, remote_descs)):
            if ld[1] != rd[1]:
                raise _nixl_error(nixlInvalidParamError, "initialize_xfer: descriptor %d: %d "
                                  "bytes here, %d there" % (k, ld[1], rd[1]))
            if not self._in_regs(ld[0], ld[1]):
                raise _nixl_error(nixlNotFoundError, "initialize_xfer: local descriptor %d "
                                  "(0x%x, %d) is outside registered memory" % (k, ld[0], ld[1]))
            if not self._in(rem, rd[0], rd[1]):
                raise _nixl_error(nixlNotFoundError, "initialize_xfer: remote descriptor %d "
                                  "(0x%x, %d) is outside the registered memory of agent %r" % (
                                      k, rd[0], rd[1], who))
            la.append(ld[0])
            ll.append(ld[1])
            ra.append(rd[0])
        if not la:
            raise _nixl_error(nixlInvalidParamError, "a transfer of no descriptors")
        req = transfer_pb2.SubmitRequest(brief=True)
        group = req.blocks.add()
        group.CopyFrom(self._blocks(op, la, ll, rem, ra))
        return self._xfer(_Xfer(op, req, group, sum(ll), len(ll), rem, notif_msg,
                                self._backend(backends)))

    def _get_xfer(self, handle, what):
        with self._lock:
            x = self._xfers.get(handle._handle)
        if x is None:
            raise _nixl_error(nixlNotFoundError, "%s: a transfer handle that was released" %
                              what)
        return x

    def transfer(self, handle, notif_msg=b""):
        """Posts the transfer (again, once it ended): one batch of the daemon, submitted
        with `wait` and not waited for — check_xfer_state then looks at the call, with no call
        of its own. Returns "PROC". A non-empty notif_msg replaces the handle's."""
        x = self._get_xfer(handle, "transfer")
        if x.state == "PROC":
            raise _nixl_error(nixlRepostActiveError, "transfer: the handle's transfer is "
                              "still going")
        if notif_msg:
            x.notif = _bytes(notif_msg)
        t0 = time.monotonic_ns()
        x.rid = "nixl-%d-%d-%d" % (os.getpid(), self._port, next(self._ids))
        try:
            x.pending = self._submit(x)
        except mg.Error as e:
            x.state, x.pending = "ERR", None
            x.err = _from_mg(e, "transfer")
            raise x.err from None
        t1 = time.monotonic_ns()
        x.t0, x.post_us, x.xfer_us, x.state, x.polls = t0, (t1 - t0) // 1000, 0, "PROC", 0
        return "PROC"

    def _submit(self, x, wait=True):
        del x.req.notify[:]
        if x.notif:
            x.req.notify.add(peer=x.remote.peer, topic=x.remote.topic,
                             payload=note_payload(self.name, x.notif))
        x.req.request_id = x.rid
        x.req.wait = wait
        if wait and x.lo is not None and not self._ring_off:
            pending = self._ring_post(x)
            if pending is not None:
                return pending
        if isinstance(x.group, _PackedGroup):
            return self._c.submit_pending(x.req.SerializeToString() + x.group.encode())
        return self._c.submit_pending(x.req) if wait else \
            _Done(self._c._call(self._c.transfers.Submit, x.req))

    def check_xfer_state(self, handle):
        """"DONE" or "PROC"; a transfer that failed raises NIXL's exception for it (moongate's
        reason attached); one never posted nixlNotPostedError. Looks at the transfer's call:
        no call to the daemon while it goes."""
        x = self._get_xfer(handle, "check_xfer_state")
        if x.state == "NEW":
            raise _nixl_error(nixlNotPostedError, "check_xfer_state: the transfer was not "
                              "posted")
        if x.state == "DONE":
            return "DONE"
        if x.pending is None:  # its post failed, and raised then
            raise x.err
        if x.state == "PROC" and not x.pending.done():
            # A caller polling in a tight loop leaves the cores to the daemons: it yields, and
            # once the transfer has gone on for a while (a large one), it pauses 50 µs a poll
            # (a small transfer is seen done as soon as it is, a large one at most 50 µs late).
            x.polls += 1
            if x.polls > 256:
                time.sleep(50e-6)
            else:
                os.sched_yield()
            return "PROC"
        try:
            b = x.pending.result().batch
        except mg.Error as e:
            if x.lo is not None and (e.code == grpc.StatusCode.NOT_FOUND and
                                     "no prepared list" in e.message or
                                     e is _RING_GONE_ERROR):  # gone with a connection: again
                try:
                    for p in (x.lo, x.ro):
                        self._prepare(p, "transfer: preparing list again")
                    x.group.local_list, x.group.remote_list = x.lo.lid, x.ro.lid
                    x.pending = self._submit(x)
                    return "PROC"
                except (mg.Error, nixlNotFoundError, nixlInvalidParamError) as again:
                    e = again if isinstance(again, mg.Error) else e
            x.state = "ERR"
            raise _from_mg(e, "transfer of %d descriptors" % x.count) from None
        if b.state == transfer_pb2.DONE:
            x.xfer_us = (time.monotonic_ns() - x.t0) // 1000
            x.state = "DONE"
            return "DONE"
        x.state = "ERR"
        raise _from_mg(mg._batch_error(b), "transfer of %d descriptors" % x.count) from None

    def get_xfer_telemetry(self, handle):
        x = self._get_xfer(handle, "get_xfer_telemetry")
        if not self._telemetry:
            raise _nixl_error(nixlNoTelemetryError, "get_xfer_telemetry: telemetry is off "
                              "(nixl_agent_config(capture_telemetry=True), or "
                              "NIXL_TELEMETRY_ENABLE=y)")
        if x.state != "DONE":
            return nixlXferTelemetry()
        return nixlXferTelemetry(x.t0 // 1000, x.post_us, x.xfer_us, x.nbytes, x.count)

    def query_xfer_backend(self, handle):
        return self._get_xfer(handle, "query_xfer_backend").backend

    def estimate_xfer_cost(self, req_handle):
        raise _nixl_error(nixlNotSupportedError, "estimate_xfer_cost: moongate has no cost "
                          "model; get_xfer_telemetry measures what a transfer took")

    def release_xfer_handle(self, handle):
        handle.release()

    def _release_xfer(self, h):
        """Forgets a transfer; one still going is cancelled first (one call to the daemon:
        its requests end CANCELLED within about 100 ms there). Never waits for it."""
        with self._lock:
            x = self._xfers.get(h)
        going = x is not None and x.state == "PROC" and self._c is not None
        try:
            bid = 0
            if going and isinstance(x.pending, _RingPending):
                bid = self._ring_forget(x.pending.ud)  # 0: not accepted yet, or over
            elif going and not x.pending.done():
                # the batch's id: the same Submit again (its request_id) answers it
                bid = self._submit(x, wait=False).result().batch_id
            if bid:
                self._c._call(self._c.transfers.Cancel, transfer_pb2.GetBatchRequest(
                    id=bid, brief=True))
        except mg.Error as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise _nixl_error(nixlRepostActiveError, "release_xfer_handle: the transfer "
                                  "could not be cancelled: %s" % e) from None
        with self._lock:
            self._xfers.pop(h, None)

    # notifications
    def _watch(self):
        """This agent's notifications as the daemon delivers them (Notify/Watch on its topic,
        watched again after a daemon restart), kept for get_new_notifs: no call per
        get_new_notifs. The open call also keeps the channel's gRPC poller thread running, so
        that posting a transfer starts no thread."""
        while True:
            c = self._c
            if c is None:
                return
            try:
                for n in c.notifications(self._topic):
                    with self._lock:
                        self._inbox.append(n)
                return
            except ValueError:  # the agent closed its channel
                return
            except mg.Error as e:
                if self._c is None:
                    return
                log.warning("notifications of agent %r: %s; watching again", self.name, e)
                time.sleep(0.5)

    def get_new_notifs(self, backends=[]):  # noqa: B006
        """The notifications that reached this agent since the last call: {sender agent name:
        [message bytes, ...]}, oldest first."""
        out = {}
        with self._lock:
            got, self._inbox = self._inbox, []
        for n in got:
            if n.outcome != 0:  # a failure notice: the transfer failed, and said so there
                continue
            parsed = note_of_payload(n.payload)
            if parsed is None:
                log.warning("get_new_notifs: a notification that is not a NIXL agent's "
                            "(%d bytes) skipped", len(n.payload))
                continue
            out.setdefault(parsed[0], []).append(parsed[1])
        return out

    def update_notifs(self, backends=[]):  # noqa: B006
        for who, msgs in self.get_new_notifs().items():
            self.notifs.setdefault(who, []).extend(msgs)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag, backends=[],  # noqa: B006
                               tag_is_prefix=True):
        self.update_notifs()
        msgs = self.notifs.get(_name(remote_agent_name), [])
        for i, m in enumerate(msgs):
            if (m.startswith(lookup_tag) if tag_is_prefix else lookup_tag in m):
                del msgs[i]
                return True
        return False

    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        """A notification to an agent, on its own: after this agent's earlier notifications to
        it (its transfers' included)."""
        who = _name(remote_agent_name)
        msg = _bytes(notif_msg)
        rem = self._remote(who, "send_notif")
        try:
            self._c.send(rem.topic, note_payload(self.name, msg), peer=rem.peer)
        except mg.Error as e:
            raise _from_mg(e, "send_notif(%r)" % who) from None

    def prep_mem_view(self, dlist, *, backends=None):
        raise _nixl_error(nixlNotSupportedError, "prep_mem_view: memory views for transfers "
                          "a GPU kernel starts (UCX's GPU device API) are not served: moongate's "
                          "transfers start from the host")

    def release_mem_view(self, mvh):
        raise _nixl_error(nixlNotSupportedError, "release_mem_view: no memory view was made "
                          "(prep_mem_view is not served)")

    # NIXL's metadata listener (moongate.compat.nixl_listen) and partial metadata
    def _ask(self, what, ip_addr, port, op, payload):
        from moongate.compat import nixl_listen
        if not ip_addr:
            raise _nixl_error(nixlNotSupportedError, "%s: no ip_addr: NIXL's central metadata "
                              "store (etcd) is not served; name the peer's listener" % what)
        try:
            ok, out = nixl_listen.ask(ip_addr, port, op, payload)
        except (OSError, ValueError) as e:
            raise _nixl_error(nixlBackendError, "%s: the metadata listener at %s:%d: %s" % (
                what, ip_addr, port, e)) from None
        if not ok:
            raise _nixl_error(nixlBackendError, "%s: the listener at %s:%d refused: %s" % (
                what, ip_addr, port, out.decode(errors="replace")))
        return out

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        """This agent's metadata to the listener at ip_addr:port, whose agent adds it (checked
        as add_remote_agent checks it)."""
        self._ask("send_local_metadata", ip_addr, port, SEND_OP, self.get_agent_metadata())

    def get_partial_agent_metadata(self, descs, inc_conn_info=False, backends=[]):  # noqa
        """This agent's metadata with only the registered regions that hold descs (the peer
        checks it with the daemon as any; the regions it may use are the daemon's)."""
        md = self.get_agent_metadata()
        d = json.loads(md[len(METADATA_MAGIC):])
        want = [(x[0], x[1]) for x in (descs or [])]
        d["regions"] = [r for r in d["regions"] if any(
            r[0] <= a and a + n <= r[0] + r[1] for a, n in want)]
        return METADATA_MAGIC + json.dumps(d).encode()

    def send_partial_agent_metadata(self, descs, inc_conn_info=False, backends=[],  # noqa
                                    ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        self._ask("send_partial_agent_metadata", ip_addr, port, SEND_OP,
                  self.get_partial_agent_metadata(descs, inc_conn_info, backends))

    def fetch_remote_metadata(self, remote_agent, ip_addr="", port=DEFAULT_COMM_PORT,
                              label=""):
        """Asks the listener at ip_addr:port for remote_agent's metadata and adds it, on a
        thread of its own, as NIXL's does: check_remote_metadata(remote_agent) says when it is
        in. A failure is logged, naming it."""
        who = _name(remote_agent)
        if not ip_addr:
            self._ask("fetch_remote_metadata", ip_addr, port, FETCH_OP, b"")

        def fetch():
            try:
                md = self._ask("fetch_remote_metadata(%r)" % who, ip_addr, port, FETCH_OP,
                               json.dumps({"agent": who, "label": label}).encode())
                self.add_remote_agent(md)
            except tuple(STATUS.values()) as e:
                log.error("fetch_remote_metadata(%r, %s:%d): %s", who, ip_addr, port, e)
        threading.Thread(target=fetch, name="nixl-fetch", daemon=True).start()

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        """Tells the listener at ip_addr:port that its agent should forget this one."""
        self._ask("invalidate_local_metadata", ip_addr, port, INVALIDATE_OP,
                  self.name.encode())


if __name__ == "__main__":
    from moongate.compat import pythonpath_main
    sys.exit(pythonpath_main("nixl", "from nixl._api import nixl_agent"))
