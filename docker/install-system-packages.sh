#!/usr/bin/env bash
# The image's operating-system packages (Debian bookworm, both flavors), for one stage: `builder`
# (Python headers, compilers, OpenMPI with mpicc) or `runtime` (Python, OpenMPI's runtime,
# OpenSSH server and client; no compilers). The runtime's OpenMPI brings libfabric with its EFA
# provider (libefa from ibverbs-providers), which the GPU flavor names explicitly.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
stage="${1:?usage: install-system-packages.sh builder|runtime}"
# shellcheck source=/dev/null
. /etc/os-release
[ "$ID" = debian ] || die "unsupported base image OS: $ID (both flavors build on Debian bookworm)"
py="python$PYTHON_VERSION"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
common=(ca-certificates "$py" "$py-venv" openssh-client)   # venv: both stages create /opt/dtc/venv
if [ "$stage" = builder ]; then
  apt_install "${common[@]}" "$py-dev" g++ make cmake patch
  OPENMPI_DEV=1 "$DOCKER_DIR/install-openmpi.sh"
elif [ "$stage" = runtime ]; then
  apt_install "${common[@]}" openssh-server
  [ "$FLAVOR" = gpu ] && apt_install libfabric1 ibverbs-providers
  OPENMPI_DEV=0 "$DOCKER_DIR/install-openmpi.sh"
else
  die "stage must be builder or runtime, got '$stage'"
fi
rm -rf /var/lib/apt/lists/*
