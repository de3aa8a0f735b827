#!/usr/bin/env bash
# Configures and builds one flavour of moongate.
# Usage: scripts/build.sh [release|asan|tsan|fuzz] (default release); prints the build directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
flavour=${1:-release}
jobs=$(nproc 2>/dev/null || echo 2)
case "$flavour" in
release) dir=$root/build; opts=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
asan) dir=$root/build-asan; opts=(-DCMAKE_BUILD_TYPE=Debug -DMG_SANITIZE=ON) ;;
tsan) dir=$root/build-tsan; opts=(-DCMAKE_BUILD_TYPE=Debug -DMG_TSAN=ON) ;;
fuzz) dir=$root/build-fuzz
      opts=(-DCMAKE_BUILD_TYPE=Debug -DMG_FUZZ=ON -DMG_SANITIZE=ON -DMG_TESTS=OFF
            -DCMAKE_C_COMPILER=clang) ;;
*) echo "usage: $0 [release|asan|tsan|fuzz]" >&2; exit 64 ;;
esac
# Warnings are errors here (developers and CI); a packager's plain cmake build leaves them warnings.
cmake -S "$root" -B "$dir" -DMG_WERROR=ON "${opts[@]}" >/dev/null
target=(all)
[ "$flavour" = fuzz ] && target=(fuzz)
if ! out=$(cmake --build "$dir" --target "${target[@]}" -j "$jobs" 2>&1); then
    echo "$out" | tail -n 60 >&2
    exit 1
fi
echo "$dir"
