#!/usr/bin/env bash
# A portable bundle: moongate, mgctl, mgbench, the client libraries (libmgclient.so.0,
# libtransfer_engine.so) and every shared library they load but glibc's, in one folder that
# runs where it is unpacked — a GPU node image without Debian's packages or a compiler. Each
# binary and library finds the others through its RPATH ($ORIGIN), so nothing is installed and
# no LD_LIBRARY_PATH is needed. The glibc it needs at least (the floor) is in its README.
#
#   scripts/bundle.sh [OUT]      default OUT: build/bundle; writes
#       OUT/moongate-VERSION-linux-ARCH/           bin/ lib/ include/ check.sh README
#       OUT/moongate-VERSION-linux-ARCH.tar.gz     the same as one archive
#
# The binaries come from the release build (scripts/build.sh release), or from $MG_BUILD_DIR.
# check.sh in the bundle is tests/gpu/check.sh: run it on a GPU node to check moongate there.
# RDMA: the daemon loads the node's libibverbs.so.1 at run time (not bundled).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(mkdir -p "${1:-build/bundle}" && cd "${1:-build/bundle}" && pwd)
command -v patchelf >/dev/null || scripts/deps.sh patchelf >&2
build=${MG_BUILD_DIR:-$(scripts/build.sh release)}
version=$(sed -n 's/^project(moongate VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
name=moongate-$version-linux-$(uname -m)
dir=$out/$name
rm -rf "$dir" "$dir.tar.gz"
cmake --install "$build" --prefix "$dir" >/dev/null
[ -d "$dir/lib" ] || mv "$dir"/lib* "$dir/lib" # lib64, lib/x86_64-linux-gnu: one lib/
install -m 0755 tests/gpu/check.sh "$dir/check.sh"
rm -rf "$dir/lib/pkgconfig" # its paths are those of an installation, not of a folder

# glibc's own libraries stay the system's: they must match its loader.
glibc='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libmvec|ld-linux.*)\.so'
elves() { find "$dir/bin" "$dir/lib" -type f | while read -r f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && echo "$f"
done; }
# The libraries every ELF here loads, until no new one appears.
while :; do
    added=0
    for f in $(elves); do
        for lib in $(ldd "$f" | awk '/=> \// {print $3}'); do
            base=$(basename "$lib")
            [[ $base =~ $glibc ]] && continue
            [ -e "$dir/lib/$base" ] && continue
            cp -L "$lib" "$dir/lib/$base"
            added=1
        done
    done
    [ $added = 0 ] && break
done
for f in $(elves); do
    chmod u+w "$f"
    case "$f" in
    "$dir"/bin/*) patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f" ;;
    *) patchelf --force-rpath --set-rpath '$ORIGIN' "$f" ;;
    esac
done

# The floor: the newest glibc symbol version any of them needs.
floor=$(for f in $(elves); do objdump -T "$f"; done | grep -o 'GLIBC_[0-9][0-9.]*' |
    sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -n 1)
cat >"$dir/README" <<EOF
moongate $version for Linux $(uname -m): a folder that runs where it is unpacked.

  bin/moongate     the daemon (moongate --help)
  bin/mgctl        its command-line client
  bin/mgbench      benchmarks (mgbench vram: GPU memory moved through moongate)
  lib/             libmgclient.so.0 and libtransfer_engine.so (moongate's client libraries),
                   and the libraries they and the binaries load, but glibc's
  include/         the client libraries' headers
  check.sh         the GPU check: ./check.sh on a node with an NVIDIA driver

Needs: Linux, glibc $floor or newer (the newest glibc symbol version the binaries and libraries
use). The CUDA driver (libcuda.so.1) and RDMA user space (libibverbs.so.1) are the node's,
loaded at run time when present. Built on $(. /etc/os-release && echo "$PRETTY_NAME").
EOF
tar -C "$out" -czf "$dir.tar.gz" "$name"
echo "$dir.tar.gz"
