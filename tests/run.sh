#!/usr/bin/env bash
# The whole moongate test suite, as CI runs it (.ci/run calls this):
#   1. installs missing Debian packages (scripts/deps.sh)
#   2. checks formatting against .clang-format, the layers' includes, function lengths, and that
#      a packager's plain `cmake -DCMAKE_BUILD_TYPE=Release` build succeeds without a warning
#   3. release build: CUnit suites (ctest), then integration tests (pytest: real daemons driven
#      by python3-grpcio, curl, mgctl and raw HTTP/2)
#      and the demo (scripts/demo.sh, the README's first command)
#   4. the same under AddressSanitizer + UndefinedBehaviorSanitizer
#   5. ThreadSanitizer: the unit suites and the integration tests whose threads share state
#      (TSAN_PYTEST below; docs/testing.md says why those)
#   6. libFuzzer targets (clang) for a bounded time each, from the committed seed corpus
# Ends with one line `N passed, N failed`; exits non-zero when anything failed.
# Environment: MG_FUZZ_SECONDS (default 30 per target), MG_SKIP_ASAN=1, MG_SKIP_TSAN=1,
# MG_SKIP_FUZZ=1.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=/usr/bin/python3
fuzz_seconds=${MG_FUZZ_SECONDS:-30}
# Integration tests run in parallel (pytest-xdist): most of their time is spent waiting on
# daemons, not computing. Every port comes from the kernel's free ones and every path from a
# per-test directory; tests that share something of the machine run on one worker
# (xdist_group).
pytest_workers=${MG_PYTEST_WORKERS:-3}
fuzz_jobs=${MG_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
passed=0
failed=0
summary=()
run_wrap=() # what the unit and integration tests run under (tsan_setup sets it)
t_start=$(date +%s)

stage() { # name command...
    local name=$1 t0 rc
    shift
    t0=$(date +%s)
    echo "=== $name"
    "$@"
    rc=$?
    summary+=("$(printf '%-34s %-6s %4ss' "$name" "$([ $rc -eq 0 ] && echo ok || echo FAILED)" \
        $(($(date +%s) - t0)))")
    return $rc
}

count_ctest() { # build-dir
    local out rc
    out=$(cd "$1" && "${run_wrap[@]}" ctest --output-on-failure 2>&1)
    rc=$?
    echo "$out" | grep -E "Test +#|tests passed|FAILED|Failed|Exception" | sed 's/^/  /'
    [ $rc -ne 0 ] && echo "$out" | tail -n 60
    local line total bad
    line=$(echo "$out" | grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" | tail -n 1)
    total=$(echo "$line" | sed -E 's/.*out of ([0-9]+).*/\1/')
    bad=$(echo "$line" | sed -E 's/.* ([0-9]+) tests failed.*/\1/')
    if [ -n "$line" ]; then
        passed=$((passed + total - bad))
        failed=$((failed + bad))
    else
        failed=$((failed + 1))
    fi
    return $rc
}

count_pytest() { # build-dir [test files or other pytest arguments; default: all of them]
    local out rc line p f e dir=$1
    shift
    [ $# -eq 0 ] && set -- tests/integration
    # the stubs once, before pytest-xdist's workers would each make them at the same time
    $py clients/python/gen_stubs.py "$dir/pygen" >/dev/null || return 1
    out=$(MG_BUILD_DIR="$dir" MG_CERTS="$certs" timeout 1200 "${run_wrap[@]}" $py -m pytest -q \
        -p no:cacheprovider -n "$pytest_workers" --dist loadgroup "$@" 2>&1)
    rc=$?
    echo "$out" | tail -n 40 | sed 's/^/  /'
    line=$(echo "$out" | tail -n 1)
    p=$(echo "$line" | grep -oE "[0-9]+ passed" | grep -oE "[0-9]+" || true)
    f=$(echo "$line" | grep -oE "[0-9]+ failed" | grep -oE "[0-9]+" || true)
    e=$(echo "$line" | grep -oE "[0-9]+ error" | grep -oE "[0-9]+" || true)
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0} + ${e:-0}))
    [ $rc -ne 0 ] && [ -z "$f$e" ] && failed=$((failed + 1))
    return $rc
}

check_format() {
    local bad=()
    for f in $(git ls-files '*.c' '*.h' 2>/dev/null || find common engine gateway client tests \
        -name '*.[ch]'); do
        clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done
    if [ ${#bad[@]} -gt 0 ]; then
        echo "  not formatted with .clang-format (clang-format $(clang-format --version |
            grep -oE '[0-9]+\.[0-9.]+' | head -1)): ${bad[*]}"
        failed=$((failed + 1))
        return 1
    fi
    passed=$((passed + 1))
}

