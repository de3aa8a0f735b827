#!/usr/bin/env bash
# Builds the OCI image (scripts/image.sh) and runs its daemon from the unpacked image root, no
# container runtime needed: `moongate --help` and `--version` in a chroot, then the daemon as
# the image's user (uid 65532) serving health checks to curl on the ops port and to the image's
# own mgctl on the Unix socket, a segment registered through it, and a clean exit on SIGTERM.
# Also checks the image's configuration (entrypoint, user, ports). Run as root.
#
#   tests/image/check.sh [OUT]    (default OUT: build/image; the Debian root is cached there)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build/image}
ref=$("$root/scripts/image.sh" "$out")
version=${ref##*:}
work=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "  FAIL $*"; exit 1; }

umoci unpack --image "$ref" "$work/bundle" >/dev/null
rootfs=$work/bundle/rootfs
config=$(cat "$work/bundle/config.json") # the runtime config umoci derived from the image's
echo "$config" | grep -q '"/usr/bin/moongate"' || fail "the image's entrypoint is not /usr/bin/moongate"
echo "$config" | grep -q '"uid": *65532' || fail "the image does not run as uid 65532"
echo "  image $ref: entrypoint /usr/bin/moongate, user 65532, $(du -sh "$out/moongate-$version.oci.tar" | cut -f1)"

chroot "$rootfs" /usr/bin/moongate --version | grep -q "$version" ||
    fail "moongate --version in the image does not say $version"
chroot "$rootfs" /usr/bin/moongate --help | grep -q -- "--auth-file" ||
    fail "moongate --help in the image lacks the options"
echo "  moongate --help and --version run in the image's root"

# A port that binds now, below the kernel's ephemeral range (tests/free_port.py says why).
port() {
    /usr/bin/python3 "$root/tests/free_port.py"
}
ops=$(port)
h2c=$(port)
mkdir -p "$rootfs/tmp/segments"
chown 65532:65532 "$rootfs/tmp/segments"
chroot --userspec=65532:65532 "$rootfs" /usr/bin/moongate --listen "" \
    --h2c-listen "127.0.0.1:$h2c" --ops-listen "127.0.0.1:$ops" \
    --unix-socket /run/moongate/moongate.sock --shm-dir /tmp/segments \
    --data-listen 127.0.0.1:0 --pool-bytes 16M --allow-anonymous >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$ops/readyz" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { cat "$work/log"; fail "the daemon in the image exited"; }
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$ops/readyz" | grep -q ok || fail "/readyz of the image's daemon"
[ "$(chroot "$rootfs" /usr/bin/mgctl --target unix:/run/moongate/moongate.sock health)" = SERVING ] ||
    fail "mgctl health on the image's Unix socket"
chroot "$rootfs" /usr/bin/mgctl --target unix:/run/moongate/moongate.sock \
    call Memory/RegisterSegment '{"name": "in-image", "size": "4096"}' | grep -q '"in-image"' ||
    fail "RegisterSegment through the image's mgctl"
[ -n "$(ls "$rootfs/tmp/segments")" ] || fail "no segment file in the image's shm directory"
echo "  the image's daemon serves /readyz, Health and RegisterSegment (as uid 65532)"
kill -TERM $pid
wait $pid || fail "the image's daemon did not exit 0 on SIGTERM: $(tail -n 3 "$work/log")"
pid=
[ -z "$(ls "$rootfs/tmp/segments")" ] || fail "segment files left after the daemon stopped"
echo "  SIGTERM: drained, exit 0, segment files removed"
