#!/usr/bin/env bash
# Makes the CPU flavor's base image, docker.io/library/debian:bookworm-slim, locally with
# debootstrap, for machines that reach Debian's mirror but no container registry (this project's
# CI). Where a registry is reachable, `docker pull debian:bookworm-slim` gives the real one.
# Skips the work when the tag exists. Needs root and podman.
set -euo pipefail
TAG="${BASE_TAG:-docker.io/library/debian:bookworm-slim}"
if podman image exists "$TAG"; then
  echo "[make-base-image] $TAG exists"; exit 0
fi
mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
security="$(awk '/^URIs:/ {print $2}' /etc/apt/sources.list.d/debian.sources 2>/dev/null | sed -n 2p || true)"
mirror="${DEBIAN_MIRROR:-${mirror:-http://deb.debian.org/debian}}"
security="${DEBIAN_SECURITY_MIRROR:-${security:-http://deb.debian.org/debian-security}}"
rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
echo "[make-base-image] debootstrap bookworm from $mirror"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$rootfs.log" 2>&1 || { tail -20 "$rootfs.log"; exit 1; }
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
  "$mirror" "$mirror" "$security" > "$rootfs/etc/apt/sources.list"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
echo localhost > "$rootfs/etc/hostname"
: > "$rootfs/etc/resolv.conf"
tar --numeric-owner -C "$rootfs" -c . | podman import --change 'CMD ["bash"]' - "$TAG" >/dev/null
echo "[make-base-image] $TAG ready"
