#!/usr/bin/env bash
# Builds the reference gRPC C++ health server into OUTDIR (default build/bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build/bench}
mkdir -p "$out/gen"
protoc -I"$root/proto" --cpp_out="$out/gen" --grpc_out="$out/gen" \
    --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" grpc/health/v1/health.proto
g++ -O2 -std=c++17 -I"$out/gen" "$root/tests/bench/ref_health_server.cc" \
    "$out/gen/grpc/health/v1/health.pb.cc" "$out/gen/grpc/health/v1/health.grpc.pb.cc" \
    $(pkg-config --cflags --libs grpc++ protobuf) -o "$out/ref_health_server"
echo "$out/ref_health_server"
