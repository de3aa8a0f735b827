#!/usr/bin/python3
"""Generates Python gRPC stubs for moongate's protos with Debian's python3-grpc-tools.

The standard grpc.health.v1 and grpc.reflection protos are generated under the module prefix
`mgstd` (mgstd.health_pb2, mgstd.reflection_v1_pb2, ...) so that they do not shadow the grpcio
package, which is also named `grpc`. Wire names (package grpc.health.v1) are unchanged.

Usage: gen_stubs.py OUT_DIR   (regenerates only when a proto changed)
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROTOS = [
    ("moongate/v1/daemon.proto", "moongate/v1/daemon.proto"),
    ("moongate/v1/debug.proto", "moongate/v1/debug.proto"),
    ("moongate/v1/memory.proto", "moongate/v1/memory.proto"),
    ("moongate/v1/pool.proto", "moongate/v1/pool.proto"),
    ("moongate/v1/peer.proto", "moongate/v1/peer.proto"),
    ("moongate/v1/transfer.proto", "moongate/v1/transfer.proto"),
    ("moongate/v1/notify.proto", "moongate/v1/notify.proto"),
    ("moongate/v1/agent.proto", "moongate/v1/agent.proto"),
    ("grpc/health/v1/health.proto", "mgstd/health.proto"),
    ("grpc/reflection/v1/reflection.proto", "mgstd/reflection_v1.proto"),
    ("grpc/reflection/v1alpha/reflection.proto", "mgstd/reflection_v1alpha.proto"),
]


def generate(out):
    stamp = os.path.join(out, ".stamp")
    # moongate itself is the client's package (clients/python/moongate), which finds
    # moongate/v1 here: an __init__.py here (older trees made one) would hide it.
    if os.path.exists(os.path.join(out, "moongate", "__init__.py")):
        os.unlink(os.path.join(out, "moongate", "__init__.py"))
    newest = max(os.path.getmtime(os.path.join(ROOT, "proto", p)) for p, _ in PROTOS)
    if os.path.exists(stamp) and os.path.getmtime(stamp) >= newest:
        return out
    src = tempfile.mkdtemp(prefix="mgproto-")
    try:
        for s, d in PROTOS:
            os.makedirs(os.path.join(src, os.path.dirname(d)), exist_ok=True)
            shutil.copy(os.path.join(ROOT, "proto", s), os.path.join(src, d))
        os.makedirs(out, exist_ok=True)
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I" + src,
                        "--python_out=" + out, "--grpc_python_out=" + out]
                       + [d for _, d in PROTOS], check=True)
        for d in ("moongate/v1", "mgstd"):
            open(os.path.join(out, d, "__init__.py"), "a").close()
        open(stamp, "w").close()
    finally:
        shutil.rmtree(src)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(generate(sys.argv[1]))
