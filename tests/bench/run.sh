#!/usr/bin/env bash
# Benchmarks (not tests: they take minutes and print figures, no pass/fail thresholds).
#   tests/bench/run.sh [control|register|batch] [-- options of the benchmark]
# control:  h2load against Health/Check on moongate and on reference gRPC C++ servers, same run.
# register: Health/Check latency idle and during a multi-GiB registration, same run.
# batch:    a batch registration on 1 and N workers against registering one by one.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
scripts/deps.sh libgrpc++-dev protobuf-compiler-grpc util-linux
build=$(scripts/build.sh release)
certs=$(mktemp -d)
trap 'rm -rf "$certs"' EXIT
certs/make-dev-certs.sh "$certs" >/dev/null
ref=$build/bench/ref_health_server
[ -x "$ref" ] || tests/bench/build_ref.sh "$build/bench" >/dev/null
what=${1:-control}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
case "$what" in
control)
    /usr/bin/python3 tests/bench/bench_control.py --moongate "$build/moongate" --ref "$ref" \
        --certs "$certs" "$@"
    ;;
register)
    /usr/bin/python3 tests/bench/bench_register.py --moongate "$build/moongate" "$@"
    ;;
batch)
    /usr/bin/python3 tests/bench/bench_batch.py --moongate "$build/moongate" "$@"
    ;;
*) echo "usage: $0 [control|register|batch] [-- options]" >&2; exit 64 ;;
esac
