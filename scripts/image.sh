#!/usr/bin/env bash
# Builds the moongate OCI image without a container engine, from Debian packages only:
# debootstrap makes a minimal Debian 12 root with the libraries the daemon links (found with
# ldd and dpkg) plus libibverbs1 and its providers (loaded at run time for RDMA), the release
# build's moongate and mgctl go into /usr/bin, and umoci packs the root as one layer of an OCI
# image. Run as root (debootstrap and umoci unpack/repack need it).
#
#   scripts/image.sh [OUT]     default OUT: build/image; writes
#       OUT/oci                 the OCI image layout, tag moongate:VERSION
#       OUT/moongate-VERSION.oci.tar   the same as one archive
#
# Load it where a container engine is: `podman load -i OUT/moongate-VERSION.oci.tar`, or
# `skopeo copy oci:OUT/oci:VERSION docker://REGISTRY/moongate:VERSION`. The chart's default
# image is moongate:VERSION. MOONGATE_DEBIAN_MIRROR changes the mirror; the root is cached in
# OUT/rootfs-base (delete it to rebuild from scratch).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(mkdir -p "${1:-build/image}" && cd "${1:-build/image}" && pwd)
mirror=${MOONGATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

for tool in debootstrap umoci; do
    command -v $tool >/dev/null ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap umoci >/dev/null
done
build=$(scripts/build.sh release)
version=$(sed -n 's/^project(moongate VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[ -n "$version" ] || { echo "image.sh: no version in CMakeLists.txt" >&2; exit 1; }

# The Debian packages of every library the binaries load, and the RDMA user space.
owner() { # a library path -> its package (Debian 12 merges /lib into /usr/lib)
    dpkg -S "$1" 2>/dev/null || dpkg -S "/usr$1" 2>/dev/null ||
        dpkg -S "$(readlink -f "$1")" 2>/dev/null || { echo "image.sh: no package has $1" >&2; exit 1; }
}
pkgs=$(for lib in $(ldd "$build/moongate" "$build/mgctl" | awk '/=> \// {print $3}' | sort -u); do
    owner "$lib"
done | cut -d: -f1 | sort -u | tr '\n' ',')
pkgs="${pkgs}libibverbs1,ibverbs-providers,ca-certificates"
stamp="$out/rootfs-base/.moongate-packages"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$pkgs" ]; then
    echo "image.sh: debootstrap bookworm (minbase) with $pkgs" >&2
    rm -rf "$out/rootfs-base"
    debootstrap --variant=minbase --include="$pkgs" bookworm "$out/rootfs-base" "$mirror" \
        >"$out/debootstrap.log" 2>&1 || { tail -n 20 "$out/debootstrap.log" >&2; exit 1; }
    # What a daemon image does not need: package caches and documentation.
    rm -rf "$out/rootfs-base"/var/cache/apt/archives/*.deb "$out/rootfs-base"/var/lib/apt/lists/* \
        "$out/rootfs-base"/usr/share/doc/* "$out/rootfs-base"/usr/share/man/* \
        "$out/rootfs-base"/usr/share/locale/*
    echo "$pkgs" >"$stamp"
fi

rootfs=$out/rootfs
rm -rf "$rootfs"
cp -a "$out/rootfs-base" "$rootfs"
rm -f "$rootfs/.moongate-packages"
install -m 0755 "$build/moongate" "$build/mgctl" "$rootfs/usr/bin/"
# The chart runs the daemon as uid 65532 unless RDMA needs root.
grep -q '^moongate:' "$rootfs/etc/passwd" ||
    echo 'moongate:x:65532:65532:moongate:/nonexistent:/usr/sbin/nologin' >>"$rootfs/etc/passwd"
grep -q '^moongate:' "$rootfs/etc/group" || echo 'moongate:x:65532:' >>"$rootfs/etc/group"
mkdir -p "$rootfs/run/moongate" "$rootfs/etc/moongate"
chown 65532:65532 "$rootfs/run/moongate"

# Pack: a fresh image, its (empty) root unpacked, replaced by ours, repacked as one layer.
oci=$out/oci
rm -rf "$oci" "$out/bundle"
umoci init --layout "$oci"
umoci new --image "$oci:$version"
umoci unpack --image "$oci:$version" "$out/bundle" >/dev/null
rm -rf "$out/bundle/rootfs"
mv "$rootfs" "$out/bundle/rootfs"
umoci repack --image "$oci:$version" "$out/bundle"
umoci config --image "$oci:$version" --author moongate \
    --config.entrypoint /usr/bin/moongate --config.user 65532:65532 \
    --config.workingdir / \
    --config.exposedports 7443/tcp --config.exposedports 7080/tcp \
    --config.exposedports 7446/tcp \
    --config.label "org.opencontainers.image.title=moongate" \
    --config.label "org.opencontainers.image.version=$version"
rm -rf "$out/bundle"
(cd "$oci" && tar -cf "$out/moongate-$version.oci.tar" .)
echo "image.sh: $oci:$version ($(du -sh "$out/moongate-$version.oci.tar" | cut -f1)," \
    "archive $out/moongate-$version.oci.tar)" >&2
echo "$oci:$version"
