#!/usr/bin/env bash
# Makes development and test certificates for moongate with openssl:
#   ca.pem / ca.key            a development CA (clients and servers trust it)
#   server.pem / server.key    the daemon's control-port certificate; SANs: localhost,
#                              127.0.0.1, ::1 and every name or address in MOONGATE_CERT_SANS
#   client.pem / client.key    a client certificate (CN=dev-client)
#   client-b.pem / client-b.key  another one (CN=dev-client-b), for tests of two clients
#   peer-a.pem, peer-b.pem     peer-daemon certificates (their own CA: peer-ca.pem), kept apart
#                              from client certificates
# Usage: certs/make-dev-certs.sh [OUTDIR]   (default: certs/dev; existing files are kept)
# Private keys are written mode 0600 and are never committed (certs/dev is git-ignored).
set -euo pipefail

out=${1:-"$(cd "$(dirname "$0")" && pwd)/dev"}
days=${MOONGATE_CERT_DAYS:-825}
mkdir -p "$out"
cd "$out"
umask 077

if [ -f server.pem ] && [ -f ca.pem ] && [ -f client.pem ] && [ -f client-b.pem ] && [ -f peer-b.pem ]; then
    echo "certificates already in $out"
    exit 0
fi

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

make_ca() { # name cn
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -sha256 -days "$days" -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$1.pem"
}

sign() { # ca name cn extfile
    key "$2.key"
    openssl req -new -key "$2.key" -subj "/CN=$3" -out "$2.csr"
    openssl x509 -req -in "$2.csr" -CA "$1.pem" -CAkey "$1.key" -CAcreateserial -sha256 \
        -days "$days" -extfile "$4" -out "$2.pem" 2>/dev/null
    rm -f "$2.csr"
}

make_ca ca "moongate development CA"
make_ca peer-ca "moongate development peer CA"

sans="DNS:localhost,IP:127.0.0.1,IP:::1"
for s in ${MOONGATE_CERT_SANS:-}; do
    if [[ $s =~ ^[0-9.]+$ || $s == *:* ]]; then sans="$sans,IP:$s"; else sans="$sans,DNS:$s"; fi
done
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$sans" > server.ext
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\nsubjectAltName=DNS:dev-client\n' > client.ext
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\nsubjectAltName=DNS:dev-client-b\n' > client-b.ext
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$sans" > peer.ext

sign ca server "localhost" server.ext
sign ca client "dev-client" client.ext
sign ca client-b "dev-client-b" client-b.ext
sign peer-ca peer-a "peer-a" peer.ext
sign peer-ca peer-b "peer-b" peer.ext
rm -f ./*.ext ./*.srl
chmod 0644 ./*.pem
echo "certificates written to $out"
