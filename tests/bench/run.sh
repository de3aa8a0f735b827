#!/usr/bin/env bash
# Benchmarks (not tests: they take minutes and print figures, no pass/fail thresholds).
#   tests/bench/run.sh [control|register|batch|memory|pmem|names|pool|mooncake|cdoor|nixl|ring|gpu|staged|scale|fanout|wire|receiver|restart|digest|lease|dataplane|transfer] [-- options]
# control:  h2load against Health/Check on moongate and on reference gRPC C++ servers, same run.
# register: Health/Check latency idle and during a multi-GiB registration, same run.
# batch:    a batch registration on 1 and N workers against registering one by one.
# memory:   a 1 GiB memfd passed by descriptor and registered against a daemon-made segment;
#           64 KiB WRITEs to a peer with local memory named by address against by segment id.
# pmem:     one 64 MiB WRITE to a peer from a bytearray registered as process memory (read with
#           process_vm_readv) against from a memfd, alternated, medians of 5; then the same
#           READ (bench_memory.py --sections big; `pmem -- --big-rounds 9`).
# names:    remote memory by (agent, address) and by "host:port", a peer by DNS name, against
#           by segment id and numeric address; Notify/Send against a batch's notification.
# pool:     1024 1 MiB READs into leases through the BufferPool shape (moongate.pool), the
#           native lease API and register-per-read.
# mooncake: Mooncake's APIs (Python mooncake.engine, C libtransfer_engine.so) against the
#           native client, the same WRITEs to a peer's engine.
# cdoor:    one 4 KiB WRITE at a time to a peer daemon's engine through libtransfer_engine.so
#           from C (submit, tight getTransferStatus polls) against mgbench's same WRITE,
#           alternated, p50s of 5 rounds (tests/bench/bench_cdoor.py; `cdoor -- --rounds 9`).
# scale:    per-call times (register, get, list a page, lease, list leases) on a daemon holding
#           10 and one holding 10,000 segments and leases, call for call (bench_scale.py).
# wire:     the shapes serving systems move beside their references, alternated, medians of 5
#           with min-max: scattered 64 KiB and 4 KiB batches in flight and one 1 GiB WRITE
#           against iperf3 and UCX, four threads against one, a same-host copy against memcpy
#           (tests/bench/bench_wire.py; `wire -- --rounds 3 --json FILE`; `wire -- --huge-pages`:
#           the daemons' segments in a tmpfs mounted huge=within_size, root only).
# fanout:   Health/Check latency with 1,000 connections open against 10; 16 peers written to at
#           once (slowest against fastest); two tenants writing at once (each one's share)
#           (tests/bench/bench_fanout.py; `fanout -- conns --rounds 3` for one part).
# receiver: how soon a waiting receiver hears its notification will not come, for each cause (a
#           WRITE refused, the sender's agent killed, its daemon restarted or frozen, the
#           deadline) beside the probe interval, liveness timeout or deadline that bounds it
#           (tests/bench/bench_receiver.py; `receiver -- --rounds 5 --liveness-ms 2000`).
# restart:  what a daemon restart costs a serving process: a Mooncake target holding 1 GiB
#           registered, its daemon SIGKILLed and started again under a looping initiator; the
#           daemon's start-up beside the time to the first WRITE that succeeds after it, medians
#           of 5 (tests/bench/bench_restart.py; `restart -- --rounds 5 --size 1G`); then the
#           daemon's start-up alone, without a pool and with a 1 GiB pool.
# digest:   what an end-to-end digest (SubmitRequest.digest) costs: one 1 GiB WRITE and READ and
#           64 KiB x 128 scattered WRITEs with and without it, alternated, medians of 3
#           (tests/bench/bench_digest.py; `digest -- --rounds 5`), then the CRC32C alone, each
#           way the CPU sums, beside memcpy (bench/bench_checksum).
# nixl:     the NIXL door (nixl._api) against the native API with the same prepared lists:
#           1024 block-indexed 64 KiB READs per transfer, alternated, medians of 5; then posting
#           10,000 descriptors by index against as descriptors (tests/bench/bench_nixl.py;
#           `nixl -- --rounds 9`).
# ring:     one 4 KiB WRITE to a peer daemon posted on a submission ring, against the same as a
#           Submit with wait, from C and from Python, beside a 4 KiB TCP ping-pong between two
#           processes, alternated, medians and p99 of 5 rounds; then 4096 blocks posted on the
#           ring and as one Submit (tests/bench/bench_ring.py; `ring -- --rounds 9 --spin-us 200`).
# gpu:      GPU memory on the CUDA driver emulator: 64 MiB device -> peer through staging
#           (mgbench vram, tests/gpu/check.sh) against the same transfer from host memory and a
#           cuMemcpyDtoH into pinned memory, medians of 3 (`gpu -- --size 1G --rounds 5`).
# lease:    destination memory per read: register + unregister against lease + release;
#           then acquire + release alone over TCP and the Unix socket, sleeping and polling.
# dataplane: the TCP data plane over loopback against iperf3 (one stream, 1 MiB writes).
# transfer: two daemons, mgbench transfer (block and batch sizes, 1 GiB each way, 4 threads)
#           against iperf3 and UCX's ucx_perftest over TCP (tag_bw, ucp_put_bw at 1 MiB).
# report:   wire, fanout, scale, transfer, control and lease, then build/bench-report/report.md
#           (the machine first) with gnuplot plots
#           (tests/bench/report.py; `report -- --quick` shortens the control rounds).
# compare REV: this revision against REV (built in a worktree under build/), alternated rounds of
#           Health/Check, AcquireLease+ReleaseLease and three transfer shapes; medians, spread
#           and ratios (tests/bench/compare.py; `compare REV -- --rounds 5`, `--quick`).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
scripts/deps.sh libgrpc++-dev protobuf-compiler-grpc util-linux iperf3 ucx-utils gnuplot-nox
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
memory)
    /usr/bin/python3 tests/bench/bench_memory.py --moongate "$build/moongate" "$@"
    ;;
