#!/usr/bin/env bash
# `docker` where a daemon answers, else `podman` with this project's settings (podman-env.sh).
# Usage: scripts/container.sh run --rm -v "$PWD/build/job/opt/ml:/opt/ml" dtc:cpu train
set -euo pipefail
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  exec docker "$@"
fi
. "$(dirname "$0")/podman-env.sh"
exec podman "$@"
