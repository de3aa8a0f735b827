#!/usr/bin/env bash
# The GPU check: moongate moving this machine's GPU memory, with moongate's binaries and bash
# only (no Python, no compiler, no Debian packages: it runs from the bundle, scripts/bundle.sh).
#
#   check.sh [--size 1G] [--rounds 3] [--ports PORT_B,PORT_A]
#
# Two daemons on loopback (A with a buffer pool for staging, B the target), then mgbench vram:
# resolves every CUDA driver symbol moongate's table uses, allocates device memory, moves SIZE
# from the device to B and back onto a second device buffer through staging and compares the
# bytes there, and prints staging GB/s beside the same transfer from host memory and beside a
# plain cuMemcpyDtoH into pinned memory, measured in the same run. Where A has an RDMA device it
# does the same by dma-buf (GPUDirect RDMA). Then, where python3 with grpcio and the source tree
# are here (not from the bundle), device to device through Mooncake's Python API: two daemons
# with RDMA off, each process's device memory registered with mooncake.engine's register_memory
# and so staged at both ends, WRITEs timed beside host to host, then a pattern written and read
# back through the peer's device and compared (tests/bench/bench_staged.py --verify).
#
# Skipped (exit 0, "skipped: ...") where no NVIDIA driver is present, unless MOONGATE_CUDA_LIB
# names a driver library (the tests give it the CUDA driver emulator). Binaries: the bundle's
# bin/ beside this script, else $MG_BUILD_DIR, else build/release of the source tree.
# --ports gives the two daemons' h2c ports (B's peer port first; the first serves the Python
# part's target too); without it, free ones are drawn from 10000-19999, below the kernel's
# ephemeral range.
# Exit status 0 when every move ended OK and the bytes compared equal.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -x "$here/bin/moongate" ]; then
    bin=$here/bin
else
    bin=${MG_BUILD_DIR:-$here/../../build/release}
fi
size=1G
rounds=3
ports=
while [ $# -gt 0 ]; do
    case "$1" in
    --size) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --ports) ports=$2; shift 2 ;;
    -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown argument $1" >&2; exit 64 ;;
    esac
done
if [ -z "${MOONGATE_CUDA_LIB:-}" ] && [ ! -e /proc/driver/nvidia/version ] &&
    ! { ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; }; then
    echo "check.sh: skipped: no NVIDIA driver here (no /proc/driver/nvidia/version, no libcuda.so.1)"
    exit 0
fi
for b in moongate mgctl mgbench; do
    [ -x "$bin/$b" ] || { echo "check.sh: no $bin/$b (build first, or set MG_BUILD_DIR)" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# A port nothing listens on now (the daemon's start says so if another took it meanwhile).
free_port() {
    local p
    for _ in $(seq 1 100); do
        p=$((10000 + RANDOM % 10000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    echo "check.sh: no free port" >&2
    exit 1
}

# start NAME FLAGS...: a daemon on h2c port $port and socket $work/NAME.sock, ready.
start() {
    local name=$1 log
    shift
    log=$work/$name.log
    "$bin/moongate" --allow-anonymous --peer-anonymous --listen "" --ops-listen "" \
        --h2c-listen "127.0.0.1:$port" --unix-socket "$work/$name.sock" \
        --shm-dir "$work/shm-$name" --data-listen 127.0.0.1:0 --peer-tls=false \
        --access-log=false --memlock try "$@" >"$log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 600); do
        grep -q "event=ready" "$log" && return 0
        if ! kill -0 "${pids[-1]}" 2>/dev/null; then
            echo "check.sh: daemon $name did not start:" >&2
            tail -n 5 "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "check.sh: daemon $name not ready within 60 s" >&2
    exit 1
}

if [ -n "$ports" ]; then
    port_b=${ports%%,*}
    port_a=${ports#*,}
    case "$port_b$port_a" in
    '' | *[!0-9]*) echo "check.sh: --ports wants two port numbers, PORT_B,PORT_A" >&2; exit 64 ;;
    esac
else
    port_b=$(free_port)
    port_a=$(free_port)
fi
port=$port_b
start b --pool-bytes 0
port=$port_a
start a --pool-bytes 256M --peer-port "$port_b"

echo "check.sh: $("$bin/moongate" --version 2>/dev/null | head -n 1), $size, $rounds rounds"
"$bin/mgbench" vram --target "unix:$work/a.sock" --peer "127.0.0.1:$port_b" --size "$size" \
    --rounds "$rounds" --path staged --verify
if "$bin/mgctl" --target "unix:$work/a.sock" info | grep -q '^ *rdma *available'; then
    "$bin/mgbench" vram --target "unix:$work/a.sock" --peer "127.0.0.1:$port_b" --size "$size" \
        --rounds "$rounds" --path dmabuf --register --verify
else
    echo "check.sh: by dma-buf: not run (daemon A has no RDMA device)"
fi
staged=$here/../bench/bench_staged.py
py=
for p in /usr/bin/python3 python3; do
    if "$p" -c 'import grpc' 2>/dev/null; then py=$p; break; fi
done
if [ -f "$staged" ] && [ -n "$py" ]; then
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
    echo "check.sh: device to device through mooncake.engine, staged at both ends:"
    MOONGATE_CLIENT_LIB=${MOONGATE_CLIENT_LIB:-$bin/libmgclient.so.0} \
        MOONGATE_PYGEN=${MOONGATE_PYGEN:-$bin/pygen} "$py" "$staged" --moongate "$bin/moongate" \
        --size "$(numfmt --from=iec "$size")" --rounds "$rounds" --port "$port_b" --verify
else
    echo "check.sh: through mooncake.engine: not run (needs python3 with grpcio, and the source tree)"
fi
echo "check.sh: ok"