pmem)
    /usr/bin/python3 tests/bench/bench_memory.py --moongate "$build/moongate" --sections big "$@"
    ;;
names)
    /usr/bin/python3 tests/bench/bench_names.py --moongate "$build/moongate" "$@"
    ;;
pool)
    /usr/bin/python3 tests/bench/bench_pool.py --moongate "$build/moongate" "$@"
    ;;
mooncake)
    /usr/bin/python3 tests/bench/bench_mooncake.py --moongate "$build/moongate" \
        --lib "$build/libtransfer_engine.so" "$@"
    ;;
cdoor)
    /usr/bin/python3 tests/bench/bench_cdoor.py --moongate "$build/moongate" \
        --lib "$build/libtransfer_engine.so" --harness "$build/te_harness" \
        --mgbench "$build/mgbench" "$@"
    ;;
nixl)
    MOONGATE_PYGEN=${MOONGATE_PYGEN:-$build/pygen} /usr/bin/python3 tests/bench/bench_nixl.py \
        --moongate "$build/moongate" "$@"
    ;;
ring)
    MOONGATE_PYGEN=${MOONGATE_PYGEN:-$build/pygen} /usr/bin/python3 tests/bench/bench_ring.py \
        --moongate "$build/moongate" --pingpong "$build/bench/bench_pingpong" \
        --ringlat "$build/bench/bench_ringlat" "$@"
    ;;
staged)
    MOONGATE_CUDA_LIB=$build/libmgcuda_emu.so MOONGATE_CLIENT_LIB=$build/libmgclient.so.0 \
        MOONGATE_PYGEN=${MOONGATE_PYGEN:-$build/pygen} /usr/bin/python3 tests/bench/bench_staged.py \
        --moongate "$build/moongate" "$@"
    ;;
gpu)
    MG_BUILD_DIR=$build MOONGATE_CUDA_LIB=$build/libmgcuda_emu.so tests/gpu/check.sh \
        --size 64M --rounds 3 "$@"
    ;;
scale)
    /usr/bin/python3 tests/bench/bench_scale.py --moongate "$build/moongate" "$@"
    ;;
wire)
    /usr/bin/python3 tests/bench/bench_wire.py --moongate "$build/moongate" --mgbench "$build/mgbench" "$@"
    ;;
receiver)
    /usr/bin/python3 tests/bench/bench_receiver.py --moongate "$build/moongate" "$@"
    ;;
restart)
    MOONGATE_PYGEN=${MOONGATE_PYGEN:-$build/pygen} \
        /usr/bin/python3 tests/bench/bench_restart.py --moongate "$build/moongate" "$@"
    ;;
digest)
    /usr/bin/python3 tests/bench/bench_digest.py --moongate "$build/moongate" --mgbench "$build/mgbench" "$@"
    "$build/bench/bench_checksum"
    ;;
fanout)
    /usr/bin/python3 tests/bench/bench_fanout.py --moongate "$build/moongate" --mgbench "$build/mgbench" "$@"
    ;;