run_demo() { # the README's first command, end to end, on its default ports
    local out
    if out=$(timeout 300 scripts/demo.sh 2>&1) && echo "$out" | grep -q "^health: SERVING" &&
        echo "$out" | grep -q '"name":"kv0"' && echo "$out" | grep -q '"reserved":"1048576"' &&
        echo "$out" | grep -q "B .* ok" && echo "$out" | grep -q "A back .* ok" &&
        echo "$out" | grep -q "notification on B, topic demo: A wrote" &&
        echo "$out" | grep -q "^lease .* into it: ok" &&
        echo "$out" | grep -q "moongate exited with status 0"; then
        passed=$((passed + 1))
    else
        echo "$out" | tail -n 40 | sed 's/^/  /'
        failed=$((failed + 1))
        return 1
    fi
}

build() { # flavour -> sets $dir
    dir=$(scripts/build.sh "$1") || { failed=$((failed + 1)); return 1; }
}

count_chart() { # build-dir: one check per values file plus the schema, golden and config checks
    local out rc
    out=$(tests/chart/check.sh "$1" 2>&1)
    rc=$?
    echo "$out" | sed 's/^/  /'
    passed=$((passed + $(echo "$out" | grep -cE ": lint, template|refuses typos|matches tests/chart|starts with every")))
    failed=$((failed + $(echo "$out" | grep -c "FAIL")))
    [ $rc -eq 0 ] || [ "$(echo "$out" | grep -c FAIL)" -gt 0 ] || failed=$((failed + 1))
    return $rc
}

count_image() { # scripts/image.sh, then the daemon run from the unpacked image
    if tests/image/check.sh 2>&1 | sed 's/^/  /'; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        return 1
    fi
}

# The layers: the engine includes nothing of the gateway, the protos, the client library or
# libevent (docs/architecture.md); common/ nothing of the engine (but its error codes) or above.
# Every shell script of the tree parses (bash -n): benchmarks and tools no test runs included.
check_shell() {
    local bad="" f
    for f in $(git ls-files '*.sh' 2>/dev/null || find . -name '*.sh' -not -path './build*'); do
        bash -n "$f" 2>/dev/null || bad="$bad $f"
    done
    if [ -n "$bad" ]; then
        echo "  shell scripts that do not parse:$bad"
        failed=$((failed + 1))
        return 1
    fi
    passed=$((passed + 1))
}

# The engine and common/ include nothing above them; the gateway's services sit side by side:
# none includes another's svc_*.h or calls what another defines, and the core and ops call
# none of them; the core calls nothing of ops, ops does not include the core's internals and
# no service the core's own header (tests/check_services.py).
check_layers() {
    local bad out
    bad=$(grep -rlE \
        '#include .*(pb-c\.h|mg_gateway|mg_core\.h|mg_server_int|mg_call|mg_client|event2/)' engine/
        grep -rE '#include "(moongate/|mg_gateway|mg_core\.h|mg_server_int|mg_client)' common/ |
            grep -v '"moongate/mg_error.h"' | cut -d: -f1)
    if [ -n "$bad" ]; then
        echo "  includes across the layers in: $bad"
        failed=$((failed + 1))
        return 1
    fi
    if ! out=$($py tests/check_services.py 2>&1); then
        echo "$out" | sed 's/^/  services: /'
        failed=$((failed + 1))
        return 1
    fi
    passed=$((passed + 1))
}

# No function under gateway/ or engine/ over 120 lines but main() (tests/check_functions.py).
check_functions() {
    local out
    if ! out=$($py tests/check_functions.py 2>&1); then
        echo "$out" | sed 's/^/  /'
        failed=$((failed + 1))
        return 1
    fi
    passed=$((passed + 1))
}

# A packager's build: the plain `cmake -DCMAKE_BUILD_TYPE=Release` (-O3, no -Werror) must build,
# and CI holds it to no warning at all.
packager_build() {
    local d out rc
    d=$(mktemp -d)
    out=$(cmake -S "$root" -B "$d" -DCMAKE_BUILD_TYPE=Release 2>&1 &&
        cmake --build "$d" -j "$(nproc)" 2>&1)
    rc=$?
    rm -rf "$d"
    if [ $rc -ne 0 ] || echo "$out" | grep -q "warning:"; then
        echo "$out" | grep -E "error|warning:" | head -n 40 | sed 's/^/  /'
        failed=$((failed + 1))
        return 1
    fi
    passed=$((passed + 1))
}

