"""NIXL's metadata listener, for moongate's NIXL door (moongate.compat.nixl): an agent made with
nixl_agent_config(enable_listen_thread=True, listen_port=P) serves its metadata on TCP port P,
and peers' send_local_metadata / fetch_remote_metadata / invalidate_local_metadata reach it.

What travels is what get_agent_metadata() gives, checked on arrival exactly as
add_remote_agent checks it (with the daemon it names). One request a connection:

    request:  b"MGNL" | op (1 byte) | length (4 bytes, big-endian) | payload
    answer:   status (1 byte: 0 ok, 1 refused) | length (4 bytes) | payload (metadata, a name,
              or the reason it was refused)

    op 1 SEND        payload: an agent's metadata; the listener's agent adds it
    op 2 FETCH       payload: {"agent": name, "label": label} (JSON); answers the listener's
                     agent's metadata when the name is its own
    op 3 INVALIDATE  payload: an agent's name; the listener's agent forgets it

Bounded: payloads up to 1 MiB, 16 connections served at once (more are closed unanswered), 5 s
for a connection's whole exchange. The listener binds $MOONGATE_NIXL_LISTEN_HOST (default every
address, as NIXL's does): docs/security.md says what it exposes.
"""
import json
import logging
import os
import socket
import struct
import threading

log = logging.getLogger("moongate.nixl")

MAGIC = b"MGNL"
SEND, FETCH, INVALIDATE = 1, 2, 3
MAX_PAYLOAD = 1 << 20
MAX_CONNECTIONS = 16
TIMEOUT_S = 5.0


def _recv_exact(sock, n):
    out = bytearray()
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError("the connection closed after %d of %d bytes" % (len(out), n))
        out += got
    return bytes(out)


def ask(host, port, op, payload):
    """One request to the listener at host:port: (ok, payload). Raises OSError (no listener,
    no answer within 5 s) or ValueError (an answer that is not a listener's)."""
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as s:
        s.settimeout(TIMEOUT_S)
        s.sendall(MAGIC + struct.pack(">BI", op, len(payload)) + payload)
        status, n = struct.unpack(">BI", _recv_exact(s, 5))
        if status > 1 or n > MAX_PAYLOAD:
            raise ValueError("not a moongate NIXL listener's answer")
        return status == 0, _recv_exact(s, n)


class Listener:
    """Serves agent's metadata on port (0: one the kernel picks; .port says which) until
    close()."""

    def __init__(self, agent, port):
        host = os.environ.get("MOONGATE_NIXL_LISTEN_HOST", "")
        self.agent = agent
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=64)
        self.port = self._sock.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="nixl-listen", daemon=True)
        self._thread.start()

    def close(self):
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(5)

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, who = self._sock.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                log.warning("metadata listener: %d connections already: %s refused",
                            MAX_CONNECTIONS, who[0])
                conn.close()
                continue
            threading.Thread(target=self._one, args=(conn, who), daemon=True).start()

    def _one(self, conn, who):
        try:
            conn.settimeout(TIMEOUT_S)
            magic, op, n = struct.unpack(">4sBI", _recv_exact(conn, 9))
            if magic != MAGIC or op not in (SEND, FETCH, INVALIDATE) or n > MAX_PAYLOAD:
                log.warning("metadata listener: %s sent what is not a request; closed", who[0])
                return
            ok, out = self._answer(op, _recv_exact(conn, n))
            conn.sendall(struct.pack(">BI", 0 if ok else 1, len(out)) + out)
        except (OSError, ConnectionError, struct.error) as e:
            log.info("metadata listener: %s: %s", who[0], e)
        finally:
            conn.close()
            self._slots.release()

    def _answer(self, op, payload):
        """(ok, bytes) for one request."""
        from moongate.compat import nixl  # the door; it imports this module
        try:
            if op == SEND:
                return True, self.agent.add_remote_agent(payload)
            if op == INVALIDATE:
                self.agent.remove_remote_agent(payload.decode())
                return True, b""
            want = json.loads(payload)
            if want.get("agent") != self.agent.name:
                return False, ("no agent %r here: this listener serves %r" % (
                    want.get("agent"), self.agent.name)).encode()
            return True, self.agent.get_agent_metadata()
        except (ValueError, UnicodeDecodeError, AttributeError) as e:
            return False, ("a request that does not parse: %s" % e).encode()
        except tuple(nixl.STATUS.values()) as e:
            return False, str(e).encode()