lease)
    # $1: extra daemon flags; starts moongate on a free port, sets $pid, $port, $shm.
    start_daemon() {
        shm=$(mktemp -d /dev/shm/mg-bench-XXXXXX)
        port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        # shellcheck disable=SC2086
        "$build/moongate" --allow-anonymous --listen "" --h2c-listen "127.0.0.1:$port" --ops-listen "" \
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
    # Both ends polling instead of sleeping between calls (--busy-poll-us, busy_poll_us).
    start_daemon "--busy-poll-us 200"
    "$build/bench/bench_lease" --target "127.0.0.1:$port" --lease-only --busy-poll 200 || rc=$?
    echo
    "$build/bench/bench_lease" --target "unix:$shm/moongate.sock" --lease-only --busy-poll 200 || rc=$?
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
transfer)
    free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
    # References first, each alone on the machine.
    port=$(free_port)
    iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
    sleep 0.5
    iperf=$(iperf3 -c 127.0.0.1 -p "$port" -l 1M -t 5 -J |
        /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9)')
    ucx() { # test -> GB/s (overall bandwidth of the final line)
        local p; p=$(free_port)
        UCX_TLS=tcp ucx_perftest -t "$1" -s 1048576 -n 4000 -p "$p" >/dev/null 2>&1 &
        sleep 1
        UCX_TLS=tcp timeout 120 ucx_perftest 127.0.0.1 -t "$1" -s 1048576 -n 4000 -p "$p" 2>/dev/null |
            awk '/^Final:/ {printf "%.3f\n", $7 * 1048576 / 1e9}'
        wait || true
    }
    tag=$(ucx tag_bw)
    put=$(ucx ucp_put_bw)
    printf 'iperf3, 1 stream, 1 MiB writes:     %6.2f GB/s\n' "$iperf"
    printf 'ucx_perftest tag_bw, TCP, 1 MiB:    %6.2f GB/s\n' "$tag"
    printf 'ucx_perftest ucp_put_bw, TCP, 1 MiB:%6.2f GB/s\n\n' "$put"
    shm=$(mktemp -d /dev/shm/mg-bench-XXXXXX)
    pids=()
    for d in a b; do
        h2c=$(free_port)
        "$build/moongate" --allow-anonymous --listen "" --h2c-listen "127.0.0.1:$h2c" --ops-listen "" --unix-socket "" \
            --data-listen 127.0.0.1:0 --shm-dir "$shm/$d" --access-log=false --peer-tls=false --peer-anonymous \
            --pool-bytes 0 --memlock try >"$certs/moongate-$d.log" 2>&1 &
        pids+=($!)
        eval "port_$d=$h2c"
    done
    for _ in $(seq 1 100); do
        grep -q "event=ready" "$certs/moongate-a.log" && grep -q "event=ready" "$certs/moongate-b.log" && break
        sleep 0.1
    done
    rc=0
    out=$("$build/mgbench" transfer --target "127.0.0.1:$port_a" --peer "127.0.0.1:$port_b" \
        --big 1G --json "$@" | tee /dev/stderr) || rc=$?
    out4=$("$build/mgbench" transfer --target "127.0.0.1:$port_a" --peer "127.0.0.1:$port_b" \
        --blocks 64M --batches 4 --threads 4 --bytes 4G --json | tee /dev/stderr) || rc=$?
    out1=$("$build/mgbench" transfer --target "127.0.0.1:$port_a" --peer "127.0.0.1:$port_b" \
        --blocks 64M --batches 4 --threads 1 --bytes 4G --json | tee /dev/stderr) || rc=$?
    out5=$("$build/mgbench" transfer --target "127.0.0.1:$port_a" --peer "127.0.0.1:$port_b" \
        --blocks 4K --batches 4096 --ops write --bytes 64M --json | tee /dev/stderr) || rc=$?
    out6=$("$build/mgbench" transfer --target "127.0.0.1:$port_a" --peer "127.0.0.1:$port_b" \
        --blocks 4K --batches 1 --ops write --bytes 8M --submit-wait --json | tee /dev/stderr) || rc=$?
    kill -TERM "${pids[@]}"; wait "${pids[@]}" || true
    rm -rf "$shm"
    printf '%s\n%s\n%s\n%s\n%s\n' "$out" "$out4" "$out1" "$out5" "$out6" | /usr/bin/python3 tests/bench/transfer_report.py \
        --iperf "$iperf" --tag "$tag" --put "$put"
    exit $rc
    ;;
compare)
    rev=${1:?usage: $0 compare REV [-- options]}
    shift
    [ "${1:-}" = "--" ] && shift
    short=$(git rev-parse --short "$rev^{commit}")
    wt=$build/compare-$short
    [ -d "$wt/src" ] || git worktree add --detach "$wt/src" "$short" >/dev/null
    cmake -S "$wt/src" -B "$wt/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$wt/build" -j "$(nproc)" >/dev/null
    /usr/bin/python3 tests/bench/compare.py --old "$wt/build" --new "$build" \
        --old-name "$short" --new-name "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +)" "$@"
    ;;
report)
    /usr/bin/python3 tests/bench/report.py --run "$root/tests/bench/run.sh" \
        --out "${MG_BENCH_OUT:-$build/bench-report}" "$@"
    ;;
*) echo "usage: $0 [control|register|batch|memory|pmem|names|pool|mooncake|cdoor|gpu|scale|fanout|wire|lease|dataplane|transfer|report|compare REV] [-- options]" >&2; exit 64 ;;
esac