# ThreadSanitizer (GCC 12's runtime) needs the address space laid out as it expects: where the
# kernel randomizes mappings over more bits (vm.mmap_rnd_bits above 28, the default of newer
# kernels on some distributions) every instrumented program dies at start with "FATAL:
# ThreadSanitizer: unexpected memory mapping". Then the tests run without address randomization
# (setarch -R, inherited by every process they start), or, where that is refused (a container's
# seccomp filter), with vm.mmap_rnd_bits set to 28 for the stage (as root; put back after).
tsan_setup() { # build-dir -> run_wrap, tsan_rnd_bits (the value to put back, or "")
    local probe=("$1/moongate" --version) arch
    arch=$(uname -m)
    run_wrap=()
    tsan_rnd_bits=""
    if "${probe[@]}" >/dev/null 2>&1; then
        echo "  instrumented programs start as they are"
        return 0
    fi
    if setarch "$arch" -R "${probe[@]}" >/dev/null 2>&1; then
        run_wrap=(setarch "$arch" -R)
        echo "  without address randomization (setarch $arch -R): the kernel's vm.mmap_rnd_bits" \
            "is $(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null)"
        return 0
    fi
    tsan_rnd_bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null)
    if [ -n "$tsan_rnd_bits" ] && sysctl -qw vm.mmap_rnd_bits=28 2>/dev/null &&
        "${probe[@]}" >/dev/null 2>&1; then
        echo "  vm.mmap_rnd_bits $tsan_rnd_bits -> 28 for this stage"
        return 0
    fi
    tsan_rnd_bits=""
    echo "  instrumented programs do not start here (MG_SKIP_TSAN=1 skips the stage):"
    "${probe[@]}" 2>&1 | tail -n 3 | sed 's/^/    /'
    failed=$((failed + 1))
    return 1
}

tsan_restore() {
    [ -n "${tsan_rnd_bits:-}" ] && sysctl -qw vm.mmap_rnd_bits="$tsan_rnd_bits"
    run_wrap=()
    return 0
}

# The integration tests whose threads share state, about two minutes under ThreadSanitizer on
# two cores (docs/testing.md says why these): libtransfer_engine.so's loop thread against its
# callers (the C harness: submits from several places, tight status polls; its restorer thread
# making the agent and regions again while callers wait across a daemon restart; the C client
# doing the same inside a call), the C examples and
# Python threads sharing a client, the BufferPool's threads, descriptors and process memory
# moved on the workers and transport threads, transfers between two daemons (cancel, kill -9,
# restart, drain, a shrunk file), and the same over the RDMA emulator's queue pairs and pollers.
# Node ids: a test renamed or gone fails the stage ("not found") rather than leaving it.
ti=tests/integration
TSAN_PYTEST=($ti/test_mooncake_c.py $ti/test_python_client.py $ti/test_bufferpool.py $ti/test_ring.py
    $ti/test_restart.py::test_a_c_target_outlives_its_daemon
    $ti/test_restart.py::test_a_c_initiator_outlives_its_daemon
    $ti/test_restart.py::test_a_c_engine_gives_up_and_comes_back_with_its_daemon
    $ti/test_restart.py::test_a_c_engine_refused_by_the_daemon_back_says_so_once
    $ti/test_restart.py::test_a_c_client_makes_again_what_it_had
    $ti/test_fd_memory.py::test_from_c $ti/test_fd_memory.py::test_from_c_buffers
    $ti/test_fd_memory.py::test_memfd_bytes_move_where_they_lie
    $ti/test_fd_memory.py::test_buffers_move_by_address_into_the_clients_mapping
    $ti/test_fd_memory.py::test_malloced_memory_moves_with_process_vm
    $ti/test_fd_memory.py::test_a_process_that_exits_mid_transfer_fails_its_requests_only
    $ti/test_fd_memory.py::test_a_file_shrunk_after_registration_is_data_loss
    $ti/test_transfer.py::test_write_and_read_between_two_daemons
    $ti/test_transfer.py::test_transfers_run_on_the_transport_threads
    $ti/test_transfer.py::test_local_copies_on_this_daemon
    $ti/test_transfer.py::test_wait_streams_progress_until_the_batch_ends
    $ti/test_transfer.py::test_leases_on_either_side
    $ti/test_transfer.py::test_cancel_stops_a_running_request
    $ti/test_transfer.py::test_kill_9_of_a_peer_mid_batch
    $ti/test_transfer.py::test_peer_restart_is_handled_without_restarting_this_daemon
    $ti/test_transfer.py::test_drain_ends_wait_calls_and_stops_running_transfers
    $ti/test_transfer.py::test_writes_into_a_shrunk_remote_file_are_data_loss_and_the_connection_stays
    $ti/test_rdma.py::test_write_and_read_over_rdma
    $ti/test_rdma.py::test_transfers_spread_over_the_devices
    $ti/test_rdma.py::test_a_stale_remote_key_fails_its_request_and_the_connection_is_remade
    $ti/test_rdma.py::test_a_digest_over_rdma_is_checked_by_both_daemons
    $ti/test_rdma.py::test_kill_9_of_a_peer_mid_rdma_batch
    $ti/test_rdma.py::test_peer_restart_over_rdma)

