#!/usr/bin/env python3
"""Writes fuzz_proto seeds with a NUL byte and with invalid UTF-8 in every string field (at any
depth) of every request type, into tests/fuzz/corpus/proto/strings-*. Byte 0 picks the method
as fuzz_proto.c's pick() does: the services in its order, their methods in declaration order.

    MG_BUILD_DIR=build /usr/bin/python3 tests/fuzz/make_string_seeds.py
"""
import hashlib
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from gen_stubs import generate  # noqa: E402

sys.path.insert(0, generate(os.path.join(os.environ.get("MG_BUILD_DIR", "build"), "pygen")))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from test_strings import MARK, message_with_mark, string_paths  # noqa: E402
from google.protobuf import symbol_database  # noqa: E402
from mgstd import health_pb2, reflection_v1_pb2  # noqa: E402
from moongate.v1 import (daemon_pb2, debug_pb2, memory_pb2, notify_pb2, peer_pb2,  # noqa: E402
                         pool_pb2, transfer_pb2)

SERVICES = [  # fuzz_proto.c's services[], in its order
    (health_pb2, "Health"), (reflection_v1_pb2, "ServerReflection"), (daemon_pb2, "Daemon"),
    (memory_pb2, "Memory"), (pool_pb2, "Pool"), (transfer_pb2, "Transfer"),
    (notify_pb2, "Notify"), (peer_pb2, "Peer"), (debug_pb2, "Debug")]
BAD = (b"Zq\x007x9", b"Zq\xc0\xaf9W", b"\xed\xa0\x80x9W", b"Zq7x9\xf4")


def main():
    out = os.path.join(ROOT, "tests", "fuzz", "corpus", "proto")
    db = symbol_database.Default()
    k, n = 0, 0
    for mod, name in SERVICES:
        for m in mod.DESCRIPTOR.services_by_name[name].methods:
            cls = db.GetSymbol(m.input_type.full_name)
            for path in string_paths(m.input_type):
                raw = message_with_mark(cls, path).SerializeToString()
                for bad in BAD:
                    seed = bytes([k]) + raw.replace(MARK, bad)
                    h = hashlib.sha1(seed).hexdigest()[:16]
                    with open(os.path.join(out, "strings-" + h), "wb") as f:
                        f.write(seed)
                    n += 1
            k += 1
    print("%d seeds for %d methods" % (n, k))


if __name__ == "__main__":
    main()
