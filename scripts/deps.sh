#!/usr/bin/env bash
# Installs the Debian 12 packages moongate needs to build, test and demo, if any is missing.
# Run as root. Usage: scripts/deps.sh [extra-package ...]
set -euo pipefail

pkgs=(
    build-essential cmake pkg-config clang clang-format
    libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev
    libevent-dev libssl-dev libcunit1-dev libjansson-dev
    libibverbs-dev  # verbs headers: the daemon opens libibverbs at run time, never links it
    python3 python3-grpcio python3-grpc-tools python3-protobuf python3-pytest python3-h2
    python3-pytest-xdist  # integration tests on parallel workers (tests/run.sh)
    python3-numpy  # NIXL's descriptor arrays and index arrays (tests/integration/test_nixl.py)
    python3-torch  # CPU tensors handed to the NIXL door as vLLM hands them (test_nixl.py)
    python3-venv python3-setuptools  # the Python package, installed offline (docs/python.md)
    curl nghttp2-client openssl ca-certificates procps iproute2
    debootstrap umoci  # the OCI image without a container engine (scripts/image.sh)
    chromium  # the status page, rendered headless (tests/integration/test_status_page.py)
    "$@"
)

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing packages: ${missing[*]} (run as root to install them)" >&2
    exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
