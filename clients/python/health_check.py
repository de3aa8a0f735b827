#!/usr/bin/python3
"""A minimal Python gRPC client for moongate: Health/Check and Daemon/Info.

  health_check.py --target localhost:7443 --ca certs/dev/ca.pem     (TLS)
  health_check.py --target unix:/run/moongate/moongate.sock         (h2c on the Unix socket)
  health_check.py --target 127.0.0.1:7444 --plaintext               (h2c on loopback)
  ... --token-file FILE    a bearer token (first line of FILE; or MOONGATE_TOKEN) for Info

Stubs come from gen_stubs.py (python3-grpcio and python3-grpc-tools from Debian).
"""
import argparse
import os
import sys

import grpc

from gen_stubs import generate  # noqa: E402  (beside this file)

# Generate first, then import: a directory missing when first looked at stays unseen.
sys.path.insert(0, generate(os.environ.get("MOONGATE_PYGEN") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "pygen")))
from mgstd import health_pb2, health_pb2_grpc  # noqa: E402
from moongate.v1 import daemon_pb2, daemon_pb2_grpc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="unix:/run/moongate/moongate.sock")
    ap.add_argument("--ca", help="CA certificate that signed the daemon's certificate")
    ap.add_argument("--plaintext", action="store_true")
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--token-file", help="bearer token: the first line of this file")
    a = ap.parse_args()
    token = os.environ.get("MOONGATE_TOKEN")
    if a.token_file:
        with open(a.token_file) as f:
            token = f.readline().strip()
    # Health checks need no credentials; Info does (a token, or a uid the daemon maps).
    md = [("authorization", "Bearer " + token)] if token else None
    if a.target.startswith("unix:") or a.plaintext:
        channel = grpc.insecure_channel(a.target)
    else:
        roots = None
        if a.ca:
            with open(a.ca, "rb") as f:
                roots = f.read()
        channel = grpc.secure_channel(a.target, grpc.ssl_channel_credentials(roots))
    with channel:
        try:
            h = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=a.timeout)
            info = daemon_pb2_grpc.DaemonStub(channel).Info(daemon_pb2.InfoRequest(),
                                                            timeout=a.timeout, metadata=md)
        except grpc.RpcError as e:
            print("error: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
            return e.code().value[0]
    print("health: %s" % health_pb2.HealthCheckResponse.ServingStatus.Name(h.status))
    print("daemon: moongate %s, epoch %016x, state %s, up %.1f s" % (
        info.version, info.epoch, info.state, info.uptime_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
