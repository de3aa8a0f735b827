#!/usr/bin/env bash
# The main job: on a fresh Debian 12 machine, as root, installs what is missing, builds moongate,
# makes development certificates, starts the daemon with its embedded defaults (TLS control port
# 7443, ops port 7080, Unix socket /run/moongate/moongate.sock) and shows it working end to end
# with mgctl, curl and a Python gRPC client, as tenant "demo" (a bearer token made for this run,
# mapped in an --auth-file; callers without credentials are refused); then starts a second daemon (B, ports 7543 and 7546)
# and moves 1 GiB from A to B and back over B's TCP data plane, checked by SHA-256
# (MOONGATE_DEMO_BYTES changes the size). Then it drains the daemons with SIGTERM.
#
#   scripts/demo.sh          run the demo and stop the daemon
#   scripts/demo.sh --keep   leave the daemon running (stop it with: kill $(cat build/demo/pid))
#
# Ports and paths follow the daemon's environment (MOONGATE_LISTEN, MOONGATE_OPS_LISTEN,
# MOONGATE_UNIX_SOCKET, ...) when set.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
keep=0
[ "${1:-}" = "--keep" ] && keep=1

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

scripts/deps.sh
echo "building moongate ..."
build=$(scripts/build.sh release)
certs/make-dev-certs.sh >/dev/null
certs=$root/certs/dev
run=$build/demo
mkdir -p "$run"

