#!/bin/sh
# Usage: deploy/mqtt-acl/make-certs.sh OUT_DIR NAME [NAME ...]
# A private CA for one cluster and a certificate per NAME, signed by it (EC P-256, openssl):
#   OUT_DIR/ca.pem            the cluster CA (trust root of the broker, the nodes and their peers)
#   OUT_DIR/ca-key.pem        its key: keep it offline, it is needed only to issue more certificates
#   OUT_DIR/NAME.pem, NAME-key.pem   for each NAME: SAN DNS:NAME (+ DNS:localhost, IP:127.0.0.1), usable as TLS
#                             server and client (the broker "mosquitto"; a node's gRPC port, its forwards
#                             to peers and its connection to the broker)
# An existing CA in OUT_DIR is reused, so more names can be added later. DAYS (default 365) sets the validity.
# Example (the compose cluster):  deploy/mqtt-acl/make-certs.sh deploy/secrets mosquitto gpu-server jetson-a cpu-node client
set -eu
[ $# -ge 2 ] || { echo "usage: $0 OUT_DIR NAME [NAME ...]" >&2; exit 2; }
out=$1; shift
days=${DAYS:-365}
command -v openssl >/dev/null || { echo "openssl not found" >&2; exit 1; }
umask 077
mkdir -p "$out"
chmod 700 "$out"
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
if [ ! -f "$out/ca.pem" ]; then
  # shellcheck disable=SC2086
  openssl req -x509 $ec -keyout "$out/ca-key.pem" -out "$out/ca.pem" -days "$days" -subj "/CN=gt-serve cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
for name in "$@"; do
  case "$name" in *[!A-Za-z0-9.-]*|'') echo "bad name: $name" >&2; exit 2;; esac
  printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
    "$name" > "$out/$name.ext"
  # shellcheck disable=SC2086
  openssl req $ec -keyout "$out/$name-key.pem" -out "$out/$name.csr" -subj "/CN=$name" 2>/dev/null
  openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" -CAcreateserial \
    -days "$days" -out "$out/$name.pem" -extfile "$out/$name.ext" 2>/dev/null
  rm -f "$out/$name.csr" "$out/$name.ext"
done
# Readable by the containers' non-root users (broker uid 1883, nodes uid 10001), which get single files
# mounted (docker-compose.yml: compose secrets), never the directory: on the host the directory stays 700,
# so no other host user reaches the keys. Mounting the whole directory would not work (700) nor be wanted.
chmod 644 "$out"/*.pem
chmod 600 "$out/ca-key.pem"
echo "wrote $out/ca.pem and a certificate + key per name ($*)"