fuzz_one() { # target: runs it from its corpus; prints what it found; exits non-zero on a find
    local target=$1 corpus=tests/fuzz/corpus/$1 work
    work=$(mktemp -d)
    echo "  fuzz_$target: ${fuzz_seconds}s from $(ls "$corpus" | wc -l) seeds"
    if "$dir/tests/fuzz/fuzz_$target" -max_total_time="$fuzz_seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/" \
        "$work" "$corpus" >"$work/log" 2>&1; then
        grep -E "stat::number_of_executed_units" "$work/log" | sed 's/^/    /'
        rm -rf "$work"
        return 0
    fi
    tail -n 40 "$work/log"
    rm -rf "$work"
    return 1
}

fuzz_run() { # every target, fuzz_jobs at a time (each is one process on one core)
    local rc=0 target out pids=() names=() i
    out=$(mktemp -d)
    for target in deframer json proto alloc dataframe auth fdproto agentdesc trace agentstate ring; do
        fuzz_one "$target" >"$out/$target" 2>&1 &
        pids+=($!)
        names+=("$target")
        while [ "$(jobs -rp | wc -l)" -ge "$fuzz_jobs" ]; do wait -n; done
    done
    for i in "${!pids[@]}"; do
        if wait "${pids[$i]}"; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
            rc=1
        fi
        cat "$out/${names[$i]}"
    done
    rm -rf "$out"
    return $rc
}

stage "dependencies" scripts/deps.sh || { echo "cannot install dependencies"; exit 1; }
certs=$(mktemp -d)
trap 'rm -rf "$certs"' EXIT
certs/make-dev-certs.sh "$certs" >/dev/null

stage "format (clang-format)" check_format
stage "layers (engine and common include nothing above them; services side by side)" check_layers
stage "shell scripts parse (bash -n)" check_shell
stage "function length (120 lines)" check_functions
stage "packager build (cmake Release)" packager_build
if stage "build (release)" build release; then
    stage "unit tests (release)" count_ctest "$dir"
    stage "integration tests (release)" count_pytest "$dir"
    stage "demo (scripts/demo.sh)" run_demo
    stage "helm chart (lint, render, schemas, daemon config)" count_chart "$dir"
    stage "image (debootstrap, umoci, daemon run from its root)" count_image
fi
if [ "${MG_SKIP_ASAN:-0}" != 1 ]; then
    if stage "build (asan+ubsan)" build asan; then
        # exitcode: a sanitizer report never passes for an expected exit status (1, 2)
        export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:exitcode=86}
        export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:exitcode=86}
        stage "unit tests (asan+ubsan)" count_ctest "$dir"
        # the soak test runs half as long here: the point is the leak checks, not the rounds
        MG_SOAK_SECONDS=${MG_SOAK_SECONDS_ASAN:-60} stage "integration tests (asan+ubsan)" \
            count_pytest "$dir"
    fi
fi
if [ "${MG_SKIP_TSAN:-0}" != 1 ]; then
    if stage "build (tsan)" build tsan && stage "tsan runs here" tsan_setup "$dir"; then
        # exitcode as under ASan; reports of every process the integration tests start also
        # fail the test they came in (tests/integration/conftest.py); tests/tsan.supp says what
        # is suppressed and why
        tsan_defaults=exitcode=86:halt_on_error=0:second_deadlock_stack=1
        export TSAN_OPTIONS=${TSAN_OPTIONS:-$tsan_defaults:suppressions=$root/tests/tsan.supp}
        stage "unit tests (tsan)" count_ctest "$dir"
        stage "integration tests (tsan)" count_pytest "$dir" "${TSAN_PYTEST[@]}"
        tsan_restore
    fi
fi
if [ "${MG_SKIP_FUZZ:-0}" != 1 ]; then
    if stage "build (fuzz, clang)" build fuzz; then
        stage "fuzz (${fuzz_seconds}s per target)" fuzz_run
    fi
fi

echo
echo "=== summary ($(($(date +%s) - t_start))s in all)"
printf '  %s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
