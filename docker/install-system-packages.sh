#!/usr/bin/env bash
# The image's operating-system packages, for one stage: `builder` (Python headers, compilers,
# OpenMPI with mpicc) or `runtime` (Python, OpenMPI's runtime, OpenSSH server and client; no
# compilers). Debian bookworm (CPU flavor) and Ubuntu 22.04 (nvidia/cuda, GPU flavor) differ in
# package names and in where OpenMPI comes from (see install-openmpi.sh).
source "$(dirname "$0")/lib.sh"
stage="${1:?usage: install-system-packages.sh builder|runtime}"
. /etc/os-release
py="python$PYTHON_VERSION"
case "$ID" in
  debian) export OPENMPI_FROM=deb ;;
  ubuntu) if [ "$stage" = builder ]; then export OPENMPI_FROM=source; else export OPENMPI_FROM=prebuilt; fi ;;
  *) die "unsupported base image OS: $ID" ;;
esac
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
common=(ca-certificates "$py" openssh-client)
if [ "$stage" = builder ]; then
  apt_install "${common[@]}" "$py-venv" "$py-dev" g++ make cmake patch
  OPENMPI_DEV=1 "$DOCKER_DIR/install-openmpi.sh"
elif [ "$stage" = runtime ]; then
  apt_install "${common[@]}" openssh-server
  [ "$ID" = ubuntu ] && apt_install libhwloc15 libevent-2.1-7 libevent-pthreads-2.1-7
  OPENMPI_DEV=0 "$DOCKER_DIR/install-openmpi.sh"
else
  die "stage must be builder or runtime, got '$stage'"
fi
rm -rf /var/lib/apt/lists/*
