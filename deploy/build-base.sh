#!/usr/bin/env bash
# Makes a plain Debian base image on this machine, without any container registry:
#   debootstrap --variant=minbase SUITE DIR MIRROR  ->  tar | docker import - TAG
# The result plays the part of a "debian:bookworm-slim" image: BASE_IMAGE for the Dockerfile (which
# apt-installs python3 into it) and for deploy/mosquitto/Dockerfile.
#
#   deploy/build-base.sh [TAG]          default TAG gt-serve-base:bookworm; does nothing when TAG exists
#
# Environment
#   DEBIAN_SUITE    default bookworm (its python3 is 3.11)
#   DEBIAN_MIRROR   Debian archive URL; default: the first URIs of this host's apt sources
#                   (/etc/apt/sources.list.d/*.sources, then /etc/apt/sources.list)
#   FORCE=1         rebuild even when TAG exists
# Needs root (debootstrap), debootstrap and a running Docker engine.
set -euo pipefail

tag="${1:-gt-serve-base:bookworm}"
suite="${DEBIAN_SUITE:-bookworm}"

host_mirror() {
    local file
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$file"
        return 0
    done
    if [ -f /etc/apt/sources.list ]; then
        awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
            /etc/apt/sources.list
    fi
}

if [ "${FORCE:-0}" != "1" ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "build-base: $tag exists (FORCE=1 rebuilds it)"
    exit 0
fi

mirror="${DEBIAN_MIRROR:-$(host_mirror)}"
if [ -z "$mirror" ]; then
    echo "build-base: no Debian mirror in this host's apt sources; set DEBIAN_MIRROR" >&2
    exit 2
fi

rootfs="$(mktemp -d /tmp/gt-serve-base.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT

echo "build-base: debootstrap $suite from $mirror"
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"

# What a slim image leaves out: package caches, apt lists, documentation and manual pages.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
# The same dpkg excludes keep later apt installs slim too.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
CFG

tar --numeric-owner -C "$rootfs" -c . \
    | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' \
        - "$tag" >/dev/null
echo "build-base: $tag $(docker image inspect --format '{{.Size}}' "$tag") bytes"
