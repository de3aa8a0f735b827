#!/usr/bin/env bash
# Benchmarks (not tests: they take minutes and print figures, no pass/fail thresholds).
#   tests/bench/run.sh [control|register|batch|lease|dataplane] [-- options of the benchmark]
# control:  h2load against Health/Check on moongate and on reference gRPC C++ servers, same run.
# register: Health/Check latency idle and during a multi-GiB registration, same run.
# batch:    a batch registration on 1 and N workers against registering one by one.
# lease:    destination memory per read: register + unregister against lease + release.
# dataplane: the TCP data plane over loopback against iperf3 (one stream, 1 MiB writes).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
scripts/deps.sh libgrpc++-dev protobuf-compiler-grpc util-linux iperf3
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
lease)
    # $1: extra daemon flags; starts moongate on a free port, sets $pid, $port, $shm.
    start_daemon() {
        shm=$(mktemp -d /dev/shm/mg-bench-XXXXXX)
        port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        # shellcheck disable=SC2086
        "$build/moongate" --listen "" --h2c-listen "127.0.0.1:$port" --ops-listen "" \
            --data-listen "" --unix-socket "$shm/moongate.sock" --shm-dir "$shm" --access-log=false --memlock try --workers 2 $1 \
            >"$certs/moongate.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 100); do
            grep -q "event=ready" "$certs/moongate.log" && break
            sleep 0.1
        done
    }
    stop_daemon() { kill -TERM "$pid"; wait "$pid" || true; rm -rf "$shm"; }
    rc=0
    start_daemon ""
    "$build/bench/bench_lease" --target "127.0.0.1:$port" --prefault "$@" || rc=$?
    echo
    # Local clients may use the daemon's Unix socket instead of TCP loopback.
    "$build/bench/bench_lease" --target "unix:$shm/moongate.sock" --lease-only || rc=$?
    stop_daemon
    echo
    start_daemon "--pool-bytes 8M"
    "$build/bench/bench_lease" --target "127.0.0.1:$port" --contention || rc=$?
    stop_daemon
    exit $rc
    ;;
dataplane)
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
    sleep 0.5
    ref=$(iperf3 -c 127.0.0.1 -p "$port" -l 1M -t 5 -J |
        /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9)')
    out=$("$build/bench/bench_dataplane" "$@")
    echo "$out"
    printf 'iperf3, 1 stream, 1 MiB writes: %.2f GB/s\n' "$ref"
    echo "$out" | /usr/bin/python3 -c '
import re, sys
ref = float(sys.argv[1])
for line in sys.stdin:
    m = re.match(r"(.+?)\s+WRITE\s+([\d.]+) GB/s\s+READ\s+([\d.]+) GB/s", line)
    if m:
        print("%-16s WRITE %.2fx   READ %.2fx of iperf3" % (m.group(1), float(m.group(2)) / ref,
                                                          float(m.group(3)) / ref))
' "$ref"
    ;;
*) echo "usage: $0 [control|register|batch|lease|dataplane] [-- options]" >&2; exit 64 ;;
esac
