#!/bin/sh
# Usage: deploy/mqtt-acl/make-passwd.sh OUT_DIR NODE [NODE ...]
# Creates OUT_DIR/passwd (mosquitto password file, one user per node, named like the node) and
# OUT_DIR/NODE.env holding `GT_MQTT_PASSWORD=...` for each node, plus OUT_DIR/cluster.env holding a
# fresh `GT_CLUSTER_KEY=...` shared by every node (telemetry HMAC key). Keep OUT_DIR secret
# (mode 700); hand each node only its own NODE.env and cluster.env.
# Modes: OUT_DIR 700; passwd 644 (salted hashes; the broker container's uid 1883 must read it through a
# single-file mount: no other host user can reach it through the 700 directory); *.env 600 (read on the
# host by docker compose's env_file, never mounted).
set -eu
[ $# -ge 2 ] || { echo "usage: $0 OUT_DIR NODE [NODE ...]" >&2; exit 2; }
out=$1; shift
command -v mosquitto_passwd >/dev/null || { echo "mosquitto_passwd not found (apt-get install mosquitto)" >&2; exit 1; }
umask 077
mkdir -p "$out"
chmod 700 "$out"
: > "$out/passwd"
for node in "$@"; do
  case "$node" in *[!A-Za-z0-9_.-]*|'') echo "bad node name: $node" >&2; exit 2;; esac
  pw=$(openssl rand -hex 24)
  mosquitto_passwd -b "$out/passwd" "$node" "$pw"
  printf 'GT_MQTT_PASSWORD=%s\nGT_TELEMETRY__USERNAME=%s\n' "$pw" "$node" > "$out/$node.env"
done
chmod 644 "$out/passwd"
[ -f "$out/cluster.env" ] || printf 'GT_CLUSTER_KEY=%s\n' "$(openssl rand -hex 32)" > "$out/cluster.env"
echo "wrote $out/passwd, $out/cluster.env and one .env per node ($*)"