control=${MOONGATE_LISTEN:-[::]:7443}
port=${control##*:}
ops=${MOONGATE_OPS_LISTEN:-[::]:7080}
ops_port=${ops##*:}
sock=${MOONGATE_UNIX_SOCKET:-/run/moongate/moongate.sock}

# Credentials: a random bearer token for tenant "demo" (the auth file holds only its SHA-256);
# the development client certificate (CN dev-client) maps to the same tenant. curl reads the
# header from a file so that the token stays out of the process list.
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
(umask 077 && printf '%s\n' "$token" >"$run/token" &&
    printf 'authorization: Bearer %s\n' "$token" >"$run/auth-header")
printf '# kind credential tenant [role]\ntoken sha256:%s demo\ncert dev-client demo\n' \
    "$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)" >"$run/auth"
auth=(-H "@$run/auth-header")

if [ -f "$run/pid" ] && kill -0 "$(cat "$run/pid")" 2>/dev/null; then
    echo "stopping the daemon of an earlier demo"
    kill -TERM "$(cat "$run/pid")"
    sleep 2
fi

say "cat build/demo/auth"
cat "$run/auth"
say "moongate --tls-cert certs/dev/server.pem --tls-key certs/dev/server.key --auth-file build/demo/auth --client-ca certs/dev/ca.pem --peer-ca certs/dev/peer-ca.pem --peer-cert certs/dev/peer-a.pem --peer-key certs/dev/peer-a.key &"
"$build/moongate" --tls-cert "$certs/server.pem" --tls-key "$certs/server.key" \
    --auth-file "$run/auth" --client-ca "$certs/ca.pem" \
    --peer-ca "$certs/peer-ca.pem" --peer-cert "$certs/peer-a.pem" --peer-key "$certs/peer-a.key" \
    >"$run/moongate.log" 2>&1 &
pid=$!
echo $pid >"$run/pid"
# A step that fails must not leave the daemon behind (unless --keep asked for it).
stop_on_error() { [ $keep -eq 1 ] || kill -TERM $pid 2>/dev/null || true; }
trap stop_on_error ERR
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$ops_port/readyz" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { cat "$run/moongate.log"; exit 1; }
    sleep 0.1
done
sed 's/^/  /' "$run/moongate.log"

say "mgctl health                                   # h2c on the Unix socket"
"$build/mgctl" --target "unix:$sock" health
say "mgctl --target localhost:$port --ca certs/dev/ca.pem --token-file build/demo/token info"
"$build/mgctl" --target "localhost:$port" --ca "$certs/ca.pem" --token-file "$run/token" info
say "mgctl --target localhost:$port --ca certs/dev/ca.pem --cert certs/dev/client.pem --key certs/dev/client.key call Memory/ListSegments   # the client certificate instead"
"$build/mgctl" --target "localhost:$port" --ca "$certs/ca.pem" --cert "$certs/client.pem" \
    --key "$certs/client.key" call Memory/ListSegments
say "curl --http2 --cacert certs/dev/ca.pem -H @build/demo/auth-header -H 'content-type: application/json' -d '{}' https://localhost:$port/moongate.v1.Daemon/Info"
curl -sS --http2 --cacert "$certs/ca.pem" "${auth[@]}" -H 'content-type: application/json' \
    -d '{}' "https://localhost:$port/moongate.v1.Daemon/Info"
say "curl --http2 --cacert certs/dev/ca.pem https://localhost:$port/v1/segments   # no credentials: refused"
curl -sS --http2 --cacert "$certs/ca.pem" -w '  (HTTP %{http_code})\n' \
    "https://localhost:$port/v1/segments"
say "curl --http2 ... -d '{\"service\": \"nope\"}' https://localhost:$port/grpc.health.v1.Health/Check   # errors are JSON too"
curl -sS --http2 --cacert "$certs/ca.pem" -H 'content-type: application/json' \
    -d '{"service": "nope"}' -w '  (HTTP %{http_code})\n' \
    "https://localhost:$port/grpc.health.v1.Health/Check"
say "curl http://127.0.0.1:$ops_port/readyz; curl -s http://127.0.0.1:$ops_port/metrics | grep grpc_handled"
curl -sS "http://127.0.0.1:$ops_port/readyz"
curl -sS "http://127.0.0.1:$ops_port/metrics" | grep '^moongate_grpc_handled_total'
say "curl --http2 ... -d '{\"name\": \"kv0\", \"size\": \"1048576\"}' https://localhost:$port/v1/segments   # register a segment"
seg=$(curl -sS --http2 --cacert "$certs/ca.pem" "${auth[@]}" -H 'content-type: application/json' \
    -d '{"name": "kv0", "size": "1048576", "prefault": true}' "https://localhost:$port/v1/segments")
echo "$seg"
seg_id=$(echo "$seg" | sed -n 's/.*"id":"\([0-9]*\)".*/\1/p')
seg_path=$(echo "$seg" | sed -n 's/.*"path":"\([^"]*\)".*/\1/p')
say "ls -l $seg_path                                # the file a local client maps"
ls -l "$seg_path"
say "curl --http2 ... https://localhost:$port/v1/segments; curl --http2 -X DELETE .../v1/segments/$seg_id"
curl -sS --http2 --cacert "$certs/ca.pem" "${auth[@]}" "https://localhost:$port/v1/segments"
curl -sS --http2 --cacert "$certs/ca.pem" "${auth[@]}" -X DELETE \
    "https://localhost:$port/v1/segments/$seg_id"
say "curl --http2 ... -d '{\"size\": \"1048576\"}' https://localhost:$port/v1/leases   # lease a slice of the buffer pool"
lease=$(curl -sS --http2 --cacert "$certs/ca.pem" "${auth[@]}" -H 'content-type: application/json' \
    -d '{"size": "1048576", "ttl_ms": 30000}' "https://localhost:$port/v1/leases")
echo "$lease"
lease_id=$(echo "$lease" | sed -n 's/.*"id":"\([0-9]*\)".*/\1/p')
say "curl --http2 ... https://localhost:$port/v1/pool; curl --http2 -X DELETE .../v1/leases/$lease_id"
curl -sS --http2 --cacert "$certs/ca.pem" "${auth[@]}" "https://localhost:$port/v1/pool"
curl -sS --http2 --cacert "$certs/ca.pem" "${auth[@]}" -X DELETE \
    "https://localhost:$port/v1/leases/$lease_id"
say "clients/python/health_check.py --target localhost:$port --ca certs/dev/ca.pem --token-file build/demo/token   # python3-grpcio"
MOONGATE_PYGEN=$build/pygen /usr/bin/python3 clients/python/health_check.py \
    --target "localhost:$port" --ca "$certs/ca.pem" --token-file "$run/token"

# The main job: a second daemon (B) on other ports, and 1 GiB moved A -> B and back over B's
# TCP data plane, checked by digest.
b_port=${MOONGATE_DEMO_B_PORT:-7543}
b_data=${MOONGATE_DEMO_B_DATA_PORT:-7546}
# The daemons authenticate each other with certificates of their own CA (mutual TLS): A serves
# its clients with the development CA's server.pem and presents peer-a.pem to peers; B serves
# peer-b.pem and lets only holders of a peer-CA certificate call its peer API.
say "moongate --listen 127.0.0.1:$b_port --tls-cert certs/dev/peer-b.pem --peer-ca certs/dev/peer-ca.pem --data-listen 127.0.0.1:$b_data ... &   # daemon B"
"$build/moongate" --listen "127.0.0.1:$b_port" --tls-cert "$certs/peer-b.pem" \
    --tls-key "$certs/peer-b.key" --peer-ca "$certs/peer-ca.pem" --auth-file "$run/auth" \
    --ops-listen "" --unix-socket "" --pool-bytes 0 \
    --data-listen "127.0.0.1:$b_data" --shm-dir /dev/shm/moongate-b >"$run/moongate-b.log" 2>&1 &
pid_b=$!
stop_b() { kill -TERM $pid_b 2>/dev/null && wait $pid_b || true; }
trap 'stop_b; stop_on_error' ERR
for _ in $(seq 1 100); do
    grep -q "event=ready" "$run/moongate-b.log" 2>/dev/null && break
    kill -0 $pid_b 2>/dev/null || { cat "$run/moongate-b.log"; exit 1; }
    sleep 0.1
done
say "clients/python/transfer_demo.py --a localhost:$port --b localhost:$b_port --peer 127.0.0.1:$b_port --ca certs/dev/ca.pem --ca-b certs/dev/peer-ca.pem --token-file build/demo/token"
MOONGATE_PYGEN=$build/pygen /usr/bin/python3 clients/python/transfer_demo.py \
    --a "localhost:$port" --b "localhost:$b_port" --peer "127.0.0.1:$b_port" \
    --ca "$certs/ca.pem" --ca-b "$certs/peer-ca.pem" --token-file "$run/token" --bytes "${MOONGATE_DEMO_BYTES:-1073741824}"
stop_b
trap stop_on_error ERR

if [ $keep -eq 1 ]; then
    echo
    echo "moongate is running (pid $pid, log $run/moongate.log); stop it with: kill $pid"
    exit 0
fi
say "kill -TERM $pid                                  # graceful drain"
trap - ERR
kill -TERM $pid
wait $pid
rc=$?
tail -n 3 "$run/moongate.log" | sed 's/^/  /'
echo "moongate exited with status $rc"
exit $rc
